"""B2sdk: one ``exec`` through the public SDK (``checkfu.AsyncSandbox.exec``), beside B2's two paths.

Three paths, interleaved round by round in one process against the local engine:

- sdk: ``AsyncSandbox.exec(["true"])`` on a live sandbox: the runner's whole path (the session core's
  plan, the lease check before the call, the provider door, strict decoding and cross-checks, the event
  journaled in SQLite), then the Docker provider's exec.
- provider: the Docker provider's ``exec`` called directly (B2's "ours"), on the same provider object and
  sandbox the SDK drives, with the request the runner builds for it.
- raw: docker-py ``container.exec_run(["true"])`` in a live container with the same flags (B2's baseline).

Figures: ``B2sdk`` is sdk against raw (B2's target, at most 1.15 times raw); ``B2sdk-overhead`` is sdk
against provider, and its ``added_p50_ms`` is what the SDK and runner add per exec, measured inside each
SDK call (its whole time less the time the provider's ``exec`` took within it), so an exec's own
variance (tens of ms on a busy engine) does not drown it (B10's bound: at most 1 ms at p50). Set
``CHECKFU_BENCH_N`` (default 30).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from b1_docker_first_command import Rig, rounds
from harness import Figure, summarize, timed

from checkfu import AsyncSandbox

NAMES = ["B2SDK"]
"""``bench/run B2sdk``: both figures (sdk against raw, and the overhead against the provider's own exec)."""


async def run() -> list[Figure]:
    rig = Rig("B2sdk")
    state = tempfile.TemporaryDirectory(prefix="checkfu-bench-sdk-")
    saved = {k: os.environ.get(k) for k in ("XDG_STATE_HOME", "CHECKFU_RUNNER_TAG")}
    os.environ.update(XDG_STATE_HOME=state.name, CHECKFU_RUNNER_TAG=rig.tag)
    sdk_t: list[float] = []
    prov_t: list[float] = []
    raw_t: list[float] = []
    paired: list[float] = []
    """Per SDK call: its whole time less the provider's exec inside it (the same call): what the SDK adds."""
    try:
        container = rig.client.containers.run(detach=True, **rig.raw_config())
        sb = await AsyncSandbox.create(profile=rig.profile, ttl=600)

        # The provider path calls the very provider object (and so the same engine connection pool) and sandbox
        # the SDK drives, with the request the runner builds: the difference is the runner's and the SDK's alone.
        live = sb._live
        same = live.session.door.provider
        request = live.session.core.exec(live.inst, ["true"]).request
        inner_exec = same.exec
        inner: list[float] = []

        async def timed_inner(req: object) -> object:
            t0 = time.perf_counter()
            try:
                return await inner_exec(req)
            finally:
                inner.append(time.perf_counter() - t0)

        async def sdk() -> None:
            same.exec = timed_inner  # the door looks the member up on each call: time the provider's part
            try:
                assert (await sb.exec(["true"])).exit_code == 0
            finally:
                same.exec = inner_exec

        async def provider() -> None:
            assert (await same.exec(request)).exit_code == 0  # type: ignore[arg-type]

        def raw() -> None:
            code, _ = container.exec_run(["true"], user="1000:1000")
            assert code == 0

        try:
            steps = [(sdk, sdk_t), (provider, prov_t), (raw, raw_t)]
            for _ in range(3):
                for step, _times in steps:
                    await timed(step)
            for i in range(rounds(30)):
                order = steps[i % 3 :] + steps[: i % 3]  # each path first, second and third in turn
                for step, times in order:
                    times.append(await timed(step))
                    if step is sdk:
                        paired.append(times[-1] - inner[-1])
        finally:
            await sb.close()
            container.remove(force=True)
    finally:
        left = await rig.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        state.cleanup()
    fig = summarize(
        "B2sdk sdk exec", sdk_t, raw_t, target="<=1.15x docker-py exec_run", met=lambda r, _a, _b: r <= 1.15
    )
    fig.extra["left_behind"] = left
    over = summarize(
        "B2sdk-overhead sdk exec vs provider exec",
        sdk_t,
        prov_t,
        target="<=+1ms p50 added to the provider's exec (paired, inside the same call)",
        met=lambda _r, a, b: statistics.median(a) - statistics.median(b) <= 0.001,
    )
    over.extra["added_p50_ms"] = round(statistics.median(paired) * 1000, 3)
    over.extra["added_p95_ms"] = round(sorted(paired)[int(0.95 * (len(paired) - 1))] * 1000, 3)
    over.met = statistics.median(paired) <= 0.001
    return [fig, over]
