"""The lifecycle table: every legal move, and every illegal one refused without a change.

The expected tables are transcribed independently from contract.md section 5 (the
state column of the member table) and the conformance cases of section 9.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from checkfu.contract import (
    MEMBERS,
    SNAPSHOT_TRANSITIONS,
    TRANSITIONS,
    SandboxStateConflict,
    snapshot_transition,
    transition,
)
from checkfu.contract.lifecycle import INSTANCE_FREE

STATES = ("absent", "provisioning", "active", "released")
SNAPSHOT_STATES = ("absent", "present", "deleted")

EXPECTED: dict[str, dict[str, str]] = {
    # journaled, not yet allocated: only an allocating member or cold compensation
    "absent": {
        "provision": "provisioning",
        "clone": "provisioning",
        "resume": "provisioning",
        "compensate": "released",
    },
    # staged writes only while provisioning; activate starts it
    "provisioning": {
        "writeFile": "provisioning",
        "activate": "active",
        "inspect": "provisioning",
        "release": "released",
        "compensate": "released",
    },
    # work happens while active; snapshot and clone leave the source active
    "active": {
        "exec": "active",
        "openProcess": "active",
        "readFiles": "active",
        "listDir": "active",
        "inspect": "active",
        "snapshot": "active",
        "clone": "active",
        "release": "released",
        "compensate": "released",
    },
    # release and compensate are idempotent; inspect shows it released
    "released": {"inspect": "released", "release": "released", "compensate": "released"},
}

EXPECTED_SNAPSHOT: dict[str, dict[str, str]] = {
    "absent": {"snapshot": "present", "compensate": "deleted"},
    "present": {"resume": "present", "deleteSnapshot": "deleted", "compensate": "deleted"},
    # a deleted snapshot cannot be resumed (case 8); deleting again is idempotent
    "deleted": {"deleteSnapshot": "deleted", "compensate": "deleted"},
}


def test_the_instance_table_is_the_contracts() -> None:
    assert {s: dict(m) for s, m in TRANSITIONS.items()} == EXPECTED


def test_the_snapshot_table_is_the_contracts() -> None:
    assert {s: dict(m) for s, m in SNAPSHOT_TRANSITIONS.items()} == EXPECTED_SNAPSHOT


def test_every_member_is_in_the_table_or_instance_free() -> None:
    in_table = {m for moves in TRANSITIONS.values() for m in moves} | {
        m for moves in SNAPSHOT_TRANSITIONS.values() for m in moves
    }
    assert in_table | INSTANCE_FREE == set(MEMBERS)
    assert {"describe", "materialize", "listAllocations"} == INSTANCE_FREE
    assert not (in_table & INSTANCE_FREE)


INSTANCE_CASES = list(itertools.product(STATES, MEMBERS))


@pytest.mark.parametrize(("state", "member"), INSTANCE_CASES, ids=[f"{s}-{m}" for s, m in INSTANCE_CASES])
def test_transition(state: Any, member: Any) -> None:
    before = copy.deepcopy(TRANSITIONS)
    expected = EXPECTED[state].get(member)
    if expected is not None:
        assert transition(state, member) == expected
    else:
        with pytest.raises(SandboxStateConflict) as info:
            transition(state, member)
        assert member in info.value.message
        assert state in info.value.message
        assert info.value.field == "state"
        assert info.value.code == "SandboxStateConflict"
    assert before == TRANSITIONS


SNAPSHOT_CASES = list(itertools.product(SNAPSHOT_STATES, MEMBERS))


@pytest.mark.parametrize(("state", "member"), SNAPSHOT_CASES, ids=[f"{s}-{m}" for s, m in SNAPSHOT_CASES])
def test_snapshot_transition(state: Any, member: Any) -> None:
    before = copy.deepcopy(SNAPSHOT_TRANSITIONS)
    expected = EXPECTED_SNAPSHOT[state].get(member)
    if expected is not None:
        assert snapshot_transition(state, member) == expected
    else:
        with pytest.raises(SandboxStateConflict) as info:
            snapshot_transition(state, member)
        assert member in info.value.message
        assert state in info.value.message
        assert info.value.field == "snapshot_id"
    assert before == SNAPSHOT_TRANSITIONS


def _run(members: list[str]) -> str:
    state: Any = "absent"
    for m in members:
        state = transition(state, m)  # type: ignore[arg-type]
    return str(state)


def test_the_round_trip_of_conformance_case_2() -> None:
    assert _run(["provision", "writeFile", "writeFile", "activate", "exec", "inspect", "release"]) == "released"


def test_released_is_terminal_except_for_idempotent_members() -> None:
    for member in MEMBERS:
        after = TRANSITIONS["released"].get(member)
        assert after in (None, "released")


def test_no_write_after_activation_and_no_exec_before() -> None:
    with pytest.raises(SandboxStateConflict):
        _run(["provision", "activate", "writeFile"])
    with pytest.raises(SandboxStateConflict):
        _run(["provision", "exec"])
    with pytest.raises(SandboxStateConflict):
        _run(["provision", "activate", "release", "activate"])


def test_a_deleted_snapshot_cannot_be_resumed() -> None:
    state: Any = snapshot_transition("absent", "snapshot")
    assert snapshot_transition(state, "resume") == "present"
    state = snapshot_transition(state, "deleteSnapshot")
    with pytest.raises(SandboxStateConflict):
        snapshot_transition(state, "resume")
    assert snapshot_transition(state, "deleteSnapshot") == "deleted"
