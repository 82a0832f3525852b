"""``allowlist`` on the Docker tier, against the real engine: every control seen from outside (``docker inspect``)
and its effect from inside, every refusal of the issue, and nothing left behind.

Traffic goes only to destinations and a name server in network namespaces this module makes (``destinations.py``)
and to containers it creates; the egress proxies of this module's provider ask that name server, never the
machine's resolver. Every server is started and stopped here.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from docker_kit import LEASE, Box, Kit, leftovers, resources

import posture
from checkfu.conformance.destinations import Destination, NameServer, beside, destination, name_server
from checkfu.contract.enforcement import AXES
from checkfu.contract.errors import SandboxCapabilityUnavailable, SandboxProviderFailed
from checkfu.contract.members import ActivateRequest, CloneRequest, CompensateRequest, ListAllocationsRequest
from checkfu.contract.profile import SandboxProfile
from checkfu.providers.docker import DockerProvider, egress
from checkfu.providers.docker import labels as L

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

REPO = Path(__file__).resolve().parents[3]
PROXY_VARIABLES = {**egress.sandbox_environment()}

PROBE = r"""
import os, socket, struct, sys, urllib.request
how, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    if how == "direct":
        s = socket.create_connection((host, port), timeout=3)
        print("connected", s.recv(64))
    elif how == "connect":
        s = socket.create_connection(("127.0.0.1", 3128), timeout=3)
        s.sendall(b"CONNECT %s:%d HTTP/1.1\r\n\r\n" % (host.encode(), port))
        s.settimeout(3)
        data = b""
        while data.count(b"\n") < 3:
            more = s.recv(256)
            if not more:
                break
            data += more
        print(data.split(b"\r\n")[0].decode(), data.split(b"\r\n\r\n", 1)[-1])
    elif how == "socks":
        s = socket.create_connection(("127.0.0.1", 3128), timeout=3)
        s.sendall(b"\x05\x01\x00")
        assert s.recv(2) == b"\x05\x00"
        s.sendall(b"\x05\x01\x00\x03" + bytes([len(host)]) + host.encode() + struct.pack(">H", port))
        print("socks", s.recv(10)[1], s.recv(64))
    elif how == "http":  # a program that honours http_proxy, as urllib does
        print(urllib.request.urlopen(f"http://{host}:{port}/hello?x=1", timeout=5).read().decode())
except OSError as e:
    print("failed", getattr(e, "errno", None), e)
"""


@dataclass
class Net:
    listed: Destination
    web: Destination
    other_port: Destination
    unlisted: Destination
    names: NameServer

    @property
    def allowlist(self) -> tuple[str, ...]:
        return (
            self.listed.address,
            f"{self.listed.host}:{self.web.port}",
            f"listed.checkfu.test:{self.listed.port}",
            f"elsewhere.checkfu.test:{self.unlisted.port}",
        )


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    if os.geteuid() != 0:
        pytest.skip("the destinations and the name server live in network namespaces: run as root")
    with contextlib.ExitStack() as stack:
        listed = stack.enter_context(destination())
        unlisted = stack.enter_context(destination())
        n = Net(
            listed=listed,
            web=stack.enter_context(beside(listed, http=True)),
            other_port=stack.enter_context(beside(listed)),
            unlisted=unlisted,
            names=stack.enter_context(
                name_server({"listed.checkfu.test": listed.host, "elsewhere.checkfu.test": unlisted.host})
            ),
        )
        for d in (n.listed, n.web, n.other_port, n.unlisted):
            d.control()
        n.names.control("listed.checkfu.test")
        yield n


@pytest.fixture(scope="module")
def egress_provider(client: Any, runner_tag: str, net: Net, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The provider whose egress proxies ask this module's name server (on port 53, as ``egress_dns`` needs)."""
    assert net.names.port == 53
    p = DockerProvider(
        state_dir=tmp_path_factory.mktemp("egress-state"),
        cache_tag=runner_tag,
        workers=16,
        egress_dns=(net.names.host,),
    )
    yield p
    p.close()


@pytest.fixture(scope="module")
def ekit(egress_provider: DockerProvider, client: Any, runner_tag: str, debian_id: str) -> Kit:
    return Kit(egress_provider, client, runner_tag, debian_id, docker=egress_provider)


def allowlisted(kit: Kit, allowlist: tuple[str, ...], image: str | None = None) -> SandboxProfile:
    return SandboxProfile(
        tier="container",
        base_image=image or kit.image,
        network_policy={"mode": "allowlist", "allowlist": list(allowlist)},  # type: ignore[arg-type]
        resource_limits=resources(memory_mib=128, disk_mib=32),
        retention_mode="ephemeral_zdr",
    )


@pytest.fixture(scope="module")
def box(ekit: Kit, net: Net) -> Iterator[Box]:
    b = asyncio.run(ekit.up("egress", profile=allowlisted(ekit, net.allowlist)))
    yield b
    asyncio.run(b.release())


async def probe(box: Box, how: str, host: str, port: int) -> str:
    ran = await box.exec("python3", "-c", PROBE, how, host, str(port))
    assert ran.exit_code == 0, ran.stderr
    return ran.stdout.decode("utf-8", "replace").strip()


def gone(client: Any, name: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    # the low-level listing: the high-level one inspects each row and fails on a container removed meanwhile
    while client.api.containers(all=True, filters={"name": f"^{name}$"}):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# the controls, from outside ----------------------------------------------------------------------


def test_the_sandbox_has_no_network_but_lo_and_only_the_proxy_variables(box: Box, client: Any, net: Net) -> None:
    info = client.api.inspect_container(box.instance_id)
    assert info["HostConfig"]["NetworkMode"] == "none"
    assert list(info["NetworkSettings"]["Networks"]) == ["none"]
    env = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert {k: env.get(k) for k in PROXY_VARIABLES} == PROXY_VARIABLES
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:3128" and env["ALL_PROXY"] == "socks5h://127.0.0.1:3128"
    labels = info["Config"]["Labels"]
    assert labels[L.PROXY] == egress.proxy_name(box.instance_id)
    assert L.json_list(labels, L.ALLOWLIST) == net.allowlist
    assert not [m for m in info["Mounts"] if m["Destination"] == egress.SOCKET_DIR], "the socket is not the sandbox's"


def test_the_proxy_and_its_socket_are_labelled_hardened_and_outside_the_sandbox(
    box: Box, client: Any, net: Net, runner_tag: str
) -> None:
    info = client.api.inspect_container(egress.proxy_name(box.instance_id))
    labels, host = info["Config"]["Labels"], info["HostConfig"]
    assert (labels[L.ALLOCATION_KEY], labels[L.RUNNER_TAG], labels[L.KIND]) == (box.key, runner_tag, "proxy")
    assert L.json_list(labels, L.ALLOWLIST) == net.allowlist
    assert info["State"]["Running"] and host["NetworkMode"] == "bridge" and host["Dns"] == [net.names.host]
    assert info["Config"]["User"] == "65534:65534" and host["ReadonlyRootfs"] is True and host["Privileged"] is False
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    assert host["Memory"] == egress.PROXY_MEMORY and host["PidsLimit"] == 64
    assert host["PidMode"] == "" and host["IpcMode"] == "private"  # none of the sandbox's namespaces
    (mount,) = info["Mounts"]
    assert (mount["Destination"], mount["Name"]) == (egress.SOCKET_DIR, egress.socket_volume(box.instance_id))
    volume = client.api.inspect_volume(mount["Name"])
    assert volume["Labels"][L.ALLOCATION_KEY] == box.key and volume["Labels"][L.KIND] == "egress"
    assert volume["Options"]["type"] == "tmpfs" and "uid=65534" in volume["Options"]["o"]
    assert gone(client, egress.door_name(box.instance_id)), "the door is removed once it has opened"


def test_activate_refuses_a_proxy_not_as_built(box: Box, client: Any, net: Net) -> None:
    """``activate``'s check of the proxy, on the real proxy's inspect and on copies with one thing changed."""
    info = client.api.inspect_container(egress.proxy_name(box.instance_id))
    assert egress.proxy_problems(info, net.allowlist) == []
    cmd = info["Config"]["Cmd"]
    wider = [*cmd[:-1], json.dumps({**json.loads(cmd[-1]), "allow": [*net.allowlist, "10.9.9.9:22"]})]
    changed: list[tuple[str, dict[str, Any], str]] = [
        ("Config", {"Cmd": wider}, "proxy allows another list"),
        ("Config", {"User": "0:0"}, "proxy not hardened"),
        ("HostConfig", {"SecurityOpt": []}, "proxy not hardened"),
        ("HostConfig", {"PidsLimit": 0}, "proxy not hardened"),
        ("HostConfig", {"Memory": 0}, "proxy not hardened"),
        ("HostConfig", {"NetworkMode": "host"}, "proxy not on the bridge"),
    ]
    for part, change, problem in changed:
        assert egress.proxy_problems({**info, part: {**info[part], **change}}, net.allowlist) == [problem], change


async def test_the_posture_oracle_finds_every_axis_held_in_allowlist_mode(
    box: Box, client: Any, ekit: Kit, net: Net
) -> None:
    """Read from the host's ``/proc``, not from the provider: an allowlist sandbox's processes hold all nine
    axes as a ``none`` sandbox's do (only ``lo``, no route), and the proxy is no process of its pid namespace."""
    init = int(client.api.inspect_container(box.instance_id)["State"]["Pid"])
    found = posture.read_all(posture.pids_in_namespace_of(init))
    envelope = (await ekit.provider.describe()).envelope
    profile = allowlisted(ekit, net.allowlist)
    report = posture.examine(found, posture.Asked(profile, user_namespace=envelope.user_namespace))
    assert found and report.failures(dict.fromkeys(AXES, True)) == []
    proxy = int(client.api.inspect_container(egress.proxy_name(box.instance_id))["State"]["Pid"])
    assert proxy not in {p.pid for p in found}
    assert posture.read(proxy).namespaces["net"] != found[0].namespaces["net"]


# the effects, from inside ----------------------------------------------------------------------


async def test_inside_only_lo_no_route_and_one_listener_not_the_sandboxs_own(box: Box) -> None:
    r = await box.sh("ls /sys/class/net; echo --; tail -n +2 /proc/net/route; echo --; tail -n +2 /proc/net/tcp")
    interfaces, routes, sockets = r.stdout.decode().split("--\n")
    assert interfaces.split() == ["lo"] and routes.strip() == ""
    listening = [line.split() for line in sockets.splitlines() if line.split()[3] == "0A"]
    assert [(s[1], s[7]) for s in listening] == [("0100007F:0C38", "65534")]  # 127.0.0.1:3128, nobody's


async def test_a_direct_connection_fails_and_the_proxied_one_reaches_the_listed_destination(box: Box, net: Net) -> None:
    before = net.listed.count()
    direct = await probe(box, "direct", net.listed.host, net.listed.port)
    assert direct.startswith("failed 101 "), direct  # ENETUNREACH: no route at all
    assert net.listed.count() == before
    via = await probe(box, "connect", net.listed.host, net.listed.port)
    assert via.startswith("HTTP/1.1 200 ") and "checkfu-destination" in via, via
    socks = await probe(box, "socks", net.listed.host, net.listed.port)
    assert socks.startswith("socks 0 ") and "checkfu-destination" in socks, socks
    assert net.listed.count() == before + 2


async def test_plain_http_works_for_a_program_that_reads_http_proxy(box: Box, net: Net) -> None:
    before = net.web.count()
    answer = await probe(box, "http", net.listed.host, net.web.port)
    assert answer.startswith("GET /hello?x=1 HTTP/1.1"), answer  # forwarded in origin form
    assert f"Host: {net.listed.host}:{net.web.port}" in answer and "Connection: close" in answer
    assert net.web.count() == before + 1


async def test_every_unlisted_way_is_refused_and_reaches_nothing(box: Box, net: Net) -> None:
    counts = (net.listed.count(), net.other_port.count(), net.unlisted.count())
    decimal = str(int(ipaddress.IPv4Address(net.unlisted.host)))
    refusals = {
        "unlisted host": (net.unlisted.host, net.unlisted.port),
        "unlisted port of a listed host": (net.listed.host, net.other_port.port),
        "unlisted address in another spelling": (decimal, net.unlisted.port),
        "unlisted address mapped into IPv6": (f"[::ffff:{net.unlisted.host}]", net.unlisted.port),
    }
    for what, (host, port) in refusals.items():
        answer = await probe(box, "connect", host, port)
        assert answer.startswith("HTTP/1.1 403 "), (what, answer)
    assert (net.listed.count(), net.other_port.count(), net.unlisted.count()) == counts


async def test_names_are_resolved_by_the_proxy_and_a_listed_name_cannot_lead_elsewhere(
    box: Box, net: Net, client: Any
) -> None:
    asked = len(net.names.questions())
    listed, unlisted = net.listed.count(), net.unlisted.count()
    via_name = await probe(box, "connect", "listed.checkfu.test", net.listed.port)
    assert via_name.startswith("HTTP/1.1 200 ") and "checkfu-destination" in via_name, via_name
    assert net.listed.count() == listed + 1
    # a listed name that resolves to an address nobody listed (a private one): refused, and never dialled
    elsewhere = await probe(box, "connect", "elsewhere.checkfu.test", net.unlisted.port)
    assert elsewhere.startswith("HTTP/1.1 403 ") and "not public" in elsewhere, elsewhere
    assert net.unlisted.count() == unlisted
    # an unlisted name is refused before anyone resolves it: DNS carries nothing out
    secret = f"x{uuid.uuid4().hex[:12]}.checkfu.test"
    refused = await probe(box, "connect", secret, net.listed.port)
    assert refused.startswith("HTTP/1.1 403 "), refused
    heard = net.names.questions()[asked:]
    assert {name for _, name in heard} == {"listed.checkfu.test", "elsewhere.checkfu.test"}
    assert secret not in {name for _, name in heard}
    log = client.api.logs(egress.proxy_name(box.instance_id)).decode()
    assert f"allowed CONNECT listed.checkfu.test:{net.listed.port} -> {net.listed.address}" in log
    assert f"refused CONNECT {secret}:{net.listed.port}: {secret}:{net.listed.port} is not on the allowlist" in log


async def test_a_dns_question_from_inside_reaches_no_server(box: Box, net: Net) -> None:
    asked = len(net.names.questions())
    r = await box.exec(
        "python3",
        "-c",
        "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)\n"
        "try:\n    s.sendto(bytes(12), (__import__('sys').argv[1], 53)); print('sent', s.recv(512))\n"
        "except OSError as e:\n    print('failed', e.errno)",
        net.names.host,
    )
    assert r.stdout.startswith(b"failed 101"), r.stdout
    assert net.names.questions()[asked:] == []


# reclaiming ------------------------------------------------------------------------------------


def held(client: Any, key: str) -> list[tuple[str, str, str]]:
    return [o for o in leftovers(client, key.split("-", maxsplit=1)[0]) if o[2] == key]


async def test_release_removes_the_proxy_the_door_and_the_socket_and_without_the_proxy_there_is_no_way_out(
    ekit: Kit, client: Any, net: Net, busybox_id: str
) -> None:
    b = await ekit.up("reclaim", profile=allowlisted(ekit, (net.listed.address,), image=busybox_id))
    listed = await ekit.provider.list_allocations(
        ListAllocationsRequest(target=ekit.target, lease=LEASE, runner_tag=ekit.runner_tag)
    )
    kinds = sorted(a.kind for a in listed.allocations if a.allocation_key == b.key)
    assert kinds.count("instance") == 1 and kinds.count("other") >= 1 and "volume" in kinds  # proxy, socket volume
    ok = await b.sh(f"printf 'CONNECT {net.listed.address} HTTP/1.1\\r\\n\\r\\n' | nc -w 3 127.0.0.1 3128")
    assert b"200 Connection established" in ok.stdout and b"checkfu-destination" in ok.stdout
    client.api.kill(egress.proxy_name(b.instance_id))  # the proxy dies: the door closes with it
    shut = await b.sh(
        f"printf 'CONNECT {net.listed.address} HTTP/1.1\\r\\n\\r\\n' | nc -w 3 127.0.0.1 3128; echo rc=$?"
    )
    assert b"200" not in shut.stdout and b"rc=1" in shut.stdout, shut
    await b.release()
    assert held(client, b.key) == []


async def test_compensate_reclaims_a_half_provisioned_allowlist_allocation_cold(
    ekit: Kit, client: Any, runner_tag: str, net: Net, busybox_id: str, tmp_path: Path
) -> None:
    key, _ = await ekit.provision("half", profile=allowlisted(ekit, (net.listed.address,), image=busybox_id))
    made = {kind for kind, _, _ in held(client, key)}
    assert made == {"container", "volume"}  # the sandbox, its proxy and door; the socket (and area) volumes
    cold = DockerProvider(state_dir=tmp_path, cache_tag=runner_tag, workers=4)  # a restarted runner knows nothing
    try:
        await cold.compensate(
            CompensateRequest(target=cold.target, lease=LEASE, allocation_key=key, runner_tag=runner_tag)
        )
    finally:
        cold.close()
    assert held(client, key) == []


async def test_a_destination_the_proxy_cannot_read_is_refused_before_anything_is_created(
    ekit: Kit, client: Any, busybox_id: str
) -> None:
    too_long = ".".join(["a" * 63] * 4) + ":443"  # a 255-character name: the profile's pattern admits it, DNS not
    key = ekit.key("long-name")
    request = ekit.provision_request(key, profile=allowlisted(ekit, (too_long,), image=busybox_id))
    with pytest.raises(SandboxCapabilityUnavailable) as refused:
        await ekit.provider.provision(request)
    assert refused.value.field == "profile.network_policy.allowlist" and "egress proxy" in refused.value.message
    assert held(client, key) == []  # refused before the stager, the areas or the proxy were made


async def test_a_door_that_finds_no_proxy_fails_activate_and_stops_the_sandbox(
    ekit: Kit, client: Any, net: Net, busybox_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = egress.source
    monkeypatch.setattr(egress, "DOOR_TIMEOUT", 2.0)
    monkeypatch.setattr(egress, "source", lambda role: "raise SystemExit(1)" if role == "proxy" else real(role))
    key, result = await ekit.provision("no-proxy", profile=allowlisted(ekit, (net.listed.address,), image=busybox_id))
    call = {"target": ekit.target, "lease": LEASE, "allocation_key": key, "instance_id": result.instance_id}
    with pytest.raises(SandboxProviderFailed) as failed:
        await ekit.provider.activate(ActivateRequest(**call))
    assert "the egress door did not open (exit 4: no proxy at /egress/door.sock" in failed.value.message
    assert not client.api.inspect_container(result.instance_id)["State"]["Running"]
    await ekit.provider.compensate(
        CompensateRequest(target=ekit.target, lease=LEASE, allocation_key=key, runner_tag=ekit.runner_tag)
    )
    assert held(client, key) == []


async def test_a_proxy_the_engine_cannot_start_is_named_with_the_engines_reason(
    ekit: Kit, client: Any, net: Net, busybox_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = egress.proxy_spec
    monkeypatch.setattr(egress, "DOOR_TIMEOUT", 2.0)
    monkeypatch.setattr(egress, "proxy_spec", lambda *a, **k: {**real(*a, **k), "entrypoint": ["/no/such/program"]})
    key, result = await ekit.provision("unstarted", profile=allowlisted(ekit, (net.listed.address,), image=busybox_id))
    call = {"target": ekit.target, "lease": LEASE, "allocation_key": key, "instance_id": result.instance_id}
    with pytest.raises(SandboxProviderFailed) as failed:
        await ekit.provider.activate(ActivateRequest(**call))
    assert failed.value.message.startswith("activate: the egress proxy did not start: ")
    assert "/no/such/program" in failed.value.message  # the engine's own reason, not only "no proxy"
    assert not client.api.inspect_container(result.instance_id)["State"]["Running"]
    await ekit.provider.compensate(
        CompensateRequest(target=ekit.target, lease=LEASE, allocation_key=key, runner_tag=ekit.runner_tag)
    )
    assert held(client, key) == []


async def test_a_clone_of_an_allowlist_sandbox_gets_a_way_out_of_its_own(
    box: Box, ekit: Kit, client: Any, net: Net
) -> None:
    profile = allowlisted(ekit, net.allowlist)
    request = ekit.provision_request(ekit.key("clone"), profile=profile)
    clone = await ekit.provider.clone(
        CloneRequest(**request.model_dump(), source_allocation_key=box.key, source_instance_id=box.instance_id)
    )
    c = Box(ekit, request.allocation_key, clone.instance_id)
    await ekit.provider.activate(ActivateRequest(**c.call))
    proxy = client.api.inspect_container(egress.proxy_name(c.instance_id))["Config"]["Labels"]
    assert proxy[L.ALLOCATION_KEY] == c.key != box.key
    answer = await probe(c, "connect", net.listed.host, net.listed.port)
    assert answer.startswith("HTTP/1.1 200 ") and "checkfu-destination" in answer
    await c.release()
    assert held(client, c.key) == []
    assert client.api.inspect_container(egress.proxy_name(box.instance_id))["State"]["Running"], "the source's own"


async def test_without_the_egress_image_allowlist_is_neither_advertised_nor_served(
    ekit: Kit, client: Any, runner_tag: str, net: Net, tmp_path: Path
) -> None:
    keys = []
    for described in (True, False):  # refused by the envelope, or (not asked yet) when the image is looked for
        p = DockerProvider(state_dir=tmp_path, cache_tag=runner_tag, workers=4, egress_image="checkfu/absent:0")
        try:
            if described:
                env = (await p.describe()).envelope
                assert env.network_modes == ("none",) and env.egress_certification == "unsupported"
            keys.append(ekit.key("no-image"))
            request = ekit.provision_request(keys[-1], profile=allowlisted(ekit, (net.listed.address,)))
            with pytest.raises(SandboxCapabilityUnavailable) as refused:
                await p.provision(request)
            assert refused.value.field == "profile.network_policy.mode"
            assert ("egress image 'checkfu/absent:0'" in refused.value.message) is not described
        finally:
            p.close()
    assert [held(client, key) for key in keys] == [[], []]


# the command line -----------------------------------------------------------------------------


def test_checkfu_run_allow_reaches_the_listed_destination_and_lists_it(
    net: Net, runner_tag: str, client: Any, tmp_path: Path
) -> None:
    checkfu = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "checkfu"
    script = (
        f"printf 'CONNECT {net.listed.address} HTTP/1.1\\r\\n\\r\\n' | nc -w 3 127.0.0.1 3128;"
        f" printf 'CONNECT {net.unlisted.address} HTTP/1.1\\r\\n\\r\\n' | nc -w 3 127.0.0.1 3128"
    )
    before = (net.listed.count(), net.unlisted.count())
    done = subprocess.run(
        [
            str(checkfu if checkfu.exists() else "checkfu"),
            "run",
            "--profile",
            str(REPO / "examples" / "profiles" / "busybox-none.toml"),
            "--allow",
            net.listed.address,
            "--allow",
            "pypi.org:443",
            "--",
            "sh",
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path), "CHECKFU_RUNNER_TAG": runner_tag},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "200 Connection established" in done.stdout and "checkfu-destination" in done.stdout
    assert "403 Forbidden" in done.stdout
    assert f"allowed  {net.listed.address}, pypi.org:443" in done.stderr
    assert (net.listed.count(), net.unlisted.count()) == (before[0] + 1, before[1])
    assert not [o for o in leftovers(client, runner_tag) if o[2].startswith("ak-")], "the run left something"
