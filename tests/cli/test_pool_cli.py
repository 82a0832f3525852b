"""``checkfu pool`` beyond the Docker tier: a host-process pool, a saved pool that does not read, one refill at a
time. (The Docker tier's pool: ``test_pool_docker.py``.)"""

from __future__ import annotations

import fcntl
import json
import stat
import time
from pathlib import Path

from .test_run_cli import Cli, cli  # noqa: F401 - fixture

ROOT = Path(__file__).resolve().parents[2]
HOST = str(ROOT / "examples" / "profiles" / "host.toml")


def sizes_file(c: Cli) -> Path:
    return c.state / "checkfu" / f"pool-{c.tag}.json"


def test_a_host_process_pool_is_filled_listed_and_drained_with_its_provider(cli: Cli) -> None:  # noqa: F811
    filled = cli.json("pool", "fill", "--provider", "host-process", "--profile", HOST, "-n", "2")
    assert len(filled["made"]) == 2 and len(filled["ready"]) == 2  # the ones it made are the ones it reports
    assert stat.S_IMODE(sizes_file(cli).stat().st_mode) == 0o600  # the user's alone, as all in the state directory
    assert len(cli.json("pool", "ls")["ready"]) == 2
    wrong = cli("pool", "drain", "--provider", "memory", "--json")
    assert wrong.code == 1, str(wrong)
    left = json.loads(wrong.out)["left"]
    assert len(left) == 2 and all("--provider host-process" in why for why in left.values())
    drained = cli.json("pool", "drain", "--provider", "host-process")
    assert len(drained["drained"]) == 2 and drained["left"] == {}
    assert cli.open_allocations() == []


def test_a_saved_pool_that_does_not_read_is_named_and_the_others_still_refill(cli: Cli) -> None:  # noqa: F811
    cli.json("pool", "fill", "--provider", "host-process", "--profile", HOST, "-n", "1")
    saved = json.loads(sizes_file(cli).read_text())
    saved["broken"] = {"provider": "host-process", "mounts": []}  # no profile, no size
    sizes_file(cli).write_text(json.dumps(saved))
    [ready] = cli.json("pool", "ls")["ready"]
    cli.json("pool", "drain", "--provider", "host-process")  # forgets the sizes too: write them back
    sizes_file(cli).write_text(json.dumps(saved))
    done = cli("pool", "refill", "--json")
    assert done.code == 1, str(done)
    out = json.loads(done.out)
    [error] = out["errors"]
    assert error["code"] == "SandboxProfileInvalid" and str(sizes_file(cli)) in error["message"]
    assert len(out["made"]) == 1 and out["made"] != [ready["allocation_key"]]  # the good one was refilled
    cli.json("pool", "drain", "--provider", "host-process")
    assert cli.open_allocations() == []


def test_refills_take_turns(cli: Cli) -> None:  # noqa: F811
    cli.json("pool", "fill", "--provider", "host-process", "--profile", HOST, "-n", "1")
    cli.json("pool", "drain", "--provider", "host-process")
    sizes_file(cli).write_text(
        json.dumps({"one": {"provider": "host-process", "profile": "{}", "mounts": [], "n": 1, "ttl": 60}})
    )
    lock = sizes_file(cli).with_suffix(".lock")
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another refill is running
        waiting = cli.start("pool", "refill", "--json")
        time.sleep(2.0)
        assert waiting.proc.poll() is None, "a refill did not wait for the one running"
    assert waiting.proc.wait(timeout=60) in (0, 1)
