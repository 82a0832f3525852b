"""An instance as the provider holds it in memory, and the label it writes of it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from checkfu.contract.labels import owner_labels
from checkfu.contract.members import InstanceState
from checkfu.providers.host_process import cgroups as cg
from checkfu.providers.host_process.envelope import PROVIDER_REVISION
from checkfu.providers.host_process.state import InstanceLabel
from checkfu.providers.host_process.streams import Linger


@dataclass(eq=False)
class Instance:
    """What a provider holds in memory of one instance; its label is what survives a restart."""

    key: str
    instance_id: str
    runner_tag: str
    state: InstanceState
    workdir: Path
    cgroups: cg.InstanceCgroups | None
    groups: list[tuple[int, int]] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closing: bool = False
    linger: Linger = field(default_factory=set)
    """Pipes still open after their call returned; closed once the processes are gone."""

    def close_pipes(self) -> None:
        for transport in list(self.linger):
            transport.close()
        self.linger.clear()

    def label(self) -> InstanceLabel:
        assert self.state != "released"
        return InstanceLabel(
            labels=owner_labels(self.key, self.runner_tag),
            revision=PROVIDER_REVISION,
            instance_id=self.instance_id,
            state=self.state,
            cgroups=self.cgroups.as_label() if self.cgroups is not None else {},
            groups=list(self.groups),
        )
