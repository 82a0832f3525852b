"""The grade card says what the envelope declares beyond the nine required members (its optional members and
lifecycle assurances) and which of them conformance exercised: held or failed in which case, from the report
run now or the evidence recorded at enrollment; otherwise not exercised, and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checkfu.conformance.evidence import generate_keys, load_private_key, load_public_key, sign
from checkfu.conformance.suite import Suite, default_profile, run_suite
from checkfu.control.enrollment import enroll
from checkfu.control.grading import grade, grade_envelope, render_html, render_text
from checkfu.core.door import ProviderDoor
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Adapter, describe
from checkfu.testing import MemoryProvider, day_one_envelope, memory_envelope
from checkfu.testing.misbehave import Misbehaving, unsupported
from checkfu.testing.served import serve_in_thread

pytestmark = pytest.mark.anyio

CHECKFU = Path(sys.executable).with_name("checkfu")
MEMORY_DECLARES = [
    "openProcess",
    "readFiles",
    "listDir",
    "listAllocations",
    "snapshot",
    "deleteSnapshot",
    "clone",
    "resume",
    "release_destroys",
    "release_idempotent",
    "reaps_process_tree",
    "cold_compensation",
    "enumerates_allocations",
]


def rows(card: Any) -> dict[str, dict[str, Any]]:
    return {d["item"]: d for d in card.declared}


def test_without_conformance_every_declared_item_is_not_exercised_and_nothing_else_is_listed() -> None:
    card = grade_envelope(memory_envelope())
    assert [d["item"] for d in card.declared] == MEMORY_DECLARES
    assert all(d["exercised"] == "not exercised" and "no conformance recorded" in d["why"] for d in card.declared)
    day_one = grade_envelope(day_one_envelope())
    assert [(d["item"], d["declared_by"]) for d in day_one.declared] == [
        ("release_destroys", "lifecycle_assurances.release_destroys")
    ]
    assert "not exercised" in "\n".join(render_text(card))


async def test_a_report_run_now_says_what_held_and_what_could_not_be_exercised() -> None:
    report = await run_suite("memory")
    card = grade_envelope(memory_envelope(), conformance=report.as_json())
    found = rows(card)
    assert {item: d["exercised"] for item, d in found.items() if d["exercised"] == "held"} == dict.fromkeys(
        [i for i in MEMORY_DECLARES if i != "cold_compensation"], "held"
    )
    assert (found["openProcess"]["case"], found["listAllocations"]["case"], found["clone"]["case"]) == (2, 4, 7)
    assert found["cold_compensation"]["exercised"] == "not exercised"
    assert "cannot make a provider lose its records" in found["cold_compensation"]["why"]
    page = render_html(card)
    assert '<table id="declared">' in page and page.count("<tr class='held'>") == 12
    assert card.as_json()["declared"] == card.declared


async def test_a_provider_answering_501_shows_both_members_failed_in_case_2() -> None:
    double = Misbehaving(MemoryProvider(), {"openProcess": unsupported, "readFiles": unsupported})
    with serve_in_thread(double) as remote:
        envelope = await describe(ProviderDoor(remote, source=remote.url))
        adapter = Adapter(envelope=envelope, provider=remote, source=remote.url)
        report = await Suite(adapter, default_profile(envelope), remote.url).run()
        await remote.aclose()
    found = rows(grade_envelope(envelope, conformance=report.as_json()))
    for member in ("openProcess", "readFiles"):
        assert (found[member]["exercised"], found[member]["case"]) == ("failed", 2)
        assert "SandboxOperationUnsupported" in found[member]["why"]
    assert found["listDir"]["exercised"] == "held"


def test_a_record_of_another_envelope_or_an_older_suite_exercised_nothing() -> None:
    old = {
        "suite_version": "checkfu-conformance 1",
        "envelope_digest": grade_envelope(memory_envelope()).envelope_digest,
        "tally": {"pass": 8, "fail": 0, "skip": 1},
        "cases": [{"number": n, "name": "?", "outcome": "pass", "reason": "ok"} for n in range(1, 9)],
    }
    found = rows(grade_envelope(memory_envelope(), conformance=old))
    assert all(d["exercised"] == "not exercised" for d in found.values())
    assert "recorded by checkfu-conformance 1, which does not say what it exercised" in found["openProcess"]["why"]
    other = {**old, "envelope_digest": "sha256:" + "0" * 64}
    found = rows(grade_envelope(memory_envelope(), conformance=other))
    assert found["readFiles"]["why"] == "the recorded conformance is of another envelope"


def test_reaping_without_open_process_says_what_it_would_need() -> None:
    env = memory_envelope().model_copy(update={"operations": ("readFiles", "listAllocations")})
    report = {
        "envelope_digest": grade_envelope(env).envelope_digest,
        "cases": [{"number": 4, "outcome": "pass", "reason": "ok", "exercised": ["release_destroys"], "faulted": []}],
    }
    found = rows(grade_envelope(env, conformance=report))
    assert found["reaps_process_tree"]["why"] == "needs openProcess, to watch a process across release"


async def test_enrolled_evidence_is_what_the_card_shows(tmp_path: Path) -> None:
    private, public = generate_keys(tmp_path / "keys" / "conformance")
    report = await run_suite("memory")
    signed = json.dumps(sign(report, load_private_key(private))).encode()
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    try:
        enrolled = await enroll(journal, "memory", signed, load_public_key(public), credentials_dir=tmp_path / "cr")
        card = grade(enrolled.adapter, enrollment=journal.enrollment(enrolled.adapter.target))
    finally:
        journal.close()
    assert card.conformance["source"] == "enrollment evidence"
    found = rows(card)
    assert (found["readFiles"]["exercised"], found["readFiles"]["case"]) == ("held", 2)
    assert (found["reaps_process_tree"]["exercised"], found["reaps_process_tree"]["case"]) == ("held", 4)


def test_the_cli_card_lists_the_declared_items(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(CHECKFU), "provider", "grade", "memory", "--test", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )
    assert done.returncode == 0, done.stderr
    declared = json.loads(done.stdout)["declared"]
    assert [d["item"] for d in declared] == MEMORY_DECLARES
    assert {d["item"] for d in declared if d["exercised"] == "held"} == set(MEMORY_DECLARES) - {"cold_compensation"}
