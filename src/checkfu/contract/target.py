"""Coordinates: the execution target tuple, the lease, allocation keys."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict

from checkfu.contract.model import Identifier, Model, NonNegInt
from checkfu.contract.vocabulary import Placement

ProviderName = Annotated[str, Strict(), Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,254}$")]
"""A provider's coordinate."""

Revision = Annotated[str, Strict(), Field(pattern=r"^[\x20-\x7e]{1,256}$")]
"""Opaque identity: 1..256 printable ASCII characters, compared byte for byte."""

AllocationKey = Identifier
RunnerTag = Identifier


class ExecutionTarget(Model):
    """The exact tuple an adapter is selected by. Equality is byte equality of all four."""

    provider: ProviderName
    provider_revision: Revision
    materialization_revision: Revision
    placement: Placement

    def __str__(self) -> str:
        return f"{self.provider}@{self.provider_revision}/{self.materialization_revision}[{self.placement}]"


class Lease(Model):
    """A Run attempt's fence: ``(lease_id, lease_epoch)``. A takeover bumps the epoch."""

    lease_id: Identifier
    lease_epoch: NonNegInt
