"""Reading processes from ``/proc``: identity by pid *and* start time, never by pid alone.

A pid is recycled once its process is reaped, so every record this provider keeps
of a process pairs the pid with the start time the kernel reports in field 22 of
``/proc/<pid>/stat`` (clock ticks since boot). A process counts as alive only if it
exists, is neither a zombie nor dead, and has the recorded start time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

PROC = "/proc"
GONE_STATES = frozenset("ZXx")
"""Zombie and dead: such a process runs no code and holds nothing but its pid."""


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` this provider uses."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    start: int

    @property
    def running(self) -> bool:
        """Not a zombie and not dead."""
        return self.state not in GONE_STATES


def parse_stat(text: str) -> ProcStat:
    """Parse one ``/proc/<pid>/stat`` line; the command name may hold spaces and parentheses.

    Raises:
        ValueError: the line is not a stat line.
    """
    head, sep, tail = text.rpartition(")")
    if not sep:
        raise ValueError("no ')' after the command name")
    pid = int(head.split("(", 1)[0])
    fields = tail.split()
    # fields[0] is field 3 (state); field N is fields[N - 3].
    return ProcStat(
        pid=pid,
        state=fields[0],
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        session=int(fields[3]),
        start=int(fields[19]),
    )


def stat(pid: int) -> ProcStat | None:
    """The process ``pid`` as ``/proc`` shows it now, or ``None`` when there is none."""
    try:
        with open(f"{PROC}/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return parse_stat(f.read())
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or ``None`` when it is gone."""
    found = stat(pid)
    return None if found is None else found.start


def is_alive(pid: int, start: int) -> bool:
    """Whether the process ``pid`` that started at ``start`` still runs (not recycled, not a zombie)."""
    found = stat(pid)
    return found is not None and found.start == start and found.running


def scan() -> Iterator[ProcStat]:
    """Every process ``/proc`` shows; processes that vanish while scanning are skipped."""
    for name in os.listdir(PROC):
        if name.isdigit():
            found = stat(int(name))
            if found is not None:
                yield found
