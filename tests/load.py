"""Load: many sandboxes provisioned and released at once through one runner, with its memory watched.

``hold_load`` starts ``n`` Runs together on one runner (each: journal the Run, take its lease, materialize,
provision, activate, release, finish the Run) and gathers them. Every Run either succeeds or fails with an
error of the closed vocabulary (``SandboxError``); anything else is counted as ``untyped`` and fails the test
that reads the figures. The runner's resident memory (``VmRSS`` of this process) is sampled every 20 ms while
the Runs are in flight, so the figures hold its peak.

The sizes come from the environment: the short run in the default test command, the full one under
``CHECKFU_SLOW=1`` (the ``slow`` mark). The figures are printed (``pytest -s`` shows them) for the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from checkfu.contract.errors import SandboxError
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.target import ExecutionTarget
from checkfu.contract.vocabulary import Platform
from checkfu.core.runner import Runner

MIB = 1 << 20


def slow() -> bool:
    return os.environ.get("CHECKFU_SLOW") == "1"


def rss() -> int:
    """This process's resident set, in bytes, as the kernel counts it."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@dataclass
class Figures:
    n: int
    concurrency: int
    seconds: float = 0.0
    ok: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    """By error code; ``untyped`` for anything outside the vocabulary (a test failure)."""
    untyped: list[str] = field(default_factory=list)
    rss_before: int = 0
    rss_peak: int = 0
    rss_after: int = 0

    @property
    def growth_peak(self) -> int:
        return self.rss_peak - self.rss_before

    def __str__(self) -> str:
        return (
            f"load n={self.n} concurrency={self.concurrency}: {self.seconds:.1f} s, ok {self.ok}, "
            f"failures {dict(self.failures) or 'none'}; RSS before {self.rss_before / MIB:.1f} MiB, "
            f"peak {self.rss_peak / MIB:.1f} MiB (+{self.growth_peak / MIB:.1f}), after {self.rss_after / MIB:.1f} MiB"
        )


async def hold_load(
    runner: Runner,
    target: ExecutionTarget,
    profile: SandboxProfile,
    platform: Platform,
    n: int,
    *,
    concurrency: int | None = None,
) -> Figures:
    """Drive ``n`` Runs at once (at most ``concurrency`` in flight; all of them by default) and measure."""
    figures = Figures(n=n, concurrency=concurrency or n)
    gate = asyncio.Semaphore(figures.concurrency)

    async def one(i: int) -> None:
        async with gate:
            attempt = runner.start(target, profile, platform=platform, command=["load", str(i)])
            session = attempt.session
            status, code = "failed", 1
            try:
                image = (await session.materialize(profile, platform)).image
                inst = await session.provision(profile, platform, image)
                await session.activate(inst)
                await session.release(inst)
                status, code = "succeeded", 0
                figures.ok += 1
            except SandboxError as exc:
                figures.failures[exc.code] += 1
            except Exception as exc:  # counted and reported: the test fails on any of these
                figures.failures["untyped"] += 1
                figures.untyped.append(f"{type(exc).__name__}: {exc}")
            finally:
                await session.release_all()
                runner.finish(attempt, status=status, exit_code=code)

    async def sample(stop: asyncio.Event) -> None:
        while not stop.is_set():
            figures.rss_peak = max(figures.rss_peak, rss())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.02)

    gc.collect()
    figures.rss_before = figures.rss_peak = rss()
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample(stop))
    started = time.monotonic()
    try:
        await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        figures.seconds = time.monotonic() - started
        stop.set()
        await sampler
    gc.collect()
    figures.rss_after = rss()
    figures.rss_peak = max(figures.rss_peak, figures.rss_after)
    print(figures)
    return figures
