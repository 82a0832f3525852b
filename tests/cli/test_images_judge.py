"""What ``checkfu images prune`` keeps and why, judged against a real journal (the engine's part is in
``tests/providers/docker/test_docker_images_prune.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkfu.cli.images import judge
from checkfu.contract.model import format_timestamp
from checkfu.core.journal import Journal, sqlite_url
from checkfu.providers.docker.images import BuiltImage
from checkfu.testing import memory_envelope

TAG = "runner-judge"
NOW = time.time()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    yield j
    j.close()


def image(image_id: str, kind: str, key: str, **kw: object) -> BuiltImage:
    fields: dict[str, object] = {
        "image_id": image_id,
        "kind": kind,
        "allocation_key": key,
        "runner_tag": TAG,
        "size": 100,
        "unique_size": 10,
        "created": 0,
        "expires_at": None,
        "root_image": None,
    }
    fields.update(kw)
    return BuiltImage(**fields)  # type: ignore[arg-type]


def row(journal: Journal, key: str, kind: str, state: str, expires_at: float | None = None) -> None:
    journal.journal_allocation(
        key,
        run_id="run-1",
        kind=kind,
        target=memory_envelope().target,
        runner_tag=TAG,
        lease_id="l",
        now=NOW,  # type: ignore[arg-type]
    )
    if state != "pending":
        journal.set_allocation(key, state, now=NOW, object_id=key, expires_at=expires_at)  # type: ignore[arg-type]


def verdicts(journal: Journal, built: list[BuiltImage], refs: dict[str, str] | None = None) -> dict[str, str]:
    return {b.image_id: why for b, why in judge(built, refs or {}, journal, NOW)}


def test_snapshots_are_kept_while_the_journal_holds_them_unexpired(journal: Journal) -> None:
    row(journal, "ak-live", "snapshot", "live")
    row(journal, "ak-expired-row", "snapshot", "live", expires_at=NOW - 1)
    row(journal, "ak-released", "snapshot", "released")
    got = verdicts(
        journal,
        [
            image("s-live", "snapshot", "ak-live"),
            image("s-expired-row", "snapshot", "ak-expired-row"),
            image("s-released", "snapshot", "ak-released"),
            image("s-expired-label", "snapshot", "ak-live", expires_at=format_timestamp(NOW - 5)),
            image("s-unknown", "snapshot", "ak-never-journaled"),
        ],
    )
    assert got["s-live"] == "snapshot ak-live is live in the journal"
    assert got["s-expired-row"] == got["s-released"] == got["s-expired-label"] == ""
    assert "never recorded" in got["s-unknown"]


def test_a_materialized_image_is_kept_for_a_kept_snapshot_a_container_or_a_sandbox_being_made(
    journal: Journal,
) -> None:
    row(journal, "ak-snap", "snapshot", "live")
    built = [
        image("s-1", "snapshot", "ak-snap", root_image="m-root"),
        image("m-root", "image", "materialize-a"),
        image("m-run", "image", "materialize-b"),
        image("m-free", "image", "materialize-c"),
        image("c-1", "carrier", "ak-clone"),
    ]
    got = verdicts(journal, built, {"m-run": "container x runs it"})
    assert "ak-snap" in got["m-root"] and got["m-run"] == "container x runs it"
    assert got["m-free"] == got["c-1"] == ""
    row(journal, "ak-clone", "clone", "pending")  # a clone being made: its carrier and any materialized image stay
    got = verdicts(journal, built, {"m-run": "container x runs it"})
    assert got["c-1"] == "allocation ak-clone is pending in the journal"
    assert "being made" in got["m-free"]


def test_snapshots_and_carriers_go_before_the_images_they_were_made_from(journal: Journal) -> None:
    built = [image("m", "image", "materialize-a", created=1), image("s", "snapshot", "ak-x", created=2)]
    row(journal, "ak-x", "snapshot", "released")
    assert [b.image_id for b, _ in judge(built, {}, journal, NOW)] == ["s", "m"]
