"""Labels and names: how every object the Docker provider creates is found again.

Every container, volume and image (an ``allowlist`` sandbox's egress proxy, door
and socket volume too) carries the contract's owner labels
(``checkfu.contract.labels``: ``checkfu.allocation_key`` and ``checkfu.runner_tag``)
and the Docker-specific ones below. Compensation, release and enumeration find objects
by these labels only, never by an id a caller handed back. Names are derived
from the allocation key, so a retried or foreign call lands on the same name
and is recognised by its labels.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Literal

from checkfu.contract.labels import LABEL_ALLOCATION_KEY, LABEL_RUNNER_TAG, owner_labels

RUNNER_TAG = LABEL_RUNNER_TAG
ALLOCATION_KEY = LABEL_ALLOCATION_KEY
KIND = "checkfu.kind"
TARGET = "checkfu.target"
"""On a volume: the sandbox path it is mounted on."""
SOURCE_KEY = "checkfu.source_allocation_key"
"""On a snapshot or a clone's carrier image: the allocation it was taken from."""
EXPIRES_AT = "checkfu.expires_at"
"""On a snapshot asked with a lifetime: when it expires (RFC 3339, UTC); the provider deletes it after that."""
ROOT_IMAGE = "checkfu.root_image"
"""On a snapshot: the id of the image its instance ran, which resuming it needs (``checkfu images prune`` keeps it)."""
RESTORE = "checkfu.restore"
"""On an instance: the image whose bytes fill its writable areas at activation."""
RETENTION = "checkfu.retention"
MOUNTS = "checkfu.mounts"
"""On an instance: the JSON list of its mount targets (where ``writeFile`` may stage)."""
AREAS = "checkfu.areas"
"""On an instance: the JSON list of its writable paths."""
HOLD = "checkfu.hold"
"""On an instance provisioned *held* (for a warm pool): ``"1"``. It was started and at once paused (frozen) at
``provision``, so its boundary is up and nothing in it runs; ``activate`` thaws it instead of starting it."""
STAGER = "checkfu.stager"
"""On an instance: the name of its staging container, when it has mounts."""
MATERIALIZATION = "checkfu.materialization_digest"
PROXY = "checkfu.proxy"
"""On an ``allowlist`` instance: the name of its egress proxy (its door and socket volume are named alike)."""
ALLOWLIST = "checkfu.allowlist"
"""On an ``allowlist`` instance and its proxy: the JSON list of the destinations it may reach."""

Kind = Literal[
    "instance", "stager", "area", "mount", "snapshot", "carrier", "image", "proxy", "companion", "egress", "handle"
]
KINDS: tuple[Kind, ...] = (
    "instance",
    "stager",
    "area",
    "mount",
    "snapshot",
    "carrier",
    "image",
    "proxy",
    "companion",
    "egress",
    "handle",
)


def object_labels(allocation_key: str, runner_tag: str, kind: Kind, **extra: str) -> dict[str, str]:
    """The labels of one object: its owner's (allocation key, runner tag), its kind, plus ``extra``."""
    return {**owner_labels(allocation_key, runner_tag), KIND: kind, **extra}


def label_filter(
    *, allocation_key: str | None = None, runner_tag: str | None = None, kind: Kind | None = None, **extra: str
) -> dict[str, list[str]]:
    """A Docker ``filters`` value matching every given label (all must hold)."""
    wanted: list[str] = []
    if allocation_key is not None:
        wanted.append(f"{ALLOCATION_KEY}={allocation_key}")
    if runner_tag is not None:
        wanted.append(f"{RUNNER_TAG}={runner_tag}")
    if kind is not None:
        wanted.append(f"{KIND}={kind}")
    wanted.extend(f"{k}={v}" for k, v in extra.items())
    return {"label": wanted}


def instance_name(allocation_key: str) -> str:
    """The container name (and instance id) of the allocation ``allocation_key``."""
    return "checkfu-" + hashlib.sha256(allocation_key.encode()).hexdigest()[:32]


def stager_name(instance: str) -> str:
    return f"{instance}-stage"


def mount_volume(instance: str, index: int) -> str:
    return f"{instance}-m{index}"


def kind_of(labels: Mapping[str, str] | None) -> Kind | None:
    value = (labels or {}).get(KIND)
    for kind in KINDS:
        if kind == value:
            return kind
    return None


def json_list(labels: Mapping[str, str] | None, name: str) -> tuple[str, ...]:
    """A label holding a JSON list of strings; empty when absent or malformed."""
    raw = (labels or {}).get(name)
    if not raw:
        return ()
    try:
        value = json.loads(raw)
    except ValueError:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return ()
    return tuple(value)


def dump_list(values: tuple[str, ...]) -> str:
    return json.dumps(list(values), separators=(",", ":"))
