"""B13: time to first command with a warm pool, beside B1's raw figure in the same run.

Ours, through the runner (SQLite journal, the Docker tier's adapter): the Run is started (selection,
journal row, lease), adopts a ready pooled sandbox (``checkfu.core.pool.adopt``: one compare-and-set),
stages its mounts, activates, runs its first ``exec true``, releases, and is finished in the journal.
Before each round the pool is topped up again (not timed) by a filler whose Docker tier holds what it
provisions (``hold``: started and at once paused, as ``checkfu pool fill`` does): the pool is warm, and
activating an adopted sandbox thaws it instead of starting it. Raw: B1's docker-py ``create``,
``start``, ``exec_run(["true"])``, ``remove(force=True)`` of an equally isolated container.
Beside them, two floors on the raw engine: a container created ahead (untimed), then ``start``,
``exec_run``, ``remove`` (timed); and the floor of this design, a container created, started and
paused ahead (untimed), then ``unpause``, ``exec_run``, ``remove`` (timed).
Interleaved in one process. Target: ours p50 <= 110 ms (the fastest hosted peer's published median).
Also stated, release left out (what the hosted peers' leaderboard times, up to the first command's answer):
``ours_to_first_result_p50_ms``, ``raw_to_first_result_p50_ms`` (B1's raw) and ``raw_held_to_first_result_p50_ms``.

Two figures: a Run without mounts (B1's shape), and a Run with one sealed mount of one 4 KiB file.
Also stated: the median of each phase of ours, and the pool's idle cost: the memory the engine
reports (``docker stats``) for a pooled sandbox, which is held (its init and ``sleep``, frozen);
its writable layer's size; and what the engine's daemons (dockerd, containerd) hold for it, their
resident memory before and after ten more wait in the pool, divided by ten (noisy on a shared
engine: other work moves it too).
Set ``CHECKFU_BENCH_N`` to change the number of rounds (default 20).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from b1_docker_first_command import Rig, rounds
from harness import Figure, summarize, timed

from checkfu.contract.errors import SandboxError
from checkfu.core.clock import SystemClock
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.mounts import ResolvedMount, parse_mount, resolve_mount
from checkfu.core.pool import adopt, drain, fill_one, ready
from checkfu.core.reconcile import reconcile
from checkfu.core.registry import Registry, adapter_from_factory
from checkfu.core.runner import Needs, Runner
from checkfu.providers.docker import DockerProvider

NAMES = ["B13"]
TARGET_S = 0.110


def _engine_rss() -> int | None:
    """The resident memory of the local engine's daemons (dockerd, containerd), in bytes; ``None`` if not here."""
    total, found = 0, False
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "comm").read_text().strip() not in ("dockerd", "containerd"):
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    found = True
        except OSError:
            continue
    return total if found else None


async def _engine_cost(filler: Runner, rig: Rig, k: int = 10) -> dict[str, Any]:
    """The engine daemons' resident memory per pooled sandbox: before and after ``k`` more wait in the pool."""
    (adapter,) = filler.registry.adapters
    before = _engine_rss()
    for _ in range(k):
        await fill_one(filler, adapter.target, rig.profile, rig.platform, [], ttl=600)
    after = _engine_rss()
    if before is None or after is None:
        return {"engine_rss_per_pooled_bytes": "not measurable (no local dockerd)"}
    return {"engine_rss_per_pooled_bytes": (after - before) // k, "engine_rss_sample_k": k}


def _pooled_memory(client: Any, instance_id: str) -> dict[str, Any]:
    """What one pooled sandbox holds while it waits: held, its processes frozen."""
    c = client.containers.get(instance_id)
    stats = c.stats(stream=False)
    usage = (stats.get("memory_stats") or {}).get("usage")
    api = client.api
    info = api._result(api._get(api._url("/containers/{0}/json", instance_id), params={"size": 1}), True)
    return {
        "pooled_state": c.status,
        "pooled_memory_bytes": int(usage or 0),
        "pooled_pids": int((stats.get("pids_stats") or {}).get("current") or 0),
        "pooled_rw_layer_bytes": int(info.get("SizeRw") or 0),
    }


async def _figure(
    rig: Rig, runner: Runner, filler: Runner, resolved: list[ResolvedMount], label: str
) -> tuple[Figure, dict[str, Any]]:
    (adapter,) = runner.registry.adapters
    target, profile, platform = adapter.target, rig.profile, rig.platform
    plans = [r.plan for r in resolved]
    targets = [p.target for p in plans]
    phases: dict[str, list[float]] = {k: [] for k in ("start", "adopt", "stage", "activate", "exec", "release")}
    # Up to the first command's answer, release left out: what the hosted peers' leaderboard times.
    to_result: list[float] = []
    raw_to_result: list[float] = []
    held_to_result: list[float] = []
    raw_config = rig.raw_config()

    async def warm() -> None:
        await fill_one(filler, target, profile, platform, targets, ttl=600)

    async def ours() -> None:
        t0 = time.perf_counter()
        attempt = runner.start(target, profile, platform=platform, mount_count=len(plans), needs=Needs())
        session = attempt.session
        t1 = time.perf_counter()
        inst = adopt(session, profile, plans)
        if inst is None:
            runner.finish(attempt, status="failed")
            raise SystemExit("the pool was empty: no figure")
        t2 = time.perf_counter()
        await session.stage(inst, resolved)
        t3 = time.perf_counter()
        await session.activate(inst)
        t4 = time.perf_counter()
        res = await session.exec(inst, ["true"])
        assert res.exit_code == 0
        t5 = time.perf_counter()
        await session.release(inst)
        runner.finish(attempt, status="succeeded", exit_code=0)
        t6 = time.perf_counter()
        for k, a, b in (
            ("start", t0, t1),
            ("adopt", t1, t2),
            ("stage", t2, t3),
            ("activate", t3, t4),
            ("exec", t4, t5),
            ("release", t5, t6),
        ):
            phases[k].append(b - a)
        to_result.append(t5 - t0)

    def raw() -> None:
        t = time.perf_counter()
        c = rig.client.containers.create(**raw_config)
        c.start()
        code, _ = c.exec_run(["true"], user="1000:1000")
        assert code == 0
        raw_to_result.append(time.perf_counter() - t)
        c.remove(force=True)

    floor: list[float] = []

    def raw_from_created() -> None:
        """The floor of this design on the raw engine: a container created ahead (untimed), then start, exec_run,
        remove (timed); what an adopted, provisioned-not-activated sandbox must still do."""
        c = rig.client.containers.create(**raw_config)
        t = time.perf_counter()
        c.start()
        code, _ = c.exec_run(["true"], user="1000:1000")
        assert code == 0
        c.remove(force=True)
        floor.append(time.perf_counter() - t)

    held_floor: list[float] = []

    def raw_from_held() -> None:
        """The floor of a held pool on the raw engine: a container created, started and paused ahead (untimed),
        then unpause, exec_run, remove (timed)."""
        c = rig.client.containers.create(**raw_config)
        c.start()
        c.pause()
        t = time.perf_counter()
        c.unpause()
        code, _ = c.exec_run(["true"], user="1000:1000")
        assert code == 0
        held_to_result.append(time.perf_counter() - t)
        c.remove(force=True)
        held_floor.append(time.perf_counter() - t)

    n = rounds()
    a: list[float] = []
    b: list[float] = []
    for i in range(-2, n):  # two warm-up rounds, then n, A B / B A alternating, each with the pool warm
        await warm()
        if i < 0:
            await ours()
            raw()
            for v in [*phases.values(), to_result, raw_to_result]:
                v.clear()
            continue
        if i % 2 == 0:
            a.append(await timed(ours))
            b.append(await timed(raw))
            raw_from_created()
            raw_from_held()
        else:
            raw_from_held()
            raw_from_created()
            b.append(await timed(raw))
            a.append(await timed(ours))
    await warm()
    idle = _pooled_memory(rig.client, ready(runner.journal, runner.runner_tag)[-1].instance_id)
    fig = summarize(
        f"B13 warm pool time to first command{label}",
        a,
        b,
        target="ours p50<=110ms (raw: B1 docker-py create,start,exec_run,remove)",
        met=lambda _r, xs, _ys: statistics.median(xs) <= TARGET_S,
    )
    fig.extra["ours_p99_over_p50"] = fig.extra["ours_p99"] / fig.ours_p50
    fig.extra["raw_precreated_start_exec_remove_p50_ms"] = round(statistics.median(floor) * 1e3, 1)
    fig.extra["raw_held_unpause_exec_remove_p50_ms"] = round(statistics.median(held_floor) * 1e3, 1)
    fig.extra["ours_over_held_floor"] = fig.ours_p50 / statistics.median(held_floor)
    for key, values in (
        ("ours_to_first_result", to_result),
        ("raw_to_first_result", raw_to_result),
        ("raw_held_to_first_result", held_to_result),
    ):
        fig.extra[f"{key}_p50_ms"] = round(statistics.median(values) * 1e3, 1)
    fig.extra.update({f"ours_{k}_p50_ms": round(statistics.median(v) * 1e3, 1) for k, v in phases.items() if v})
    return fig, idle


async def run() -> list[Figure]:
    rig = Rig("B13")
    home = tempfile.TemporaryDirectory(prefix="checkfu-bench-b13-")
    os.environ["XDG_STATE_HOME"] = home.name
    journal = Journal(sqlite_url(Path(home.name) / "journal.sqlite"))
    registry = Registry()
    registry.add(await adapter_from_factory(lambda: rig.provider, "bench docker", {}, in_tree=True))
    runner = Runner(registry, journal, runner_tag=rig.tag, clock=SystemClock())
    # The filler: the same runner tag, journal and engine, its Docker tier holding what it provisions.
    held = DockerProvider(state_dir=rig.state.name, cache_tag=rig.tag, hold=True)
    fill_registry = Registry()
    fill_registry.add(await adapter_from_factory(lambda: held, "bench docker (hold)", {}, in_tree=True))
    filler = Runner(fill_registry, journal, runner_tag=rig.tag, clock=SystemClock())
    data = Path(home.name) / "data"
    data.mkdir()
    (data / "one.bin").write_bytes(os.urandom(4096))
    figures: list[Figure] = []
    try:
        plain, idle = await _figure(rig, runner, filler, [], "")
        idle.update(await _engine_cost(filler, rig))
        mounted_in = [resolve_mount(parse_mount(f"{data}:/data"))]
        mounted, _ = await _figure(rig, runner, filler, mounted_in, ", one sealed 4 KiB mount")
        figures = [plain, mounted]
    finally:
        drained = await drain(journal, registry, rig.tag, runner)
        report = await reconcile(journal, registry, SystemClock(), runner_tag=rig.tag)
        failed = [d for d in drained if d.error] + list(report.left)
        left = await rig.close()
        journal.close()
        home.cleanup()
    if failed:
        raise SandboxError(f"the pool was not drained: {failed}")
    for fig in figures:
        fig.extra.update(idle)
        fig.extra["left_behind"] = left
    return figures
