"""Snapshots of the writable areas, held on this host by the engine (runner custody).

With a read-only root, everything a sandbox can change lives in its writable
areas; committing the container's layer would capture nothing. So a snapshot
reads the areas through the archive API while the sandbox is paused (as
``docker commit`` pauses), re-roots the entries under the area's path, and
imports them as one single-layer image labelled with the snapshot's allocation
key and runner tag, the allocation it came from, and ``checkfu.kind=snapshot``.
Entries under a mount target are left out: mounts are staged again by the runner.

One archive request, not one per area: the engine holds a container's lock for
the whole of an archive request (until its body is read) and starts a helper
process for each, so requests for several areas of one container run one after
another. Instead, a *handle* is created for the call: a container that is never
started, labelled ``checkfu.kind=handle`` with the sandbox's allocation key,
which mounts each area's volume below one directory,
``HANDLE_ROOT/<index>``. One archive of that directory holds every area. The
sandbox's own mounts are not on the handle, so nothing of a mount can be read
or written through it. An instance has at most one handle (``handle_name``),
made at its first snapshot or clone, or at the activation that restores it, and
kept for the next: it is removed with the instance (``release``, ``compensate``).

A clone uses the same capture, kept as a *carrier* file in the provider's state
directory, named after the clone's instance and runner tag (as staged writes are),
written once the clone's container exists (so reclaiming its allocation key
finds and removes it) and consumed (deleted) when the clone is activated. It
never becomes an image: importing it only to read it back at activation cost
an import, a ``docker save`` and an image removal. (A clone made before this
carries an image labelled ``checkfu.kind=carrier``; such a clone still activates.)

Restore reads the image back (``docker save``), takes its one layer, keeps
what belongs in an area (device nodes dropped, set-id bits cleared, hard links
kept only within their area) and uploads it in one request into a handle on the
started sandbox's area volumes.
"""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, cast

import docker.types

from checkfu.contract.errors import SandboxNotFound, SandboxProviderFailed
from checkfu.contract.paths import is_within
from checkfu.providers.docker.archive import open_path

SPOOL_BYTES = 32 << 20
CARRIER = "carrier-file"
"""The ``checkfu.restore`` label of a clone whose areas come from its carrier file, not from an image."""
SETID = 0o6000
HANDLE_ROOT = "/.checkfu-areas"
"""Where a handle mounts the areas: area ``i`` (in the instance's order) at ``HANDLE_ROOT/i``."""


def area_volumes(info: Mapping[str, Any], areas: tuple[str, ...]) -> tuple[str, ...]:
    """The names of the volumes the container (its ``inspect``) mounts at ``areas``, in that order.

    Raises:
        SandboxProviderFailed: an area has no volume on the container.
    """
    by_target = {m.get("Destination"): m.get("Name") for m in info.get("Mounts") or [] if m.get("Type") == "volume"}
    names = []
    for area in areas:
        name = by_target.get(area)
        if not name:
            raise SandboxProviderFailed(f"snapshot: writable area {area!r} has no volume on the sandbox")
        names.append(str(name))
    return tuple(names)


def handle_spec(
    api: Any, *, name: str, image: str, volumes: tuple[str, ...], labels: dict[str, str], read_only: bool
) -> dict[str, Any]:
    """A container that is never started: the area volumes ``volumes`` below ``HANDLE_ROOT``, nothing else."""
    mounts = [
        docker.types.Mount(target=f"{HANDLE_ROOT}/{i}", source=v, type="volume", read_only=read_only, no_copy=True)
        for i, v in enumerate(volumes)
    ]
    host_config = api.create_host_config(
        mounts=mounts, network_mode="none", log_config=docker.types.LogConfig(type="none")
    )
    return {
        "image": image,
        "command": ["true"],
        "name": name,
        "labels": labels,
        "host_config": host_config,
        "network_disabled": True,
    }


def handle_name(instance: str) -> str:
    """The name of ``instance``'s handle (one per instance, so a retried or concurrent create lands on it)."""
    return f"{instance}-areas"


def _mounted(info: Mapping[str, Any]) -> list[tuple[str, str]]:
    return sorted((str(m.get("Destination")), str(m.get("Name"))) for m in info.get("Mounts") or [])


def create_handle(api: Any, config: dict[str, Any]) -> None:
    """Create a handle from ``handle_spec``'s configuration. One of that name already there (a concurrent
    capture's) is kept when it mounts the same volumes, and otherwise (one left by a crash) made again."""
    try:
        api.create_container(**config)
        return
    except Exception as exc:
        if getattr(exc, "status_code", None) != 409:
            raise
    wanted = sorted((m["Target"], m["Source"]) for m in config["host_config"]["Mounts"])
    if _mounted(api.inspect_container(config["name"])) == wanted:
        return
    remove_handle(api, config["name"])
    api.create_container(**config)


def remove_handle(api: Any, handle: str) -> None:
    """Remove a handle container; one already gone is fine."""
    try:
        api.remove_container(handle, force=True)
    except Exception as exc:
        if getattr(exc, "status_code", None) != 404:
            raise


def _excluded(path: str, excluded: tuple[str, ...]) -> bool:
    return any(is_within(path, root) for root in excluded)


def _open(api: Any, config: dict[str, Any]) -> Any:
    """The open response streaming the archive of every area on the handle ``config`` makes; a handle found
    gone is made again (once). The caller closes it."""
    opened = open_path(api, config["name"], HANDLE_ROOT)
    if opened is None:
        create_handle(api, config)
        opened = open_path(api, config["name"], HANDLE_ROOT)
    if opened is None:
        raise SandboxProviderFailed("snapshot: the writable areas are missing from the sandbox")
    return opened[1]


class _Pipe:
    """Bytes written in one thread and read, as an iterable of chunks, in another (a chunked request body).

    ``fail`` ends the reading side with the writer's error (so the request is cut short, never sent as if
    complete); ``abandon`` (the reading side gone) makes the next write raise ``BrokenPipeError``.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=64)
        self._abandoned = threading.Event()

    def _put(self, item: bytes | BaseException | None) -> None:
        while not self._abandoned.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return
            except queue.Full:
                continue
        raise BrokenPipeError("the reader of the pipe is gone")

    def write(self, data: bytes) -> int:
        self._put(bytes(data))
        return len(data)

    def close(self) -> None:
        self._put(None)

    def fail(self, exc: BaseException) -> None:
        with contextlib.suppress(BrokenPipeError):
            self._put(exc)

    def abandon(self) -> None:
        self._abandoned.set()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise SandboxProviderFailed("snapshot: reading the writable areas failed") from item
            yield item


def _import_from(api: Any, pipe: _Pipe, labels: dict[str, str]) -> str:
    try:
        return import_image(api, pipe, labels)
    finally:
        pipe.abandon()


def _area_of(name: str, areas: tuple[str, ...]) -> tuple[str, str] | None:
    """``(area, rel)`` of a handle archive entry ``.checkfu-areas/<i>/<rel>``; ``None`` for an area's root."""
    parts = name.strip("/").split("/", 2)
    if len(parts) < 3 or not parts[1].isdigit() or int(parts[1]) >= len(areas) or not parts[2]:
        return None
    return areas[int(parts[1])], parts[2]


def combine(archive: IO[bytes], areas: tuple[str, ...], excluded: tuple[str, ...], out: IO[bytes]) -> int:
    """Write one archive of every area (names re-rooted at ``/``, mounts left out) to ``out``; the entry count.

    ``archive`` is a handle's archive of ``HANDLE_ROOT`` (area ``i`` under ``<i>/``).
    """
    count = 0
    with (
        tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as writer,
        tarfile.open(fileobj=archive, mode="r|") as reader,
    ):
        for member in reader:
            found = _area_of(member.name, areas)
            if found is None:
                continue
            area, rel = found
            if _excluded(f"{area}/{rel}", excluded):
                continue
            member.name = f"{area.lstrip('/')}/{rel}"
            if member.islnk():
                link = _area_of(member.linkname, areas)
                if link is None or link[0] != area:
                    continue
                member.linkname = f"{area.lstrip('/')}/{link[1]}"
            data = reader.extractfile(member) if member.isreg() else None
            writer.addfile(member, data)
            count += 1
    return count


def import_image(api: Any, data: IO[bytes] | Iterable[bytes], labels: dict[str, str]) -> str:
    """Import ``data`` as a single-layer image with ``labels``; its id."""
    changes = [f"LABEL {key}={json.dumps(value)}" for key, value in sorted(labels.items())]
    answer = api.import_image_from_data(data, changes=changes)
    for line in str(answer).splitlines():
        try:
            status = json.loads(line).get("status", "")
        except (ValueError, AttributeError):
            continue
        if isinstance(status, str) and status.startswith("sha256:"):
            return status
    raise SandboxProviderFailed("snapshot: the engine did not report the imported image's id")


def take(
    api: Any,
    container: str,
    areas: tuple[str, ...],
    excluded: tuple[str, ...],
    labels: dict[str, str],
    handle: dict[str, Any],
    fresh: bool = True,
) -> str:
    """Capture the areas of ``container`` (paused while they are read) as an image labelled ``labels``; its id.

    ``handle`` is the ``handle_spec`` configuration of the container's handle; a ``fresh`` one is created
    first, while the sandbox is being paused (and one found gone is made again). The archive streams into
    the import as it is read and re-rooted (the engine builds the layer meanwhile, rather than after); the
    sandbox is thawed once it is read, while the import finishes. A failure to thaw it fails the call (and
    the image is removed); a read cut short cuts the import's body short, so no image is made of it.
    """
    pipe = _Pipe()
    if areas:  # the first bytes go at once, so the engine sets the import up while the areas are being read
        pipe.write(_area_entry(areas[0]))
    with ThreadPoolExecutor(max_workers=3) as pool:
        importing = pool.submit(_import_from, api, pipe, labels)
        created = pool.submit(create_handle, api, handle) if fresh else None
        try:
            api.pause(container)
            try:
                if created is not None:
                    created.result()
                response = _open(api, handle)
                try:
                    combine(response.raw, areas, excluded, cast(IO[bytes], pipe))  # tarfile only writes to it
                finally:
                    response.close()
            finally:
                thawed = pool.submit(api.unpause, container)  # the pool's exit waits for it
            pipe.close()
        except BaseException as exc:
            pipe.fail(exc)  # the import's body is cut short: it fails, and makes no image
            if isinstance(exc, BrokenPipeError):
                importing.result()  # the import stopped reading: its own error is the one to tell
            raise
        try:
            image = importing.result()
        except BaseException:
            thawed.exception()
            raise
        try:
            thawed.result()
        except BaseException:
            with contextlib.suppress(Exception):
                api.remove_image(image)
            raise
        return image


def _area_entry(area: str) -> bytes:
    """The archive entry of an area's own directory (which a restore leaves alone, as every area's root)."""
    info = tarfile.TarInfo(area.strip("/"))
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = 0
    return info.tobuf(format=tarfile.PAX_FORMAT)


def capture(
    api: Any,
    container: str,
    areas: tuple[str, ...],
    excluded: tuple[str, ...],
    handle: dict[str, Any],
    fresh: bool,
    out: IO[bytes],
) -> int:
    """Capture the areas of ``container`` (paused while they are read) into ``out``, as ``take`` into an
    image's layer; the entry count. (A clone's carrier, which never needs to be an image.)"""
    with ThreadPoolExecutor(max_workers=1) as pool:
        created = pool.submit(create_handle, api, handle) if fresh else None
        api.pause(container)
        try:
            if created is not None:
                created.result()
            response = _open(api, handle)
            try:
                return combine(response.raw, areas, excluded, out)
            finally:
                response.close()
        finally:
            api.unpause(container)


def _layer(saved: IO[bytes], out: IO[bytes]) -> None:
    """Copy the one layer of a saved single-layer image (legacy or OCI layout) to ``out``."""
    with tarfile.open(fileobj=saved, mode="r:") as outer:
        manifest_file = outer.extractfile("manifest.json")
        if manifest_file is None:
            raise SandboxProviderFailed("restore: the saved image has no manifest")
        manifest = json.load(manifest_file)
        layers = manifest[0]["Layers"] if manifest else []
        if len(layers) != 1:
            raise SandboxProviderFailed(f"restore: a snapshot image has one layer, this one has {len(layers)}")
        layer = outer.extractfile(layers[0])
        if layer is None:
            raise SandboxProviderFailed("restore: the saved image's layer is not a file")
        shutil.copyfileobj(layer, out, 1 << 20)
    out.seek(0)


def split(layer: IO[bytes], areas: tuple[str, ...], excluded: tuple[str, ...]) -> tuple[IO[bytes], int]:
    """The archive to upload into a handle's ``HANDLE_ROOT`` to fill ``areas`` from ``layer`` (an archive of
    entries under the areas' paths: area ``i`` goes under ``<i>/``; mounts, device nodes, area roots and links
    out of their area left out, set-id bits cleared), and its entry count. The caller closes it."""
    out = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115 (returned to the caller)
    try:
        count = 0
        with (
            tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as writer,
            tarfile.open(fileobj=layer, mode="r|") as reader,
        ):
            for member in reader:
                name = "/" + member.name.rstrip("/").removeprefix("./")
                index = next((i for i, a in enumerate(areas) if is_within(name, a) and name != a), None)
                if index is None or _excluded(name, excluded) or member.isdev():
                    continue
                area = areas[index]
                member.name = f"{index}/{name[len(area) + 1 :]}"
                # no set-id file; a directory keeps set-group-id, so what is made in it stays the sandbox user's group
                member.mode &= ~(0o4000 if member.isdir() else SETID)
                if member.islnk():
                    link = "/" + member.linkname.removeprefix("./")
                    if not is_within(link, area) or link == area:
                        continue
                    member.linkname = f"{index}/{link[len(area) + 1 :]}"
                data = reader.extractfile(member) if member.isreg() else None
                writer.addfile(member, data)
                count += 1
        out.seek(0)
        return out, count
    except BaseException:
        out.close()
        raise


def load(api: Any, image: str, areas: tuple[str, ...], excluded: tuple[str, ...]) -> tuple[IO[bytes], int]:
    """``split`` of the one layer of image ``image`` (``docker save``). The caller closes what it returns.

    Raises:
        SandboxNotFound: the image is gone.
    """
    with contextlib.ExitStack() as stack:
        saved = stack.enter_context(tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES))
        try:
            for chunk in api.get_image(image, chunk_size=1 << 20):
                saved.write(chunk)
        except Exception as exc:
            if getattr(exc, "status_code", None) == 404:
                raise SandboxNotFound(f"restore: image {image[:19]} is gone") from exc
            raise
        saved.seek(0)
        layer = stack.enter_context(tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES))
        _layer(saved, layer)
        saved.close()
        return split(layer, areas, excluded)


def load_carrier(path: Path, areas: tuple[str, ...], excluded: tuple[str, ...]) -> tuple[IO[bytes], int]:
    """``split`` of a clone's carrier file (``capture``).

    Raises:
        SandboxNotFound: the file is gone (the clone was reclaimed, or made on another host's state).
    """
    try:
        f = path.open("rb")
    except FileNotFoundError as exc:
        raise SandboxNotFound(f"restore: the clone's carrier {path.name} is gone") from exc
    with f:
        return split(f, areas, excluded)


def fill(api: Any, handle: str, data: IO[bytes]) -> None:
    """Upload ``load``'s archive into a writable handle's areas."""
    api.put_archive(handle, HANDLE_ROOT, data)
