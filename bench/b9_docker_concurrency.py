"""B9: concurrent provisions on the Docker tier, beside docker-py with the same concurrency.

Ours: ``CHECKFU_BENCH_B9_N`` (default 100, the spec's number) ``provision`` calls
at once through one provider (its docker-py calls run in its own thread pool).
Raw: the same number of docker-py ``create`` calls at once from as many threads.
Each provision's latency is recorded; rounds alternate which side goes first.
Target: every provision succeeds, and ours p99 at most 1.1 times raw p99.
``CHECKFU_BENCH_B9_ROUNDS`` sets the rounds (default 3).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from b1_docker_first_command import Rig, rounds
from harness import Figure, percentile, summarize

from checkfu.contract.members import ReleaseRequest

NAMES = ["B9"]


async def run() -> list[Figure]:
    n = rounds(100, "CHECKFU_BENCH_B9_N")
    rig = Rig("B9", workers=max(128, n))
    cfg = rig.raw_config()
    ours_times: list[float] = []
    raw_times: list[float] = []
    failures = 0

    async def one_ours(key: str) -> str | None:
        t0 = time.perf_counter()
        try:
            made = await rig.provider.provision(rig.provision_request(key))
        except Exception:
            return None
        ours_times.append(time.perf_counter() - t0)
        return made.instance_id

    async def ours_round() -> int:
        keys = [rig.key() for _ in range(n)]
        ids = await asyncio.gather(*(one_ours(k) for k in keys))
        await asyncio.gather(
            *(rig.provider.release(ReleaseRequest(**rig.call(k, i))) for k, i in zip(keys, ids, strict=True) if i)
        )
        return sum(1 for i in ids if i is None)

    def one_raw() -> object:
        t0 = time.perf_counter()
        c = rig.client.containers.create(**cfg)
        raw_times.append(time.perf_counter() - t0)
        return c

    def raw_round() -> int:
        with ThreadPoolExecutor(max_workers=n) as pool:
            futures = [pool.submit(one_raw) for _ in range(n)]
            made = [f.result() for f in futures if f.exception() is None]
            errors = sum(1 for f in futures if f.exception() is not None)
            list(pool.map(lambda c: c.remove(force=True), made))  # type: ignore[attr-defined]
        return errors

    try:
        for i in range(rounds(3, "CHECKFU_BENCH_B9_ROUNDS")):
            if i % 2 == 0:
                failures += await ours_round()
                raw_failures = await asyncio.to_thread(raw_round)
            else:
                raw_failures = await asyncio.to_thread(raw_round)
                failures += await ours_round()
            assert raw_failures == 0, "the raw path must not fail"
    finally:
        left = await rig.close()
    total = len(ours_times) + failures
    fig = summarize(
        f"B9 docker {n} concurrent provisions",
        ours_times,
        raw_times,
        target="100% success, <=1.1x raw p99",
        met=lambda _r, xs, ys: failures == 0 and percentile(xs, 0.99) <= 1.1 * percentile(ys, 0.99),
    )
    fig.extra["success_rate"] = len(ours_times) / total if total else 0.0
    fig.extra["p99_ratio"] = fig.extra["ours_p99"] / fig.extra["raw_p99"]
    fig.extra["left_behind"] = left
    return [fig]
