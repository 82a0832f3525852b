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
    assert box.status == "created"  # provisioned, never started: nothing can run in it yet
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
    filler = dcli.start("pool", "fill", "--profile", BUSYBOX, "-n", "4", "--ttl", "3", "--mount-target", "/data")
    deadline = time.monotonic() + 60
    while not dcli.open_allocations() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # well into the filling: some ready, one being provisioned
    filler.proc.send_signal(signal.SIGKILL)
    filler.proc.wait()
    assert dcli.open_allocations(), "the filler was killed before it journaled anything"
    assert containers(engine, dcli.tag), "the filler was killed before it made anything"
    # The sandbox being made when the filler died is reclaimable at once (its owner is gone); the ready ones
    # only once their --ttl has passed.
    time.sleep(3.5)
    done = dcli("runner", "reconcile", "--json")
    assert done.code == 0, str(done)
    assert json.loads(done.out)["compensated"]
    assert dcli.open_allocations() == []
    assert leftovers(engine, dcli.tag) == []
    assert ready(dcli) == []
