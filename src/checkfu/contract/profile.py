"""The admitted ``SandboxProfile``, frozen at admission, with its content digest."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any, ClassVar, Self

from pydantic import AfterValidator, ConfigDict, Field, Strict, model_validator
from pydantic_core import PydanticCustomError

from checkfu.contract.codec import digest
from checkfu.contract.errors import SandboxError, SandboxProfileInvalid
from checkfu.contract.model import UNIQUE, UNIQUE_ITEMS, Model, rule_error, schema_rules
from checkfu.contract.vocabulary import NetworkMode, PackageManager, Resources, RetentionMode, Tier

HOST_IMAGE = "host"
"""The base image of the host-process tier: the runner host's own userland."""

ImageRef = Annotated[
    str,
    Strict(),
    Field(pattern=r"^(?:host|sha256:[0-9a-f]{64}|[a-z0-9][a-z0-9._/:-]{0,254}@sha256:[0-9a-f]{64})$"),
]
"""A pinned image: ``name@sha256:…`` by digest, ``sha256:…`` a locally built image id, or ``host``."""

_SEMVER = r"[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?"
"""An exact semantic version: a tag (``latest``) or a prefix (``1``, ``1.x``, ``v0.1``) is not a pin."""

PIN_PATTERNS: dict[PackageManager, re.Pattern[str]] = {
    "apt": re.compile(r"^[a-z0-9][a-z0-9+.-]*=[A-Za-z0-9.+~:-]+$"),
    "pip": re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+$"),
    "npm": re.compile(r"^(?:@[a-z0-9._-]+/)?[a-z0-9._-]+@" + _SEMVER + "$"),
    "cargo": re.compile(r"^[A-Za-z0-9_-]+@" + _SEMVER + "$"),
    "gem": re.compile(r"^[A-Za-z0-9._-]+:[0-9A-Za-z.+-]+$"),
    "go": re.compile(r"^[A-Za-z0-9._~/-]+@v" + _SEMVER + "$"),
}
"""A pinned name per manager: ``curl=7.88.1-10``, ``requests==2.31.0``, ``left-pad@1.3.0``,
``serde@1.0.0``, ``rake:13.0.6``, ``golang.org/x/tools@v0.1.0``."""

PIN_EXAMPLES: dict[PackageManager, str] = {
    "apt": "curl=7.88.1-10",
    "pip": "requests==2.31.0",
    "npm": "left-pad@1.3.0",
    "cargo": "serde@1.0.0",
    "gem": "rake:13.0.6",
    "go": "golang.org/x/tools@v0.1.0",
}


def _port_in_range(value: str) -> str:
    host, port_text = value.rsplit(":", 1)
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise PydanticCustomError("destination", "port {port} is outside 1..65535", {"port": port})
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise PydanticCustomError("destination", "{host} is not a bracketed IPv6 address", {"host": host}) from None
    return value


def _ipv6_pattern() -> str:
    """RFC 3986's ``IPv6address`` in lowercase hex, IPv4 tails without leading zeros, as ``ipaddress`` reads it."""
    h = r"[0-9a-f]{1,4}"
    octet = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
    ls32 = rf"(?:{h}:{h}|{octet}(?:\.{octet}){{3}})"
    return (
        "(?:"
        + "|".join(
            (
                rf"(?:{h}:){{6}}{ls32}",
                rf"::(?:{h}:){{5}}{ls32}",
                rf"(?:{h})?::(?:{h}:){{4}}{ls32}",
                rf"(?:(?:{h}:){{0,1}}{h})?::(?:{h}:){{3}}{ls32}",
                rf"(?:(?:{h}:){{0,2}}{h})?::(?:{h}:){{2}}{ls32}",
                rf"(?:(?:{h}:){{0,3}}{h})?::{h}:{ls32}",
                rf"(?:(?:{h}:){{0,4}}{h})?::{ls32}",
                rf"(?:(?:{h}:){{0,5}}{h})?::{h}",
                rf"(?:(?:{h}:){{0,6}}{h})?::",
            )
        )
        + ")"
    )


_DNS_NAME = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*"
_PORT = r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
DESTINATION_PATTERN = rf"^(?:{_DNS_NAME}|\[{_ipv6_pattern()}\]):{_PORT}$"
"""``host:port`` with the whole rule in the pattern (port 1..65535, a valid bracketed IPv6), so the
published schema refuses what the decoder refuses; ``_port_in_range`` checks the same again."""

Destination = Annotated[
    str,
    Strict(),
    Field(
        pattern=DESTINATION_PATTERN,
        max_length=260,
        json_schema_extra={
            "$comment": "destination rule: host:port, the host a lowercase DNS name, an IPv4 address or a "
            "bracketed IPv6 address, the port 1..65535"
        },
    ),
    AfterValidator(_port_in_range),
]
"""``host:port``: a lowercase DNS name, an IPv4 address, or a bracketed IPv6 address."""


class NetworkPolicy(Model):
    """The profile's network: a mode and, for ``allowlist`` only, its destinations."""

    model_config = ConfigDict(
        json_schema_extra=schema_rules(
            {
                "$comment": "mode allowlist names at least one destination; any other mode names none; "
                "field: allowlist",
                "if": {"required": ["mode"], "properties": {"mode": {"const": "allowlist"}}},
                "then": {"required": ["allowlist"], "properties": {"allowlist": {"type": "array", "minItems": 1}}},
                "else": {"properties": {"allowlist": {"type": "array", "maxItems": 0}}},
            }
        )
    )

    decode_error: ClassVar[type[SandboxError]] = SandboxProfileInvalid

    mode: NetworkMode
    allowlist: Annotated[tuple[Destination, ...], UNIQUE, UNIQUE_ITEMS] = Field(
        default=(), description="host:port destinations, only (and at least one) with mode allowlist"
    )

    @model_validator(mode="after")
    def _allowlist_matches_mode(self) -> NetworkPolicy:
        if self.mode == "allowlist" and not self.allowlist:
            raise rule_error(SandboxProfileInvalid, "allowlist", "mode 'allowlist' needs at least one destination")
        if self.mode != "allowlist" and self.allowlist:
            raise rule_error(
                SandboxProfileInvalid,
                "allowlist",
                f"destinations are only allowed with mode 'allowlist', not {self.mode!r}",
            )
        return self


class SandboxProfile(Model):
    """What a Session's sandbox is, frozen at admission and never moved again."""

    decode_error: ClassVar[type[SandboxError]] = SandboxProfileInvalid

    tier: Tier
    base_image: ImageRef
    packages: dict[
        PackageManager, Annotated[tuple[Annotated[str, Strict(), Field(max_length=256)], ...], UNIQUE, UNIQUE_ITEMS]
    ] = Field(
        default_factory=dict,
        description="pinned names per package manager",
        json_schema_extra={
            "default": {},
            "properties": {
                m: {
                    "type": "array",
                    "items": {"type": "string", "$comment": f"pin rule: a pinned {m} name", "pattern": p.pattern},
                }
                for m, p in PIN_PATTERNS.items()
            },
        },
    )
    network_policy: NetworkPolicy
    resource_limits: Resources
    retention_mode: RetentionMode

    @model_validator(mode="after")
    def _pins(self) -> SandboxProfile:
        for manager, names in self.packages.items():
            pattern = PIN_PATTERNS[manager]
            for i, name in enumerate(names):
                if not pattern.fullmatch(name):
                    raise rule_error(
                        SandboxProfileInvalid,
                        f"packages.{manager}.{i}",
                        f"{name[:80]!r} is not a pinned {manager} name (for example {PIN_EXAMPLES[manager]!r})",
                    )
        return self

    @cached_property
    def digest(self) -> str:
        """``sha256:`` of the profile's RFC 8785 canonical JSON; independent of key order."""
        return digest(self)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy whose digest is its own: the cached digest of the original is never carried over."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("digest", None)
        return copy

    @property
    def package_managers(self) -> tuple[PackageManager, ...]:
        return tuple(m for m, names in self.packages.items() if names)
