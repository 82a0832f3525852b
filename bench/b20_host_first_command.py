"""B20: time to first command on the host-process tier, beside ``subprocess.run(["true"])``.

Ours is the whole first-command path of a Run: provision, activate, ``exec true``,
release, each round a fresh allocation key. The raw path is the cheapest way to
run ``true`` from Python. Both run in this process, interleaved.

Figures:
- ``B20 host-process time to first command``: the provider as this host gives it
  (with cgroups when the host allows; the figure says which). No target when it has
  cgroups: making, filling and removing a control group is the kernel's work, and the
  issue's target (at most ``TARGET`` times raw) is set for the fallback below;
- ``B20 host-process time to first command (no cgroups)``: the process-group fallback;
- ``B20 host-process exec under a high RLIMIT_NOFILE``: one ``exec true`` in a live
  instance with the soft open-file limit at the hard limit, beside the same at
  1024. A ``close_fds`` loop would make the first cost about limit/1024 times
  the second; the ratio should be about 1.

Set ``CHECKFU_BENCH_N`` to change the number of rounds (default 50).
"""

from __future__ import annotations

import itertools
import os
import resource
import subprocess
import tempfile
from pathlib import Path

from harness import Figure, interleave, summarize

from checkfu.contract.members import (
    ActivateRequest,
    ExecRequest,
    ProvisionRequest,
    ReleaseRequest,
)
from checkfu.contract.profile import NetworkPolicy, SandboxProfile
from checkfu.contract.target import Lease
from checkfu.contract.vocabulary import Resources
from checkfu.providers.host_process import HostProcessProvider

NAMES = ["B20"]
TARGET = 3.0
"""Ours may cost at most three raw spawns: it spawns once, and writes a label, a directory and cgroups."""

LEASE = Lease(lease_id="bench", lease_epoch=1)
PROFILE = SandboxProfile(
    tier="container",
    base_image="host",
    network_policy=NetworkPolicy(mode="unrestricted"),
    resource_limits=Resources(cpu_millis=1000, memory_mib=512, disk_mib=256, pids=256),
    retention_mode="durable",
)


class FirstCommand:
    """provision, activate, exec true, release: one fresh instance per call."""

    def __init__(self, provider: HostProcessProvider) -> None:
        self.provider = provider
        self.keys = itertools.count()

    async def __call__(self) -> None:
        env = (await self.provider.describe()).envelope
        key = f"ak-b20-{next(self.keys)}"
        made = await self.provider.provision(
            ProvisionRequest(
                target=env.target,
                lease=LEASE,
                profile=PROFILE,
                profile_digest=PROFILE.digest,
                platform=env.platforms[0],
                allocation_key=key,
                runner_tag="bench-b20",
                root_image="host",
            )
        )
        call = {"target": env.target, "lease": LEASE, "allocation_key": key, "instance_id": made.instance_id}
        await self.provider.activate(ActivateRequest(**call))
        ran = await self.provider.exec(ExecRequest(**call, argv=["true"], timeout_ms=10_000, max_output_bytes=1024))
        if ran.exit_code != 0:
            raise SystemExit(f"exec true exited {ran.exit_code}: {ran.stderr!r}")
        await self.provider.release(ReleaseRequest(**call))


def raw() -> None:
    subprocess.run(["true"], check=True)


def rounds() -> int:
    return int(os.environ.get("CHECKFU_BENCH_N", "50"))


async def first_command(state: Path, name: str, cgroups: str) -> Figure:
    provider = HostProcessProvider(state_dir=state, cgroups="off" if cgroups == "off" else "auto")
    ours, plain = await interleave(FirstCommand(provider), raw, n=rounds(), warmup=5)
    figure = summarize(name, ours, plain, target=f"<={TARGET}x", met=lambda ratio, _a, _b: ratio <= TARGET)
    figure.extra["cgroups"] = "yes" if provider.cgroup_reason is None else "no"
    if provider.cgroup_reason is None:
        figure.target, figure.met = f"none with cgroups (<={TARGET}x is the fallback's)", None
    figure.extra["warmup"] = 5
    return figure


async def exec_under_nofile(state: Path) -> Figure:
    provider = HostProcessProvider(state_dir=state)
    env = (await provider.describe()).envelope
    made = await provider.provision(
        ProvisionRequest(
            target=env.target,
            lease=LEASE,
            profile=PROFILE,
            profile_digest=PROFILE.digest,
            platform=env.platforms[0],
            allocation_key="ak-b20-nofile",
            runner_tag="bench-b20",
            root_image="host",
        )
    )
    call = {"target": env.target, "lease": LEASE, "allocation_key": "ak-b20-nofile", "instance_id": made.instance_id}
    await provider.activate(ActivateRequest(**call))
    request = ExecRequest(**call, argv=["true"], timeout_ms=10_000, max_output_bytes=1024)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    async def at(limit: int) -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        try:
            await provider.exec(request)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    async def high() -> None:
        await at(hard)

    async def low() -> None:
        await at(min(1024, hard))

    try:
        ours, base = await interleave(high, low, n=rounds(), warmup=5)
    finally:
        await provider.release(ReleaseRequest(**call))
    figure = summarize(
        "B20 host-process exec under a high RLIMIT_NOFILE",
        ours,
        base,
        target="<=1.2x the same at 1024",
        met=lambda ratio, _a, _b: ratio <= 1.2,
    )
    figure.extra["nofile"] = hard
    return figure


async def run() -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="checkfu-b20-") as scratch:
        root = Path(scratch)
        return [
            await first_command(root / "auto", "B20 host-process time to first command", "auto"),
            await first_command(root / "off", "B20 host-process time to first command (no cgroups)", "off"),
            await exec_under_nofile(root / "nofile"),
        ]
