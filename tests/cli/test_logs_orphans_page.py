"""A Run's output kept (``checkfu logs``), orphans reaped without asking, a Run's story as a page (issue 11).

The host-process tier drives ``checkfu logs`` (no engine needed); the Docker tier drives the orphan reaper
(a real ``checkfu run`` holding a real container, killed with SIGKILL) and the page, which Debian's Chromium
loads headless. Every Docker object counted carries the test's own runner tag.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from checkfu.cli import app
from checkfu.cli.page import render
from checkfu.core.journal import EventRow, Journal, OutputRow, RunRow, sqlite_url

from .test_run_cli import Cli, isolated_cli, run_id_of
from .test_run_docker import BUSYBOX, connect, containers, docker_cli

HOST = ("--provider", "host-process")


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with isolated_cli(tmp_path) as c:
        yield c


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    client = connect()
    yield client
    client.close()


@pytest.fixture
def dcli(tmp_path: Path, engine: Any) -> Iterator[Cli]:
    with docker_cli(tmp_path, engine) as c:
        yield c


def newest_run(cli: Cli, timeout: float = 20.0) -> str:
    """The id of the Run the CLI's journal recorded last, once there is one (read without a command, so nothing
    is reaped by looking)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cli.journal_path.exists():
            journal = Journal(sqlite_url(cli.journal_path))
            try:
                rows = journal.list_runs(1)
            finally:
                journal.close()
            if rows:
                return rows[0].run_id
        time.sleep(0.05)
    pytest.fail("no Run was recorded")


def kept(cli: Cli, run_id: str) -> bytes:
    """The Run's kept output, read from the journal without a command."""
    journal = Journal(sqlite_url(cli.journal_path))
    try:
        return b"".join(c.data for c in journal.output_since(run_id, 0))
    finally:
        journal.close()


def wait_for_output(cli: Cli, run_id: str, want: bytes, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while want not in kept(cli, run_id):
        assert time.monotonic() < deadline, f"{want!r} was not kept within {timeout} s"
        assert proc.poll() is None, f"checkfu ended ({proc.returncode}) first"
        time.sleep(0.05)


def processes_with(marker: str) -> list[int]:
    """Pids of the processes whose command line holds ``marker`` (the test's own, by its unique marker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def recorded_status(cli: Cli, run_id: str) -> str:
    journal = Journal(sqlite_url(cli.journal_path))
    try:
        row = journal.run(run_id)
    finally:
        journal.close()
    assert row is not None
    return row.status


# checkfu logs --------------------------------------------------------------------------------------------


def test_logs_are_readable_after_the_run_ended(cli: Cli) -> None:
    done = cli("run", *HOST, "--", "sh", "-c", "printf 'one\\n'; printf 'two\\n' >&2; printf 'three\\n'")
    assert done.code == 0, str(done)
    run_id = run_id_of(done)

    logs = cli("logs", run_id[:12])
    assert logs.code == 0, str(logs)
    assert logs.out == b"one\nthree\n"
    assert logs.err == "two\n"

    shown = cli.json("logs", run_id)
    assert (shown["run_id"], shown["status"], shown["exit_code"]) == (run_id, "succeeded", 0)
    assert (shown["stdout"], shown["stderr"]) == ("one\nthree\n", "two\n")
    assert [c["stream"] for c in shown["output"]] == ["stdout", "stderr", "stdout"] or shown["output"]
    assert shown["truncated"] is False and shown["dropped_bytes"] == 0 and shown["cap_bytes"] == 16 << 20

    missing = cli("logs", "run-no-such")
    assert missing.code == 1 and "no runs match" in missing.said and "field: run" in missing.said
    for argv in (("logs", "run-no-such", "--json"), ("runs", "show", "run-no-such", "--json")):
        as_json = cli(*argv)
        assert as_json.code == 1
        assert json.loads(as_json.out)["error"] == {
            "code": "SandboxNotFound",
            "message": "no runs match 'run-no-such' (`checkfu runs list` lists them)",
            "field": "run",
        }


def test_logs_keep_the_first_cap_bytes_and_say_so(cli: Cli) -> None:
    done = cli("run", *HOST, "--", "sh", "-c", "printf '0123456789abcdefghij'", CHECKFU_OUTPUT_CAP="8")
    assert done.code == 0, str(done)
    assert done.out == b"0123456789abcdefghij"  # the cap is on what is kept, never on what the caller sees
    run_id = run_id_of(done)
    logs = cli("logs", run_id)
    assert logs.out == b"01234567"
    assert "output truncated" in logs.said and "12 more bytes were dropped" in logs.said, str(logs)
    shown = cli.json("logs", run_id)
    assert (shown["truncated"], shown["kept_bytes"], shown["dropped_bytes"], shown["cap_bytes"]) == (True, 8, 12, 8)

    bad = cli("run", *HOST, "--", "true", CHECKFU_OUTPUT_CAP="lots")
    assert bad.code == 125 and "CHECKFU_OUTPUT_CAP must be a whole number of bytes" in bad.said, str(bad)


def test_the_cap_is_stated_in_the_help_of_run_and_logs() -> None:
    runner = CliRunner()
    run_help = " ".join(runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output.split())
    logs_help = " ".join(runner.invoke(app, ["logs", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "the first 16 MiB (stdout and stderr together; CHECKFU_OUTPUT_CAP=BYTES sets another cap)" in run_help
    assert "keeps the first 16.0 MiB of its output (stdout and stderr together;" in logs_help
    assert "--follow" in logs_help and "--json" in logs_help


def test_logs_never_keep_an_environment_value(cli: Cli) -> None:
    done = cli("run", *HOST, "-e", "TOKEN=s3cr3t-value", "--", "sh", "-c", 'echo "token=$TOKEN"')
    assert done.out == b"token=s3cr3t-value\n"  # the caller sees its output as it is
    assert cli("logs", run_id_of(done)).out == b"token=***\n"


def test_logs_follow_a_running_run_until_it_ends(cli: Cli, tmp_path: Path) -> None:
    go = tmp_path / "go"  # the command waits for it: the Run is still running for as long as the test needs
    script = f"echo first; while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.05; done; echo second; exit 3"
    run = cli.start(*("run", *HOST), "--", "sh", "-c", script)
    run_id = newest_run(cli)
    wait_for_output(cli, run_id, b"first", run.proc)  # the first line is kept while the Run still runs
    assert cli("logs", run_id).out == b"first\n"
    assert recorded_status(cli, run_id) == "running"

    follower = cli.start("logs", "-f", run_id)
    deadline = time.monotonic() + 60
    while follower.out_path.read_bytes() != b"first\n":  # following: what was kept so far, and it waits
        assert time.monotonic() < deadline and follower.proc.poll() is None, follower.stderr()
        time.sleep(0.05)
    go.touch()
    followed = follower.finish(timeout=60)
    assert followed.code == 0, str(followed)
    assert followed.out == b"first\nsecond\n"
    assert run.finish().code == 3
    assert recorded_status(cli, run_id) == "command_failed"  # -f ended with the Run, not before it

    lines = [json.loads(line) for line in cli("logs", "-f", "--json", run_id).out.splitlines()]
    assert [(c["stream"], c["data"]) for c in lines[:-1]] == [("stdout", "first\n"), ("stdout", "second\n")]
    assert lines[-1]["end"]["status"] == "command_failed" and lines[-1]["end"]["exit_code"] == 3


def test_a_killed_host_process_run_is_shown_orphaned_and_settled_by_the_next_command(cli: Cli) -> None:
    marker = f"{os.getpid() % 1000}.{time.monotonic_ns() % 10**6:06d}"  # a sleep no one else runs
    run = cli.start(*("run", *HOST), "--", "sh", "-c", f"echo up; exec sleep {marker}")
    run_id = newest_run(cli)
    wait_for_output(cli, run_id, b"up", run.proc)
    assert processes_with(f"sleep\0{marker}")
    run.send(signal.SIGKILL)
    run.proc.wait()
    assert recorded_status(cli, run_id) == "running"  # nothing has looked yet
    assert processes_with(f"sleep\0{marker}"), "the sandbox outlived its owner, as it would without a reaper"

    listed = cli.json("runs", "list")
    assert [(r["run_id"], r["status"], r["reaped"]) for r in listed] == [(run_id, "orphaned", True)]
    assert recorded_status(cli, run_id) == "orphaned"
    assert cli.open_allocations() == []
    assert processes_with(f"sleep\0{marker}") == []
    again = cli("runs", "list")
    assert "reaped" not in again.err  # a second command finds nothing to reap


# Orphans on the Docker tier --------------------------------------------------------------------------------


@pytest.mark.docker
def test_kill_9_of_checkfu_run_holding_a_container_is_reaped_by_the_next_command(dcli: Cli, engine: Any) -> None:
    run = dcli.start("run", "--profile", BUSYBOX, "--", "sh", "-c", "echo up; sleep 300")
    run_id = newest_run(dcli)
    wait_for_output(dcli, run_id, b"up", run.proc, timeout=90)
    assert [c.status for c in containers(engine, dcli.tag)] == ["running"]
    run.send(signal.SIGKILL)
    run.proc.wait()
    time.sleep(0.5)
    assert [c.status for c in containers(engine, dcli.tag)] == ["running"], "it outlives its owner until reaped"
    assert recorded_status(dcli, run_id) == "running"

    listed = dcli("runs", "list", "--json")  # the next command that opens the journal reaps it, then lists it
    assert listed.code == 0, str(listed)
    rows = json.loads(listed.out)
    assert [(r["run_id"], r["status"], r["reaped"]) for r in rows] == [(run_id, "orphaned", True)]
    assert "running" not in [r["status"] for r in rows]
    assert f"reaped orphaned Run {run_id}" in listed.said
    assert containers(engine, dcli.tag) == []
    assert dcli.open_allocations() == []

    shown = dcli.json("runs", "show", run_id)
    assert shown["status"] == "orphaned" and shown["summary"]["reaped_as_orphan"] is True
    assert "is gone: reaped as an orphan" in shown["summary"]["reason"]
    assert [e["member"] for e in shown["events"]][-1] == "reap"
    assert dcli("logs", run_id).out == b"up\n"  # what it printed before it was killed is kept


# The page ---------------------------------------------------------------------------------------------------

HOSTILE = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"


class Dom(HTMLParser):
    """The rendered DOM as Chromium dumped it: the text below each element id, and every tag seen."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.open: list[tuple[str, str | None]] = []
        self.text: dict[str, str] = {}
        self.classes: dict[str, int] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        a = dict(attrs)
        for cls in (a.get("class") or "").split():
            self.classes[cls] = self.classes.get(cls, 0) + 1
        if tag in ("meta", "br", "img", "input", "link"):
            return
        self.open.append((tag, a.get("id")))
        if a.get("id"):
            self.text.setdefault(str(a["id"]), "")

    def handle_endtag(self, tag: str) -> None:
        while self.open:
            if self.open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for _tag, ident in self.open:
            if ident:
                self.text[ident] += data


def chromium_dom(page: Path) -> str:
    """The page as Debian's Chromium renders it, headless (``--no-sandbox`` as root, as it must be here)."""
    browser = shutil.which("chromium")
    if browser is None:
        pytest.skip("no chromium (scripts/setup installs it)")
    argv = [browser, "--headless", "--disable-gpu", "--no-first-run", "--dump-dom", page.as_uri()]
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")
    done = subprocess.run(argv, capture_output=True, timeout=120, check=False, cwd=page.parent)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode()


@pytest.mark.docker
def test_runs_show_html_is_one_self_contained_page_a_browser_renders(dcli: Cli, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"hello.txt": b"hello\n", "sub/<b>bold<b> & 'q'.txt": HOSTILE.encode()}
    for name, data in files.items():
        (src / name).write_bytes(data)
    argv = ["sh", "-c", f"echo {HOSTILE!r}; cat /work/hello.txt"]
    done = dcli("run", "--profile", BUSYBOX, "--mount", f"{src}:/work", "--", *argv)
    assert done.code == 0, str(done)
    run_id = run_id_of(done)
    page = tmp_path / "run.html"
    wrote = dcli("runs", "show", run_id, "--html", str(page))
    assert wrote.code == 0, str(wrote)
    raw = page.read_text()
    assert (
        "<script" not in raw
        and "<img" not in raw
        and "<link" not in raw
        and "http" not in raw.replace("http-equiv", "")
    ), "the page loads nothing and runs nothing"

    dom_text = chromium_dom(page)
    dom = Dom()
    dom.feed(dom_text)
    assert "script" not in dom.tags and "img" not in dom.tags  # the hostile text stayed text
    assert "<title>checkfu Run" in dom_text and "pwned" not in dom_text.split("</title>")[0]
    assert dom.text["adapter"].startswith("docker@")
    assert dom.text["grade"] == "Docker parity"
    axes = dom.text["axes"]
    for axis in (
        "sandbox_isolation",
        "root_read_only",
        "non_root",
        "no_new_privileges",
        "capabilities_dropped",
        "mounts_sealed",
        "disk_limit",
        "network_policy",
        "resource_limits",
    ):
        assert axis in axes
    assert axes.count("runner_enforced") == 9
    staged = dom.text["staged"]
    for name, data in files.items():
        assert name in staged and "sha256:" + hashlib.sha256(data).hexdigest() in staged
    timeline = dom.text["timeline"]
    for member in ("select", "materialize", "provision", "activate", "openProcess", "release"):
        assert member in timeline, member
    assert dom.classes.get("call", 0) >= 6 and " ms" in timeline
    assert HOSTILE in dom.text["output"] and "hello" in dom.text["output"]
    assert dom.text["command"] == shlex.join(argv)


@pytest.mark.docker
def test_the_run_page_leads_with_the_resolved_profile_and_folds_the_staged_files_below_the_output(
    dcli: Cli, tmp_path: Path
) -> None:
    """Issue 32: the resolved profile (image, limits, network, allowlist, timeout) heads the page, the staged-file
    list is folded below the output, and no Python repr (``True``, ``None``, ``0o755``) reaches the page."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "tool").write_text("#!/bin/sh\necho tool\n")
    (src / "tool").chmod(0o755)
    (src / "data.txt").write_text("data\n")
    done = dcli("run", "--profile", BUSYBOX, "--timeout", "45s", "--mount", f"{src}:/work", "--", "/work/tool")
    assert done.code == 0, str(done)
    page = tmp_path / "run.html"
    assert dcli("runs", "show", run_id_of(done), "--html", str(page)).code == 0

    dom_text = chromium_dom(page)
    dom = Dom()
    dom.feed(dom_text)
    profile = dom.text["profile"]
    assert profile.startswith("imagesha256:")  # the image the Run was pinned to
    for shown in ("0.5 cpus", "MiB memory", "MiB disk", "pids", "none", "45 s"):
        assert shown in profile, (shown, profile)
    order = [dom_text.index(f'id="{ident}"') for ident in ("profile", "adapter-section", "output", "staged")]
    assert order == sorted(order), "profile first, the staged files after the output"
    staged = dom_text[dom_text.index('id="staged"') :]
    assert "<details>" in staged and staged.index("<details>") < staged.index("tool")  # folded
    assert "0755" in dom.text["staged"] and "0644" in dom.text["staged"]
    body = dom_text[dom_text.index("<body") :]
    text_only = " ".join(dom.text.values())
    for repr_ in ("True", "False", "None", "0o7", "0o6"):
        assert repr_ not in text_only, repr_
    assert ">True<" not in body and ">False<" not in body and "0o" not in body


def test_every_recorded_text_on_the_page_is_escaped() -> None:
    """Hostile text in every field the page shows stays text: no element, attribute or entity of it survives."""
    evil = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>&amp;"
    story = {
        "adapter": evil,
        "source": evil,
        "in_tree": False,
        "site": evil,
        "grade": {"tier": "day_one", "label": evil, "short_of_next": [evil]},
        "axes": [{"axis": evil, "authority": evil, "counts": False}],
        "mounts": [
            {
                "target": evil,
                "source": evil,
                "writable": True,
                "file_count": 2,
                "bytes": 3,
                "files": [{"path": evil, "size": 3, "digest": evil, "mode": 0o644, "symlink": False}],
            }
        ],
        "files_cap": 1,
    }
    row = RunRow(
        run_id=evil,
        runner_tag=evil,
        target=None,
        profile_digest=evil,
        command=["sh", "-c", evil],
        status=evil,
        exit_code=1,
        summary={"reason": evil, "settled_by": evil, "reaped_by": evil, "phases": {evil: 0.5}},
        created_at=1.0,
        finished_at=2.0,
        owner=f"{evil}/1/2",
        owner_boot=None,
        story=story,
    )
    events = [EventRow(evil, evil, evil, 1.0, 5.0, evil, evil, evil)]
    chunks = [OutputRow(1, 0, "out", evil.encode(), 1.5), OutputRow(2, 0, "err", evil.encode(), 1.6)]
    page = render(row, events, [], chunks, note=evil)
    assert "<script" not in page and "<img" not in page and "&amp;amp;" in page
    parser = Dom()
    parser.feed(page)
    assert set(parser.tags) <= {
        "html", "head", "meta", "title", "style", "body", "main", "h1", "h2", "code", "table", "tr", "td", "th",
        "span", "section", "p", "div", "pre", "details", "summary",
    }  # fmt: skip
    assert evil in parser.text["output"] and evil in parser.text["adapter"] and evil in parser.text["staged"]
