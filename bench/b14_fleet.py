"""B14: a fleet on one PostgreSQL: Runs per second with 1, 2 and 3 runners; takeover time; claim latency.

Everything real: a throwaway PostgreSQL 15 cluster on loopback (``fsync`` on, as shipped), the
memory provider served over the wire by ``checkfu provider serve memory`` (one shared process),
and ``checkfu runner serve`` processes (``--concurrency 4``). Runs are ``echo`` commands: the
figure is the fleet's own cost per Run (claim, select, journal, provision, process, release,
settle), not a workload's.

- **B14 throughput**: N Runs queued, then k runners started; Runs/s is N over the span from the
  first claim to the last settlement (runner start-up not counted). Rounds interleave k = 1, 2,
  3; the medians are reported, 1 runner being the baseline (``raw``).
- **B14 takeover**: a runner holding a long Run is SIGKILLed beside an idle one; the time from the
  kill to the idle one's claim of the next attempt (lease TTL 2 s, heartbeat 0.5 s). Target:
  at most TTL + 1 s.
- **B14 claim**: the latency of one claim (``RunQueue.claim``: ``FOR UPDATE SKIP LOCKED``, a lease
  inserted) with 1 000 Runs queued (one is queued for each claimed, so the queue stays at 1 000),
  from 1 and from 3 claimers at once; raw, beside it: the same select-for-update-skip-locked and
  update in bare psycopg, the database's own row-lock floor.
- Transactions per Run (from ``pg_stat_database``) and where the CPU went, to say what limits it.

``CHECKFU_BENCH_FLEET_RUNS`` sets N (default 300), ``CHECKFU_BENCH_FLEET_ROUNDS`` the rounds (3).
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from harness import Figure, percentile

from checkfu.contract.codec import digest
from checkfu.control.endpoints import remote_adapter
from checkfu.core.clock import SystemClock
from checkfu.core.journal import Journal
from checkfu.core.queue import RunQueue, RunRequest
from checkfu.core.registry import Adapter, enrollment_endpoint
from checkfu.fleet import submit_request
from checkfu.testing import memory_profile
from checkfu.wire.credentials import Credential

CHECKFU = Path(sys.executable).with_name("checkfu")
PG_BIN = Path("/usr/lib/postgresql/15/bin")
NAMES = ["B14"]
TTL = 2.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    def __init__(self) -> None:
        if not (PG_BIN / "initdb").exists():
            raise SystemExit(f"PostgreSQL 15 is not installed ({PG_BIN}); scripts/setup installs it")
        self.root = Path(tempfile.mkdtemp(prefix="checkfu-b14-"))
        self.user = pwd.getpwuid(os.geteuid()).pw_name
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            self.user = "postgres"
            self.as_user = ["runuser", "-u", "postgres", "--"]
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self.port = _port()
        data, sock = self.root / "data", self.root / "sock"
        self._run(str(PG_BIN / "initdb"), "-D", str(data), "-U", self.user, "--auth=trust", "--no-sync")
        self._run("mkdir", str(sock))
        opts = f"-p {self.port} -k {sock} -c listen_addresses=127.0.0.1 -c max_connections=200"
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(self.root / "log"), "-o", opts, "-w", "start")

    def postmaster(self) -> int:
        return int((self.root / "data" / "postmaster.pid").read_text().split()[0])

    def _run(self, *argv: str) -> None:
        subprocess.run([*self.as_user, *argv], check=True, capture_output=True, timeout=120)

    def database(self) -> str:
        name = f"b14_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        subprocess.run(
            [*self.as_user, str(PG_BIN / "pg_ctl"), "-D", str(self.root / "data"), "stop", "-m", "fast"],
            capture_output=True,
            check=False,
            timeout=60,
        )
        shutil.rmtree(self.root, ignore_errors=True)


class Fleet:
    """A served memory provider, an environment, runner processes; all ended by ``close``."""

    def __init__(self, cluster: Cluster) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="checkfu-b14-fleet-"))
        self.secret = secrets.token_urlsafe(32)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("CHECKFU_")},
            "XDG_STATE_HOME": str(self.root / "state"),
            "CHECKFU_RUNNER_TAG": "bench-b14",
            "CHECKFU_PROVIDER_CREDENTIAL": self.secret,
        }
        cred = self.root / "credential"
        cred.write_text(self.secret)
        cred.chmod(0o600)
        port = _port()
        self.provider = subprocess.Popen(
            [
                str(CHECKFU),
                "provider",
                "serve",
                "memory",
                "--listen",
                f"127.0.0.1:{port}",
                "--credential-file",
                str(cred),
            ],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > end:
                raise SystemExit("the memory provider service did not start")
            time.sleep(0.05)
        self.profile = json.loads(memory_profile().model_dump_json())
        self.cluster = cluster
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.enrolled: set[str] = set()

    def enroll(self, journal: Journal) -> None:
        """Record the served memory provider as enrolled at its endpoint, as ``checkfu provider enroll`` leaves it
        after checking its evidence: a provider service is selected only once enrolled, and without it every Run
        is refused at selection. Enrollment itself is not what B14 measures (``tests/control`` tests it)."""

        async def describe() -> Adapter:
            adapter = await remote_adapter(self.url, Credential(self.secret))
            close = getattr(adapter.provider, "close", None)
            if callable(close):
                close()
            return adapter

        got: list[Adapter] = []
        asking = threading.Thread(target=lambda: got.append(asyncio.run(describe())))  # ``run`` is on a loop already
        asking.start()
        asking.join()
        if not got:
            raise SystemExit(f"B14: the memory provider service at {self.url} could not be described")
        adapter = got[0]
        journal.record_enrollment(
            adapter.target,
            endpoint=enrollment_endpoint(adapter),
            source=adapter.source,
            kind="evidence",
            envelope_digest=digest(adapter.envelope),
            envelope=adapter.envelope.model_dump_json(),
            ceiling=adapter.ceiling.model_dump_json(),
            now=time.time(),
        )

    def submit(self, db: str, n: int, argv: list[str]) -> list[str]:
        journal = Journal(db)
        try:
            if db not in self.enrolled:
                self.enroll(journal)
                self.enrolled.add(db)
            request = RunRequest(provider=self.url, command=tuple(argv), profile=self.profile, timeout=600)
            return [submit_request(journal, request, runner_tag="bench") for _ in range(n)]
        finally:
            journal.close()

    def runner(self, db: str, *options: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.root / f"runner-{uuid.uuid4().hex[:6]}.jsonl"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(CHECKFU), "runner", "serve", "--db", db, "--json", *options],
                env=self.env,
                stdout=out,
                stderr=subprocess.DEVNULL,
            )
        self.procs.append((proc, log))
        return proc, log

    @staticmethod
    def events(log: Path) -> list[dict[str, Any]]:
        out = []
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def stop(self, procs: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self.stop(self.procs)
        self.provider.send_signal(signal.SIGTERM)
        try:
            self.provider.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.provider.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def _xacts(db: str) -> int:
    dsn = db.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        got = row.fetchone()
        return int(got[0]) if got else 0


def _cpu(pid: int, *, children: bool = False) -> float:
    """CPU seconds (user + system) a process used so far; with ``children``, its reaped children's too."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in ((11, 12, 13, 14) if children else (11, 12))) / os.sysconf("SC_CLK_TCK")


def throughput_round(fleet: Fleet, k: int, n: int) -> dict[str, float]:
    db = fleet.cluster.database()
    fleet.submit(db, n, ["echo", "b14"])
    before = _xacts(db)
    provider_cpu = _cpu(fleet.provider.pid)
    db_cpu = _cpu(fleet.cluster.postmaster(), children=True)  # backends end with their runners, then counted
    procs = [fleet.runner(db, "--concurrency", "4", "--poll", "0.02", "--lease-ttl", "30") for _ in range(k)]
    end = time.monotonic() + 600
    while True:
        settled = [e for _, log in procs for e in fleet.events(log) if e["event"] == "settled"]
        if len(settled) >= n:
            break
        if time.monotonic() > end:
            raise SystemExit(f"B14: {len(settled)} of {n} Runs settled in 600 s")
        time.sleep(0.2)
    runner_cpu = sum(_cpu(p.pid) for p, _ in procs)
    claims = [e["at"] for _, log in procs for e in fleet.events(log) if e["event"] == "claimed"]
    span = max(e["at"] for e in settled) - min(claims)
    xacts = _xacts(db) - before
    fleet.stop(procs)
    time.sleep(0.5)  # the runners' backends exit and are reaped
    db_cpu = _cpu(fleet.cluster.postmaster(), children=True) - db_cpu
    failed = [e for e in settled if e["status"] != "succeeded"]
    if failed:
        raise SystemExit(f"B14: {len(failed)} Runs did not succeed: {failed[:3]}")
    return {
        "runs_per_s": n / span,
        "xacts_per_run": xacts / n,
        "runner_cpu_per_run_ms": 1000 * runner_cpu / n,
        "provider_cpu_per_run_ms": 1000 * (_cpu(fleet.provider.pid) - provider_cpu) / n,
        "db_cpu_per_run_ms": 1000 * db_cpu / n,
        "load_1min": os.getloadavg()[0],
    }


def takeover(fleet: Fleet) -> float:
    db = fleet.cluster.database()
    (run_id,) = fleet.submit(db, 1, ["sleep", "60"])
    options = ("--lease-ttl", str(TTL), "--heartbeat", "0.5", "--poll", "0.05", "--concurrency", "1")
    holder, holder_log = fleet.runner(db, *options)
    end = time.monotonic() + 30
    while not any(e["event"] == "claimed" for e in fleet.events(holder_log)):
        if time.monotonic() > end:
            raise SystemExit("B14: the first runner claimed nothing")
        time.sleep(0.02)
    time.sleep(0.5)  # mid-Run
    idle, idle_log = fleet.runner(db, *options)
    while not any(e["event"] == "serving" for e in fleet.events(idle_log)):
        time.sleep(0.02)
    killed_at = time.time()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    end = time.monotonic() + 30
    while True:
        claimed = [e for e in fleet.events(idle_log) if e["event"] == "claimed" and e["run_id"] == run_id]
        if claimed:
            fleet.stop([(idle, idle_log)])
            return float(claimed[0]["at"]) - killed_at
        if time.monotonic() > end:
            raise SystemExit("B14: no takeover within 30 s")
        time.sleep(0.01)


def claim_latency(db: str, claimers: int, per_claimer: int, fleet: Fleet) -> list[float]:
    fleet.submit(db, 1000, ["true"])
    samples: list[float] = []
    guard = threading.Lock()

    def work(i: int) -> None:
        journal = Journal(db)
        queue = RunQueue(journal, SystemClock())
        mine = []
        try:
            for _ in range(per_claimer):
                t0 = time.perf_counter()
                got = queue.claim(owner=f"bench-{i}.invalid/1/1", runner_id=f"bench-{i}", runner_tag="b", ttl=600)
                mine.append(time.perf_counter() - t0)
                assert got is not None
                fleet.submit(db, 1, ["true"])  # keep 1 000 queued
        finally:
            journal.close()
        with guard:
            samples.extend(mine)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples


def raw_claim_latency(db: str, n: int) -> list[float]:
    """The database's own floor: select-for-update-skip-locked and one update, in bare psycopg."""
    dsn = db.replace("postgresql+psycopg://", "postgresql://")
    samples = []
    with psycopg.connect(dsn) as c:
        c.execute("CREATE TABLE raw_q (id serial PRIMARY KEY, status text NOT NULL, created_at float8 NOT NULL)")
        c.execute("CREATE INDEX ON raw_q (status, created_at)")
        c.execute("INSERT INTO raw_q (status, created_at) SELECT 'queued', g FROM generate_series(1, 1000) g")
        c.commit()
        for i in range(n):
            t0 = time.perf_counter()
            with c.transaction():
                row = c.execute(
                    "SELECT id FROM raw_q WHERE status = 'queued' ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED"
                ).fetchone()
                assert row is not None
                c.execute("UPDATE raw_q SET status = 'running' WHERE id = %s", (row[0],))
            samples.append(time.perf_counter() - t0)
            c.execute("INSERT INTO raw_q (status, created_at) VALUES ('queued', %s)", (2000.0 + i,))
            c.commit()
    return samples


async def run() -> list[Figure]:
    n = int(os.environ.get("CHECKFU_BENCH_FLEET_RUNS", "300"))
    rounds = int(os.environ.get("CHECKFU_BENCH_FLEET_ROUNDS", "3"))
    cluster = Cluster()
    fleet: Fleet | None = None
    try:
        fleet = Fleet(cluster)
        by_k: dict[int, list[dict[str, float]]] = {1: [], 2: [], 3: []}
        for r in range(rounds):
            for k in (1, 2, 3) if r % 2 == 0 else (3, 2, 1):
                by_k[k].append(throughput_round(fleet, k, n))
        med = {k: statistics.median(x["runs_per_s"] for x in v) for k, v in by_k.items()}
        xacts = statistics.median(x["xacts_per_run"] for v in by_k.values() for x in v)
        runner_cpu = statistics.median(x["runner_cpu_per_run_ms"] for x in by_k[1])
        provider_cpu = statistics.median(x["provider_cpu_per_run_ms"] for x in by_k[1])
        db_cpu = statistics.median(x["db_cpu_per_run_ms"] for x in by_k[1])
        load = statistics.median(x["load_1min"] for v in by_k.values() for x in v)
        figures = [
            Figure(
                name="B14 throughput (Runs/s, 3 runners vs 1)",
                ours_p50=med[3],
                raw_p50=med[1],
                ratio=med[3] / med[1],
                target="scales with runners until the provider or the host saturates",
                met=med[2] >= med[1] * 0.95,
                n=rounds,
                unit=" Runs/s",
                extra={
                    "runs_per_round": n,
                    "runs_per_s_1": round(med[1], 2),
                    "runs_per_s_2": round(med[2], 2),
                    "runs_per_s_3": round(med[3], 2),
                    "db_transactions_per_run": round(xacts, 1),
                    "runner_cpu_ms_per_run": round(runner_cpu, 2),
                    "provider_cpu_ms_per_run": round(provider_cpu, 2),
                    "db_cpu_ms_per_run": round(db_cpu, 2),
                    "host_load_1min": round(load, 2),
                    "cores": os.cpu_count() or 0,
                },
            )
        ]
        takes = [takeover(fleet) for _ in range(5)]
        figures.append(
            Figure(
                name="B14 takeover after SIGKILL",
                ours_p50=statistics.median(takes),
                raw_p50=TTL,
                ratio=statistics.median(takes) / TTL,
                target=f"<= lease TTL + 1 s ({TTL + 1:g} s)",
                met=max(takes) <= TTL + 1,
                n=len(takes),
                extra={"max_s": round(max(takes), 3), "min_s": round(min(takes), 3), "lease_ttl_s": TTL},
            )
        )
        db = cluster.database()
        raw = raw_claim_latency(db, 300)
        one = claim_latency(db, 1, 300, fleet)
        db3 = cluster.database()
        three = claim_latency(db3, 3, 100, fleet)
        figures.append(
            Figure(
                name="B14 claim latency at 1000 queued",
                ours_p50=statistics.median(one),
                raw_p50=statistics.median(raw),
                ratio=statistics.median(one) / statistics.median(raw),
                target="a few ms: the database's row-lock floor plus the lease",
                met=statistics.median(one) < 0.02,
                n=len(one),
                extra={
                    "ours_p95": percentile(one, 0.95),
                    "raw_p95": percentile(raw, 0.95),
                    "three_claimers_p50": statistics.median(three),
                    "three_claimers_p95": percentile(three, 0.95),
                    "three_claimers_n": len(three),
                },
            )
        )
        return figures
    finally:
        if fleet is not None:
            fleet.close()
        cluster.stop()
