"""The images the Docker tier built, what still refers to each, and removing one: for ``checkfu images prune``.

The tier builds three kinds of image, all labelled with an allocation key and a runner tag
(``labels.py``): ``snapshot`` (a snapshot's bytes), ``carrier`` (a clone's areas until the clone
is activated) and ``image`` (a profile materialized with its packages, labelled with the cache
tag). Base images (``checkfu/debian:12``) carry no label and are never listed here.

What refers to an image, as the engine sees it: a container of any tag that runs it, or that
will restore from it at activation (``checkfu.restore``), and a kept snapshot that was taken
from an instance running it (``checkfu.root_image``: resuming the snapshot needs it). What
the journal says (a snapshot still live, an allocation still open) is the caller's to add.

Blocking: call from a worker thread, or from a command that does nothing else meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from checkfu.providers.docker import labels as L

BUILT_KINDS = ("snapshot", "carrier", "image")


@dataclass(frozen=True)
class BuiltImage:
    """One image this tier built, as the engine holds it."""

    image_id: str
    kind: str
    allocation_key: str
    runner_tag: str
    size: int
    """The image's whole size, its base's layers included."""
    unique_size: int
    """What removing it frees: its size less that of the largest other image whose layers it starts with."""
    created: int
    expires_at: str | None
    root_image: str | None


def _labels(info: dict[str, Any]) -> dict[str, str]:
    return dict((info.get("Config") or {}).get("Labels") or {})


def list_built(api: Any, tags: Iterable[str]) -> list[BuiltImage]:
    """Every image labelled with one of ``tags`` as its runner tag, oldest first."""
    infos: dict[str, dict[str, Any]] = {}
    for tag in tags:
        for summary in api.images(filters=L.label_filter(runner_tag=tag)):
            image_id = str(summary["Id"])
            if image_id not in infos:
                try:
                    infos[image_id] = api.inspect_image(image_id)
                except Exception as exc:
                    if getattr(getattr(exc, "response", None), "status_code", None) == 404:
                        continue  # removed meanwhile
                    raise
    layered = {i: tuple((info.get("RootFS") or {}).get("Layers") or ()) for i, info in infos.items()}
    bases = _base_sizes(api, layered) if any(len(v) > 1 for v in layered.values()) else {}
    out = []
    for image_id, info in infos.items():
        labels = _labels(info)
        size = int(info.get("Size") or 0)
        out.append(
            BuiltImage(
                image_id=image_id,
                kind=labels.get(L.KIND, "other"),
                allocation_key=labels.get(L.ALLOCATION_KEY, ""),
                runner_tag=labels.get(L.RUNNER_TAG, ""),
                size=size,
                unique_size=max(0, size - bases.get(image_id, 0)),
                created=_created(info),
                expires_at=labels.get(L.EXPIRES_AT),
                root_image=labels.get(L.ROOT_IMAGE),
            )
        )
    return sorted(out, key=lambda b: (b.created, b.image_id))


def _created(info: dict[str, Any]) -> int:
    raw = str(info.get("Created") or "")
    try:
        return int(datetime.fromisoformat(raw[:26].rstrip("Z") + "+00:00").timestamp())
    except ValueError:
        return 0


def _base_sizes(api: Any, layered: dict[str, tuple[str, ...]]) -> dict[str, int]:
    """For each image of ``layered``, the size of the largest other image on the engine whose layers are a proper
    prefix of its own (its base): the bytes it shares and that removing it does not free."""
    others: list[tuple[tuple[str, ...], int]] = []
    for summary in api.images():
        image_id = str(summary["Id"])
        try:
            info = api.inspect_image(image_id)
        except Exception:  # removed meanwhile: it shares nothing any more
            continue
        others.append((tuple((info.get("RootFS") or {}).get("Layers") or ()), int(info.get("Size") or 0)))
    out: dict[str, int] = {}
    for image_id, layers in layered.items():
        best = 0
        for other, size in others:
            if 0 < len(other) < len(layers) and layers[: len(other)] == other:
                best = max(best, size)
        out[image_id] = best
    return out


def container_references(api: Any) -> dict[str, str]:
    """Image id -> why a container needs it: it runs it, or restores from it at activation. Every container on
    the engine counts, whatever its tag: an image another runner's sandbox runs is not this runner's to take."""
    refs: dict[str, str] = {}
    for c in api.containers(all=True):
        name = str((c.get("Names") or [c.get("Id", "")])[0]).lstrip("/")
        image = str(c.get("ImageID") or "")
        if image:
            refs.setdefault(image, f"container {name} runs it")
        restore = (c.get("Labels") or {}).get(L.RESTORE)
        if restore:
            refs.setdefault(str(restore), f"container {name} restores from it at activation")
    return refs


def remove(api: Any, image_id: str) -> str | None:
    """Remove ``image_id`` (never forced); ``None`` when it is gone, else why the engine kept it."""
    try:
        api.remove_image(image_id, force=False, noprune=False)
    except Exception as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None) or getattr(exc, "status_code", None)
        if status == 404:
            return None
        explanation = str(getattr(exc, "explanation", "") or exc)[:300]
        if status == 409:
            return f"in use ({explanation})"
        return f"the engine refused ({status}: {explanation})"
    return None
