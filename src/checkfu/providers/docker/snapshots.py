"""Snapshots of the writable areas, held on this host by the engine (runner custody).

With a read-only root, everything a sandbox can change lives in its writable
areas; committing the container's layer would capture nothing. So a snapshot
reads every area through the archive API while the sandbox is paused (as
``docker commit`` pauses), re-roots the entries under the area's path, and
imports them as one single-layer image labelled with the snapshot's allocation
key and runner tag, the allocation it came from, and ``checkfu.kind=snapshot``.
Entries under a mount target are left out: mounts are staged again by the runner.

A clone uses the same capture as a ``carrier`` image labelled with the clone's
own allocation key, consumed (deleted) when the clone is activated.

Restore reads the image back (``docker save``), splits its layer by area and
uploads each part into the started sandbox's area. Device nodes are dropped and
set-id bits cleared on the way in.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from checkfu.contract.errors import SandboxNotFound, SandboxProviderFailed
from checkfu.contract.paths import is_within
from checkfu.providers.docker.archive import open_path

SPOOL_BYTES = 32 << 20
SETID = 0o6000


@contextlib.contextmanager
def paused(api: Any, container: str) -> Iterator[None]:
    """Freeze every process of ``container`` for the duration; thaw it whatever happens."""
    api.pause(container)
    try:
        yield
    finally:
        api.unpause(container)


def _excluded(path: str, excluded: tuple[str, ...]) -> bool:
    return any(is_within(path, root) for root in excluded)


def _fetch(api: Any, container: str, area: str) -> IO[bytes]:
    """The engine's archive of ``area``, spooled."""
    opened = open_path(api, container, area)
    if opened is None:
        raise SandboxProviderFailed(f"snapshot: writable area {area!r} is missing from the sandbox")
    _, response = opened
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115 (returned to the caller)
    try:
        shutil.copyfileobj(response.raw, spool)
    except BaseException:
        spool.close()
        raise
    finally:
        response.close()
    spool.seek(0)
    return spool


def fetch_all(api: Any, container: str, areas: tuple[str, ...]) -> list[IO[bytes]]:
    """The archives of every area, fetched at once (each archive request costs the engine a helper process)."""
    with ThreadPoolExecutor(max_workers=max(1, len(areas))) as pool:
        futures = [pool.submit(_fetch, api, container, area) for area in areas]
        done: list[IO[bytes]] = []
        try:
            for future in futures:
                done.append(future.result())
        except BaseException:
            for f in done:
                f.close()
            for future in futures:
                if future.done() and not future.exception():
                    future.result().close()
            raise
    return done


def combine(archives: list[IO[bytes]], areas: tuple[str, ...], excluded: tuple[str, ...], out: IO[bytes]) -> int:
    """Write one archive of every area (names re-rooted at ``/``, mounts left out) to ``out``; the entry count."""
    count = 0
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as writer:
        for area, archive in zip(areas, archives, strict=True):
            prefix = area.lstrip("/")
            with tarfile.open(fileobj=archive, mode="r|") as reader:
                for member in reader:
                    _, sep, rel = member.name.rstrip("/").partition("/")
                    if not sep or not rel or _excluded(f"{area}/{rel}", excluded):
                        continue
                    member.name = f"{prefix}/{rel}"
                    if member.islnk():
                        _, _, target = member.linkname.partition("/")
                        member.linkname = f"{prefix}/{target}"
                    data = reader.extractfile(member) if member.isreg() else None
                    writer.addfile(member, data)
                    count += 1
    return count


def import_image(api: Any, data: IO[bytes], labels: dict[str, str]) -> str:
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


def take(api: Any, container: str, areas: tuple[str, ...], excluded: tuple[str, ...], labels: dict[str, str]) -> str:
    """Capture the areas of ``container`` (paused while they are read) as an image labelled ``labels``; its id."""
    with contextlib.ExitStack() as stack:
        with paused(api, container):
            archives = fetch_all(api, container, areas)
        for archive in archives:
            stack.callback(archive.close)
        spool = stack.enter_context(tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES))
        combine(archives, areas, excluded, spool)
        spool.seek(0)
        return import_image(api, spool, labels)


def _copy_layer(saved: IO[bytes], out: IO[bytes]) -> None:
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
        shutil.copyfileobj(layer, out)
    out.seek(0)


def restore(api: Any, image: str, container: str, areas: tuple[str, ...], excluded: tuple[str, ...]) -> int:
    """Fill the areas of running ``container`` from image ``image``; the number of entries restored.

    Raises:
        SandboxNotFound: the image is gone.
    """
    count = 0
    with contextlib.ExitStack() as stack:
        saved = stack.enter_context(tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES))
        try:
            for chunk in api.get_image(image):
                saved.write(chunk)
        except Exception as exc:
            if getattr(exc, "status_code", None) == 404:
                raise SandboxNotFound(f"restore: image {image[:19]} is gone") from exc
            raise
        saved.seek(0)
        layer = stack.enter_context(tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES))
        _copy_layer(saved, layer)
        parts = {area: stack.enter_context(tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)) for area in areas}
        writers = {
            area: stack.enter_context(tarfile.open(fileobj=f, mode="w|", format=tarfile.PAX_FORMAT))
            for area, f in parts.items()
        }
        with tarfile.open(fileobj=layer, mode="r|") as reader:
            for member in reader:
                name = "/" + member.name.rstrip("/").removeprefix("./")
                area = next((a for a in areas if is_within(name, a) and name != a), None)
                if area is None or _excluded(name, excluded) or member.isdev():
                    continue
                member.name = name[len(area) + 1 :]
                member.mode &= ~SETID
                if member.islnk():
                    link = "/" + member.linkname.removeprefix("./")
                    if not is_within(link, area):
                        continue
                    member.linkname = link[len(area) + 1 :]
                data = reader.extractfile(member) if member.isreg() else None
                writers[area].addfile(member, data)
                count += 1
        for writer in writers.values():
            writer.close()
        for part in parts.values():
            part.seek(0)
        with ThreadPoolExecutor(max_workers=max(1, len(areas))) as pool:
            for future in [pool.submit(api.put_archive, container, area, parts[area]) for area in areas]:
                future.result()
    return count
