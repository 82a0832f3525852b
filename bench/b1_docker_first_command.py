"""B1: time to first command on the Docker tier, beside docker-py doing the same steps.

Ours: ``provision``, ``activate``, ``exec true``, ``release`` through the provider,
a fresh allocation key each round. Raw: docker-py ``create``, ``start``,
``exec_run(["true"])``, ``remove(force=True)`` of a container with the same
isolation flags (read-only root, user 1000, no-new-privileges, every capability
dropped, network none, the same limits, its writable paths as size-limited tmpfs).
Both run in this process, interleaved. Target: ours p50 at most 1.10 times raw,
and ours p99/p50 at most 2.

This module also holds the rig the other Docker benchmarks (B2, B6, B7, B8, B9) share.
Set ``CHECKFU_BENCH_N`` to change the number of rounds (default 20).
"""

from __future__ import annotations

import itertools
import os
import statistics
import tempfile
import uuid
from typing import Any

import docker
from harness import Figure, interleave, percentile, summarize

from checkfu.contract.members import (
    ActivateRequest,
    CompensateRequest,
    ExecRequest,
    ProvisionRequest,
    ReleaseRequest,
)
from checkfu.contract.mounts import MountPlan
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.target import Lease
from checkfu.providers.docker import DockerProvider, spec

NAMES = ["B1"]
LEASE = Lease(lease_id="bench", lease_epoch=1)
LIMITS = {"cpu_millis": 1000, "memory_mib": 256, "disk_mib": 64, "pids": 128}


def rounds(default: int = 20, var: str = "CHECKFU_BENCH_N") -> int:
    return int(os.environ.get(var, default))


class Rig:
    """One provider and one docker-py client against the local engine, with a runner tag of its own.

    Raises SystemExit when there is no engine or no base image, so a benchmark never prints a made-up figure.
    """

    def __init__(self, name: str, *, retention: str = "ephemeral_zdr", workers: int = 128) -> None:
        try:
            self.client = docker.from_env(max_pool_size=workers)
            self.client.ping()
            self.image = str(self.client.images.get("checkfu/busybox:1").id)
        except Exception as exc:
            raise SystemExit(f"no Docker Engine or no checkfu/busybox:1 image ({type(exc).__name__}: {exc})") from exc
        self.tag = f"bench-{name.lower()}-{uuid.uuid4().hex[:8]}"
        self.state = tempfile.TemporaryDirectory(prefix="checkfu-bench-")
        self.provider = DockerProvider(state_dir=self.state.name, cache_tag=self.tag, workers=workers)
        self.target = self.provider.target
        self.platform = self.provider.envelope.platforms[0]
        self.profile = SandboxProfile(
            tier="container",
            base_image=self.image,
            network_policy={"mode": "none"},  # type: ignore[arg-type]
            resource_limits=LIMITS,  # type: ignore[arg-type]
            retention_mode=retention,  # type: ignore[arg-type]
        )
        self._keys = itertools.count()

    def key(self) -> str:
        return f"{self.tag}-{next(self._keys)}"

    def provision_request(self, key: str, mounts: tuple[MountPlan, ...] = ()) -> ProvisionRequest:
        return ProvisionRequest(
            target=self.target,
            lease=LEASE,
            profile=self.profile,
            profile_digest=self.profile.digest,
            platform=self.platform,
            allocation_key=key,
            runner_tag=self.tag,
            mounts=mounts,
            root_image=self.image,
        )

    def call(self, key: str, instance_id: str) -> dict[str, Any]:
        return {"target": self.target, "lease": LEASE, "allocation_key": key, "instance_id": instance_id}

    async def up(self, mounts: tuple[MountPlan, ...] = ()) -> dict[str, Any]:
        key = self.key()
        made = await self.provider.provision(self.provision_request(key, mounts))
        call = self.call(key, made.instance_id)
        await self.provider.activate(ActivateRequest(**call))
        return call

    async def down(self, call: dict[str, Any]) -> None:
        await self.provider.release(ReleaseRequest(**call))

    def raw_config(self, *, writable_root: bool = False, command: list[str] | None = None) -> dict[str, Any]:
        """docker-py's arguments for a container as isolated as ours (tmpfs writable paths, same limits)."""
        mib = LIMITS["disk_mib"] * 1024
        memory = LIMITS["memory_mib"] << 20
        return {
            "image": self.image,
            "command": command or ["sleep", "infinity"],
            "user": "1000:1000",
            "working_dir": "/home/sandbox",
            "read_only": not writable_root,
            "tmpfs": {
                "/home/sandbox": f"size={mib - mib // 4 - mib // 16}k,uid=1000,gid=1000,mode=755,nosuid,nodev",
                "/tmp": f"size={mib // 4}k,mode=1777,nosuid,nodev",
                "/dev/shm": f"size={mib // 16}k,mode=1777,nosuid,nodev,noexec",
            },
            "network_mode": "none",
            "ipc_mode": "private",
            "init": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "mem_limit": memory,
            "memswap_limit": memory,
            "nano_cpus": LIMITS["cpu_millis"] * 1_000_000,
            "pids_limit": LIMITS["pids"],
            "log_config": {"type": "none", "config": {}},
            "labels": {"checkfu.runner_tag": self.tag, "checkfu.allocation_key": f"{self.tag}-raw"},
        }

    def raw_shaped_config(self) -> dict[str, Any]:
        """docker-py's arguments for a container of our exact shape: the same flags, and its writable paths as
        the same size-limited tmpfs *volumes* ours has (anonymous, created by the engine at ``create``, removed
        with the container by ``v=True``). HostConfig tmpfs mounts (``raw_config``) are invisible to the engine's
        archive API, which staging, ``cp`` and snapshots need under a read-only root; the volumes are not.
        The raw engine creating the same isolation, for B8 and B9."""
        cfg = self.raw_config()
        del cfg["tmpfs"]
        user = self.provider.user
        areas = spec.split_disk(LIMITS["disk_mib"], user)
        cfg["mounts"] = spec.area_mounts(areas, user, f"{self.tag}-raw", self.tag)
        cfg["ulimits"] = [docker.types.Ulimit(name="msgqueue", soft=0, hard=0)]
        return cfg

    def leftovers(self) -> int:
        flt = {"label": [f"checkfu.runner_tag={self.tag}"]}
        return (
            len(self.client.containers.list(all=True, filters=flt))
            + len(self.client.volumes.list(filters=flt))
            + len(self.client.images.list(filters=flt))
        )

    async def close(self) -> int:
        """Reclaim everything of this rig's tag; the number of objects that were still there."""
        left = self.leftovers()
        flt = {"label": [f"checkfu.runner_tag={self.tag}"]}
        keys = {c.labels.get("checkfu.allocation_key", "") for c in self.client.containers.list(all=True, filters=flt)}
        keys |= {v.attrs["Labels"].get("checkfu.allocation_key", "") for v in self.client.volumes.list(filters=flt)}
        keys |= {i.labels.get("checkfu.allocation_key", "") for i in self.client.images.list(filters=flt)}
        for key in sorted(k for k in keys if k):
            await self.provider.compensate(
                CompensateRequest(target=self.target, lease=LEASE, allocation_key=key, runner_tag=self.tag)
            )
        self.provider.close()
        self.client.close()
        self.state.cleanup()
        return left


def exec_request(call: dict[str, Any], *argv: str) -> ExecRequest:
    return ExecRequest(**call, argv=argv, timeout_ms=30_000, max_output_bytes=1 << 20)


async def run() -> list[Figure]:
    rig = Rig("B1")
    loop_raw = rig.raw_config()

    async def ours() -> None:
        call = await rig.up()
        result = await rig.provider.exec(exec_request(call, "true"))
        assert result.exit_code == 0
        await rig.down(call)

    def raw() -> None:
        c = rig.client.containers.create(**loop_raw)
        c.start()
        code, _ = c.exec_run(["true"], user="1000:1000")
        assert code == 0
        c.remove(force=True)

    try:
        n = rounds()
        a, b = await interleave(ours, raw, n=n, warmup=2)
    finally:
        left = await rig.close()
    fig = summarize(
        "B1 docker time to first command",
        a,
        b,
        target="<=1.10x docker-py, p99/p50<=2",
        met=lambda r, xs, _: r <= 1.10 and percentile(xs, 0.99) / statistics.median(xs) <= 2,
    )
    fig.extra["ours_p99_over_p50"] = fig.extra["ours_p99"] / fig.ours_p50
    fig.extra["left_behind"] = left
    return [fig]
