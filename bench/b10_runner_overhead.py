"""B10: the runner's overhead per member call, beside the memory provider called directly.

Ours: ``RunSession`` calls (lease renewal, a deadline, strict re-decoding of the
result, every cross-check, the event written to an SQLite journal in a temporary
file; for an allocation also its journal row before and its settlement after).
Raw: the same memory provider called directly with an equivalent request built
for each call. Three figures, interleaved A B / B A:

- ``B10a exec``: one ``exec(["true"])`` in a live instance;
- ``B10b inspect``: one ``inspect``;
- ``B10c cycle``: provision, activate, exec, release, divided by 4.

The target is at most 1 ms added per member at p50: ``ours_p50 - raw_p50``
(``added_p50``); the median of the per-round differences is reported beside it.
Set ``CHECKFU_BENCH_N`` to change the number of rounds (default 1000; the cycle
runs a quarter as many).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

from harness import Figure, interleave, summarize

from checkfu.contract.members import ActivateRequest, InspectRequest, ReleaseRequest
from checkfu.contract.vocabulary import Platform
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Adapter, Registry
from checkfu.core.runner import Runner
from checkfu.testing import MemoryProvider, Requests, memory_profile

NAMES = ["B10"]

TARGET_ADDED = 1e-3
AMD64 = Platform(os="linux", architecture="amd64")


def rounds(default: int) -> int:
    return int(os.environ.get("CHECKFU_BENCH_N", str(default)))


def figure(name: str, a: list[float], b: list[float], *, per: int = 1, warmup: int) -> Figure:
    per_a = [t / per for t in a]
    per_b = [t / per for t in b]
    added = statistics.median(per_a) - statistics.median(per_b)
    fig = summarize(
        name,
        per_a,
        per_b,
        target="<=1ms added p50 per member",
        met=lambda _r, _a, _b: added <= TARGET_ADDED,
    )
    fig.extra.update(
        added_p50=added,
        added_pairwise_p50=statistics.median(x - y for x, y in zip(per_a, per_b, strict=True)),
        members_per_sample=per,
        warmup=warmup,
        journal="sqlite file",
    )
    return fig


async def run() -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="checkfu-b10-") as tmp:
        journal = Journal(sqlite_url(Path(tmp) / "journal.sqlite"))
        try:
            return await _run(journal)
        finally:
            journal.close()


async def _run(journal: Journal) -> list[Figure]:
    memory = MemoryProvider()
    registry = Registry()
    registry.add(Adapter(envelope=memory.envelope, provider=memory, source="bench"))
    runner = Runner(registry, journal, runner_tag="bench-b10")
    profile = memory_profile()
    attempt = runner.start(memory.target, profile, platform=AMD64)
    session = attempt.session
    image = (await session.materialize(profile, AMD64)).image
    ours_inst = await session.provision(profile, AMD64, image)
    await session.activate(ours_inst)

    raw = Requests(memory.target, runner_tag="bench-b10-raw")
    raw_inst = await memory.provision(raw.provision("ak-b10-raw", image))
    raw_inst = await memory.activate(ActivateRequest(**raw.on(raw_inst)))

    figures: list[Figure] = []
    n, warmup = rounds(1000), 50

    async def ours_exec() -> None:
        res = await session.exec(ours_inst, ["true"], timeout=10)
        assert res.exit_code == 0

    async def raw_exec() -> None:
        res = await memory.exec(raw.exec(raw_inst, "true", timeout_ms=10_000, max_output_bytes=8 << 20))
        assert res.exit_code == 0

    a, b = await interleave(ours_exec, raw_exec, n=n, warmup=warmup)
    figures.append(figure("B10a runner overhead: exec", a, b, warmup=warmup))

    async def ours_inspect() -> None:
        await session.inspect(ours_inst)

    async def raw_inspect() -> None:
        await memory.inspect(InspectRequest(**raw.on(raw_inst)))

    a, b = await interleave(ours_inspect, raw_inspect, n=n, warmup=warmup)
    figures.append(figure("B10b runner overhead: inspect", a, b, warmup=warmup))

    counter = iter(range(10**9))

    async def ours_cycle() -> None:
        inst = await session.provision(profile, AMD64, image)
        await session.activate(inst)
        await session.exec(inst, ["true"], timeout=10)
        await session.release(inst)

    async def raw_cycle() -> None:
        inst = await memory.provision(raw.provision(f"ak-b10-raw-{next(counter)}", image))
        await memory.activate(ActivateRequest(**raw.on(inst)))
        await memory.exec(raw.exec(inst, "true", timeout_ms=10_000, max_output_bytes=8 << 20))
        await memory.release(ReleaseRequest(**raw.on(inst)))

    cycles, cycle_warmup = max(10, n // 4), 10
    a, b = await interleave(ours_cycle, raw_cycle, n=cycles, warmup=cycle_warmup)
    figures.append(
        figure("B10c runner overhead: provision+activate+exec+release / 4", a, b, per=4, warmup=cycle_warmup)
    )

    await session.release_all()
    await memory.release(ReleaseRequest(**raw.on(raw_inst)))
    runner.finish(attempt, status="succeeded")
    left = len(memory.live_objects())
    events = len(journal.events_for_run(session.run_id))
    for fig in figures:
        fig.extra["left_behind"] = left
    figures[0].extra["events_journaled"] = events
    if left:
        raise SystemExit(f"{left} objects were left behind; refusing to report")
    return figures
