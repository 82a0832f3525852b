"""B15: how fast the ``checkfu`` command starts, beside the floors it cannot go below.

Every figure times whole processes (wall time, ``subprocess.run``), interleaved in one run:

- ``B15 checkfu --version``: the installed console script, beside ``python -c pass`` (the interpreter's own
  start-up, the floor). Target: p50 at most 100 ms. Extra: the ten largest imports of ``-X importtime``.
- ``B15 checkfu run -- true``: ``checkfu run --profile examples/profiles/busybox-none.toml -- true`` (the shipped
  Docker profile; a Run journaled, its sandbox provisioned, ``true`` run in it, the sandbox released), run in a
  warm start-up server's child (``checkfu server start`` first, in a server directory of the benchmark's own:
  ``XDG_RUNTIME_DIR``), beside
  ``docker run --rm`` of ``true`` on the same image with the same hardening the Docker tier sets
  (``providers/docker/spec.py``: read-only root, user 1000:1000, every capability dropped, no-new-privileges,
  network none, private IPC, an init, the profile's memory (swap not extra), CPU and pids limits, no message
  queues, no logging, and its writable paths as tmpfs of the same sizes). Target: ours p50 at most 1.5 times raw.
  Extra: ``deps_import_p50``, a process that only imports the libraries any such Run needs (``DEPS_FLOOR``), and
  its ratio to raw: the part of the start no lazy import of checkfu's can remove; ``ours_phases_p50``, the Run's
  own phases as ``checkfu run`` reports them (the sandbox's work, journaled), and ``ours_outside_phases_p50``, the
  rest of its wall time (start-up, opening the journal, exit); ``cold_p50`` and ``cold_over_raw``, the same
  command in a process of its own (``CHECKFU_SERVER=off``: every import paid), interleaved with the two;
  ``server_rss_mib``, the warm server's resident memory, what it costs to keep; ``engine_same_work_p50``, the
  engine doing what a Run on the Docker tier asks of it (``same_work_config``: create the sandbox with a long-lived
  init, start it, ``exec true`` in it, remove it, through docker-py in this process, no client to start) and
  ``engine_same_work_over_raw``, its ratio to raw; ``design_floor_over_raw``, that plus Python's own start-up
  (``python -c pass``) over raw: the least a Python command that runs ``true`` by an exec in a sandbox of that
  shape can take. Every process is an exec, so its exit is the engine's word (issue 28: a first process started
  from inside the sandbox could have its exit forged by the sandbox). Between timed steps the
  benchmark waits, untimed, until the server has its spare ready (``docs/server.md``), so that making it is not
  timed as part of the next step; ``spare_rss_mib`` is the spare's own memory, and ``back_to_back_p50`` (with
  ``back_to_back_over_raw``) times ``checkfu run -- true`` run again at once, n times, as a script's loop runs it:
  no spare is made between those.

The state directory (``XDG_STATE_HOME``) is a temporary one and the runner tag (``CHECKFU_RUNNER_TAG``) the
benchmark's own; ``left_behind`` counts only Docker objects labelled with that tag. checkfu's own modules are
byte-compiled first, as an installed package's are. Set ``CHECKFU_BENCH_N`` to change the rounds (default 20).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.types
from harness import Figure, interleave, interleave_many, summarize

import checkfu
from checkfu.cli import startup

NAMES = ["B15"]
ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "examples" / "profiles" / "busybox-none.toml"
IMAGE = "checkfu/busybox:1"
CHECKFU = Path(sys.executable).with_name("checkfu")
VERSION_TARGET = 0.100
RUN_TARGET = 1.5
DEPS_FLOOR = "import sqlalchemy, docker, pydantic, typer, rich.console"
"""What any ``checkfu run`` on the Docker tier imports before its own code: its journal (SQLAlchemy), the engine's
client (docker-py), the contract's models (pydantic) and the command line (typer, rich)."""


def rounds() -> int:
    return int(os.environ.get("CHECKFU_BENCH_N", "20"))


def docker_run_argv(tag: str) -> list[str]:
    """``docker run`` of ``true`` as isolated as the Docker tier makes a sandbox of ``PROFILE``
    (cpu_millis 500, memory_mib 128, disk_mib 64 split as ``spec.split_disk`` splits it, pids 64)."""
    disk_kib = 64 * 1024
    shm, tmp = disk_kib // 16, disk_kib // 4
    home = disk_kib - shm - tmp
    return [
        "docker",
        "run",
        "--rm",
        "--read-only",
        "--user",
        "1000:1000",
        "--workdir",
        "/home/sandbox",
        "--hostname",
        "sandbox",
        "--env",
        "HOME=/home/sandbox",
        "--network",
        "none",
        "--ipc",
        "private",
        "--init",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--memory",
        "128m",
        "--memory-swap",
        "128m",
        "--cpus",
        "0.5",
        "--pids-limit",
        "64",
        "--ulimit",
        "msgqueue=0:0",
        "--log-driver",
        "none",
        "--tmpfs",
        f"/home/sandbox:size={home}k,uid=1000,gid=1000,mode=755,nosuid,nodev",
        "--tmpfs",
        f"/tmp:size={tmp}k,mode=1777,nosuid,nodev",
        "--tmpfs",
        f"/dev/shm:size={shm}k,mode=1777,nosuid,nodev,noexec",
        "--label",
        f"checkfu.runner_tag={tag}",
        IMAGE,
        "true",
    ]


def same_work_config(tag: str) -> dict[str, Any]:
    """docker-py's arguments for the sandbox ``docker_run_argv`` runs, shaped as the Docker tier shapes one: a
    long-lived init, so that ``true`` runs in it by ``exec`` (a Run may run many processes in one sandbox)."""
    disk_kib = 64 * 1024
    shm, tmp = disk_kib // 16, disk_kib // 4
    home = disk_kib - shm - tmp
    return {
        "image": IMAGE,
        "command": ["sleep", "infinity"],
        "user": "1000:1000",
        "working_dir": "/home/sandbox",
        "hostname": "sandbox",
        "environment": {"HOME": "/home/sandbox"},
        "read_only": True,
        "network_mode": "none",
        "ipc_mode": "private",
        "init": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "mem_limit": 128 << 20,
        "memswap_limit": 128 << 20,
        "nano_cpus": 500_000_000,
        "pids_limit": 64,
        "ulimits": [docker.types.Ulimit(name="msgqueue", soft=0, hard=0)],
        "log_config": {"type": "none", "config": {}},
        "tmpfs": {
            "/home/sandbox": f"size={home}k,uid=1000,gid=1000,mode=755,nosuid,nodev",
            "/tmp": f"size={tmp}k,mode=1777,nosuid,nodev",
            "/dev/shm": f"size={shm}k,mode=1777,nosuid,nodev,noexec",
        },
        "labels": {"checkfu.runner_tag": tag},
    }


def importtime_top(argv: list[str], env: dict[str, str], k: int = 10) -> str:
    """The ``k`` largest imports (cumulative microseconds) of one ``python -X importtime`` run of ``argv``."""
    done = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env, capture_output=True, check=True)
    rows: list[tuple[int, str]] = []
    for line in done.stderr.decode().splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        _, cumulative, name = line.split(":", 1)[1].split("|")
        rows.append((int(cumulative), name.strip()))
    rows.sort(reverse=True)
    return ",".join(f"{name}={us}us" for us, name in rows[:k])


def phase_seconds(said: str) -> float:
    """The sum of the phases ``checkfu run`` reports (``phases     resolve 0 ms, select 8 ms, ...``): the Run's own
    work, from resolving mounts to releasing the sandbox; the rest of its wall time is start-up and exit."""
    for line in said.splitlines():
        if line.startswith("phases"):
            return sum(float(m) for m in re.findall(r" ([0-9.]+) ms", line)) / 1000
    raise SystemExit(f"checkfu run printed no phases: {said[-400:]}")


def _status(where: str) -> dict[str, Any]:
    """The start-up server's answer to ``status``, asked on its socket (no command started for it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(where)
        startup.send_message(sock, {"op": "status"})
        answer, _ = startup.recv_message(sock)
    return answer


def _spare_ready(where: str, timeout: float = 5.0) -> None:
    """Wait until the server has a spare ready (it makes one once commands have been quiet a moment): untimed,
    so that making it is not timed as part of whatever runs next."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spare = _status(where).get("spare")
        if isinstance(spare, dict) and spare.get("ready"):
            return
        time.sleep(0.02)
    raise SystemExit(f"the start-up server at {where} had no spare ready after {timeout:.0f} s")


def _rss_mib(pid: int) -> float:
    """The resident memory of process ``pid``, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _ended(pid: int) -> None:
    """Wait for the server this benchmark started to exit (asked to stop); end it by its id if it does not."""
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def leftovers(tag: str) -> int:
    """Containers, volumes and images labelled with the benchmark's runner tag."""
    label = f"label=checkfu.runner_tag={tag}"
    count = 0
    for kind in (["ps", "-a"], ["volume", "ls"], ["images"]):
        out = subprocess.run(["docker", *kind, "-q", "--filter", label], capture_output=True, check=True, text=True)
        count += len(out.stdout.split())
    return count


async def run() -> list[Figure]:
    if not CHECKFU.exists():
        raise SystemExit(f"no installed checkfu command at {CHECKFU} (run scripts/setup)")
    probe = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, check=False)
    if probe.returncode != 0:
        raise SystemExit(f"no Docker Engine or no {IMAGE} image: {probe.stderr.decode().strip()[:200]}")
    # checkfu's modules byte-compiled, as an installed package's are (a checkout run under PYTHONDONTWRITEBYTECODE
    # would otherwise compile them from source on every start)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(Path(checkfu.__file__).parent)], check=False, capture_output=True
    )
    tag = f"bench-b15-{uuid.uuid4().hex[:8]}"
    n = rounds()
    with tempfile.TemporaryDirectory(prefix="checkfu-b15-") as home:
        runtime = Path(home) / "runtime"
        runtime.mkdir(mode=0o700)
        env = {**os.environ, "XDG_STATE_HOME": home, "CHECKFU_RUNNER_TAG": tag, "XDG_RUNTIME_DIR": str(runtime)}
        env["CHECKFU_SERVER"] = "on"
        env.pop("CHECKFU_DEBUG", None)
        cold_env = {**env, "CHECKFU_SERVER": "off"}

        def call(argv: list[str], environ: dict[str, str] | None = None) -> str:
            done = subprocess.run(
                argv, env=environ or env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
            )
            if done.returncode != 0:
                raise SystemExit(f"{' '.join(argv[:3])} ... exited {done.returncode}: {done.stderr.decode()[-400:]}")
            return done.stderr.decode(errors="replace")

        def version() -> None:
            call([str(CHECKFU), "--version"])

        def floor() -> None:
            call([sys.executable, "-c", "pass"])

        def deps() -> None:
            call([sys.executable, "-c", DEPS_FLOOR])

        phases: list[float] = []
        run_argv = [str(CHECKFU), "run", "--profile", str(PROFILE), "--", "true"]

        def ours() -> None:
            phases.append(phase_seconds(call(run_argv)))

        def cold() -> None:
            call(run_argv, cold_env)

        engine = docker.from_env()
        same_shape = same_work_config(tag)

        def same_work() -> None:
            box = engine.containers.create(**same_shape)
            box.start()
            code, _ = box.exec_run(["true"], user="1000:1000")
            box.remove(force=True)
            if code != 0:
                raise SystemExit(f"exec true in the engine's own sandbox exited {code}")

        raw_argv = docker_run_argv(tag)

        def raw() -> None:
            call(raw_argv)

        a, b = await interleave(version, floor, n=n, warmup=2)
        first = summarize(
            "B15 checkfu --version",
            a,
            b,
            target=f"<={VERSION_TARGET * 1000:.0f}ms p50 (raw: python -c pass)",
            met=lambda _r, xs, _b: statistics.median(xs) <= VERSION_TARGET,
        )
        first.extra["importtime_top10"] = importtime_top([str(CHECKFU), "--version"], env)
        e, f = await interleave(deps, floor, n=n, warmup=1)
        started = subprocess.run([str(CHECKFU), "server", "start", "--json"], env=env, check=True, capture_output=True)
        server = json.loads(started.stdout)
        where = str(server["socket"])
        try:
            c, d, g, h = await interleave_many(
                [ours, raw, cold, same_work], n=n, warmup=2, settle=lambda: _spare_ready(where)
            )
            rss = _rss_mib(int(server["pid"]))
            spare = _status(where).get("spare") or {}
            spare_rss = int(spare.get("rss_kib") or 0) / 1024
            # One command straight after another, as a script's loop runs them: no spare is made between them.
            _spare_ready(where)
            back_to_back = []
            for _ in range(n):
                t0 = time.perf_counter()
                ours()
                back_to_back.append(time.perf_counter() - t0)
        finally:
            subprocess.run([str(CHECKFU), "server", "stop"], env=env, capture_output=True, check=False)
            _ended(int(server["pid"]))
            engine.close()
            left = leftovers(tag)
        second = summarize(
            "B15 checkfu run -- true",
            c,
            d,
            target=f"<={RUN_TARGET}x hardened docker run",
            met=lambda r, _a, _b: r <= RUN_TARGET,
        )
        second.met = second.met and left == 0
        first.extra["left_behind"] = second.extra["left_behind"] = left
        phased = phases[-len(c) :]  # the timed rounds' (the first were warm-up)
        second.extra["ours_phases_p50"] = statistics.median(phased)
        second.extra["ours_outside_phases_p50"] = statistics.median(w - p for w, p in zip(c, phased, strict=True))
        second.extra["cold_p50"] = statistics.median(g)
        second.extra["cold_over_raw"] = statistics.median(g) / statistics.median(d)
        second.extra["server_rss_mib"] = rss
        second.extra["spare_rss_mib"] = spare_rss
        second.extra["back_to_back_p50"] = statistics.median(back_to_back)
        second.extra["back_to_back_over_raw"] = statistics.median(back_to_back) / statistics.median(d)
        second.extra["python_floor_p50"] = statistics.median(f)
        second.extra["deps_import_p50"] = statistics.median(e)
        second.extra["deps_import_over_raw"] = statistics.median(e) / statistics.median(d)
        second.extra["engine_same_work_p50"] = statistics.median(h)
        second.extra["engine_same_work_over_raw"] = statistics.median(h) / statistics.median(d)
        second.extra["design_floor_over_raw"] = (statistics.median(h) + statistics.median(f)) / statistics.median(d)
        second.extra["profile"] = str(PROFILE.relative_to(ROOT))
        return [first, second]
