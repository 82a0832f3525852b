"""B9: concurrent provisions on the Docker tier, beside docker-py with the same concurrency.

Ours: ``CHECKFU_BENCH_B9_N`` (default 100, the spec's number) ``provision`` calls
at once through one provider (its docker-py calls run in its own thread pool).
Raw (the figure's ratio): the same number of docker-py ``create`` calls at once from as many threads,
of a container of our shape (the same flags and three tmpfs volumes, ``Rig.raw_shaped_config``).
Beside them, the *bare* container the earlier figure compared with (HostConfig tmpfs mounts, one
engine object instead of four) at the same concurrency; its p99 ratio is stated too.
Each provision's latency is recorded; rounds rotate which side goes first.
Target (issue 18): every provision succeeds, and ours p99 at most 1.2 times the same-shape raw p99
(benchmarks.md's 1.1 is stated beside it).
``CHECKFU_BENCH_B9_ROUNDS`` sets the rounds (default 3).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from b1_docker_first_command import Rig, rounds
from harness import Figure, percentile, summarize

from checkfu.contract.members import ReleaseRequest

NAMES = ["B9"]


async def run() -> list[Figure]:
    n = rounds(100, "CHECKFU_BENCH_B9_N")
    rig = Rig("B9", workers=max(128, n))
    shaped, bare_cfg = rig.raw_shaped_config(), rig.raw_config()
    ours_times: list[float] = []
    raw_times: list[float] = []
    bare_times: list[float] = []
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

    def one_raw(cfg: dict[str, object], times: list[float]) -> object:
        t0 = time.perf_counter()
        c = rig.client.containers.create(**cfg)
        times.append(time.perf_counter() - t0)
        return c

    def raw_round(cfg: dict[str, object], times: list[float]) -> int:
        with ThreadPoolExecutor(max_workers=n) as pool:
            futures = [pool.submit(one_raw, cfg, times) for _ in range(n)]
            made = [f.result() for f in futures if f.exception() is None]
            errors = sum(1 for f in futures if f.exception() is not None)
            list(pool.map(lambda c: c.remove(force=True, v=True), made))  # type: ignore[attr-defined]
        return errors

    try:
        for i in range(rounds(3, "CHECKFU_BENCH_B9_ROUNDS")):
            for j in range(3):
                which = (i + j) % 3
                if which == 0:
                    failures += await ours_round()
                elif which == 1:
                    assert await asyncio.to_thread(raw_round, shaped, raw_times) == 0, "the raw path must not fail"
                else:
                    assert await asyncio.to_thread(raw_round, bare_cfg, bare_times) == 0, "the raw path must not fail"
    finally:
        left = await rig.close()
    total = len(ours_times) + failures
    fig = summarize(
        f"B9 docker {n} concurrent provisions",
        ours_times,
        raw_times,
        target="100% success, <=1.2x same-shape raw p99",
        met=lambda _r, xs, ys: failures == 0 and percentile(xs, 0.99) <= 1.2 * percentile(ys, 0.99),
    )
    fig.extra["raw"] = "docker-py create, the same flags and three tmpfs volumes"
    fig.extra["within_1_1x"] = failures == 0 and fig.extra["ours_p99"] <= 1.1 * fig.extra["raw_p99"]
    fig.extra["bare_p50"] = statistics.median(bare_times)
    fig.extra["bare_p99"] = percentile(bare_times, 0.99)
    fig.extra["bare_p99_ratio"] = fig.extra["ours_p99"] / fig.extra["bare_p99"]
    fig.extra["success_rate"] = len(ours_times) / total if total else 0.0
    fig.extra["p99_ratio"] = fig.extra["ours_p99"] / fig.extra["raw_p99"]
    fig.extra["left_behind"] = left
    return [fig]
