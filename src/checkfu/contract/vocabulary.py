"""The closed word lists of the contract and the small values built from them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from checkfu.contract.model import Model, PosInt

Placement = Literal["test", "local", "hosted", "byoc"]
Tier = Literal["container", "microvm"]
ImageMode = Literal["profile", "fixed"]
PackageManager = Literal["apt", "cargo", "gem", "go", "npm", "pip"]
NetworkMode = Literal["none", "allowlist", "unrestricted"]
RetentionMode = Literal["durable", "ephemeral_zdr"]
SnapshotCustody = Literal["runner", "provider"]
EgressGrade = Literal["unsupported", "advisory_filter", "security_boundary"]
OptionalOperation = Literal["openProcess", "readFiles", "listAllocations"]

PLACEMENTS: tuple[Placement, ...] = ("test", "local", "hosted", "byoc")
TIERS: tuple[Tier, ...] = ("container", "microvm")
PACKAGE_MANAGERS: tuple[PackageManager, ...] = ("apt", "cargo", "gem", "go", "npm", "pip")
NETWORK_MODES: tuple[NetworkMode, ...] = ("none", "allowlist", "unrestricted")
RETENTION_MODES: tuple[RetentionMode, ...] = ("durable", "ephemeral_zdr")
EGRESS_GRADES: tuple[EgressGrade, ...] = ("unsupported", "advisory_filter", "security_boundary")
"""Weakest first."""
OPTIONAL_OPERATIONS: tuple[OptionalOperation, ...] = ("openProcess", "readFiles", "listAllocations")


class Platform(Model):
    """An ``{os, architecture}`` pair; ``os`` is always ``linux``."""

    os: Literal["linux"]
    architecture: Literal["amd64", "arm64"]


RESOURCE_DIMENSIONS = ("cpu_millis", "memory_mib", "disk_mib", "pids")


class Resources(Model):
    """The four resource dimensions, all positive integers."""

    cpu_millis: PosInt = Field(description="CPU in thousandths of a core")
    memory_mib: PosInt = Field(description="memory in MiB (swap is not extra)")
    disk_mib: PosInt = Field(description="writable disk in MiB, over every writable path")
    pids: PosInt = Field(description="most processes and threads at once")

    def within(self, low: Resources, high: Resources) -> list[str]:
        """The dimensions of ``self`` outside ``[low, high]``, each with the reason."""
        out: list[str] = []
        for dim in RESOURCE_DIMENSIONS:
            value, lo, hi = getattr(self, dim), getattr(low, dim), getattr(high, dim)
            if value < lo:
                out.append(f"{dim}: {value} is below the minimum {lo}")
            elif value > hi:
                out.append(f"{dim}: {value} is above the maximum {hi}")
        return out
