"""The lifecycle as a table. Every legal transition lives here and nowhere else.

An instance starts ``absent`` (journaled, not yet allocated). A member not listed
for the current state is illegal: ``transition`` raises ``SandboxStateConflict``
naming the state and the member, and nothing changes. ``clone`` is listed twice:
on the source (which stays ``active``) and on the new instance (``absent`` to
``provisioning``). Snapshots have their own three-state table.
"""

from __future__ import annotations

from typing import Literal

from checkfu.contract.envelope import Member
from checkfu.contract.errors import SandboxStateConflict

State = Literal["absent", "provisioning", "active", "released"]
SnapshotState = Literal["absent", "present", "deleted"]

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
