"""The warm pool on the Docker tier (issue 18): ``checkfu pool fill|ls|drain`` and ``checkfu run --pool``.

Each test has a state directory and runner tag of its own; on the way out nothing labelled with that
tag is on the engine and no allocation of it is open in the journal (``docker_cli``).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from .test_run_cli import Cli
from .test_run_docker import BUSYBOX, containers, dcli, engine, leftovers  # noqa: F401 - fixtures

pytestmark = pytest.mark.docker


def ready(cli: Cli) -> list[dict[str, Any]]:
    return list(cli.json("pool", "ls")["ready"])


def wait_ready(cli: Cli, n: int, timeout: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = ready(cli)
        if len(got) >= n:
            return got
        time.sleep(0.5)
    raise AssertionError(f"the pool did not reach {n} ready sandboxes in {timeout:g} s: {ready(cli)}")


def test_a_run_adopts_a_pooled_sandbox_stages_its_mounts_sealed_and_the_pool_refills(
    dcli: Cli,  # noqa: F811
    engine: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    filled = dcli.json("pool", "fill", "--profile", BUSYBOX, "-n", "1", "--mount-target", "/data")
    [pooled] = filled["ready"]
    assert filled["made"] == [pooled["allocation_key"]]
    [box] = [c for c in containers(engine, dcli.tag) if c.name == pooled["instance_id"]]
    # Held: started and at once frozen, so nothing can run in it yet, and adopting it thaws instead of starting.
    assert box.status == "paused"
    assert box.labels["checkfu.hold"] == "1"
    assert box.labels["checkfu.allocation_key"] == pooled["allocation_key"]

    data = tmp_path / "data"
    data.mkdir()
    blob = os.urandom(100_000)
    (data / "blob.bin").write_bytes(blob)
    script = "sha256sum /data/blob.bin; if echo x > /data/new; then echo WRITABLE; fi"
    summary_file = tmp_path / "run.json"
    done = dcli(
        "run", "--pool", "--json", str(summary_file), "--profile", BUSYBOX, "--mount", f"{data}:/data", "--",
        "sh", "-c", script,
    )  # fmt: skip
    assert done.code == 0, str(done)
    assert done.out.decode().split()[0] == hashlib.sha256(blob).hexdigest()
    assert b"WRITABLE" not in done.out
    summary = json.loads(summary_file.read_text())
    assert summary["adopted"] == pooled["allocation_key"]
    assert "adopt" in summary["phases_ms"] and "provision" not in summary["phases_ms"]
    used = pooled["allocation_key"]
    assert not [c for c in containers(engine, dcli.tag) if c.labels.get("checkfu.allocation_key") == used]

    # The Run that adopted started a refill in the background: a new sandbox, never the one used.
    [again] = wait_ready(dcli, 1)
    assert again["allocation_key"] != pooled["allocation_key"]
    drained = dcli.json("pool", "drain")
    assert drained == {"drained": [again["allocation_key"]], "left": {}}
    assert ready(dcli) == []
    assert leftovers(engine, dcli.tag) == []


def test_a_run_whose_mounts_differ_provisions_its_own(dcli: Cli, tmp_path: Path) -> None:  # noqa: F811
    dcli.json("pool", "fill", "--profile", BUSYBOX, "-n", "1", "--mount-target", "/data")
    summary_file = tmp_path / "run.json"
    done = dcli("run", "--pool", "--json", str(summary_file), "--profile", BUSYBOX, "--", "true")
    assert done.code == 0, str(done)
    assert json.loads(summary_file.read_text())["adopted"] is None
    assert len(ready(dcli)) == 1
    assert dcli.json("pool", "drain")["left"] == {}


def test_two_concurrent_adopters_never_get_the_same_sandbox(dcli: Cli, engine: Any, tmp_path: Path) -> None:  # noqa: F811
    pooled = [e["allocation_key"] for e in dcli.json("pool", "fill", "--profile", BUSYBOX, "-n", "2")["ready"]]
    files = [tmp_path / f"run{i}.json" for i in range(3)]
    procs = [dcli.start("run", "--pool", "-q", "--json", str(f), "--profile", BUSYBOX, "--", "true") for f in files]
    for p in procs:
        p.proc.wait(timeout=120)
        assert p.proc.returncode == 0, p.stderr()
    adopted = [k for k in (json.loads(f.read_text())["adopted"] for f in files) if k is not None]
    assert len(adopted) == len(set(adopted)), f"one pooled sandbox adopted twice: {adopted}"
    assert set(pooled) <= set(adopted), (pooled, adopted)  # both ready ones were taken, each by one Run
    wait_ready(dcli, 2)  # the winners' background refills
    time.sleep(1.0)  # a refill still topping up finds the pool full and makes nothing
    assert dcli.json("pool", "drain")["left"] == {}
    assert leftovers(engine, dcli.tag) == []


def test_reconcile_reclaims_pooled_sandboxes_after_the_filler_is_killed(dcli: Cli, engine: Any) -> None:  # noqa: F811
    filler = dcli.start("pool", "fill", "--profile", BUSYBOX, "-n", "3", "--ttl", "10", "--mount-target", "/data")
    deadline = time.monotonic() + 60
    caught: list[str] = []
    while not caught and time.monotonic() < deadline and filler.proc.poll() is None:
        rows = dcli.open_allocations()
        caught = [r.allocation_key for r in rows if r.state == "pending" and len(rows) >= 2]
        time.sleep(0.02)
    filler.proc.send_signal(signal.SIGKILL)
    filler.proc.wait()
    assert caught, "the filler was not caught in the middle of a provision"
    assert containers(engine, dcli.tag)
    # The one being made when the filler died is reclaimable at once (its owner is gone) ...
    first = dcli("runner", "reconcile", "--json")
    assert first.code == 0, str(first)
    assert caught[0] in json.loads(first.out)["compensated"]
    still = {r.allocation_key for r in dcli.open_allocations()}
    waiting = ready(dcli)
    assert still == {e["allocation_key"] for e in waiting}  # ... what is left is exactly the ready ones,
    assert still, "no sandbox was ready before the kill"
    time.sleep(max(e["expires_at"] for e in waiting) - time.time() + 0.5)  # ... reclaimed once their --ttl passed
    second = dcli("runner", "reconcile", "--json")
    assert second.code == 0, str(second)
    assert set(json.loads(second.out)["compensated"]) == still
    assert dcli.open_allocations() == []
    assert leftovers(engine, dcli.tag) == []
    assert ready(dcli) == []


def test_an_interrupt_after_adoption_releases_the_sandbox_never_back_to_the_pool(
    dcli: Cli,  # noqa: F811
    engine: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    [pooled] = dcli.json("pool", "fill", "--profile", BUSYBOX, "-n", "1", "--mount-target", "/data")["ready"]
    data = tmp_path / "data"
    data.mkdir()
    (data / "f.txt").write_bytes(b"staged\n")
    running = dcli.start(
        "run", "--pool", "--profile", BUSYBOX, "--mount", f"{data}:/data", "--", "cat", "/data/f.txt",
        pause_before="stage",
    )  # fmt: skip
    running.wait_for("paused before stage")
    assert ready(dcli) == []  # adopted: no longer offered to anyone else
    running.send(signal.SIGTERM)
    done = running.finish()
    assert done.code == 128 + signal.SIGTERM, str(done)
    run = next(r for r in dcli.json("runs", "list") if r["status"] == "interrupted")
    shown = dcli.json("runs", "show", run["run_id"])
    assert [(a["allocation_key"], a["state"]) for a in shown["allocations"]] == [(pooled["allocation_key"], "released")]
    [again] = wait_ready(dcli, 1)  # refilled with a new sandbox, never the one the Run held
    assert again["allocation_key"] != pooled["allocation_key"]
    assert dcli.json("pool", "drain")["left"] == {}
    assert leftovers(engine, dcli.tag) == []
