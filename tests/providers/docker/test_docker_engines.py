"""The Docker tier on several engines: each its own site, placed by load, reconciled one by one.

Two private engines this module starts (``private_engines.py``): ``a`` reached by its Unix
socket, ``b`` by TCP with TLS. The shared engine is only read from (the base image is copied
from it) and must hold nothing of these tests afterwards. One test stops ``b`` in the middle
of its Runs (SIGKILL of its dockerd): its Runs fail with a typed error, reconciliation reports ``b`` down (never
empty) and exits non-zero, new Runs go to ``a``, and once ``b`` is back a reconciliation
reclaims everything left on it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from private_engines import PrivateEngine, _free_port, can_run_dockerd, new_engine

import checkfu
from checkfu.core.fleet import FleetConfig, FleetRunner
from checkfu.core.journal import Journal, allocations, runs, sqlite_url
from checkfu.core.queue import is_terminal
from checkfu.core.registry import Registry, load_registry
from fleet_rig import (
    FleetRig,
    check_every_run_settled_once,
    check_the_paused_runner_changed_nothing,
    fleet_round,
    takeover_seconds,
    wait_for,
)

pytestmark = pytest.mark.docker

CHECKFU = Path(sys.executable).with_name("checkfu")
TTL = 2.0
RUNNER_OPTIONS = ("--lease-ttl", str(TTL), "--heartbeat", "0.4", "--poll", "0.05", "--reconcile-every", "2")


@pytest.fixture(scope="module")
def engines(client: Any) -> Iterator[tuple[PrivateEngine, PrivateEngine]]:
    why = can_run_dockerd()
    if why is not None:
        if os.environ.get("CHECKFU_REQUIRE_DOCKER") == "1":
            pytest.fail(f"private engines cannot run: {why}")
        pytest.skip(why)
    a, b = new_engine("a"), new_engine("b", tls=True)
    try:
        for engine in (a, b):
            engine.start()
            engine.load(client, "checkfu/busybox:1")
        yield a, b
    finally:
        a.destroy()
        b.destroy()


def sites(a: PrivateEngine, b: PrivateEngine) -> dict[str, list[dict[str, Any]]]:
    return {
        "docker": [
            {"site": "a", "url": a.url},
            {"site": "b", "url": b.url, "tls_dir": str(b.client_dir)},
        ]
    }


def engine_options(a: PrivateEngine, b: PrivateEngine) -> list[str]:
    return ["--engine", f"a={a.url}", "--engine", f"b={b.url}", "--engine-certs", str(b.client_dir.parent)]


def busybox_profile(busybox_id: str) -> dict[str, Any]:
    return {
        "tier": "container",
        "base_image": busybox_id,
        "network_policy": {"mode": "none"},
        "resource_limits": {"cpu_millis": 500, "memory_mib": 128, "disk_mib": 64, "pids": 64},
        "retention_mode": "ephemeral_zdr",
    }


class InProcessRunner:
    """A ``FleetRunner`` serving in a thread of its own (its own event loop), stopped on the way out."""

    def __init__(self, db: str, loaded: dict[str, list[dict[str, Any]]], tag: str, **config: Any) -> None:
        self.journal = Journal(db)

        async def load(spec: str) -> Registry:
            return await load_registry(entry_point_names=[spec], recorder=self.journal, sites=loaded)

        self.events: list[dict[str, Any]] = []
        self.fleet = FleetRunner(
            self.journal,
            load,
            runner_tag=tag,
            config=FleetConfig(**{"lease_ttl": 10.0, "poll": 0.05, "reconcile_every": 3600.0, **config}),
            emit=self.events.append,
        )
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.failed: BaseException | None = None

    def _main(self) -> None:
        async def serve() -> None:
            self.loop = asyncio.get_running_loop()
            await self.fleet.serve()

        try:
            asyncio.run(serve())
        except BaseException as exc:
            self.failed = exc

    def __enter__(self) -> InProcessRunner:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.fleet.stop)
        self.thread.join(timeout=120)
        self.journal.close()
        assert self.failed is None, self.failed


def wait_terminal(db: str, ids: list[str], timeout: float) -> dict[str, Any]:
    journal = Journal(db)
    try:
        end = time.monotonic() + timeout
        while True:
            rows = {r.run_id: r for r in (journal.run(i) for i in ids) if r is not None}
            if all(is_terminal(r.status) for r in rows.values()):
                return rows
            assert time.monotonic() < end, {i: r.status for i, r in rows.items()}
            time.sleep(0.2)
    finally:
        journal.close()


def query(db: str, statement: Any) -> list[Any]:
    journal = Journal(db)
    try:
        with journal.tx() as c:
            return list(c.execute(statement).all())
    finally:
        journal.close()


def shared_holds(client: Any, tag: str) -> list[str]:
    selector = {"label": [f"checkfu.runner_tag={tag}"]}
    return [c.name for c in client.containers.list(all=True, filters=selector, ignore_removed=True)] + [
        v.name for v in client.volumes.list(filters=selector)
    ]


def test_each_engine_is_a_site_and_sandboxes_land_on_both(
    engines: tuple[PrivateEngine, PrivateEngine], client: Any, busybox_id: str, tmp_path: Path
) -> None:
    a, b = engines
    db = sqlite_url(tmp_path / "journal.sqlite")
    tag = f"engines-{uuid.uuid4().hex[:8]}"
    # `cat` ends only once stdin is closed: over TLS that is a close_notify the engine must read as EOF
    ids = [
        checkfu.submit(
            ["sh", "-c", f"cat; echo run {i} ok"], db=db, provider="docker", profile=busybox_profile(busybox_id)
        )
        for i in range(6)
    ]
    with InProcessRunner(db, sites(a, b), tag, concurrency=4):
        rows = wait_terminal(db, ids, timeout=120)
    assert {r.status for r in rows.values()} == {"succeeded"}, [(r.status, r.summary) for r in rows.values()]
    assert {r.site for r in rows.values()} == {"a", "b"}  # placed by load: both engines took sandboxes
    for i, run_id in enumerate(ids):
        assert checkfu.wait(run_id, db=db).exit_code == 0
        out = bytearray()
        checkfu.wait(run_id, db=db, on_stdout=out.extend)
        assert bytes(out) == f"run {i} ok\n".encode()
    placed = query(db, sa.select(allocations.c.site, allocations.c.state).where(allocations.c.kind == "instance"))
    assert {p.site for p in placed} == {"a", "b"} and {p.state for p in placed} == {"released"}
    assert a.labelled(tag) == [] and b.labelled(tag) == []
    assert shared_holds(client, tag) == []


def reconcile_cli(db: str, tag: str, a: PrivateEngine, b: PrivateEngine) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, "CHECKFU_RUNNER_TAG": tag}
    done = subprocess.run(
        [str(CHECKFU), "runner", "reconcile", "--db", db, "--provider", "docker", "--json", *engine_options(a, b)],
        capture_output=True,
        env=env,
        timeout=300,
        check=False,
    )
    return done.returncode, json.loads(done.stdout or b"{}")


def test_an_engine_stopped_mid_run_is_reported_never_empty_and_reconciled_once_back(
    engines: tuple[PrivateEngine, PrivateEngine], client: Any, busybox_id: str, tmp_path: Path
) -> None:
    a, b = engines
    db = sqlite_url(tmp_path / "journal.sqlite")
    tag = f"engines-{uuid.uuid4().hex[:8]}"
    profile = busybox_profile(busybox_id)
    ids = [checkfu.submit(["sleep", "6"], db=db, provider="docker", profile=profile) for _ in range(4)]
    try:
        with InProcessRunner(db, sites(a, b), tag, concurrency=4) as runner:
            deadline = time.monotonic() + 60
            while len(b.labelled(tag)) == 0 or len(a.labelled(tag)) == 0:  # sandboxes on both engines
                assert time.monotonic() < deadline, runner.events
                time.sleep(0.1)
            time.sleep(1.0)
            b.crash()  # mid-run, abruptly: its API is gone, and what it held stays until it is back
            rows = wait_terminal(db, ids, timeout=120)
            on_b = [r for r in rows.values() if r.site == "b"]
            on_a = [r for r in rows.values() if r.site == "a"]
            assert on_a and on_b
            assert {r.status for r in on_a} == {"succeeded"}
            # a typed failure, never a success made up and never a hang
            assert all(r.status.startswith(("refused:Sandbox", "failed")) for r in on_b), [
                (r.status, r.summary) for r in on_b
            ]
            left_on_b = {
                x.allocation_key
                for x in query(db, sa.select(allocations).where(allocations.c.site == "b"))
                if x.state in ("pending", "live")
            }
            assert left_on_b  # it could not be released: the journal still holds it open

            # a Run submitted now goes to the engine that answers
            late = checkfu.submit(["echo", "late"], db=db, provider="docker", profile=profile)
            (late_row,) = wait_terminal(db, [late], timeout=60).values()
            assert (late_row.status, late_row.site) == ("succeeded", "a")

        code, report = reconcile_cli(db, tag, a, b)
        assert code == 1, report  # something is left: never "nothing to do"
        assert "listAllocations at b" in report["failed"]
        assert left_on_b <= set(report["failed"])
        assert not (left_on_b & set(report["compensated"]))
        assert a.labelled(tag) == []

        b.start()  # back, with what it held when it stopped
        assert b.labelled(tag)
        code, report = reconcile_cli(db, tag, a, b)
        assert code == 0, report
        assert left_on_b <= set(report["compensated"]) | set(report["enumerated"])
        assert b.labelled(tag) == [] and a.labelled(tag) == []
        code, report = reconcile_cli(db, tag, a, b)
        assert code == 0 and not (report["compensated"] or report["enumerated"] or report["failed"]), report
        assert query(db, sa.select(runs.c.run_id).where(runs.c.status.in_(("queued", "running")))) == []
    finally:
        if not b.running:
            b.start()
        assert shared_holds(client, tag) == []


def test_a_fleet_of_three_on_two_engines_through_a_sigkill_and_a_sigstop(
    engines: tuple[PrivateEngine, PrivateEngine], client: Any, busybox_id: str, pg_cluster: Any, tmp_path: Path
) -> None:
    """The Docker tier's shorter version of ``tests/runner/test_runner_fleet.py``: every Run ends once, the paused
    runner is fenced and changes nothing, and neither engine holds anything of the fleet afterwards."""
    a, b = engines
    rig = FleetRig.make(pg_cluster.url(pg_cluster.create_database()), tmp_path)
    options = [*RUNNER_OPTIONS, *engine_options(a, b)]
    profile = busybox_profile(busybox_id)
    try:
        ids = [checkfu.submit(["sleep", "5"], db=rig.db, provider="docker", profile=profile) for _ in range(4)]
        ids += [checkfu.submit(["echo", f"short {i}"], db=rig.db, provider="docker", profile=profile) for i in range(4)]
        first = rig.start_runner("a", *options, "--concurrency", "2")
        wait_for("runner a to hold two Runs", lambda: len(first.in_flight()) == 2, 60)
        second = rig.start_runner("b", *options, "--concurrency", "2")
        wait_for("runner b to hold two Runs", lambda: len(second.in_flight()) == 2, 60)
        third = rig.start_runner("c", *options, "--concurrency", "4")
        seen = fleet_round(rig, ids, (first, second))
        assert set(rig.wait_terminal(ids, timeout=120).values()) == {"succeeded"}
        check_every_run_settled_once(rig, ids)
        for run_id in seen["killed_runs"]:
            assert rig.lease_of(run_id).epoch >= 2
            assert takeover_seconds(rig, run_id, seen["t_kill"]) <= TTL + 3
        check_the_paused_runner_changed_nothing(rig, seen, second)
        sites = {r.site for r in rig.query(sa.select(runs.c.site).where(runs.c.run_id.in_(ids)))}
        assert sites == {"a", "b"}
        rig.stop_runners()
        assert first.proc.returncode == -9 and (second.proc.returncode, third.proc.returncode) == (0, 0)
        assert rig.open_allocations() == []
        assert a.labelled(rig.tag) == [] and b.labelled(rig.tag) == []
    finally:
        rig.stop()
        assert shared_holds(client, rig.tag) == []


@pytest.fixture
def sshd(
    engines: tuple[PrivateEngine, PrivateEngine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """An ``sshd`` of this test's own on a loopback port, whose sessions see engine ``a`` as their Docker engine;
    yields the ``ssh://`` URL the runner reaches engine ``a`` by. The client's key and settings live in a home
    directory of this test's own."""
    sshd_bin, keygen = Path("/usr/sbin/sshd"), shutil.which("ssh-keygen")
    if not sshd_bin.exists() or keygen is None or shutil.which("ssh") is None:
        if os.environ.get("CHECKFU_REQUIRE_DOCKER") == "1":
            pytest.fail("openssh-server and openssh-client are needed (scripts/setup installs them)")
        pytest.skip("openssh-server is not installed")
    a, _ = engines
    root = tmp_path / "sshd"
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    root.mkdir()
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(root / "host")], check=True)
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh" / "id_ed25519")], check=True)
    (root / "authorized_keys").write_bytes((home / ".ssh" / "id_ed25519.pub").read_bytes())
    port = _free_port()
    (root / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {root / 'host'}\nPidFile {root / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        f"SetEnv DOCKER_HOST={a.socket_url}\n"
    )
    (home / ".ssh" / "config").write_text(
        "Host 127.0.0.1\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        f"  IdentityFile {home / '.ssh' / 'id_ed25519'}\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    proc = subprocess.Popen([str(sshd_bin), "-D", "-e", "-f", str(root / "sshd_config")], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "sshd did not start"
            time.sleep(0.05)
        # ssh reads the passwd entry's home, not $HOME: the real client, told where this test's settings are
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {home / ".ssh" / "config"} "$@"\n')
        wrapper.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("HOME", str(home))
        yield f"ssh://root@127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_an_engine_reached_over_ssh_runs_and_reclaims_like_any_other(
    engines: tuple[PrivateEngine, PrivateEngine], sshd: str, busybox_id: str, tmp_path: Path
) -> None:
    a, _ = engines
    db = sqlite_url(tmp_path / "journal.sqlite")
    tag = f"ssh-{uuid.uuid4().hex[:8]}"
    run_id = checkfu.submit(
        ["sh", "-c", "cat; echo over ssh"], db=db, provider="docker", profile=busybox_profile(busybox_id)
    )
    with InProcessRunner(db, {"docker": [{"site": "s", "url": sshd}]}, tag, concurrency=1):
        (row,) = wait_terminal(db, [run_id], timeout=120).values()
    assert (row.status, row.site) == ("succeeded", "s"), row.summary.get("error")
    out = bytearray()
    checkfu.wait(run_id, db=db, on_stdout=out.extend)
    assert bytes(out) == b"over ssh\n"  # stdin's end reached the process through ssh and dial-stdio
    assert a.labelled(tag) == []
