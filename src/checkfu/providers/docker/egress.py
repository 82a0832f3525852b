"""The way out of an ``allowlist`` sandbox: its proxy, its door, and the socket between them.

The sandbox itself is exactly as in ``none`` mode: ``NetworkMode: none``, only
``lo``, no route and no resolver it can reach. Beside it, all labelled with its
allocation key and runner tag (``labels.py``) and named after it:

- the **proxy** container (``<instance>-proxy``, kind ``proxy``) runs
  ``egress_proxy.py`` on the engine's default bridge, outside every namespace of
  the sandbox; it is created at ``provision`` and started right after, in the
  background, and waits for the door;
- the **door** container (``<instance>-door``, kind ``companion``) joins only the
  sandbox's network namespace; at ``activate``, once the sandbox runs, it runs
  ``egress_door.py``: binds ``127.0.0.1:3128`` there, hands the listening socket
  to the proxy and exits; it is removed in the background (``release`` removes
  it too);
- the **socket volume** (``<instance>-egress``, kind ``egress``), a tiny tmpfs
  mounted by the proxy and the door only, carries the one handoff.

The sandbox's environment names the door in ``HTTP_PROXY``, ``HTTPS_PROXY`` and
``ALL_PROXY`` (and their lowercase forms). Both helper containers run as
``nobody`` with every capability dropped, no new privileges, a read-only root
and small memory and process limits. ``release`` and ``compensate`` remove them
with the sandbox; ``listAllocations`` lists them. Why this shape, rather than an
``--internal`` network, is in ``docs/egress.md``.
"""

from __future__ import annotations

import functools
import ipaddress
import json
from pathlib import Path
from typing import Any

import docker.types

from checkfu.contract.errors import (
    SandboxAdapterUnavailable,
    SandboxCapabilityUnavailable,
    SandboxProviderFailed,
    Unmet,
)
from checkfu.contract.profile import SandboxProfile
from checkfu.providers.docker import labels as L
from checkfu.providers.docker.egress_door import PORT
from checkfu.providers.docker.egress_proxy import Allowlist, Refused

HELPER_USER = "65534:65534"
"""``nobody``: the proxy and the door run as neither root nor the sandbox user."""
SOCKET_DIR = "/egress"
SOCKET = f"{SOCKET_DIR}/door.sock"
PROXY_URL = f"http://127.0.0.1:{PORT}"
SOCKS_URL = f"socks5h://127.0.0.1:{PORT}"
DOOR_TIMEOUT = 30.0
"""Seconds ``activate`` waits for the door to be handed to the proxy."""
PROXY_MEMORY = 128 << 20
DOOR_MEMORY = 32 << 20


def proxy_name(instance: str) -> str:
    return f"{instance}-proxy"


def door_name(instance: str) -> str:
    return f"{instance}-door"


def socket_volume(instance: str) -> str:
    return f"{instance}-egress"


def wants_egress(profile: SandboxProfile) -> bool:
    return profile.network_policy.mode == "allowlist"


def allowlist_of(profile: SandboxProfile) -> tuple[str, ...]:
    """The profile's destinations, once the proxy can read every one.

    Raises:
        SandboxCapabilityUnavailable: a destination the proxy cannot serve (field
            ``profile.network_policy.allowlist``), such as a name longer than DNS allows.
    """
    entries = tuple(profile.network_policy.allowlist)
    try:
        Allowlist(entries)
    except Refused as exc:
        raise SandboxCapabilityUnavailable(
            [Unmet("profile.network_policy.allowlist", f"the egress proxy cannot serve it: {exc.reason}")]
        ) from None
    return entries


def parse_dns(value: str) -> tuple[str, ...]:
    """The ``egress_dns`` option: comma-separated IP addresses of the DNS servers the proxies ask.

    Raises:
        SandboxAdapterUnavailable: an entry is not an IP address (field ``egress_dns``).
    """
    servers: list[str] = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        try:
            servers.append(str(ipaddress.ip_address(part)))
        except ValueError:
            raise SandboxAdapterUnavailable(
                f"egress_dns: {part[:80]!r} is not an IP address", field="egress_dns"
            ) from None
    return tuple(servers)


@functools.cache
def source(role: str) -> str:
    """The source the ``proxy`` or the ``door`` container runs: ``egress_proxy.py`` or ``egress_door.py``."""
    return Path(__file__).with_name(f"egress_{role}.py").read_text(encoding="utf-8")


def sandbox_environment() -> dict[str, str]:
    """What a program in the sandbox reads to find its way out: the standard proxy variables."""
    env = {
        "HTTP_PROXY": PROXY_URL,
        "HTTPS_PROXY": PROXY_URL,
        "ALL_PROXY": SOCKS_URL,
        "NO_PROXY": "localhost,127.0.0.1,::1",
    }
    return {**env, **{k.lower(): v for k, v in env.items()}}


def _command(role: str, config: dict[str, Any]) -> list[str]:
    return ["python3", "-I", "-S", "-c", source(role), json.dumps(config, separators=(",", ":"))]


def _socket_mount(instance: str, key: str, tag: str) -> Any:
    """The socket volume: created by whichever container's create comes first, labelled, 64 KiB of tmpfs
    that only ``nobody`` may enter."""
    return docker.types.Mount(
        target=SOCKET_DIR,
        source=socket_volume(instance),
        type="volume",
        read_only=False,
        no_copy=True,
        labels=L.object_labels(key, tag, "egress"),
        driver_config=docker.types.DriverConfig(
            "local",
            {"type": "tmpfs", "device": "tmpfs", "o": "size=64k,mode=0700,uid=65534,gid=65534,nosuid,nodev,noexec"},
        ),
    )


def _hardened(api: Any, *, memory: int, pids: int, **extra: Any) -> Any:
    return api.create_host_config(
        read_only=True,
        ipc_mode="private",
        privileged=False,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        mem_limit=memory,
        memswap_limit=memory,
        pids_limit=pids,
        log_config=docker.types.LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
        **extra,
    )


def proxy_spec(
    api: Any,
    *,
    instance: str,
    image: str,
    allowlist: tuple[str, ...],
    key: str,
    tag: str,
    dns: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The proxy container: on the default bridge, outside the sandbox, allowing only ``allowlist``."""
    resolver: dict[str, Any] = {"dns": list(dns), "dns_search": ["."]} if dns else {}
    host_config = _hardened(
        api,
        memory=PROXY_MEMORY,
        pids=64,
        network_mode="bridge",
        mounts=[_socket_mount(instance, key, tag)],
        **resolver,
    )
    return {
        "image": image,
        "command": _command("proxy", {"allow": list(allowlist), "socket": SOCKET}),
        "name": proxy_name(instance),
        "user": HELPER_USER,
        "hostname": "egress",
        "labels": L.object_labels(key, tag, "proxy", **{L.ALLOWLIST: L.dump_list(allowlist)}),
        "host_config": host_config,
    }


def door_spec(api: Any, *, instance: str, image: str, key: str, tag: str) -> dict[str, Any]:
    """The door container: in the sandbox's network namespace and no other of its namespaces."""
    host_config = _hardened(
        api,
        memory=DOOR_MEMORY,
        pids=8,
        network_mode=f"container:{instance}",
        mounts=[_socket_mount(instance, key, tag)],
    )
    return {
        "image": image,
        "command": _command("door", {"socket": SOCKET, "port": PORT, "wait": DOOR_TIMEOUT}),
        "name": door_name(instance),
        "user": HELPER_USER,
        "labels": L.object_labels(key, tag, "companion"),
        "host_config": host_config,
    }


def _logs(api: Any, container: str) -> str:
    try:
        out = api.logs(container, stdout=True, stderr=True, tail=5)
    except Exception as exc:
        return f"(no log: {type(exc).__name__})"
    text = out.decode("utf-8", "replace") if isinstance(out, bytes) else str(out)
    return " | ".join(line for line in text.strip().splitlines() if line)[:500]


def open_door(api: Any, instance: str) -> None:
    """Start the door of the (running) sandbox ``instance`` and wait until it has handed ``127.0.0.1:3128`` to
    the proxy (the caller removes the exited door).

    Raises:
        SandboxProviderFailed: the door did not open (its last log lines say why), or did not in time.
    """
    door = door_name(instance)
    api.start(door)
    try:  # the door gives up on the proxy after DOOR_TIMEOUT and says why; this waits a little longer than it
        status = api.wait(door, timeout=DOOR_TIMEOUT + 15).get("StatusCode")
    except Exception as exc:
        raise SandboxProviderFailed(
            f"activate: the egress door did not open within {DOOR_TIMEOUT + 15:.0f} s ({type(exc).__name__})"
        ) from exc
    if status != 0:
        raise SandboxProviderFailed(f"activate: the egress door did not open (exit {status}: {_logs(api, door)})")


def proxy_problems(info: dict[str, Any], allowlist: tuple[str, ...]) -> list[str]:
    """What is wrong with the proxy container as the engine reports it (empty when all is as built)."""
    host = info.get("HostConfig", {})
    config = info.get("Config", {})
    problems = []
    if not info.get("State", {}).get("Running"):
        problems.append("proxy not running")
    if host.get("NetworkMode") != "bridge":
        problems.append("proxy not on the bridge")
    if (
        config.get("User") != HELPER_USER
        or not host.get("ReadonlyRootfs")
        or "ALL" not in (host.get("CapDrop") or [])
        or "no-new-privileges" not in (host.get("SecurityOpt") or [])
        or not host.get("Memory")
        or not host.get("PidsLimit")
    ):
        problems.append("proxy not hardened")
    if L.json_list(config.get("Labels"), L.ALLOWLIST) != allowlist or _served_list(config) != allowlist:
        problems.append("proxy allows another list")
    return problems


def _served_list(config: dict[str, Any]) -> tuple[str, ...] | None:
    """The allowlist in the command the proxy container runs (``None``: not a command of ``_command``'s)."""
    command = config.get("Cmd") or []
    try:
        served = json.loads(command[-1]).get("allow") if len(command) == 6 else None
    except (ValueError, AttributeError):
        return None
    return tuple(served) if isinstance(served, list) else None
