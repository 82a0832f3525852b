"""A fleet for tests: ``checkfu runner serve`` processes on one journal, driven and observed from outside.

Every runner is the installed console script in a process of its own, with ``--json`` events on
stdout (kept in a file the test reads as it goes). The fleet shares one runner tag of its own
(``CHECKFU_RUNNER_TAG``), so what it leaves on a provider is found by that tag, and a state
directory of its own. ``stop()`` ends every process the rig started, and only those.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from checkfu.core.journal import Journal, allocations, events, leases, run_output, runs
from checkfu.core.queue import is_terminal
from enrolled import enroll_service

CHECKFU = Path(sys.executable).with_name("checkfu")
SCRUBBED = ("CHECKFU_DEBUG", "CHECKFU_RUNNER_TAG", "XDG_STATE_HOME", "COLUMNS", "CHECKFU_PROVIDER_CREDENTIAL")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], Any], timeout: float, pause: float = 0.05) -> Any:
    """``check()``'s first truthy answer within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(pause)


@dataclass
class RunnerProc:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    paused: bool = False

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def in_flight(self) -> list[str]:
        """Runs this runner claimed and has not finished with, in claim order."""
        open_: dict[str, float] = {}
        for e in self.events():
            if e.get("event") == "claimed":
                open_[e["run_id"]] = e["at"]
            elif e.get("event") in ("settled", "fenced", "given_back", "postponed"):
                open_.pop(e.get("run_id", ""), None)
        return list(open_)

    def claimed_at(self, run_id: str, attempt: int) -> float | None:
        for e in self.events():
            if e.get("event") == "claimed" and e["run_id"] == run_id and e["attempt"] == attempt:
                return float(e["at"])
        return None


@dataclass
class FleetRig:
    db: str
    root: Path
    env: dict[str, str]
    tag: str
    runners: list[RunnerProc] = field(default_factory=list)
    services: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def make(cls, db: str, root: Path, **extra_env: str) -> FleetRig:
        tag = f"fleet-{uuid.uuid4().hex[:10]}"
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
        env.update({"XDG_STATE_HOME": str(root / "state"), "CHECKFU_RUNNER_TAG": tag, "COLUMNS": "200", **extra_env})
        return cls(db=db, root=root, env=env, tag=tag)

    # processes ----------------------------------------------------------------------------------

    def checkfu(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [str(CHECKFU), *argv], env=self.env, capture_output=True, timeout=timeout, cwd=self.root, check=False
        )

    def serve_provider(self, name: str, credential_file: Path) -> str:
        """``checkfu provider serve NAME`` as one shared process; its URL once it answers."""
        port = free_port()
        with (self.root / f"provider-{name}.log").open("wb") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                [str(CHECKFU), "provider", "serve", name, "--listen", f"127.0.0.1:{port}", "--credential-file",
                 str(credential_file)],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
            )  # fmt: skip
        self.services.append(proc)

        def answers() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the provider service exited: {(self.root / f'provider-{name}.log').read_text()}")
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_for("the provider service", answers, 30)
        url = f"http://127.0.0.1:{port}"
        enroll_service(self.db, url, credential_file)  # a service is selected only once enrolled at its endpoint
        return url

    def start_runner(self, name: str, *options: str) -> RunnerProc:
        log = self.root / f"runner-{name}.jsonl"
        with log.open("wb") as out, (self.root / f"runner-{name}.err").open("wb") as err:
            proc = subprocess.Popen(
                [str(CHECKFU), "runner", "serve", "--db", self.db, "--json", *options],
                env=self.env, stdout=out, stderr=err, cwd=self.root,
            )  # fmt: skip
        runner = RunnerProc(name, proc, log)
        self.runners.append(runner)
        wait_for(f"runner {name} to serve", lambda: any(e["event"] == "serving" for e in runner.events()), 30)
        return runner

    def signal(self, runner: RunnerProc, sig: signal.Signals) -> float:
        runner.proc.send_signal(sig)
        runner.paused = sig == signal.SIGSTOP
        if sig == signal.SIGCONT:
            runner.paused = False
        return time.time()

    def stop_runners(self) -> None:
        """SIGTERM, then SIGKILL, every runner this rig started (a paused one is resumed first)."""
        self._end([r.proc for r in self.runners], before=signal.SIGCONT)

    def stop(self) -> None:
        """End every process this rig started: the runners, then the services."""
        self.stop_runners()
        self._end(self.services)

    @staticmethod
    def _end(procs: list[subprocess.Popen[bytes]], before: signal.Signals | None = None) -> None:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    if before is not None:
                        proc.send_signal(before)
                    proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    # the journal --------------------------------------------------------------------------------

    def journal(self) -> Journal:
        return Journal(self.db)

    def statuses(self, run_ids: Iterable[str]) -> dict[str, str]:
        wanted = list(run_ids)
        j = self.journal()
        try:
            with j.tx() as c:
                rows = c.execute(sa.select(runs.c.run_id, runs.c.status).where(runs.c.run_id.in_(wanted))).all()
        finally:
            j.close()
        return {r.run_id: r.status for r in rows}

    def wait_terminal(self, run_ids: list[str], timeout: float) -> dict[str, str]:
        def done() -> dict[str, str] | None:
            got = self.statuses(run_ids)
            return got if len(got) == len(run_ids) and all(is_terminal(s) for s in got.values()) else None

        result: dict[str, str] = wait_for("every Run to reach a terminal state", done, timeout, pause=0.2)
        return result

    def query(self, statement: Any) -> list[Any]:
        j = self.journal()
        try:
            with j.tx() as c:
                return list(c.execute(statement).all())
        finally:
            j.close()

    def settle_events(self, run_id: str) -> list[Any]:
        return self.query(sa.select(events).where(events.c.run_id == run_id, events.c.member == "settle"))

    def open_allocations(self) -> list[Any]:
        return self.query(sa.select(allocations).where(allocations.c.state.in_(("pending", "live"))))

    def output_of(self, run_id: str) -> list[Any]:
        return self.query(sa.select(run_output).where(run_output.c.run_id == run_id).order_by(run_output.c.id))

    def lease_of(self, run_id: str) -> Any:
        rows = self.query(
            sa.select(leases).join(runs, runs.c.lease_id == leases.c.lease_id).where(runs.c.run_id == run_id)
        )
        return rows[0] if rows else None


# one round of trouble, and what must hold after it -------------------------------------------


def in_flight(runner: RunnerProc) -> list[str]:
    return runner.in_flight()


def taken_over(rig: FleetRig, run_ids: list[str], by_not: str) -> bool:
    rows = rig.query(sa.select(runs.c.run_id, runs.c.attempt, runs.c.runner_id).where(runs.c.run_id.in_(run_ids)))
    return len(rows) == len(run_ids) and all(r.attempt >= 2 and r.runner_id != by_not for r in rows)


def runner_id(runner: RunnerProc) -> str:
    return next(e["runner_id"] for e in runner.events() if e["event"] == "serving")


def check_every_run_settled_once(rig: FleetRig, ids: list[str]) -> None:
    for run_id in ids:
        settled = rig.settle_events(run_id)
        assert len(settled) == 1, (run_id, settled)
    rows = rig.query(sa.select(runs).where(runs.c.run_id.in_(ids)))
    bad = [(r.run_id, r.status, r.exit_code) for r in rows if (r.status, r.exit_code) != ("succeeded", 0)]
    assert bad == []


def fleet_round(rig: Any, ids: list[str], victims: tuple[RunnerProc, RunnerProc]) -> dict[str, Any]:
    """Kill one runner while it holds Runs; pause another past its lease until they are taken over; resume it.

    Returns what was seen: the killed and paused Runs, and when.
    """
    killed, paused = victims
    killed_runs = wait_for(f"runner {killed.name} to hold a Run", lambda: in_flight(killed), 30)
    t_kill = rig.signal(killed, signal.SIGKILL)
    paused_runs = wait_for(f"runner {paused.name} to hold a Run", lambda: in_flight(paused), 30)
    t_stop = rig.signal(paused, signal.SIGSTOP)
    paused_id = runner_id(paused)
    killed_id = runner_id(killed)
    wait_for("the paused runner's Runs to be taken over", lambda: taken_over(rig, paused_runs, paused_id), 30)
    wait_for("the killed runner's Runs to be taken over", lambda: taken_over(rig, killed_runs, killed_id), 30)
    time.sleep(0.5)
    t_cont = rig.signal(paused, signal.SIGCONT)
    fenced = wait_for(
        "the resumed runner to find itself fenced",
        lambda: {e["run_id"] for e in paused.events() if e["event"] == "fenced"} >= set(paused_runs),
        30,
    )
    epochs = {e["run_id"]: e["lease_epoch"] for e in paused.events() if e["event"] == "claimed"}
    return {
        "paused_epochs": {run_id: epochs[run_id] for run_id in paused_runs},
        "killed_runs": killed_runs,
        "t_kill": t_kill,
        "killed_id": killed_id,
        "paused_runs": paused_runs,
        "t_stop": t_stop,
        "t_cont": t_cont,
        "paused_id": paused_id,
        "fenced": fenced,
    }


def takeover_seconds(rig: FleetRig, run_id: str, since: float) -> float:
    """From ``since`` to the first claim of a later attempt of ``run_id``, by any runner."""
    claims = [
        e["at"]
        for r in rig.runners
        for e in r.events()
        if e["event"] == "claimed" and e["run_id"] == run_id and e["attempt"] >= 2
    ]
    assert claims, f"no later attempt of {run_id} was claimed"
    return float(min(claims)) - since


def check_the_paused_runner_changed_nothing(rig: FleetRig, seen: dict[str, Any], paused: RunnerProc) -> None:
    for run_id in seen["paused_runs"]:
        row = rig.query(sa.select(runs).where(runs.c.run_id == run_id))[0]
        assert row.runner_id != seen["paused_id"] and row.attempt >= 2
        summary = json.loads(row.summary)
        assert summary["runner_id"] != seen["paused_id"] and summary["lease_epoch"] > seen["paused_epochs"][run_id]
        # the paused attempt's allocations were compensated by the taker, and by nobody after it
        epoch = seen["paused_epochs"][run_id]
        first = rig.query(
            sa.select(allocations).where(allocations.c.run_id == run_id, allocations.c.lease_epoch == epoch)
        )
        assert first and all(a.state == "compensated" for a in first)
        # after the takeover, every call on those allocations is the taker's compensation or a fenced refusal; the
        # paused attempt may also record the end of a process it had open when it was paused, which broke once the
        # taker reclaimed its sandbox: a fault found on that stream (recorded as it is seen, with no duration), no
        # call of its own (whether it is seen before the heartbeat finds the lease gone is a race of the resume)
        keys = [a.allocation_key for a in first]
        later = rig.query(
            sa.select(events).where(events.c.allocation_key.in_(keys), events.c.started_at > seen["t_stop"])
        )
        assert all(
            e.member == "compensate"
            or e.error_code == "SandboxLeaseFenced"
            or (e.member == "openProcess" and e.outcome == "error" and e.duration_ms == 0.0)
            for e in later
        ), later
        # it never settled the Run, and its output ends where it was paused
        assert not any(e["event"] == "settled" and e["run_id"] == run_id for e in paused.events())
        paused_attempt = next(
            e["attempt"] for e in paused.events() if e["event"] == "claimed" and e["run_id"] == run_id
        )
        assert all(o.attempt != paused_attempt or o.at <= seen["t_stop"] + 0.5 for o in rig.output_of(run_id))
