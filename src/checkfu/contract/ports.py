"""Published ports: a sandbox port reached from the machine of the engine, on its loopback unless asked otherwise.

``-p [HOST_IP:]HOST_PORT:CONTAINER_PORT`` as Docker spells it: ``HOST_IP`` defaults to
``127.0.0.1`` (not Docker's ``0.0.0.0``), ``HOST_PORT`` ``0`` takes any free port. The sandbox
keeps its network (``none`` has only ``lo``): what a published port opens is one listening
address on the host that leads to ``127.0.0.1:CONTAINER_PORT`` inside the sandbox, nothing more.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from checkfu.contract.errors import SandboxCapabilityUnavailable, SandboxProfileInvalid, Unmet

LOOPBACK = "127.0.0.1"
FLAG = "-p"
PUBLISH_PORT = "publishPort"
"""The journal's name (``events.member``) for a port published: its ``detail`` is ``PublishedPort.to_json()``."""


@dataclass(frozen=True, slots=True)
class PortSpec:
    """One ``-p`` value: publish sandbox ``port`` on ``host:host_port`` (``host_port`` 0: any free port)."""

    port: int
    host: str = LOOPBACK
    host_port: int = 0

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.host).is_loopback


@dataclass(frozen=True, slots=True)
class PublishedPort:
    """A port published: where the host listens, and the sandbox port it leads to."""

    host: str
    host_port: int
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.host_port}"

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "host_port": self.host_port, "port": self.port, "url": self.url}


def _port(text: str, what: str, value: str, *, zero: bool) -> int:
    if not text.isdigit() or len(text) > 5 or not (0 if zero else 1) <= int(text) <= 65535:
        low = 0 if zero else 1
        raise SandboxProfileInvalid(f"{FLAG} {value!r}: {what} must be a number from {low} to 65535", field=FLAG)
    return int(text)


def parse_port_spec(value: str) -> PortSpec:
    """``[HOST_IP:]HOST_PORT:CONTAINER_PORT`` (an IPv6 host in brackets), or a bare ``CONTAINER_PORT`` (any free
    host port on the loopback).

    Raises:
        SandboxProfileInvalid: (field ``-p``) not of that form, a port out of range, a host that is not an IP address.
    """
    text = value.strip()
    host = LOOPBACK
    if text.startswith("["):
        end = text.find("]:")
        if end < 0:
            raise SandboxProfileInvalid(
                f"{FLAG} {value!r}: an IPv6 host is written [ADDRESS]:HOST_PORT:PORT", field=FLAG
            )
        host, text = text[1:end], text[end + 2 :]
        parts = text.split(":")
        if len(parts) != 2:
            raise SandboxProfileInvalid(f"{FLAG} {value!r}: expected [HOST_IP:]HOST_PORT:CONTAINER_PORT", field=FLAG)
    else:
        parts = text.split(":")
        if len(parts) == 3:
            host, parts = parts[0], parts[1:]
        elif len(parts) == 1:
            parts = ["0", parts[0]]
        elif len(parts) != 2:
            raise SandboxProfileInvalid(f"{FLAG} {value!r}: expected [HOST_IP:]HOST_PORT:CONTAINER_PORT", field=FLAG)
    if parts[-1].endswith(("/tcp", "/udp")):
        if parts[-1].endswith("/udp"):
            raise SandboxProfileInvalid(f"{FLAG} {value!r}: only TCP ports can be published", field=FLAG)
        parts[-1] = parts[-1][:-4]
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        raise SandboxProfileInvalid(
            f"{FLAG} {value!r}: the host {host[:80]!r} is not an IP address (use 127.0.0.1, or 0.0.0.0 for every "
            "address)",
            field=FLAG,
        ) from None
    host_port = _port(parts[0], "HOST_PORT", value, zero=True)
    port = _port(parts[1], "CONTAINER_PORT", value, zero=False)
    return PortSpec(port=port, host=host, host_port=host_port)


def parse_port_specs(values: list[str] | tuple[str, ...]) -> list[PortSpec]:
    """Every ``-p`` value, parsed; two that ask for the same host address and port are refused.

    Raises:
        SandboxProfileInvalid: (field ``-p``) as ``parse_port_spec``, or a host port asked for twice.
    """
    specs = [parse_port_spec(v) for v in values]
    seen: set[tuple[str, int]] = set()
    for spec in specs:
        if spec.host_port and (spec.host, spec.host_port) in seen:
            raise SandboxProfileInvalid(f"{FLAG}: {spec.host}:{spec.host_port} is published twice", field=FLAG)
        seen.add((spec.host, spec.host_port))
    return specs


def exposure_warning(spec: PortSpec | PublishedPort) -> str | None:
    """The warning a published port off the loopback deserves (``None`` on the loopback)."""
    if ipaddress.ip_address(spec.host).is_loopback:
        return None
    return (
        f"{FLAG} publishes sandbox port {spec.port} on {spec.host}, not the loopback: anyone who can reach this "
        "machine at that address reaches the sandbox's port"
    )


@runtime_checkable
class PortPublisher(Protocol):
    """A provider that can publish a port of an active sandbox on the machine it runs on (the Docker tier).

    Not a member of the wire contract: a provider reached over the wire runs on another machine, whose loopback
    is not the caller's.
    """

    async def publish_port(
        self, *, allocation_key: str, instance_id: str, runner_tag: str, spec: PortSpec
    ) -> PublishedPort: ...


def admit_ports(values: list[str] | tuple[str, ...], provider: str) -> list[PortSpec]:
    """The ``-p`` values of a Run or sandbox on ``provider`` (an installed provider's name or a service's URL),
    checked before any provider work.

    Raises:
        SandboxProfileInvalid: (field ``-p``) a value is not ``[HOST_IP:]HOST_PORT:CONTAINER_PORT``.
        SandboxCapabilityUnavailable: (field ``-p``) ports are published by the Docker tier only, on its own host.
    """
    specs = parse_port_specs(values)
    if specs and provider != "docker":
        raise SandboxCapabilityUnavailable(
            [Unmet(FLAG, f"only the Docker tier publishes ports (on this machine's engine), not {provider[:80]!r}")],
            provider=provider[:80],
        )
    return specs
