"""``checkfu images prune``: remove the images checkfu built that nothing refers to any more.

Only images labelled with this runner's tag are considered (``--cache`` adds the Docker tier's
shared cache tag, under which materialized images are kept); anything else on the engine, base
images included, is never touched. An image is kept while anything refers to it:

- a container (of any runner) runs it, or restores from it when it is activated;
- it is a snapshot this journal still holds and that has not expired;
- it is the carrier of a clone this journal still holds open;
- a kept snapshot was taken from a sandbox running it (resuming the snapshot needs it);
- (a materialized image) a sandbox of this runner is being made at this moment.

A snapshot image this journal never recorded is kept too: it is another journal's. Removal is never
forced: an image the engine finds in use at that moment is kept and reported.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.markup import escape

from checkfu.cli.common import DbOpt, human_bytes
from checkfu.cli.consoles import console
from checkfu.cli.state import open_journal, runner_tag
from checkfu.contract.lifecycle import OPEN_ROW_STATES
from checkfu.contract.model import parse_timestamp
from checkfu.core.journal import Journal
from checkfu.providers.docker.engine import Engine, require_engine
from checkfu.providers.docker.images import BuiltImage, container_references, list_built, remove

CACHE_TAG = "checkfu-cache"
"""The runner tag the Docker tier labels materialized images with unless told another (its ``cache_tag``)."""

images_app = typer.Typer(help="The images checkfu built.", no_args_is_help=True)
err = console(stderr=True, highlight=False, soft_wrap=True)


@dataclass
class Verdict:
    image: BuiltImage
    action: str
    """``removed``, ``would_remove``, ``kept`` or ``failed``."""
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.image.image_id,
            "kind": self.image.kind,
            "allocation_key": self.image.allocation_key,
            "runner_tag": self.image.runner_tag,
            "bytes": self.image.unique_size,
            "action": self.action,
            "reason": self.reason,
        }


def _expired(stamp: str | None, now: float) -> bool:
    if not stamp:
        return False
    try:
        return parse_timestamp(stamp) <= now
    except ValueError:
        return False


def judge(built: list[BuiltImage], refs: dict[str, str], journal: Journal, now: float) -> list[tuple[BuiltImage, str]]:
    """Each image with why it is kept (``""``: nothing refers to it any more)."""
    rows = {b.allocation_key: journal.allocation(b.allocation_key) for b in built if b.allocation_key}
    kept_snapshots: list[BuiltImage] = []
    verdicts: dict[str, str] = {}
    for b in built:
        if b.kind != "snapshot":
            continue
        row = rows.get(b.allocation_key)
        if b.image_id in refs:
            verdicts[b.image_id] = refs[b.image_id]
        elif _expired(b.expires_at, now):
            verdicts[b.image_id] = ""
        elif row is None:
            verdicts[b.image_id] = "a snapshot this journal never recorded (another journal's)"
        elif row.state in OPEN_ROW_STATES and (row.expires_at is None or row.expires_at > now):
            verdicts[b.image_id] = f"snapshot {b.allocation_key} is {row.state} in the journal"
        else:
            verdicts[b.image_id] = ""
        if verdicts[b.image_id]:
            kept_snapshots.append(b)
    roots = {s.root_image for s in kept_snapshots if s.root_image}
    unknown_root = [s for s in kept_snapshots if not s.root_image]
    tags = {b.runner_tag for b in built}
    in_flight = [
        r
        for tag in sorted(tags)
        for r in journal.open_allocations(runner_tag=tag)
        if r.state == "pending" and r.kind in ("instance", "clone", "resume")
    ]
    for b in built:
        if b.kind == "snapshot":
            continue
        row = rows.get(b.allocation_key)
        if b.image_id in refs:
            verdicts[b.image_id] = refs[b.image_id]
        elif b.kind == "image" and b.image_id in roots:
            needs = next(s for s in kept_snapshots if s.root_image == b.image_id)
            verdicts[b.image_id] = f"kept snapshot {needs.allocation_key} was taken from it (resuming needs it)"
        elif b.kind == "image" and in_flight:
            verdicts[b.image_id] = f"sandbox {in_flight[0].allocation_key} is being made now (it may run this image)"
        elif b.kind == "image" and unknown_root:
            verdicts[b.image_id] = (
                f"kept snapshot {unknown_root[0].allocation_key} does not say which image it needs (taken before "
                "snapshots were labelled with it)"
            )
        elif b.kind != "image" and row is not None and row.state in OPEN_ROW_STATES:
            verdicts[b.image_id] = f"allocation {b.allocation_key} is {row.state} in the journal"
        else:
            verdicts[b.image_id] = ""
    order = {"snapshot": 0, "carrier": 1}
    return sorted(((b, verdicts[b.image_id]) for b in built), key=lambda p: (order.get(p[0].kind, 2), p[0].created))


@images_app.command("prune")
def images_prune(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="list what would be removed; remove nothing")] = False,
    cache: Annotated[
        bool,
        typer.Option(
            "--cache",
            help=f"also the materialized images of the shared cache tag {CACHE_TAG!r} (every runner on this engine "
            "shares them; one a sandbox runs is kept)",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object instead of a summary")] = False,
    db: DbOpt = None,
) -> None:
    """Remove the images checkfu built under this runner's tag (snapshots, clone carriers, materialized images)
    that nothing refers to any more: no sandbox runs or restores from it, no unexpired snapshot in the journal
    needs it. Images without this runner's tag are never touched. Exits 1 when an image could not be removed."""
    journal = open_journal(db)  # sweeps expired snapshots first
    try:
        tag = runner_tag(db)
        tags = [tag, CACHE_TAG] if cache and tag != CACHE_TAG else [tag]
        require_engine()
        engine = Engine(workers=2)
        try:
            api = engine.api
            built = list_built(api, tags)
            judged = judge(built, container_references(api), journal, time.time())
            verdicts = []
            for image, kept in judged:
                if kept:
                    verdicts.append(Verdict(image, "kept", kept))
                    continue
                if dry_run:
                    verdicts.append(Verdict(image, "would_remove", "nothing refers to it"))
                else:
                    refused = remove(api, image.image_id)
                    verdicts.append(
                        Verdict(image, "failed" if refused else "removed", refused or "nothing refers to it")
                    )
                if not as_json:
                    _progress(verdicts[-1])
        finally:
            engine.close()
    finally:
        journal.close()
    removed = [v for v in verdicts if v.action == "removed"]
    would = [v for v in verdicts if v.action == "would_remove"]
    kept_list = [v for v in verdicts if v.action == "kept"]
    failed = [v for v in verdicts if v.action == "failed"]
    reclaimed = sum(v.image.unique_size for v in removed)
    if as_json:
        print(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "runner_tags": tags,
                    "images": [v.as_json() for v in verdicts],
                    "removed": len(removed),
                    "would_remove": len(would),
                    "kept": len(kept_list),
                    "failed": len(failed),
                    "reclaimed_bytes": reclaimed,
                    "reclaimable_bytes": sum(v.image.unique_size for v in would),
                }
            )
        )
    else:
        for v in kept_list:
            err.print(f"kept {escape(_short(v.image))}: {escape(v.reason)}")
        if dry_run:
            reclaimable = human_bytes(sum(v.image.unique_size for v in would))
            err.print(
                f"would remove {len(would):d} image(s), reclaiming {escape(reclaimable)}"
                f"; {len(kept_list):d} kept (run without --dry-run to remove them)"
            )
        else:
            err.print(
                f"removed {len(removed):d} image(s), reclaimed {escape(human_bytes(reclaimed))}; "
                f"{len(kept_list):d} kept"
            )
        if failed:
            err.print(
                f"[bold red]not removed[/]: {len(failed):d} image(s) the engine kept (listed above); "
                "run `checkfu images prune` again once nothing uses them"
            )
    if failed:
        raise typer.Exit(1)


def _short(image: BuiltImage) -> str:
    key = f" {image.allocation_key}" if image.allocation_key else ""
    return f"{image.image_id.removeprefix('sha256:')[:12]} {image.kind}{key} ({human_bytes(image.unique_size)})"


def _progress(v: Verdict) -> None:
    if v.action == "removed":
        err.print(f"removed {escape(_short(v.image))}")
    elif v.action == "would_remove":
        err.print(f"would remove {escape(_short(v.image))}")
    elif v.action == "failed":
        err.print(f"[bold red]failed[/] {escape(_short(v.image))}: {escape(v.reason)}")
