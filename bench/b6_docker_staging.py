"""B6: ``writeFile`` staging, beside docker-py ``put_archive`` of the same tar.

Small: 1000 files of 4 KiB. Ours: 1000 ``writeFile`` calls (each checks the
length and SHA-256) on a provisioned instance ("staged"); then, in a second
figure, plus the ``activate`` that lands them in the sealed mount and starts the
sandbox ("landed, started"). Raw: one ``put_archive`` of a tar of the same 1000
files (built before the clock starts) into a created container's volume; then
plus its ``start``. Target: at least 2000 files/s.

Each side's writes and landing are one step, timed whole, and the sides take
turns going first: the provider uploads staged files in the background while
writes go on, and that work must neither run while raw is timed nor go uncounted.
Raw does less than ours: no per-file SHA-256, no archive built on the clock, no
stager to remove and no check of the sandbox's flags after start.

Large: one 256 MiB file. Ours: one ``writeFile`` (hash, then upload). Raw:
``put_archive`` of the prebuilt tar. Target: ours throughput at least 0.8 times
raw (a time ratio of at most 1.25).

``CHECKFU_BENCH_N`` sets the small rounds (default 10); ``CHECKFU_BENCH_LARGE_N``
the large ones (default 5).
"""

from __future__ import annotations

import hashlib
import io
import os
import statistics
import tarfile
import time
from typing import Any

from b1_docker_first_command import Rig, rounds
from harness import Figure, interleave, summarize

from checkfu.contract.members import ActivateRequest, ReleaseRequest, WriteFileRequest
from checkfu.contract.mounts import MountFile, MountPlan

NAMES = ["B6"]
SMALL, SMALL_BYTES = 1000, 4096
LARGE_BYTES = 256 << 20


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.uid, info.gid, info.mode = len(data), 1000, 1000, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def run() -> list[Figure]:
    rig = Rig("B6")
    small = {f"src/d{i % 20}/f{i}.txt": os.urandom(SMALL_BYTES) for i in range(SMALL)}
    small_plan = MountPlan(
        target="/workspace",
        files=tuple(MountFile(path=p, size=len(d), digest=sha(d)) for p, d in small.items()),
    )
    small_tar = tar_of(small)
    figures = []
    try:
        pending: list[dict[str, Any]] = []
        raw_pending: list[Any] = []

        async def prepare_ours() -> dict[str, Any]:
            key = rig.key()
            made = await rig.provider.provision(rig.provision_request(key, (small_plan,)))
            return rig.call(key, made.instance_id)

        def raw_container(volume: str) -> Any:
            rig.client.volumes.create(volume, labels=rig.raw_config()["labels"])
            cfg = rig.raw_config()
            cfg["volumes"] = {volume: {"bind": "/workspace", "mode": "rw"}}
            return rig.client.containers.create(**cfg)

        def prepare_raw() -> Any:
            return raw_container(f"{rig.tag}-raw-{os.urandom(4).hex()}")

        staged_a: list[float] = []
        staged_b: list[float] = []

        async def ours() -> None:
            # One step, timed whole: the writes and then activate, with no gap between them (work the provider
            # does in the background while writes go on is counted where it ends, never while raw runs).
            call = pending[-1]
            start = time.perf_counter()
            for path, data in small.items():
                await rig.provider.write_file(
                    WriteFileRequest(**call, path=f"/workspace/{path}", size=len(data), digest=sha(data)), data
                )
            staged_a.append(time.perf_counter() - start)
            await rig.provider.activate(ActivateRequest(**call))

        def raw() -> None:
            start = time.perf_counter()
            raw_pending[-1].put_archive("/workspace", small_tar)
            staged_b.append(time.perf_counter() - start)
            raw_pending[-1].start()

        times_a: list[float] = []
        times_b: list[float] = []
        land_a: list[float] = []
        land_b: list[float] = []
        n = rounds(10)
        for i in range(n + 1):
            pending.append(await prepare_ours())
            raw_pending.append(prepare_raw())
            if i % 2 == 0:  # which side goes first alternates
                a, b = await interleave(ours, raw, n=1, warmup=0)
            else:
                b, a = await interleave(raw, ours, n=1, warmup=0)
            if i > 0:  # the first round is a warm-up
                times_a.append(staged_a[-1])
                times_b.append(staged_b[-1])
                land_a += a
                land_b += b
            await rig.provider.release(ReleaseRequest(**pending.pop()))
            container = raw_pending.pop()
            volume = next(iter(container.attrs["HostConfig"]["Binds"]))[: -len(":/workspace:rw")]
            container.remove(force=True)
            rig.client.volumes.get(volume).remove()
        for name, xs, ys in (
            ("B6 docker writeFile 1000 x 4 KiB (staged)", times_a, times_b),
            ("B6 docker writeFile 1000 x 4 KiB + activate (landed, started)", land_a, land_b),
        ):
            fig = summarize(
                name, xs, ys, target=">=2000 files/s", met=lambda _r, a, _b: SMALL / statistics.median(a) >= 2000
            )
            fig.extra["ours_files_per_s"] = SMALL / fig.ours_p50
            fig.extra["raw_files_per_s"] = SMALL / (fig.raw_p50 or 1)
            figures.append(fig)

        large = os.urandom(LARGE_BYTES)
        large_digest = sha(large)
        large_file = MountFile(path="big.bin", size=LARGE_BYTES, digest=large_digest)
        large_plan = MountPlan(target="/workspace", files=(large_file,))
        large_tar = tar_of({"big.bin": large})
        key = rig.key()
        made = await rig.provider.provision(rig.provision_request(key, (large_plan,)))
        call = rig.call(key, made.instance_id)
        volume = f"{rig.tag}-raw-large"
        container = raw_container(volume)

        async def ours_large() -> None:
            await rig.provider.write_file(
                WriteFileRequest(**call, path="/workspace/big.bin", size=LARGE_BYTES, digest=large_digest), large
            )

        def raw_large() -> None:
            container.put_archive("/workspace", large_tar)

        try:
            a, b = await interleave(ours_large, raw_large, n=rounds(5, "CHECKFU_BENCH_LARGE_N"), warmup=1)
        finally:
            await rig.provider.release(ReleaseRequest(**call))
            container.remove(force=True)
            rig.client.volumes.get(volume).remove()
        fig = summarize(
            "B6 docker writeFile one 256 MiB file",
            a,
            b,
            target=">=0.8x put_archive throughput (time ratio <=1.25)",
            met=lambda r, _a, _b: r <= 1.25,
        )
        fig.extra["ours_MiB_per_s"] = 256 / fig.ours_p50
        fig.extra["raw_MiB_per_s"] = 256 / (fig.raw_p50 or 1)
        figures.append(fig)
    finally:
        left = await rig.close()
    for fig in figures:
        fig.extra["left_behind"] = left
    return figures
