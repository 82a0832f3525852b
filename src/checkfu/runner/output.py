"""A Run's output, kept in the journal (``run_output``) as it streams, for ``checkfu logs``.

The first ``cap`` bytes of a Run's output (stdout and stderr together, in the order they came) are
kept; beyond the cap output is counted, not kept, and the Run's summary says how much was dropped.
Output reaches the journal in batches at most ``FLUSH_SECONDS`` apart while the Run goes on, so
``checkfu logs -f`` follows it, and a Run whose runner is killed keeps what was flushed before.
A journal that cannot take a batch never fails the Run: the lost bytes are counted and named.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from checkfu.runner.clock import Clock
from checkfu.runner.journal import Journal, JournalError

OUTPUT_CAP = 16 << 20
"""Bytes of a Run's output kept (stdout and stderr together): 16 MiB. ``CHECKFU_OUTPUT_CAP`` sets another."""
FLUSH_SECONDS = 0.1
"""How often kept output goes to the journal while the Run runs."""
CAP_ENV = "CHECKFU_OUTPUT_CAP"


def output_cap() -> int:
    """The cap on kept output: ``CHECKFU_OUTPUT_CAP`` bytes (``0`` keeps none), else ``OUTPUT_CAP``.

    Raises:
        ValueError: the variable is not a non-negative whole number of bytes.
    """
    raw = os.environ.get(CAP_ENV)
    if raw is None or raw == "":
        return OUTPUT_CAP
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{CAP_ENV} must be a whole number of bytes (0 or more), not {raw[:40]!r}")
    return value


class OutputKeeper:
    """Keeps a Run's output in ``journal`` up to ``cap`` bytes; ``feed`` takes each chunk as it streams."""

    def __init__(self, journal: Journal, run_id: str, clock: Clock, *, cap: int = OUTPUT_CAP) -> None:
        self.journal = journal
        self.run_id = run_id
        self.clock = clock
        self.cap = cap
        self.kept = 0
        self.dropped = 0
        self.lost = 0
        """Bytes within the cap that the journal could not take."""
        self.failure: str | None = None
        self.pending: list[tuple[str, bytes]] = []
        self._flusher: asyncio.Task[None] | None = None

    def feed(self, stream: str, data: bytes) -> None:
        room = self.cap - self.kept
        if room <= 0:
            self.dropped += len(data)
            return
        if len(data) > room:
            self.dropped += len(data) - room
            data = data[:room]
        self.kept += len(data)
        if data:
            self.pending.append((stream, bytes(data)))

    def flush(self) -> None:
        """Write what is pending, in one transaction; never raises."""
        if not self.pending:
            return
        chunks, self.pending = self.pending, []
        try:
            self.journal.append_output(self.run_id, chunks, now=self.clock.now())
        except JournalError as exc:
            self.lost += sum(len(d) for _, d in chunks)
            self.failure = str(exc)

    async def _flush_while_running(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            self.flush()

    def start(self) -> None:
        """Flush every ``FLUSH_SECONDS`` from now on (in the running loop) until ``stop``."""
        self._flusher = asyncio.ensure_future(self._flush_while_running())

    def stop(self) -> None:
        """Stop the periodic flush and write what is left (never waits, so a Run being cancelled releases at once)."""
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        self.flush()

    def summary(self) -> dict[str, Any]:
        """What the Run's summary says of its output: bytes kept, dropped past the cap, and the cap."""
        out: dict[str, Any] = {
            "output_kept_bytes": self.kept - self.lost,
            "output_dropped_bytes": self.dropped,
            "output_cap_bytes": self.cap,
        }
        if self.lost:
            out["output_lost_bytes"] = self.lost
        return out
