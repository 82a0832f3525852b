"""The lifecycle as tables. Every legal transition lives here and nowhere else.

Three tables, one per kind of state the seam keeps:

- ``TRANSITIONS``: an instance. It starts ``absent`` (journaled, not yet
  allocated). ``clone`` is listed twice: on the source (which stays ``active``)
  and on the new instance (``absent`` to ``provisioning``).
- ``SNAPSHOT_TRANSITIONS``: a snapshot, ``absent`` to ``present`` to ``deleted``.
- ``ROW_TRANSITIONS``: a row of the runner's journal, moved by what the runner
  learned about the allocation it records (``settle`` once its result passed
  every check, ``release`` once it was released or deleted through the
  provider, ``compensate`` once cold compensation reclaimed it).

A move a table does not list is illegal: the function for that table raises
``SandboxStateConflict`` naming the state and the member or event, and nothing
changes.
"""

from __future__ import annotations

from typing import Literal

from checkfu.contract.envelope import Member
from checkfu.contract.errors import SandboxStateConflict

State = Literal["absent", "provisioning", "active", "released"]
SnapshotState = Literal["absent", "present", "deleted"]
RowState = Literal["pending", "live", "released", "compensated"]
"""A journal row: ``pending`` (journaled before the provider was asked), ``live`` (its result passed
every check), ``released`` (released or deleted through the provider), ``compensated`` (reclaimed by key)."""
RowEvent = Literal["settle", "release", "compensate"]
RowKind = Literal["instance", "snapshot", "clone", "resume"]
"""What a journal row records: an instance by ``provision``, ``clone`` or ``resume``, or a snapshot."""
OPEN_ROW_STATES: tuple[RowState, ...] = ("pending", "live")
"""Rows reconciliation may still have to settle."""

TRANSITIONS: dict[State, dict[Member, State]] = {
    "absent": {
        "provision": "provisioning",
        "clone": "provisioning",
        "resume": "provisioning",
        "compensate": "released",
    },
    "provisioning": {
        "writeFile": "provisioning",
        "activate": "active",
        "inspect": "provisioning",
        "release": "released",
        "compensate": "released",
    },
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
    "released": {
        "inspect": "released",
        "release": "released",
        "compensate": "released",
    },
}

SNAPSHOT_TRANSITIONS: dict[SnapshotState, dict[Member, SnapshotState]] = {
    "absent": {"snapshot": "present", "compensate": "deleted"},
    "present": {"resume": "present", "deleteSnapshot": "deleted", "compensate": "deleted"},
    "deleted": {"deleteSnapshot": "deleted", "compensate": "deleted"},
}

ROW_TRANSITIONS: dict[RowState, dict[RowEvent, RowState]] = {
    # The provider may or may not have allocated: only a checked result or a reclaim settles it.
    "pending": {"settle": "live", "compensate": "compensated"},
    "live": {"release": "released", "compensate": "compensated"},
    # Settled rows stay settled: a late compensation of a released allocation changes nothing.
    "released": {"release": "released", "compensate": "released"},
    "compensated": {"compensate": "compensated"},
}

INSTANCE_FREE: frozenset[Member] = frozenset({"describe", "materialize", "listAllocations"})
"""Members that act on no instance and change no state."""


def transition(state: State, member: Member) -> State:
    """The state after ``member`` in ``state``.

    Raises:
        SandboxStateConflict: ``member`` is not allowed in ``state``.
    """
    after = TRANSITIONS[state].get(member)
    if after is None:
        raise SandboxStateConflict(f"{member} is not allowed while the instance is {state}", field="state")
    return after


def snapshot_transition(state: SnapshotState, member: Member) -> SnapshotState:
    """The snapshot's state after ``member``.

    Raises:
        SandboxStateConflict: ``member`` is not allowed on a snapshot that is ``state``.
    """
    after = SNAPSHOT_TRANSITIONS[state].get(member)
    if after is None:
        raise SandboxStateConflict(f"{member} is not allowed while the snapshot is {state}", field="snapshot_id")
    return after


def row_transition(state: RowState, event: RowEvent) -> RowState:
    """A journal row's state after ``event``.

    Raises:
        SandboxStateConflict: ``event`` cannot happen to a row that is ``state``.
    """
    after = ROW_TRANSITIONS[state].get(event)
    if after is None:
        raise SandboxStateConflict(f"{event} is not allowed while the journal row is {state}", field="state")
    return after
