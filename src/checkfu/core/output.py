"""A Run's output, kept in the journal (``run_output``) as it streams, for ``checkfu logs``.

The first ``cap`` bytes of a Run's output (stdout and stderr together, in the order they came) are
kept; beyond the cap output is counted, not kept, and the Run's summary says how much was dropped.
Output reaches the journal in batches at most ``FLUSH_SECONDS`` apart while the Run goes on, so
``checkfu logs -f`` follows it, and a Run whose runner is killed keeps what was flushed before.
A journal that cannot take a batch never fails the Run: the lost bytes are counted and named.

No value of the Run's environment is recorded (only names are): each value of ``MASK_MIN`` bytes
or more is replaced by ``MASK`` in what is kept, even when a chunk boundary splits it (the bytes that
may begin a value are held back until the next chunk tells). A shorter value cannot be told from
ordinary output; the summary names the variables whose values were too short to mask.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any

from checkfu.core.clock import Clock
from checkfu.core.journal import Journal, JournalError

OUTPUT_CAP = 16 << 20
"""Bytes of a Run's output kept (stdout and stderr together): 16 MiB. ``CHECKFU_OUTPUT_CAP`` sets another."""
FLUSH_SECONDS = 0.1
"""How often kept output goes to the journal while the Run runs."""
CAP_ENV = "CHECKFU_OUTPUT_CAP"
MASK = b"***"
MASK_MIN = 4
"""Environment values at least this long are masked in kept output."""


class Masker:
    """Replaces every occurrence of the given values by ``MASK`` in a stream of chunks, across chunk boundaries."""

    def __init__(self, values: Iterable[str]) -> None:
        encoded = {v.encode("utf-8", "surrogateescape") for v in values}
        self.values = sorted((v for v in encoded if len(v) >= MASK_MIN), key=len, reverse=True)
        self.carry: dict[str, bytes] = {}

    def feed(self, stream: str, data: bytes) -> bytes:
        """``data`` masked; what may begin a value is held back until the next chunk of ``stream`` (or ``end``)."""
        if not self.values:
            return data
        buf = self.carry.pop(stream, b"") + data
        cut = len(buf) - self._held(buf)
        moved = True
        while moved:  # a whole value across the cut is held with it, so it is masked whole, never in halves
            moved = False
            for value in self.values:
                at = buf.find(value, max(0, cut - len(value) + 1))
                if 0 <= at < cut < at + len(value):
                    cut, moved = at, True
        out = buf[:cut]
        for value in self.values:
            out = out.replace(value, MASK)
        if cut < len(buf):
            self.carry[stream] = buf[cut:]
        return out

    def _held(self, buf: bytes) -> int:
        """The length of the longest end of ``buf`` that begins a value (and may be completed by what follows)."""
        hold = 0
        for value in self.values:
            for k in range(min(len(value) - 1, len(buf)), hold, -1):
                if buf.endswith(value[:k]):
                    hold = k
                    break
        return hold

    def end(self) -> list[tuple[str, bytes]]:
        """What was held back, now that no more comes (it began a value, but no value followed)."""
        out = []
        for stream, held in self.carry.items():
            data = held
            for value in self.values:
                data = data.replace(value, MASK)
            if data:
                out.append((stream, data))
        self.carry = {}
        return out


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

    def __init__(
        self, journal: Journal, run_id: str, clock: Clock, *, cap: int = OUTPUT_CAP, mask: Iterable[str] = ()
    ) -> None:
        self.journal = journal
        self.masker = Masker(mask)
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
        self._keep(stream, self.masker.feed(stream, data))

    def _keep(self, stream: str, data: bytes) -> None:
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
        for stream, data in self.masker.end():
            self._keep(stream, data)
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
