"""Published ports of a Docker sandbox: a door in its network namespace, a porter on the host, a socket between.

The sandbox is left exactly as it is (``NetworkMode: none`` keeps only ``lo``; an
``allowlist`` sandbox keeps its egress door). Publishing sandbox port ``P`` on
``HOST:HOST_PORT`` adds, all labelled with the sandbox's allocation key and runner
tag and named after it:

- the **ports door** (``<instance>-pdoor``, kind ``companion``, label
  ``checkfu.ports``): joins only the sandbox's network namespace, refuses to open
  if it holds more than ``lo``, and on request connects to ``127.0.0.1:P`` there
  and hands the connected socket over (``ports_door.py``); one per sandbox, made
  by the first port published;
- a **porter** per published port (``<instance>-port-<P>-<n>``, kind
  ``companion``, label ``checkfu.ports``): on the engine host's network, binds
  ``HOST:HOST_PORT`` (``127.0.0.1`` unless the caller named another address),
  and relays each connection it accepts through a socket the door hands it;
- the **ports socket volume** (``<instance>-ports``, kind ``egress``): a tiny
  tmpfs only the door and the porters mount.

Both helpers run as ``nobody`` with every capability dropped (so a porter cannot
bind a port below 1024), no new privileges, a read-only root and small limits.
``release`` and ``compensate`` remove them with the sandbox (they carry its key).
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

import docker.types

from checkfu.contract.errors import SandboxProviderFailed, SandboxStateConflict
from checkfu.contract.ports import PortSpec, PublishedPort
from checkfu.providers.docker import labels as L
from checkfu.providers.docker.egress import HELPER_USER, _hardened

PORTS = "checkfu.ports"
"""On a ports door and a porter: ``door``, or the sandbox port a porter leads to."""
SOCKET_DIR = "/ports"
SOCKET = f"{SOCKET_DIR}/door.sock"
READY_TIMEOUT = 20.0
"""Seconds a door or porter has to say it listens."""
DOOR_MEMORY = 32 << 20
PORTER_MEMORY = 64 << 20
PORTER_PIDS = 256
"""A porter relays each connection in a thread of its own: this many connections at once, at most."""


def door_name(instance: str) -> str:
    return f"{instance}-pdoor"


def porter_name(instance: str, port: int, n: int) -> str:
    return f"{instance}-port-{port}-{n}"


def socket_volume(instance: str) -> str:
    return f"{instance}-ports"


@functools.cache
def source() -> str:
    return Path(__file__).with_name("ports_door.py").read_text(encoding="utf-8")


def _command(config: dict[str, Any]) -> list[str]:
    return ["python3", "-I", "-S", "-c", source(), json.dumps(config, separators=(",", ":"))]


def _socket_mount(instance: str, key: str, tag: str) -> Any:
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


def door_spec(api: Any, *, instance: str, image: str, key: str, tag: str) -> dict[str, Any]:
    """The ports door: in the sandbox's network namespace and no other of its namespaces."""
    host_config = _hardened(
        api,
        memory=DOOR_MEMORY,
        pids=8,
        network_mode=f"container:{instance}",
        mounts=[_socket_mount(instance, key, tag)],
    )
    return {
        "image": image,
        "command": _command({"role": "door", "socket": SOCKET}),
        "name": door_name(instance),
        "user": HELPER_USER,
        "labels": L.object_labels(key, tag, "companion", **{PORTS: "door"}),
        "host_config": host_config,
    }


def porter_spec(api: Any, *, instance: str, image: str, key: str, tag: str, spec: PortSpec, n: int) -> dict[str, Any]:
    """A porter: on the engine host's network, listening on ``spec.host:spec.host_port`` only."""
    host_config = _hardened(
        api, memory=PORTER_MEMORY, pids=PORTER_PIDS, network_mode="host", mounts=[_socket_mount(instance, key, tag)]
    )
    config = {"role": "porter", "socket": SOCKET, "host": spec.host, "host_port": spec.host_port, "port": spec.port}
    return {
        "image": image,
        "command": _command(config),
        "name": porter_name(instance, spec.port, n),
        "user": HELPER_USER,
        "labels": L.object_labels(key, tag, "companion", **{PORTS: str(spec.port)}),
        "host_config": host_config,
    }


def _ready_line(api: Any, container: str) -> str:
    """The helper's ``listening ...`` line once it printed it; raises when it stopped first."""
    deadline = time.monotonic() + READY_TIMEOUT
    delay = 0.005
    while True:
        text = bytes(api.logs(container, stdout=True, stderr=True)).decode("utf-8", "replace")
        for line in text.splitlines():
            if line.startswith("listening "):
                return str(line)
        state = api.inspect_container(container).get("State", {})
        if not state.get("Running"):
            last = " | ".join(x for x in text.strip().splitlines() if x)[-300:]
            taken = next((x for x in text.splitlines() if x.startswith("cannot bind ")), None)
            if taken is not None:  # this machine's port is someone else's: the caller's to choose, no fault of ours
                raise SandboxStateConflict(
                    f"-p: {taken.removeprefix('cannot bind ')[:200]} (choose another HOST_PORT, or 0 for any free one)",
                    field="-p",
                )
            raise SandboxProviderFailed(
                f"-p: {container} stopped (exit {state.get('ExitCode')}): {last}", field="-p", retryable=False
            )
        if time.monotonic() > deadline:
            raise SandboxProviderFailed(f"-p: {container} did not listen within {READY_TIMEOUT:.0f} s", field="-p")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def helpers(api: Any, key: str) -> list[dict[str, Any]]:
    """The ports door and porters of allocation ``key`` (every runner tag: the key is the sandbox's own)."""
    selector = L.label_filter(allocation_key=key, kind="companion")
    return list(api.containers(all=True, filters={"label": [*selector["label"], PORTS]}))


def open_port(api: Any, *, instance: str, image: str, key: str, tag: str, spec: PortSpec) -> PublishedPort:
    """Publish ``spec`` for the running sandbox ``instance``: its door (made once), then a porter.

    Raises:
        SandboxProviderFailed: (field ``-p``) the door or the porter did not open (the address is taken, the port
            is below 1024, the namespace holds more than ``lo`` ...), named with its last words.
    """
    door = door_name(instance)
    existing = helpers(api, key)
    if not any(c.get("Labels", {}).get(PORTS) == "door" for c in existing):
        try:
            api.create_container(**door_spec(api, instance=instance, image=image, key=key, tag=tag))
        except Exception as exc:
            if getattr(getattr(exc, "response", None), "status_code", None) != 409:
                raise
        api.start(door)
        _ready_line(api, door)
    n = len(existing)
    name = porter_name(instance, spec.port, n)
    api.create_container(**porter_spec(api, instance=instance, image=image, key=key, tag=tag, spec=spec, n=n))
    api.start(name)
    try:
        line = _ready_line(api, name)
    except SandboxProviderFailed:
        api.remove_container(name, force=True)
        raise
    _, host, port = line.split()
    return PublishedPort(host=host, host_port=int(port), port=spec.port)
