"""Helpers of the Docker provider's tests: request builders and a short way to drive one sandbox.

A module of its own (not ``conftest``) so test files import it by a name no other test directory uses.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Any

from checkfu.contract.members import (
    ActivateRequest,
    ExecRequest,
    ExecResult,
    InstanceResult,
    ProvisionRequest,
    ReleaseRequest,
    WriteFileRequest,
)
from checkfu.contract.mounts import MountFile, MountPlan
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.provider import Provider
from checkfu.contract.target import Lease
from checkfu.contract.vocabulary import Platform, Resources
from checkfu.providers.docker import DockerProvider
from checkfu.providers.docker import labels as L
from checkfu.providers.docker.envelope import host_facts

LEASE = Lease(lease_id="lease-1", lease_epoch=1)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def leftovers(client: Any, tag: str) -> list[tuple[str, str, str]]:
    flt = {"label": [f"{L.RUNNER_TAG}={tag}"]}
    out = [
        ("container", c.name, c.labels.get(L.ALLOCATION_KEY, ""))
        for c in client.containers.list(all=True, filters=flt, ignore_removed=True)
    ]
    out += [("volume", v.name, v.attrs["Labels"].get(L.ALLOCATION_KEY, "")) for v in client.volumes.list(filters=flt)]
    out += [("image", i.id, i.labels.get(L.ALLOCATION_KEY, "")) for i in client.images.list(filters=flt)]
    return out


def resources(**over: int) -> Resources:
    base = {"cpu_millis": 500, "memory_mib": 64, "disk_mib": 16, "pids": 64}
    base.update(over)
    return Resources(**base)


@dataclass
class Box:
    """One activated sandbox and short ways to drive it."""

    kit: Kit
    key: str
    instance_id: str

    @property
    def call(self) -> dict[str, Any]:
        return {
            "target": self.kit.target,
            "lease": LEASE,
            "allocation_key": self.key,
            "instance_id": self.instance_id,
        }

    async def exec(
        self, *argv: str, stdin: bytes = b"", timeout_ms: int = 20_000, cap: int = 1 << 20, **kw: Any
    ) -> ExecResult:
        return await self.kit.provider.exec(
            ExecRequest(**self.call, argv=argv, stdin=stdin, timeout_ms=timeout_ms, max_output_bytes=cap, **kw)
        )

    async def sh(self, script: str, **kw: Any) -> ExecResult:
        return await self.exec("sh", "-c", script, **kw)

    async def release(self) -> None:
        await self.kit.provider.release(ReleaseRequest(**self.call))

    def container(self) -> Any:
        return self.kit.client.containers.get(self.instance_id)


class Kit:
    """Builds requests for this session's runner tag and base image.

    ``provider`` is what the tests drive: the Docker provider itself, or a client of it served over the
    wire; ``docker`` is always the Docker provider, for what only it knows (its sandbox user, its state).
    """

    def __init__(self, provider: Provider, client: Any, runner_tag: str, image: str, *, docker: DockerProvider) -> None:
        self.provider = provider
        self.docker = docker
        self.target = docker.target
        self.client = client
        self.runner_tag = runner_tag
        self.image = image
        self._n = itertools.count()

    def key(self, name: str) -> str:
        return f"{self.runner_tag}-{name}-{next(self._n)}"

    def profile(self, *, image: str | None = None, retention: str = "ephemeral_zdr", **limits: int) -> SandboxProfile:
        return SandboxProfile(
            tier="container",
            base_image=image or self.image,
            network_policy={"mode": "none"},
            resource_limits=resources(**limits),
            retention_mode=retention,
        )

    @staticmethod
    def platform() -> Platform:
        return Platform(os="linux", architecture=_arch())

    def provision_request(
        self, key: str, *, profile: SandboxProfile | None = None, mounts: tuple[MountPlan, ...] = (), **kw: Any
    ) -> ProvisionRequest:
        prof = profile or self.profile()
        return ProvisionRequest(
            target=self.target,
            lease=LEASE,
            profile=prof,
            profile_digest=prof.digest,
            platform=self.platform(),
            allocation_key=key,
            runner_tag=self.runner_tag,
            mounts=mounts,
            root_image=kw.pop("root_image", prof.base_image),
            **kw,
        )

    async def provision(self, name: str, **kw: Any) -> tuple[str, InstanceResult]:
        key = self.key(name)
        result = await self.provider.provision(self.provision_request(key, **kw))
        return key, result

    async def stage(self, box_call: dict[str, Any], files: dict[str, bytes], mode: int = 0o644) -> None:
        for path, data in files.items():
            await self.provider.write_file(
                WriteFileRequest(**box_call, path=path, mode=mode, size=len(data), digest=sha(data)), data
            )

    async def up(
        self,
        name: str,
        *,
        files: dict[str, bytes] | None = None,
        mounts: tuple[MountPlan, ...] | None = None,
        **kw: Any,
    ) -> Box:
        files = files or {}
        if mounts is None:
            mounts = plans_for(files)
        key, result = await self.provision(name, mounts=mounts, **kw)
        box = Box(self, key, result.instance_id)
        await self.stage(box.call, files)
        await self.provider.activate(ActivateRequest(**box.call))
        return box


def plans_for(files: dict[str, bytes]) -> tuple[MountPlan, ...]:
    """One mount plan per top directory of ``files`` (absolute paths ``/target/rel``)."""
    by_target: dict[str, list[MountFile]] = {}
    for path, data in files.items():
        _, top, rel = path.split("/", 2)
        by_target.setdefault(f"/{top}", []).append(MountFile(path=rel, size=len(data), digest=sha(data)))
    return tuple(MountPlan(target=t, files=tuple(fs)) for t, fs in by_target.items())


def _arch() -> Any:
    return host_facts().architecture


HARDENED: dict[str, Any] = {
    "user": "1000:1000",
    "read_only": True,
    "cap_drop": ["ALL"],
    "security_opt": ["no-new-privileges"],
    "network_mode": "none",
    "ipc_mode": "private",
    "init": True,
}
"""The hardening flags of a sandbox container, as a plain ``docker run`` spells them: a positive control is
these minus the one setting a probe tests (``control(..., without=...)``)."""


def control(
    kit: Kit, argv: list[str], *, without: tuple[str, ...] = (), image: str | None = None, **settings: Any
) -> tuple[int, bytes]:
    """Run ``argv`` in a plain container of ``image`` (the kit's by default) with every ``HARDENED`` flag but
    those named in ``without``, ``settings`` added or overriding; labelled with the runner tag and removed
    after. Returns the exit code and stdout and stderr together.

    A probe that a sandbox blocks must succeed here: that is what makes its failure in the sandbox mean
    that the setting blocked it, not that the probe could never work.
    """
    flags = {k: v for k, v in HARDENED.items() if k not in without}
    flags.update(settings)
    c = kit.client.containers.create(
        image or kit.image,
        argv,
        labels={L.RUNNER_TAG: kit.runner_tag, L.ALLOCATION_KEY: f"{kit.runner_tag}-control"},
        **flags,
    )
    try:
        c.start()
        code = int(c.wait(timeout=120)["StatusCode"])
        return code, bytes(c.logs(stdout=True, stderr=True))
    finally:
        c.remove(force=True, v=True)
