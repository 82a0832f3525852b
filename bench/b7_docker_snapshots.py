"""B7: snapshot, resume and clone on the Docker tier, beside ``docker commit`` and a create from the image.

The sandbox holds 1 MiB of state (files in its home and in ``/tmp``). Its root
is read-only, so ours captures the writable areas through the archive API (the
sandbox paused, as ``commit`` pauses) into a labelled image, and restores them
at activation. The raw container keeps the same files in a writable root layer,
which is what ``docker commit`` captures.

- snapshot: ours ``snapshot`` beside raw ``commit``;
- resume: ours ``resume`` + ``activate`` beside raw ``create`` from the committed image + ``start``;
- clone: ours ``clone`` + ``activate`` beside raw ``commit`` + ``create`` + ``start``.

Target (issue 18): each at most 1.25 times the raw primitive. ``CHECKFU_BENCH_N`` sets the rounds (default 10).

The raw side of resume and clone is not the same isolation as ours: its container has a writable root and
no writable areas, while ours has a read-only root and three size-limited tmpfs areas, which the restored
state must be written into after start (the engine has no primitive that fills a tmpfs area; ``create``
from a committed image only serves a writable root). So each round also times raw ``create`` + ``start`` of
the committed image with our isolation (B1's raw configuration: read-only root, the areas as tmpfs, the same
limits), reported as ``raw_hardened_p50`` and ``ratio_vs_hardened`` (for clone, after a raw ``commit``).
Two floors, measured in the same run: ``raw_capture_floor_p50``, the archive path alone (pause, one archive read
of the areas through the handle, unpause: what a capture pays before its bytes are kept anywhere), and
``raw_shape_and_fill_p50``, the raw engine creating our resumed sandbox's shape (read-only root, the areas as tmpfs
volumes), starting it and uploading the captured areas into it, each over the issue's raw figure.
``raw_disk_shape_p50``: the raw engine making a disk-backed shape instead (each area an ext4 image of its size,
``mke2fs -d`` from the captured files, on a loop device, mounted as a local volume; then create and start, with
nothing to upload after), the alternative issue 33 asks to measure.
Beside the snapshot, the raw engine making the same calls as ours one after another (``raw_archive_serial_p50``,
after the interleaved rounds): pause, one archive read of the areas through the sandbox's handle, unpause,
import. Ours streams the read into the import and thaws meanwhile, so it comes in under that.
The stated comparison (``ratio``) stays the issue's.
"""

from __future__ import annotations

import concurrent.futures
import io
import os
import re
import shutil
import statistics
import subprocess
import tarfile
import tempfile
from typing import Any

import docker.types
from b1_docker_first_command import LEASE, LIMITS, Rig, exec_request, rounds
from harness import Figure, interleave, summarize, timed

from checkfu.contract.members import (
    ActivateRequest,
    CloneRequest,
    DeleteSnapshotRequest,
    ReleaseRequest,
    ResumeRequest,
    SnapshotRequest,
)
from checkfu.providers.docker import snapshots, spec

NAMES = ["B7"]
STATE = (
    "mkdir -p $HOME/proj && for i in 1 2 3 4 5 6 7 8; do head -c 98304 /dev/urandom > $HOME/proj/f$i; done"
    " && head -c 262144 /dev/urandom > /tmp/scratch"
)
RAW_STATE = STATE.replace("$HOME", "/home/sandbox")


async def run() -> list[Figure]:
    rig = Rig("B7", retention="durable")
    p = rig.provider
    figures: list[Figure] = []
    try:
        source = await rig.up()
        assert (await p.exec(exec_request(source, "sh", "-c", STATE))).exit_code == 0
        cfg = rig.raw_config(writable_root=True)
        cfg.pop("tmpfs")
        raw_source = rig.client.containers.run(detach=True, **cfg)
        assert raw_source.exec_run(["sh", "-c", RAW_STATE], user="1000:1000").exit_code == 0
        snaps: list[tuple[str, str]] = []
        images: list[Any] = []
        label = {"LABEL": f"checkfu.runner_tag={rig.tag}"}

        async def snapshot() -> None:
            key = rig.key()
            result = await p.snapshot(SnapshotRequest(**source, snapshot_allocation_key=key))
            snaps.append((key, result.snapshot_id))

        def commit() -> None:
            images.append(raw_source.commit(changes=[f"LABEL checkfu.runner_tag={rig.tag}"]))

        serial_ids: list[str] = []

        def archive_serial() -> None:
            """Our engine calls, one after another: pause, one archive read of the areas through the sandbox's
            handle (made by the first snapshot), unpause, import the bytes as an image (no re-rooting)."""
            api = rig.client.api
            api.pause(source["instance_id"])
            try:
                stream, _ = api.get_archive(snapshots.handle_name(source["instance_id"]), snapshots.HANDLE_ROOT)
                data = b"".join(stream)
            finally:
                api.unpause(source["instance_id"])
            answer = api.import_image_from_data(data, changes=[f"LABEL checkfu.runner_tag={rig.tag}"])
            serial_ids.extend(re.findall(r"sha256:[0-9a-f]{64}", str(answer))[-1:])

        captured: list[bytes] = []

        def capture_floor() -> None:
            """The archive path alone: pause, one archive read of the areas through the handle, unpause (what any
            capture that is not ``docker commit`` pays before its bytes are kept anywhere)."""
            api = rig.client.api
            api.pause(source["instance_id"])
            try:
                stream, _ = api.get_archive(snapshots.handle_name(source["instance_id"]), snapshots.HANDLE_ROOT)
                captured[:] = [b"".join(stream)]
            finally:
                api.unpause(source["instance_id"])

        serial: list[float] = []
        floor: list[float] = []

        a, b = await interleave(snapshot, commit, n=rounds(10), warmup=1)
        for _ in range(rounds(10)):
            serial.append(await timed(archive_serial))
            floor.append(await timed(capture_floor))
        fig = summarize("B7 docker snapshot", a, b, target="<=1.25x docker commit", met=lambda r, *_: r <= 1.25)
        fig.extra["raw_archive_serial_p50"] = statistics.median(serial)
        fig.extra["ratio_vs_archive_serial"] = fig.ours_p50 / statistics.median(serial)
        fig.extra["raw_capture_floor_p50"] = statistics.median(floor)
        fig.extra["capture_floor_over_commit"] = statistics.median(floor) / fig.raw_p50
        figures.append(fig)
        snap_key, snap_id = snaps[0]
        image = images[0]
        made: list[dict[str, Any]] = []
        raw_made: list[Any] = []

        async def resume() -> None:
            base = rig.provision_request(rig.key())
            request = ResumeRequest(**base.model_dump(), snapshot_allocation_key=snap_key, snapshot_id=snap_id)
            result = await p.resume(request)
            call = rig.call(request.allocation_key, result.instance_id)
            await p.activate(ActivateRequest(**call))
            made.append(call)

        def create_from_image() -> None:
            c = rig.client.containers.create(**{**cfg, "image": image.id})
            c.start()
            raw_made.append(c)

        hardened = rig.raw_config()

        def create_hardened() -> None:
            c = rig.client.containers.create(**{**hardened, "image": image.id})
            c.start()
            raw_made.append(c)

        shaped = rig.raw_shaped_config()
        fill_floor: list[float] = []

        def create_start_fill() -> None:
            """The raw engine making our resume's shape and filling it: create (read-only root, the areas as tmpfs
            volumes), start, then one upload of the captured areas into the running container's home area (no
            engine call fills a tmpfs volume before its container starts)."""
            c = rig.client.containers.create(**{**shaped, "image": rig.image})
            c.start()
            raw_made.append(c)
            rig.client.api.put_archive(c.id, "/home/sandbox", captured[0])

        disk_floor: list[float] = []
        disk_dirs: list[str] = []
        loops: list[str] = []
        areas = spec.split_disk(LIMITS["disk_mib"], p.user)

        def create_start_on_disk() -> None:
            """The raw engine making the disk-backed shape issue 33 asks to measure: each area an ext4 image of
            its size (``disk_limit`` kept by the file system's size) made by ``mke2fs -d`` from the captured
            files, attached to a loop device and mounted as a local volume; create and start, with nothing to
            upload after (this host's engine only: the images are files on the engine's host)."""
            work = tempfile.mkdtemp(prefix="b7-disk-", dir="/var/tmp")
            disk_dirs.append(work)
            with tarfile.open(fileobj=io.BytesIO(captured[0])) as archive:
                archive.extractall(work, filter="fully_trusted")
            root = os.path.join(work, snapshots.HANDLE_ROOT.strip("/"))

            def make(i: int) -> str:
                img = os.path.join(work, f"area{i}.ext4")
                src = os.path.join(root, str(i))
                argv = ["mke2fs", "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-E", "root_owner=1000:1000"]
                argv += ["-d", src] if os.path.isdir(src) else []
                subprocess.run([*argv, img, f"{areas[i].size_kib}k"], check=True, capture_output=True)
                dev = subprocess.run(["losetup", "-f", "--show", img], check=True, capture_output=True, text=True)
                loops.append(dev.stdout.strip())
                return loops[-1]

            with concurrent.futures.ThreadPoolExecutor(len(areas)) as pool:
                images = list(pool.map(make, range(len(areas))))
            mounts = [
                docker.types.Mount(
                    a.path,
                    None,
                    type="volume",
                    labels={"checkfu.runner_tag": rig.tag},
                    driver_config=docker.types.DriverConfig(
                        "local", {"type": "ext4", "device": img, "o": "nosuid,nodev"}
                    ),
                )
                for a, img in zip(areas, images, strict=True)
            ]
            c = rig.client.containers.create(**{**shaped, "image": rig.image, "mounts": mounts})
            c.start()
            raw_made.append(c)

        def commit_create_hardened() -> None:
            img = raw_source.commit(changes=[f"LABEL checkfu.runner_tag={rig.tag}"])
            images.append(img)
            c = rig.client.containers.create(**{**hardened, "image": img.id})
            c.start()
            raw_made.append(c)

        async def clone() -> None:
            base = rig.provision_request(rig.key())
            request = CloneRequest(
                **base.model_dump(),
                source_allocation_key=source["allocation_key"],
                source_instance_id=source["instance_id"],
            )
            result = await p.clone(request)
            call = rig.call(request.allocation_key, result.instance_id)
            await p.activate(ActivateRequest(**call))
            made.append(call)

        def commit_create() -> None:
            img = raw_source.commit(changes=[f"LABEL checkfu.runner_tag={rig.tag}"])
            images.append(img)
            c = rig.client.containers.create(**{**cfg, "image": img.id})
            c.start()
            raw_made.append(c)

        async def cleanup() -> None:
            while made:
                await p.release(ReleaseRequest(**made.pop()))
            while raw_made:
                raw_made.pop().remove(force=True, v=True)  # v: the shaped one's area volumes go with it

        for name, ours, raw, fair in (
            ("B7 docker resume", resume, create_from_image, create_hardened),
            ("B7 docker clone", clone, commit_create, commit_create_hardened),
        ):
            xs: list[float] = []
            ys: list[float] = []
            zs: list[float] = []
            for i in range(rounds(10) + 1):
                # Which goes first alternates by round (interleave with n=1 always starts with its first step,
                # which would always meet the engine still busy with the previous round's removals).
                if i % 2:
                    b, a = await interleave(raw, ours, n=1, warmup=0)
                else:
                    a, b = await interleave(ours, raw, n=1, warmup=0)
                z = await timed(fair)
                w = await timed(create_start_fill) if name.endswith("resume") else 0.0
                d = await timed(create_start_on_disk) if name.endswith("resume") else 0.0
                if i:
                    xs += a
                    ys += b
                    zs.append(z)
                    if name.endswith("resume"):
                        fill_floor.append(w)
                        disk_floor.append(d)
                await cleanup()
                while loops:
                    subprocess.run(["losetup", "-d", loops.pop()], check=False, capture_output=True)
                while disk_dirs:
                    shutil.rmtree(disk_dirs.pop(), ignore_errors=True)
            fig = summarize(name, xs, ys, target="<=1.25x commit + create", met=lambda r, *_: r <= 1.25)
            fig.extra["raw_hardened_p50"] = statistics.median(zs)
            fig.extra["ratio_vs_hardened"] = fig.ours_p50 / statistics.median(zs)
            if name.endswith("resume"):
                fig.extra["raw_shape_and_fill_p50"] = statistics.median(fill_floor)
                fig.extra["shape_and_fill_over_raw"] = statistics.median(fill_floor) / fig.raw_p50
                fig.extra["raw_disk_shape_p50"] = statistics.median(disk_floor)
                fig.extra["disk_shape_over_raw"] = statistics.median(disk_floor) / fig.raw_p50
            figures.append(fig)
        check = await p.exec(exec_request(source, "sh", "-c", "cat $HOME/proj/f3 | wc -c"))
        assert check.stdout.strip() == b"98304"
        await p.release(ReleaseRequest(**source))
        for key, sid in snaps:
            await p.delete_snapshot(
                DeleteSnapshotRequest(target=rig.target, lease=LEASE, snapshot_allocation_key=key, snapshot_id=sid)
            )
        raw_source.remove(force=True)
        for img in images:
            rig.client.images.remove(img.id, force=True)
        for image_id in serial_ids:
            rig.client.images.remove(image_id, force=True)
        _ = label
    finally:
        left = await rig.close()
    for fig in figures:
        fig.extra["left_behind"] = left
    return figures
