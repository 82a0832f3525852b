"""A Run's history keeps how it was asked for and how it ended: its timeout and whether it timed out, its network
allowlist and its profile, in ``runs show`` (text, ``--json``, ``--html``) and ``logs``; and a sandbox id given to
either is its Run, never a refusal. On the real Docker tier, with busybox."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .test_run_cli import Cli, run_id_of
from .test_run_docker import BUSYBOX, connect, docker_cli

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    client = connect()
    yield client
    client.close()


@pytest.fixture
def dcli(tmp_path: Path, engine: Any) -> Iterator[Cli]:
    with docker_cli(tmp_path, engine) as c:
        yield c


def test_a_timed_out_run_keeps_its_timeout_allowlist_and_profile(dcli: Cli, tmp_path: Path) -> None:
    done = dcli("run", "--profile", BUSYBOX, "--timeout", "1", "--allow", "example.com:443", "--", "sleep", "30")
    assert done.code == 124, str(done)
    run_id = run_id_of(done)

    shown = dcli.json("runs", "show", run_id)
    assert shown["timeout"] == 1.0 and shown["timed_out"] is True
    assert shown["allowlist"] == ["example.com:443"]
    profile = shown["profile"]
    assert profile["source"] == BUSYBOX and profile["network"] == "allowlist"
    assert profile["digest"] == shown["profile_digest"] and profile["digest"].startswith("sha256:")
    assert profile["document"]["network_policy"] == {"mode": "allowlist", "allowlist": ["example.com:443"]}
    assert profile["document"]["base_image"].startswith("sha256:")  # as admitted: the tag pinned to an image id
    assert shown["sandbox"] is None

    text = dcli("runs", "show", run_id)
    said = " ".join(text.out.decode().split())
    assert "timeout 1 s; timed out: killed at the timeout" in said, said
    assert "allowlist: example.com:443" in said and BUSYBOX in said.replace(" ", ""), said

    logs = dcli.json("logs", run_id)
    assert (logs["timeout"], logs["timed_out"], logs["allowlist"]) == (1.0, True, ["example.com:443"])
    assert logs["profile"] == profile
    plain = dcli("logs", run_id)
    assert plain.code == 0 and "timed out" in plain.err and "timeout of 1 s" in plain.err, str(plain)

    page = tmp_path / "run.html"
    assert dcli("runs", "show", run_id, "--html", str(page)).code == 0
    html = page.read_text()
    assert '<span id="timeout">1 s</span>' in html and "timed out: killed at the timeout" in html
    assert '<span id="allowlist">example.com:443</span>' in html


def test_a_run_that_ends_in_time_says_it_did_not_time_out(dcli: Cli) -> None:
    done = dcli("run", "--profile", BUSYBOX, "--timeout", "30", "--", "true")
    assert done.code == 0, str(done)
    shown = dcli.json("runs", "show", run_id_of(done))
    assert (shown["timeout"], shown["timed_out"], shown["allowlist"]) == (30.0, False, [])
    assert shown["profile"]["network"] == "none"


def test_a_sandbox_id_is_its_run_to_runs_show_and_logs(dcli: Cli) -> None:
    made = dcli("sandbox", "create", "--profile", BUSYBOX, "--ttl", "5m")
    assert made.code == 0, str(made)
    sandbox_id = made.out.decode().strip()
    try:
        assert dcli("exec", sandbox_id, "--", "echo", "hi").code == 0
        shown = dcli.json("runs", "show", sandbox_id)
        assert shown["sandbox"]["sandbox_id"] == sandbox_id and shown["sandbox"]["state"] == "live"
        assert shown["run_id"].startswith("run-") and shown["profile"]["network"] == "none"
        assert "openProcess" in [e["member"] for e in shown["events"]] or "exec" in [
            e["member"] for e in shown["events"]
        ]
        by_prefix = dcli.json("runs", "show", sandbox_id[:10])
        assert by_prefix["run_id"] == shown["run_id"]

        text = dcli("runs", "show", sandbox_id)
        assert text.code == 0 and f"sandbox {sandbox_id} live" in " ".join(text.out.decode().split()), str(text)

        logs = dcli("logs", sandbox_id)
        assert logs.code == 0, str(logs)
        assert logs.out == b"" and "long-lived sandbox" in logs.err and "not to the journal" in logs.err
        as_json = dcli.json("logs", sandbox_id)
        assert as_json["run_id"] == shown["run_id"] and as_json["sandbox"]["sandbox_id"] == sandbox_id
    finally:
        assert dcli("sandbox", "rm", sandbox_id).code == 0
    ended = dcli.json("runs", "show", sandbox_id)
    assert ended["sandbox"]["state"] == "released" and ended["status"] == "released"


def test_an_unknown_id_is_refused_by_name(dcli: Cli) -> None:
    for command in (("logs", "sb-nothing-here"), ("runs", "show", "sb-nothing-here")):
        done = dcli(*command, "--json")
        assert done.code == 1
        error = json.loads(done.out)["error"]
        assert (error["code"], error["field"]) == ("SandboxNotFound", "run")
        assert "no runs match 'sb-nothing-here' and no sandbox id does" in error["message"]
