"""The Docker provider's per-instance record: its state table, and ``Records`` moving it (no engine needed).

Every legal move is listed here again, transcribed from the life of a container in
``provider.py`` (not copied from the table); every other move must raise
``RecordStateError`` and leave the record as it was.
"""

from __future__ import annotations

import itertools
import typing
from concurrent.futures import Future

import pytest

from checkfu.providers.docker.record import (
    TRANSITIONS,
    ContainerRecord,
    Event,
    Handle,
    Instance,
    Records,
    RecordState,
    RecordStateError,
    record_transition,
)

STATES: tuple[RecordState, ...] = typing.get_args(RecordState)
EVENTS: tuple[Event, ...] = typing.get_args(Event)
LATE = {"find", "stage", "activate", "activated", "fail"}
"""What a call still under way may learn once the release began: it changes nothing."""

EXPECTED: dict[str, dict[str, str]] = {
    # born: made here, found on the engine, or released without ever being seen
    "absent": {"create": "staging", "find": "known", "forget": "released"},
    "known": {
        "find": "known",
        "stage": "staging",
        "activate": "activating",
        "release": "releasing",
        "forget": "released",
    },
    "staging": {
        "find": "staging",
        "stage": "staging",
        "activate": "activating",
        "release": "releasing",
        "forget": "released",
    },
    "activating": {
        "find": "activating",
        "stage": "activating",
        "activate": "activating",
        "activated": "active",
        "fail": "known",
        "release": "releasing",
        "forget": "released",
    },
    "active": {"find": "active", "activated": "active", "fail": "known", "release": "releasing", "forget": "released"},
    "releasing": {**dict.fromkeys(LATE, "releasing"), "release": "releasing", "forget": "released"},
    "released": {**dict.fromkeys(LATE, "released"), "release": "releasing", "forget": "released"},
}


def view(name: str = "checkfu-x", container_id: str = "c1", state: typing.Any = "provisioning") -> Instance:
    return Instance(container_id, name, state, running=False, labels={}, volumes=())


def test_the_table_is_the_expected_one() -> None:
    assert set(TRANSITIONS) == set(STATES)
    assert {s: dict(m) for s, m in TRANSITIONS.items()} == EXPECTED


@pytest.mark.parametrize(("state", "event"), list(itertools.product(STATES, EVENTS)))
def test_every_move_is_allowed_or_refused_by_the_table(state: RecordState, event: Event) -> None:
    after = EXPECTED[state].get(event)
    if after is not None:
        assert record_transition("checkfu-x", state, event) == after
    else:
        with pytest.raises(RecordStateError, match=f"'{event}' is not allowed while the record of 'checkfu-x' is"):
            record_transition("checkfu-x", state, event)


def test_nothing_but_absent_births_and_absent_is_never_reached() -> None:
    assert all("absent" not in moves.values() for moves in TRANSITIONS.values())
    assert all("create" not in moves for state, moves in TRANSITIONS.items() if state != "absent")


def test_a_container_lives_through_the_table() -> None:
    records = Records()
    made = view()
    assert records.create(made) == ContainerRecord(name="checkfu-x", container_id="c1", state="staging", view=made)
    records.move("checkfu-x", "c1", "activate")
    got = records.get("checkfu-x")
    assert got is not None and (got.state, got.view, got.staged) == ("activating", None, None)
    active = view(state="active")
    records.move("checkfu-x", "c1", "activated", active)
    got = records.get("checkfu-x")
    assert got is not None and (got.state, got.view, got.staged, got.running_id) == ("active", active, None, "c1")
    records.move("checkfu-x", "c1", "release")
    got = records.get("checkfu-x")
    assert got is not None and (got.state, got.view) == ("releasing", active)  # kept for a retried release
    assert got.refuses_writes("c1")
    records.forget("checkfu-x")
    got = records.get("checkfu-x")
    assert got is not None and (got.state, got.view, got.running_id) == ("released", None, None)


def test_an_illegal_move_raises_and_changes_nothing() -> None:
    records = Records()
    records.create(view())
    records.move("checkfu-x", "c1", "activate")
    records.move("checkfu-x", "c1", "activated", view(state="active"))
    before = records.get("checkfu-x")
    with pytest.raises(RecordStateError, match="internal error"):
        records.move("checkfu-x", "c1", "stage", view())
    assert records.get("checkfu-x") is before


def test_a_failed_activation_keeps_only_the_id() -> None:
    records = Records()
    records.create(view())
    records.move("checkfu-x", "c1", "activate")
    records.move("checkfu-x", "c1", "fail")
    got = records.get("checkfu-x")
    assert got is not None and (got.state, got.view, got.running_id) == ("known", None, "c1")


def test_a_move_about_another_container_changes_nothing() -> None:
    records = Records()
    records.create(view())
    before = records.get("checkfu-x")
    records.move("checkfu-x", "c0", "release")
    records.move("checkfu-y", "c1", "release")
    assert records.get("checkfu-x") is before and records.get("checkfu-y") is None
    assert before is not None and before.refuses_writes("c0") and not before.refuses_writes("c1")


def test_finding_another_container_is_a_new_record_that_takes_over_the_name() -> None:
    records = Records()
    records.create(view())
    handle = Handle(name="checkfu-x-areas", container="c1", image="i", volumes=("v",), config={})
    records.keep_handle("checkfu-x", handle)
    work: Future[None] = Future()
    records.add_background("checkfu-x", work)
    assert records.find("checkfu-x", "c1").state == "staging"  # its own container: unchanged
    found = records.find("checkfu-x", "c2")
    assert (found.state, found.view, found.handle, found.background) == ("known", None, handle, (work,))


def test_a_release_of_an_unseen_instance_is_remembered_and_found_again_as_new() -> None:
    records = Records()
    records.forget("checkfu-x")
    got = records.get("checkfu-x")
    assert got is not None and (got.state, got.container_id) == ("released", None)
    assert records.find("checkfu-x", "c9").state == "known"


def test_released_stays_released_when_its_own_container_is_found_again() -> None:
    records = Records()
    records.create(view())
    records.forget("checkfu-x")
    assert records.find("checkfu-x", "c1").state == "released"
    records.move("checkfu-x", "c1", "release")  # still there: removed again
    got = records.get("checkfu-x")
    assert got is not None and got.state == "releasing"


def test_settle_waits_for_the_work_and_for_what_it_added() -> None:
    records = Records()
    records.create(view())
    first: Future[None] = Future()
    second: Future[None] = Future()

    def done(_: Future[None]) -> None:
        records.add_background("checkfu-x", second)
        second.set_exception(RuntimeError("outcome does not matter"))

    first.add_done_callback(done)
    records.add_background("checkfu-x", first)
    first.set_result(None)
    records.settle("checkfu-x")
    got = records.get("checkfu-x")
    assert got is not None and got.background == ()


def test_work_for_a_name_without_a_record_is_an_internal_error() -> None:
    with pytest.raises(RecordStateError, match="never found nor made here"):
        Records().add_background("checkfu-x", Future())


def test_the_proxy_failure_is_taken_once_and_forget_drops_view_and_handle() -> None:
    records = Records()
    records.create(view())
    records.proxy_failed("checkfu-x", "no bridge")
    assert records.take_proxy_failure("checkfu-x") == "no bridge"
    assert records.take_proxy_failure("checkfu-x") is None
    records.keep_handle("checkfu-x", Handle(name="h", container="c1", image="", volumes=(), config={}))
    records.forget("checkfu-x")
    got = records.get("checkfu-x")
    assert got is not None and (got.view, got.handle) == (None, None)
    assert records.drop_handle("checkfu-y") is None and len(records) == 1
