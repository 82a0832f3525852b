"""Published ports (issue 32): ``-p`` on ``checkfu run`` and ``checkfu sandbox create``, ``sb.ports.expose`` in the SDK.

A ``python3 -m http.server`` in a ``none`` sandbox is answered from this machine's loopback through the printed
URL, and nothing else listens: the host holds the port on ``127.0.0.1`` only, the sandbox still has only ``lo``
and ``NetworkMode: none``. Once the sandbox goes, nothing listens there and nothing labelled is left.
"""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import checkfu
from checkfu.contract.errors import SandboxCapabilityUnavailable, SandboxProfileInvalid
from checkfu.contract.ports import PortSpec, exposure_warning, parse_port_spec, parse_port_specs

from .test_run_cli import PROFILES, Cli
from .test_run_docker import containers, dcli, engine, leftovers  # noqa: F401 - fixtures

DEBIAN = str(PROFILES / "debian-none.toml")
URL = re.compile(r"published (http://127\.0\.0\.1:(\d+)) -> sandbox port 8000")


def listening(port: int) -> list[str]:
    """The local addresses (hex, as ``/proc/net/tcp*`` writes them) listening on ``port`` on this machine."""
    found = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(name).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == "0A":
                found.append(f"{name[-4:]} {address}")
    return found


def fetch(url: str, timeout: float = 20.0) -> bytes:
    """GET ``url``, retrying while the server in the sandbox is still starting (the porter closes at once then)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as res:
                return bytes(res.read())
        except (urllib.error.URLError, ConnectionError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def instance_of(engine: Any, tag: str) -> Any:  # noqa: F811
    [inst] = containers(engine, tag, **{"label": [f"checkfu.runner_tag={tag}", "checkfu.kind=instance"]})
    return inst


@pytest.fixture
def sdk_env(dcli: Cli, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:  # noqa: F811
    monkeypatch.setenv("XDG_STATE_HOME", str(dcli.state))
    monkeypatch.setenv("CHECKFU_RUNNER_TAG", dcli.tag)
    yield dcli


def test_run_publishes_an_http_server_on_the_loopback_only(dcli: Cli, engine: Any, tmp_path: Path) -> None:  # noqa: F811
    summary = tmp_path / "run.json"
    script = "ls /sys/class/net; exec python3 -m http.server 8000"
    running = dcli.start(
        "run", "-p", "127.0.0.1:0:8000", "--json", str(summary), "--profile", DEBIAN, "--", "sh", "-c", script
    )
    running.wait_for("published http://127.0.0.1:", timeout=60)
    found = URL.search(running.stderr())
    assert found is not None, running.stderr()
    url, host_port = found.group(1), int(found.group(2))
    assert b"Directory listing" in fetch(url)
    assert listening(host_port) == ["/tcp 0100007F"]  # 127.0.0.1 only: no 0.0.0.0, no IPv6
    inst = instance_of(engine, dcli.tag)
    assert inst.attrs["HostConfig"]["NetworkMode"] == "none"
    helpers = containers(engine, dcli.tag, label=[f"checkfu.runner_tag={dcli.tag}", "checkfu.ports"])
    assert sorted(c.attrs["HostConfig"]["NetworkMode"] for c in helpers) == sorted(["host", f"container:{inst.id}"])
    running.send(signal.SIGTERM)
    done = running.finish()
    assert done.code == 143, str(done)
    assert done.out.decode().split() == ["lo"]  # the sandbox had lo alone, with its port published
    assert listening(host_port) == []
    assert not leftovers(engine, dcli.tag)


def test_run_summary_names_the_port(dcli: Cli, engine: Any, tmp_path: Path) -> None:  # noqa: F811
    summary = tmp_path / "run.json"
    done = dcli("run", "-p", "0:9000", "--json", str(summary), "--profile", DEBIAN, "--", "true")
    assert done.code == 0, str(done)
    [port] = json.loads(summary.read_text())["ports"]
    assert port["host"] == "127.0.0.1" and port["port"] == 9000 and port["host_port"] > 0
    assert port["url"] == f"http://127.0.0.1:{port['host_port']}"
    assert f"port       {port['url']} -> sandbox port 9000" in done.err
    assert listening(port["host_port"]) == []
    assert not leftovers(engine, dcli.tag)


def test_sandbox_create_publishes_until_rm(dcli: Cli, engine: Any) -> None:  # noqa: F811
    made = dcli.json("sandbox", "create", "-p", "127.0.0.1:0:8000", "--profile", DEBIAN)
    sandbox_id = made["sandbox_id"]
    [port] = made["ports"]
    assert port["host"] == "127.0.0.1" and port["port"] == 8000
    server = dcli.start("exec", sandbox_id, "--", "python3", "-m", "http.server", "8000")
    assert b"Directory listing" in fetch(port["url"])
    assert listening(port["host_port"]) == ["/tcp 0100007F"]
    net = dcli("exec", sandbox_id, "--", "ls", "/sys/class/net")
    assert net.out.decode().split() == ["lo"], str(net)
    assert instance_of(engine, dcli.tag).attrs["HostConfig"]["NetworkMode"] == "none"
    # ps names what is published, as docker ps does
    [listed] = [b for b in dcli.json("ps")["sandboxes"] if b["id"] == sandbox_id]
    assert listed["ports"] == [port]
    table = dcli("ps")
    assert table.out.decode().splitlines()[0].split()[-1] == "PORTS"
    assert f"127.0.0.1:{port['host_port']}->8000/tcp" in table.out.decode(), str(table)
    rm = dcli("sandbox", "rm", sandbox_id)
    assert rm.code == 0, str(rm)
    server.finish()
    assert listening(port["host_port"]) == []
    assert not leftovers(engine, dcli.tag)


def test_sdk_ports_expose_returns_a_loopback_url(sdk_env: Cli, engine: Any) -> None:  # noqa: F811
    with checkfu.Sandbox(profile=DEBIAN, ttl=120) as sb:
        server = sb.commands.run("python3 -m http.server 8000", background=True, timeout=120)
        url = sb.ports.expose(8000)
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        assert b"Directory listing" in fetch(url)
        host_port = int(url.rsplit(":", 1)[1])
        assert listening(host_port) == ["/tcp 0100007F"]
        assert [p.port for p in sb.ports.published] == [8000]
        server.kill()
    assert listening(host_port) == []
    assert not leftovers(engine, sdk_env.tag)


def test_a_taken_host_port_is_refused_and_nothing_is_left(dcli: Cli, engine: Any) -> None:  # noqa: F811
    import socket  # noqa: PLC0415

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = dcli("sandbox", "create", "-p", f"127.0.0.1:{port}:8000", "--profile", DEBIAN, "--json")
    assert done.code != 0, str(done)
    body = json.loads(done.out)
    assert body["error"]["field"] == "-p", body
    # the port is this machine's, taken by someone else: a conflict the caller resolves, not the provider's fault
    assert body["error"]["code"] == "SandboxStateConflict", body
    assert f"127.0.0.1:{port}" in body["error"]["message"] and "HOST_PORT" in body["error"]["message"], body
    assert not leftovers(engine, dcli.tag)


# refusals before any provider work -------------------------------------------------------------


@pytest.mark.parametrize("value", ["8080:abc", "1.2.3:80:80", "99999:80", "80:0", "a:b:c:d", "80:80/udp", "[::1:80:80"])
def test_bad_p_values_are_refused_by_name(value: str) -> None:
    with pytest.raises(SandboxProfileInvalid) as refused:
        parse_port_spec(value)
    assert refused.value.field == "-p"


def test_p_values_read_as_docker_reads_them() -> None:
    assert parse_port_spec("127.0.0.1:8080:8000") == PortSpec(port=8000, host="127.0.0.1", host_port=8080)
    assert parse_port_spec("8080:8000") == PortSpec(port=8000, host="127.0.0.1", host_port=8080)
    assert parse_port_spec("8000") == PortSpec(port=8000, host="127.0.0.1", host_port=0)
    assert parse_port_spec("0.0.0.0:0:8000/tcp") == PortSpec(port=8000, host="0.0.0.0", host_port=0)
    assert parse_port_spec("[::1]:0:8000") == PortSpec(port=8000, host="::1", host_port=0)
    with pytest.raises(SandboxProfileInvalid):
        parse_port_specs(["8080:80", "127.0.0.1:8080:81"])
    # off the loopback only when asked, and then loudly (not bound here: network tests stay on the loopback)
    assert exposure_warning(parse_port_spec("8000")) is None
    assert exposure_warning(parse_port_spec("[::1]:0:8000")) is None
    said = exposure_warning(parse_port_spec("0.0.0.0:8080:8000"))
    assert said is not None and "not the loopback" in said and "-p" in said


def test_run_refuses_p_on_another_provider_and_bad_syntax(dcli: Cli, tmp_path: Path) -> None:  # noqa: F811
    summary = tmp_path / "s.json"
    done = dcli("run", "-p", "8000", "--provider", "host-process", "--json", str(summary), "--", "true")
    assert done.code == 125, str(done)
    error = json.loads(summary.read_text())["error"]
    assert (error["code"], error["field"]) == ("SandboxCapabilityUnavailable", "-p")
    done = dcli("run", "-p", "x:8000", "--profile", DEBIAN, "--json", str(summary), "--", "true")
    assert done.code == 125, str(done)
    error = json.loads(summary.read_text())["error"]
    assert (error["code"], error["field"]) == ("SandboxProfileInvalid", "-p")
    made = dcli("sandbox", "create", "-p", "8000", "--provider", "host-process", "--json")
    assert json.loads(made.out)["error"]["code"] == "SandboxCapabilityUnavailable", str(made)
    assert dcli.open_allocations() == []


def test_sdk_refuses_expose_on_the_host_process_tier(sdk_env: Cli) -> None:
    with checkfu.Sandbox(provider="host-process", ttl=60) as sb, pytest.raises(SandboxCapabilityUnavailable) as no:
        sb.ports.expose(8000)
    assert no.value.field == "-p"


def test_the_grade_card_says_what_a_published_port_opens(dcli: Cli) -> None:  # noqa: F811
    docker_card = dcli.json("provider", "grade", "docker")
    assert "127.0.0.1 unless -p names another" in docker_card["ports"]
    assert "the sandbox's network is unchanged" in docker_card["ports"]
    assert dcli.json("provider", "grade", "host-process")["ports"] is None
    text = dcli("provider", "grade", "docker")
    assert "ports      -p publishes a sandbox port on this machine" in text.out.decode(), str(text)


def test_a_sandbox_whose_ttl_passed_takes_its_port_with_it(dcli: Cli, engine: Any) -> None:  # noqa: F811
    made = dcli.json("sandbox", "create", "-p", "0:8000", "--ttl", "3s", "--profile", DEBIAN)
    [port] = made["ports"]
    assert listening(port["host_port"]) == ["/tcp 0100007F"]
    time.sleep(4)
    ps = dcli("ps", "--json")  # whatever is due is reclaimed first
    assert ps.code == 0, str(ps)
    assert listening(port["host_port"]) == []
    assert not leftovers(engine, dcli.tag)


def test_kill_9_of_a_run_with_a_port_is_reaped_with_its_port(dcli: Cli, engine: Any) -> None:  # noqa: F811
    run = dcli.start("run", "-p", "0:8000", "--profile", DEBIAN, "--", "python3", "-m", "http.server", "8000")
    run.wait_for("published http://127.0.0.1:", timeout=60)
    found = URL.search(run.stderr())
    assert found is not None
    url, host_port = found.group(1), int(found.group(2))
    assert b"Directory listing" in fetch(url)
    run.send(signal.SIGKILL)
    run.proc.wait()
    assert listening(host_port) == ["/tcp 0100007F"], "the porter outlives its owner until reaped"
    listed = dcli("runs", "list", "--json")  # the next command that opens the journal reaps the orphan
    assert listed.code == 0, str(listed)
    assert "reaped orphaned Run" in listed.said
    assert listening(host_port) == []
    assert not leftovers(engine, dcli.tag)


def test_submit_refuses_p_by_name(dcli: Cli) -> None:  # noqa: F811
    done = dcli("submit", "-p", "8000", "--profile", DEBIAN, "--", "true")
    assert done.code == 2, str(done)
    assert "-p: a queued Run runs later" in done.said
    assert dcli.open_allocations() == []
