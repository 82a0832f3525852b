"""How long a caller waits for each member before it calls the provider hung: the runner at its door, and a
wire client on its own (so no call hangs even outside a runner)."""

from __future__ import annotations

from checkfu.contract.envelope import Member

DEFAULT_DEADLINES: dict[Member, float] = {
    "describe": 30,
    "materialize": 1800,
    "provision": 300,
    "writeFile": 120,
    "activate": 120,
    "exec": 30,
    "inspect": 30,
    "release": 120,
    "compensate": 120,
    "openProcess": 60,
    "readFiles": 120,
    "listAllocations": 60,
    "listDir": 60,
    "snapshot": 900,
    "deleteSnapshot": 120,
    "clone": 900,
    "resume": 900,
}
"""Seconds per member; ``exec`` adds the request's own timeout to its figure."""
