"""Side-by-side benchmarks: our path and the raw path, interleaved in one process.

Each figure runs ``warmup`` unrecorded rounds, then ``n`` rounds of A then B
(alternating which goes first), and reports p50/p95/p99 of both and the ratio of
the medians. Absolute times are printed only beside their baseline.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

Step = Callable[[], Any] | Callable[[], Awaitable[Any]]
RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"


@dataclass
class Figure:
    name: str
    ours_p50: float
    raw_p50: float | None
    ratio: float | None
    target: str
    met: bool | None
    """``None``: the figure has no target (it is stated beside one that has)."""
    n: int
    unit: str = "s"
    extra: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        raw = "-" if self.raw_p50 is None else _fmt(self.raw_p50, self.unit)
        ratio = "-" if self.ratio is None else f"{self.ratio:.3f}"
        extra = "".join(f" {k}={_show(v)}" for k, v in self.extra.items())
        return (
            f"{self.name}: ours p50={_fmt(self.ours_p50, self.unit)} raw p50={raw} ratio={ratio} "
            f"target={self.target} met={'-' if self.met is None else 'yes' if self.met else 'no'} (n={self.n}){extra}"
        )

    def record(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(out.pop("extra"))
        return out


def _show(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _fmt(seconds: float, unit: str) -> str:
    if unit != "s":
        return f"{seconds:.4g}{unit}"
    if seconds >= 1:
        return f"{seconds:.3f}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f}ms"
    return f"{seconds * 1e6:.1f}us"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


async def _call(step: Step) -> None:
    out = step()
    if asyncio.iscoroutine(out) or isinstance(out, Awaitable):
        await out


async def timed(step: Step) -> float:
    t0 = time.perf_counter()
    await _call(step)
    return time.perf_counter() - t0


async def interleave(ours: Step, raw: Step, *, n: int, warmup: int) -> tuple[list[float], list[float]]:
    """Times of ``ours`` and ``raw``, A B / B A alternating, after ``warmup`` rounds of each."""
    for _ in range(warmup):
        await _call(ours)
        await _call(raw)
    a: list[float] = []
    b: list[float] = []
    for i in range(n):
        if i % 2 == 0:
            a.append(await timed(ours))
            b.append(await timed(raw))
        else:
            b.append(await timed(raw))
            a.append(await timed(ours))
    return a, b


async def interleave_many(
    steps: list[Step], *, n: int, warmup: int, settle: Callable[[], None] | None = None
) -> list[list[float]]:
    """Times of each step, their order rotated every round (A B C / B C A / C A B ...), after ``warmup`` rounds.
    ``settle``, untimed after every step: waits until what a step left working in the background is done, so it
    is not timed as part of the next."""
    for _ in range(warmup):
        for step in steps:
            await _call(step)
            if settle is not None:
                settle()
    times: list[list[float]] = [[] for _ in steps]
    k = len(steps)
    for i in range(n):
        for j in range(k):
            which = (i + j) % k
            times[which].append(await timed(steps[which]))
            if settle is not None:
                settle()
    return times


def summarize(
    name: str, a: list[float], b: list[float], *, target: str, met: Callable[[float, list[float], list[float]], bool]
) -> Figure:
    a50, b50 = statistics.median(a), statistics.median(b)
    ratio = a50 / b50 if b50 > 0 else float("inf")
    return Figure(
        name=name,
        ours_p50=a50,
        raw_p50=b50,
        ratio=ratio,
        target=target,
        met=met(ratio, a, b),
        n=len(a),
        extra={
            "ours_p95": percentile(a, 0.95),
            "ours_p99": percentile(a, 0.99),
            "raw_p95": percentile(b, 0.95),
            "raw_p99": percentile(b, 0.99),
        },
    )


def save(figures: list[Figure]) -> None:
    """Merge ``figures`` into ``bench/results/latest.json`` by name."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    existing: list[dict[str, Any]] = []
    if RESULTS.exists():
        try:
            existing = json.loads(RESULTS.read_text())
        except ValueError:
            existing = []
    names = {f.name for f in figures}
    merged = [r for r in existing if r.get("name") not in names] + [f.record() for f in figures]
    RESULTS.write_text(json.dumps(merged, indent=2) + "\n")
