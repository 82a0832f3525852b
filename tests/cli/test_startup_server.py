"""The start-up server (``checkfu server``, ``checkfu.cli.startup``): a command run in a warm server's child is the
same command, with this process's arguments, working directory, environment, standard streams, exit status and
signals, and a server never outlives its welcome.

Every test has a server directory of its own (``XDG_RUNTIME_DIR``) and stops what it started: by asking, then by
the process id it reported. The Docker cases use the installed console script on the real engine, with a runner tag
of their own, and find nothing of theirs left.
"""

from __future__ import annotations

import json
import os
import signal
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

from checkfu.cli import consoles, startup, state
from checkfu.core.journal import Journal, sqlite_url

from .test_run_docker import BUSYBOX, connect, leftovers

CHECKFU = Path(sys.executable).with_name("checkfu")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Servers:
    def __init__(self, tmp_path: Path) -> None:
        self.runtime = tmp_path / "runtime"
        self.runtime.mkdir(mode=0o700)
        self.home = tmp_path / "work"
        self.home.mkdir()
        self.tag = f"srv-{uuid.uuid4().hex[:10]}"
        self.env = {
            **os.environ,
            "XDG_RUNTIME_DIR": str(self.runtime),
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "CHECKFU_RUNNER_TAG": self.tag,
            "CHECKFU_SERVER": "on",
        }
        self.pids: set[int] = set()

    @property
    def dir(self) -> Path:
        return self.runtime / "checkfu-server"

    def __call__(
        self, *args: str, input: bytes | None = None, timeout: float = 120, **env: str
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [str(CHECKFU), *args],
            cwd=self.home,
            env={**self.env, **env},
            input=input,
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    def popen(self, *args: str, stdout: int, stderr: int) -> subprocess.Popen[bytes]:
        """``checkfu ARGS`` started in the background, in the work directory with this test's environment."""
        return subprocess.Popen([str(CHECKFU), *args], cwd=self.home, env=self.env, stdout=stdout, stderr=stderr)

    def start(self, *more: str) -> dict[str, Any]:
        done = self("server", "start", "--json", *more)
        assert done.returncode == 0, done.stderr.decode()
        answer: dict[str, Any] = json.loads(done.stdout)
        self.pids.add(int(answer["pid"]))
        return answer

    def status(self) -> dict[str, Any]:
        done = self("server", "status", "--json")
        assert done.returncode == 0, done.stderr.decode()
        answer: dict[str, Any] = json.loads(done.stdout)
        return answer

    def served(self) -> int:
        return sum(int(s.get("served", 0)) for s in self.status()["servers"] if s["current"])

    def current(self) -> dict[str, Any]:
        (server,) = [s for s in self.status()["servers"] if s["current"]]
        return server

    def spare(self, timeout: float = 20) -> int:
        """The process id of the current server's spare, once it says it is ready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spare = self.current().get("spare")
            if isinstance(spare, dict) and spare.get("ready"):
                return int(spare["pid"])
            time.sleep(0.05)
        pytest.fail(f"no spare was ready within {timeout:.0f} s")

    def stop_all(self) -> None:
        self("server", "stop", "--json", timeout=30)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in self.pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in self.pids:  # one that did not stop when asked is a failure, after it is ended
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"server {pid} did not stop when asked")


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    s = Servers(tmp_path)
    try:
        yield s
    finally:
        s.stop_all()


# without an engine ---------------------------------------------------------------------------


@pytest.mark.parametrize("spare", ["ready", "none"])
def test_a_command_in_the_server_is_the_command_here(servers: Servers, spare: str) -> None:
    """Working directory (a relative path), output, exit status and program name: the same through the server as
    run here, whether a spare made ahead runs the command or a child forked for it does; the server counts each
    command it ran."""
    if spare == "none":
        servers.env[startup.SPARE_ENV] = "0"
    answer = servers.start()
    assert answer["started_now"] is True and answer["running"] == 0
    if spare == "ready":
        servers.spare()
    assert servers("profile", "init", "p.toml").returncode == 0
    assert (servers.home / "p.toml").is_file()
    if spare == "ready":
        servers.spare()
    through = servers("profile", "check", "p.toml", "--json")
    here = servers("profile", "check", "p.toml", "--json", CHECKFU_SERVER="off")
    assert (through.returncode, through.stdout) == (here.returncode, here.stdout) == (0, here.stdout)
    missing = servers("profile", "check", "nope.toml")
    assert missing.returncode == servers("profile", "check", "nope.toml", CHECKFU_SERVER="off").returncode != 0
    assert b"nope.toml" in missing.stderr
    usage = servers("kit", "--help")
    assert b"Usage: checkfu kit" in usage.stdout, usage.stdout.decode()
    assert servers.served() == 4  # init, check, check of nope.toml, kit --help (`checkfu server` runs here)
    by_spare = servers.current()["served_by_spare"]
    assert by_spare >= 2 if spare == "ready" else by_spare == 0


def test_a_spare_takes_the_next_command_and_another_is_made(servers: Servers) -> None:
    servers.start()
    first = servers.spare()
    done = servers("profile", "init", "p.toml")
    assert done.returncode == 0, done.stderr.decode()
    assert servers.current()["served_by_spare"] == 1
    second = servers.spare()
    assert second != first
    assert not _alive(first), "the spare that ran the command ended with it, and was reaped"


def test_a_spare_ends_with_its_server(servers: Servers) -> None:
    servers.start()
    spare = servers.spare()
    servers.stop_all()
    deadline = time.monotonic() + 5
    while _alive(spare) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(spare), "a spare outlived its server"


def test_a_spare_that_dies_is_replaced(servers: Servers) -> None:
    servers.start()
    spare = servers.spare()
    os.kill(spare, signal.SIGKILL)  # the server's child, which this test started through it
    again = servers.spare()
    assert again != spare
    done = servers("profile", "init", "p.toml")
    assert done.returncode == 0, done.stderr.decode()
    assert servers.served() == 1


def test_no_spare_is_kept_when_asked_for_none(servers: Servers) -> None:
    servers.env[startup.SPARE_ENV] = "off"
    servers.start()
    assert servers("profile", "init", "p.toml").returncode == 0
    time.sleep(1.0)  # past the moment a spare would be made
    current = servers.current()
    assert current["spare"] is None and current["served_by_spare"] == 0 and current["served"] == 1


def test_a_spare_copies_what_it_shares_with_the_server_before_its_command(tmp_path: Path) -> None:
    """``_prefault`` in a forked child: the pages it shares with its parent are copied at once (a second call finds
    none left), so the child's writes after it fault no more."""
    script = (
        "import os, resource, sys\n"
        "from checkfu.cli.startup_server import _prefault\n"
        "block = bytearray(os.urandom(32 << 20))\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    first, second = _prefault(), _prefault()\n"
        "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    for i in range(0, len(block), 4096):\n"
        "        block[i] = 1\n"
        "    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before\n"
        "    print(first, second, faults, flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, check=True)
    first, second, faults = (int(x) for x in done.stdout.split())
    if first == 0:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14): nothing is copied ahead")
    assert first >= 32 << 20, "the 32 MiB written before the fork were copied"
    assert second < 1 << 20, "nothing shared was left for a second pass"
    assert faults < 100, f"writing 8192 pages after it faulted {faults} times"


def test_a_command_runs_once_however_fast_or_slow(servers: Servers) -> None:
    """A command that ends before the server has said anything, and one that runs a while: each runs once (``profile
    init`` refuses a file that exists, so a second run would fail) and its client gets its own status."""
    servers.start()
    for i in range(12):
        done = servers("profile", "init", f"p{i}.toml")
        assert done.returncode == 0, done.stderr.decode()
    for _ in range(4):
        done = servers("run", "-q", "--provider", "host-process", "--", "sh", "-c", "sleep 0.3; echo ran")
        assert (done.returncode, done.stdout) == (0, b"ran\n"), done.stderr.decode()
    assert servers.served() == 16


def test_start_is_idempotent_and_stop_ends_it(servers: Servers) -> None:
    first = servers.start()
    again = servers.start()
    assert again["pid"] == first["pid"] and again["started_now"] is False
    done = servers("server", "stop", "--json")
    assert json.loads(done.stdout)["stopped"] == [{"key": first["key"], "pid": first["pid"]}]
    deadline = time.monotonic() + 10
    while _alive(first["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(first["pid"])
    assert not (servers.dir / f"{first['key']}.sock").exists()
    assert servers.status()["servers"] == []


def test_an_idle_server_exits_by_itself(servers: Servers) -> None:
    answer = servers.start("--idle", "1")
    deadline = time.monotonic() + 15
    while _alive(answer["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(answer["pid"]), "an idle server stayed"
    assert not (servers.dir / f"{answer['key']}.sock").exists()


def test_off_never_uses_or_starts_one(servers: Servers) -> None:
    done = servers("profile", "init", "p.toml", CHECKFU_SERVER="off")
    assert done.returncode == 0
    assert servers.status()["servers"] == []
    servers.start()
    assert servers("profile", "check", "p.toml", CHECKFU_SERVER="off").returncode == 0
    assert servers.served() == 0


def test_a_directory_others_can_enter_is_never_used(servers: Servers) -> None:
    answer = servers.start()
    servers.dir.chmod(0o755)
    try:
        done = servers("profile", "init", "p.toml")
        assert done.returncode == 0  # run here instead
        status = servers("server", "status")
        assert status.returncode == 1
        assert b"SandboxPathRejected" in status.stderr and str(servers.dir).encode() in status.stderr
    finally:
        servers.dir.chmod(0o700)
    assert servers.served() == 0
    assert answer["pid"] in servers.pids


def test_stop_touches_nothing_in_a_directory_others_could_have_made(servers: Servers, tmp_path: Path) -> None:
    """Another user could make ``/tmp/checkfu-server-<uid>`` first and plant a lock that links anywhere: ``stop``
    refuses such a directory, and never creates a file through a link."""
    servers.dir.mkdir(mode=0o700)
    target = tmp_path / "victim"
    (servers.dir / "k.sock").touch()
    (servers.dir / "k.lock").symlink_to(target)
    servers.dir.chmod(0o777)
    try:
        done = servers("server", "stop")
        assert done.returncode == 1 and b"SandboxPathRejected" in done.stderr
    finally:
        servers.dir.chmod(0o700)
    done = servers("server", "stop", "--json")
    assert done.returncode == 0, done.stderr.decode()
    assert not target.exists()
    assert json.loads(done.stdout)["stale_sockets_removed"] == ["k"]


def test_a_closed_stdin_is_devnull_not_the_servers_socket(servers: Servers) -> None:
    """With its standard input closed, the client's socket must not become the command's stdin: ``cat`` reads
    nothing and ends, rather than reading the protocol (or never ending)."""
    servers.start()
    done = subprocess.run(
        [str(CHECKFU), "run", "-q", "-i", "--provider", "host-process", "--", "cat"],
        cwd=servers.home,
        env=servers.env,
        capture_output=True,
        timeout=60,
        preexec_fn=lambda: os.close(0),
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, b""), done.stderr.decode()
    assert servers.served() == 1


def test_a_server_started_for_other_code_does_not_serve(servers: Servers) -> None:
    servers.dir.mkdir(mode=0o700)
    done = subprocess.run(
        [sys.executable, "-m", "checkfu.cli.startup_server", "--dir", str(servers.dir), "--key", "00000000"],
        env=servers.env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and b"not serving" in done.stderr
    assert not (servers.dir / "00000000.sock").exists()


def test_a_request_it_does_not_answer_leaves_it_serving(servers: Servers) -> None:
    answer = servers.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(servers.dir / f"{answer['key']}.sock"))
        startup.send_message(sock, {"op": "format-disk"})
        said, _ = startup.recv_message(sock)
    assert "error" in said
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:  # a run request without its streams
        sock.settimeout(5)
        sock.connect(str(servers.dir / f"{answer['key']}.sock"))
        startup.send_message(sock, {"op": "run", "argv": ["--help"]})
        said, _ = startup.recv_message(sock)
    assert "error" in said and "pid" not in said
    assert servers("profile", "init", "p.toml").returncode == 0
    assert servers.served() == 1


def test_the_code_key_follows_the_source(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    module = package / "sub" / "m.py"
    module.write_text("x = 1\n")
    before = startup.code_key(str(package), environ={})
    assert startup.code_key(str(package), environ={}) == before
    module.write_text("x = 22\n")
    assert startup.code_key(str(package), environ={}) != before
    assert startup.code_key(str(package), environ={"PYTHONUNBUFFERED": "1"}) != startup.code_key(
        str(package), environ={}
    )


def test_a_variable_read_at_import_is_part_of_the_key(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    assert startup.code_key(str(package), environ={"FORCE_COLOR": "1"}) != startup.code_key(str(package), environ={})
    assert startup.code_key(str(package), environ={"HOME": "/x"}) == startup.code_key(str(package), environ={})


def test_consoles_are_made_again_for_the_childs_streams_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A console made while a server imported its module (no terminal, no FORCE_COLOR) takes the command's
    environment once ``refresh`` runs, as the child does."""
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    made = consoles.console(stderr=True, highlight=False)
    assert made.color_system is None  # pytest's stderr is no terminal
    monkeypatch.setenv("FORCE_COLOR", "1")
    consoles.refresh()
    assert made.color_system is not None and made.stderr


def test_a_child_lets_go_of_the_clients_streams_before_it_reports(tmp_path: Path) -> None:
    """What a child does last, before it reports its status and exits: its copies of the client's streams are
    /dev/null, so whoever reads them through a pipe sees them end with the client, whatever this process still
    has to do."""
    script = (
        "import os, sys, time\n"
        "from checkfu.cli.startup_server import _let_go_of_streams\n"
        "print('said', flush=True); print('warned', file=sys.stderr, flush=True)\n"
        "_let_go_of_streams()\n"
        "print('lost', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    watchdog = threading.Timer(30, proc.kill)  # streams that never end end with the process, and fail below
    watchdog.start()
    try:
        out, err = proc.stdout.read(), proc.stderr.read()
        alive = proc.poll() is None
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert alive, "the streams ended while the process still ran"
    assert (out, err) == (b"said\n", b"warned\n")


def test_what_a_command_leaves_until_its_status_is_told_runs_after_it(tmp_path: Path) -> None:
    """A child reports its status first, then does what the command left for then (``state.AFTER_REPLY``: a
    journal's close), then exits: its client has the status while that work still runs, and the work is done."""
    marker = tmp_path / "done"
    script = (
        "import socket, sys, time\n"
        "from pathlib import Path\n"
        "from checkfu.cli import state\n"
        "from checkfu.cli.startup_server import _exit\n"
        "conn = socket.socket(fileno=int(sys.argv[1]))\n"
        "def later():\n"
        "    time.sleep(0.5)\n"
        "    Path(sys.argv[2]).write_text('done')\n"
        "state.AFTER_REPLY = [later, lambda: 1 / 0, lambda: Path(sys.argv[2]).write_text('all done')]\n"
        "_exit(conn, 3)\n"
    )
    ours, theirs = socket.socketpair()
    with ours:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(theirs.fileno()), str(marker)], pass_fds=[theirs.fileno()]
        )
        theirs.close()
        ours.settimeout(30)
        message, _ = startup.recv_message(ours)
        assert message == {"exit": 3}
        assert not marker.exists(), "the work ran before the status was told"
        assert proc.wait(timeout=30) == 3
    assert marker.read_text() == "all done"  # each job on its own: one that fails leaves the next to run


def test_a_journal_is_closed_at_once_or_after_the_reply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``close_journal`` closes at once in a command of its own, and in a server's child leaves the close for
    ``AFTER_REPLY``: its pooled connection stays open until then."""
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    journal.list_runs()
    assert journal.engine.pool.checkedin() == 1
    monkeypatch.setattr(state, "AFTER_REPLY", [])
    state.close_journal(journal)
    assert journal.engine.pool.checkedin() == 1
    assert state.AFTER_REPLY is not None
    (later,) = state.AFTER_REPLY
    later()
    assert journal.engine.pool.checkedin() == 0
    journal.list_runs()
    monkeypatch.setattr(state, "AFTER_REPLY", None)
    state.close_journal(journal)
    assert journal.engine.pool.checkedin() == 0


def test_a_run_in_the_server_closes_its_journal_after_telling_its_status(servers: Servers) -> None:
    """A Run's child closes its journal after its client has the status: closing the last connection copies the
    write-ahead log back and removes it, as a command of its own does; and the Run's records are there."""
    servers.start()
    done = servers("run", "-q", "--provider", "host-process", "--", "true")
    assert done.returncode == 0, done.stderr.decode()
    log = Path(servers.env["XDG_STATE_HOME"]) / "checkfu" / "journal.sqlite-wal"
    deadline = time.monotonic() + 20
    while (log.exists() or servers.current()["running"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not log.exists(), "a child left its journal open"
    listed = servers("runs", "list", "--json")
    assert listed.returncode == 0, listed.stderr.decode()
    (run,) = json.loads(listed.stdout)
    assert (run["status"], run["exit_code"]) == ("succeeded", 0), run


def test_modes() -> None:
    assert startup.mode({}) == "auto"
    assert startup.mode({"CHECKFU_SERVER": "OFF"}) == "off"
    assert startup.mode({"CHECKFU_SERVER": "0"}) == "off"
    assert startup.mode({"CHECKFU_SERVER": "1"}) == "on"
    assert startup.mode({"CHECKFU_SERVER": "sometimes"}) == "auto"


# on the engine -------------------------------------------------------------------------------


@pytest.fixture
def engine() -> Iterator[Any]:
    client = connect()
    yield client
    client.close()


def _clean(engine: Any, tag: str) -> list[str]:
    left = leftovers(engine, tag)
    for c in engine.containers.list(all=True, filters={"label": f"checkfu.runner_tag={tag}"}):
        c.remove(force=True, v=True)
    for v in engine.volumes.list(filters={"label": f"checkfu.runner_tag={tag}"}):
        v.remove(force=True)
    return left


@pytest.mark.docker
def test_a_run_in_the_server_keeps_stdin_env_cwd_and_status(servers: Servers, engine: Any) -> None:
    servers.start()
    script = 'echo "$FOO"; cat; echo to-stderr >&2; exit 3'
    argv = ["run", "-q", "-i", "-e", "FOO", "--json", "summary.json", "--profile", BUSYBOX, "--", "sh", "-c", script]
    try:
        through = servers(*argv, input=b"piped\n", FOO="bar")
        assert through.returncode == 3, through.stderr.decode()
        assert through.stdout == b"bar\npiped\n"
        assert b"to-stderr" in through.stderr
        assert json.loads((servers.home / "summary.json").read_text())["exit_code"] == 3
        here = servers(*argv, input=b"piped\n", FOO="bar", CHECKFU_SERVER="off")
        assert (here.returncode, here.stdout) == (through.returncode, through.stdout)
        assert servers.served() == 1
    finally:
        assert _clean(engine, servers.tag) == []


def _started(servers: Servers, engine: Any, proc: subprocess.Popen[bytes]) -> None:
    """Wait until the Run's sandbox exists."""
    deadline = time.monotonic() + 60
    while not leftovers(engine, servers.tag):
        assert proc.poll() is None, proc.communicate()[1].decode()
        assert time.monotonic() < deadline, "the sandbox never came"
        time.sleep(0.1)
    time.sleep(1.0)  # into its process phase


def _until_clean(servers: Servers, engine: Any) -> None:
    deadline = time.monotonic() + 60
    while leftovers(engine, servers.tag) and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.mark.docker
def test_ctrl_c_reaches_the_run_through_the_server(servers: Servers, engine: Any) -> None:
    servers.start()
    proc = servers.popen(
        "run", "--profile", BUSYBOX, "--", "sleep", "60", stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        _started(servers, engine, proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err.decode()
        assert b"interrupted" in err
        assert leftovers(engine, servers.tag) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert _clean(engine, servers.tag) == []


@pytest.mark.docker
def test_a_client_that_goes_away_ends_its_run(servers: Servers, engine: Any) -> None:
    """SIGKILL cannot be forwarded: the command's process sees its client gone and gets SIGTERM, so the Run
    releases its sandbox rather than running on unwatched."""
    servers.start()
    proc = servers.popen(
        "run", "--profile", BUSYBOX, "--", "sleep", "60", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _started(servers, engine, proc)
        proc.kill()
        proc.wait()
        _until_clean(servers, engine)
        assert leftovers(engine, servers.tag) == []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(s["running"] for s in servers.status()["servers"] if s["answering"]):
            time.sleep(0.1)
        assert not any(s["running"] for s in servers.status()["servers"] if s["answering"])
    finally:
        assert _clean(engine, servers.tag) == []


PRELOADED_RUN = """
import json, sys
from checkfu.cli.startup_server import preload
assert preload() == []
from checkfu.cli import run_here
sys.argv = ["checkfu", "run", "--profile", sys.argv[1], "--", "true"]
before = set(sys.modules)
try:
    run_here(warm=True)
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print(json.dumps(sorted(set(sys.modules) - before)), file=sys.__stderr__)
"""


@pytest.mark.docker
def test_preload_leaves_nothing_for_a_run_to_import(servers: Servers, engine: Any) -> None:
    """What a warm child would import on its own costs every Run its import; ``PRELOAD`` names each such module.
    (The journal exists first: only its creation imports the migrations' modules.)"""
    try:
        first = servers("run", "-q", "--profile", BUSYBOX, "--", "true", CHECKFU_SERVER="off")
        assert first.returncode == 0, first.stderr.decode()
        done = subprocess.run(
            [sys.executable, "-c", PRELOADED_RUN, BUSYBOX],
            env={**servers.env, "CHECKFU_SERVER": "off"},
            cwd=servers.home,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode()
        assert json.loads(done.stderr.decode().strip().splitlines()[-1]) == []
    finally:
        assert _clean(engine, servers.tag) == []


def test_the_servers_rehearsal_leaves_a_runs_statements_compiled(tmp_path: Path) -> None:
    """After ``rehearse`` (what the server does before it serves), a Run on a journal of its own compiles
    nothing: its statements (and the enrollment read an in-tree provider's Run makes) were compiled in the
    rehearsal, in the dialect and cache every SQLite journal of the process shares. Counted beside the same Run
    without the rehearsal, in a process of its own each."""
    script = (
        "import asyncio, sys, tempfile\n"
        "from pathlib import Path\n"
        "from sqlalchemy.sql import compiler\n"
        "from checkfu.cli.startup_server import rehearse\n"
        "from checkfu.cli.state import open_journal\n"
        "from checkfu.core.job import run_job\n"
        "from checkfu.core.journal import sqlite_url\n"
        "from checkfu.core.leases import current_owner\n"
        "from checkfu.core.registry import Adapter, Registry\n"
        "from checkfu.core.runner import Runner\n"
        "from checkfu.testing import MemoryProvider, memory_profile\n"
        "if sys.argv[1] == 'rehearsed':\n"
        "    rehearse()\n"
        "where = Path(sys.argv[2])\n"
        "open_journal(sqlite_url(where / 'journal.sqlite')).close()  # made, at HEAD, as a user's journal is\n"
        "compiled = []\n"
        "real = compiler.SQLCompiler.__init__\n"
        "def counted(self, *a, **k):\n"
        "    compiled.append(1)\n"
        "    real(self, *a, **k)\n"
        "compiler.SQLCompiler.__init__ = counted\n"
        "journal = open_journal(sqlite_url(where / 'journal.sqlite'))\n"
        "memory = MemoryProvider()\n"
        "registry = Registry()\n"
        "registry.add(Adapter(envelope=memory.envelope, provider=memory, source='test'))\n"
        "runner = Runner(registry, journal, runner_tag='test')\n"
        "result = asyncio.run(run_job(runner, memory.target, memory_profile(), ['true'], capture_root=where / 'c',\n"
        "                             owner=current_owner(), keep_output=1 << 20, noted={'engine': 'x'}))\n"
        "journal.enrollment(memory.target)  # as a Run of an in-tree provider reads its enrollment\n"
        "journal.close()\n"
        "assert result.exit_code == 0\n"
        "print(len(compiled))\n"
    )
    counts = {}
    for how in ("rehearsed", "cold"):
        where = tmp_path / how
        where.mkdir()
        done = subprocess.run(
            [sys.executable, "-c", script, how, str(where)], capture_output=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        counts[how] = int(done.stdout)
    assert counts["cold"] >= 8, counts  # what a Run compiles on its own
    assert counts["rehearsed"] == 0, counts


# the wire, the loop and the directory ----------------------------------------------------------


ATTACH = """
import sys
from checkfu.cli import startup
if sys.argv[1] == "key":
    print(startup.code_key())
else:
    sys.exit(startup.attach(["profile", "list"]))
"""


def test_a_status_that_comes_with_the_process_id_is_not_lost(tmp_path: Path) -> None:
    """A child that ends at once says its process id and its status before its client reads either: the client
    reads both in one go and must take the second as well (once, it dropped it and exited 70). A stand-in server
    answers as a child does, both messages in one write."""
    runtime = tmp_path / "runtime"
    (runtime / "checkfu-server").mkdir(parents=True, mode=0o700)
    runtime.chmod(0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "CHECKFU_SERVER": "on"}
    key = subprocess.run(
        [sys.executable, "-c", ATTACH, "key"], env=env, cwd=tmp_path, capture_output=True, check=True, text=True
    ).stdout.strip()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(startup.socket_path(str(runtime / "checkfu-server"), key))
        listener.listen(1)
        listener.settimeout(60)
        client = subprocess.Popen([sys.executable, "-c", ATTACH, "attach"], env=env, cwd=tmp_path)
        try:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(30)
                request, fds = startup.recv_message(conn, want_fds=3)
                for fd in fds:
                    os.close(fd)
                assert request["op"] == "run"
                both = [{"pid": os.getpid()}, {"exit": 3}]
                conn.sendall(b"".join(startup.frame(m) for m in both))
            assert client.wait(timeout=30) == 3
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 16])
def test_the_reader_takes_every_message_however_the_bytes_come(chunk: int) -> None:
    """Two messages in one read, and one message split over many: each comes out whole, in order, and nothing
    is taken before it is complete."""
    messages = [{"pid": 1234}, {"exit": 0}, {"argv": ["x" * 5000]}]
    data = b"".join(startup.frame(m) for m in messages)
    inbox = startup.Inbox()
    taken = []
    for i in range(0, len(data), chunk):
        inbox.feed(data[i : i + chunk])
        while (message := inbox.take()) is not None:
            taken.append(message[0])
    assert taken == messages
    assert inbox.take() is None and not inbox.pending()


def test_recv_message_keeps_what_it_read_past_a_message() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        theirs.sendall(startup.frame({"pid": 7}) + startup.frame({"exit": 0}))
        theirs.shutdown(socket.SHUT_WR)
        ours.settimeout(10)
        inbox = startup.Inbox()
        assert startup.recv_message(ours, inbox=inbox)[0] == {"pid": 7}
        assert startup.recv_message(ours, inbox=inbox)[0] == {"exit": 0}
        with pytest.raises(EOFError):
            startup.recv_message(ours, inbox=inbox)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (startup.HEADER.pack(startup.MAX_REQUEST + 1), "bytes"),
        (startup.HEADER.pack(3) + b"\xff\xff\xff", "decode"),
        (startup.HEADER.pack(2) + b"N\x00", "not an object"),  # marshal's None, then a stray byte
    ],
)
def test_the_reader_refuses_what_is_not_a_message(data: bytes, why: str) -> None:
    inbox = startup.Inbox()
    inbox.feed(data)
    with pytest.raises(ValueError, match=why):
        inbox.take()


def test_idle_connections_do_not_hold_up_a_command(servers: Servers) -> None:
    """Connections that send nothing, or half a request, cost the other clients nothing (each once held the server
    for its whole timeout, 5 s): a command behind three of them is served at once, and each is still closed
    when its time is up."""
    answer = servers.start()
    idle = []
    try:
        for _ in range(3):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(servers.dir / f"{answer['key']}.sock"))
            idle.append(sock)
        idle[-1].sendall(startup.frame({"op": "status"})[:3])  # a request begun and never finished
        began = time.monotonic()
        done = servers("profile", "init", "p.toml")
        took = time.monotonic() - began
        assert done.returncode == 0, done.stderr.decode()
        assert servers.served() == 1, "it ran through the server"
        assert took < 4.0, f"a command behind three idle connections took {took:.1f} s"
        for sock in idle:
            sock.settimeout(30)
            assert sock.recv(1) == b"", "the server closes a connection whose request did not come in time"
    finally:
        for sock in idle:
            sock.close()


def test_a_server_directory_of_another_user_is_named_with_what_to_do(servers: Servers) -> None:
    """``/tmp/checkfu-server-<uid>`` made by someone else first: every `checkfu server` command names it, says
    whose it is and what to do; a command runs in its own process, without a word."""
    if os.geteuid() != 0:
        pytest.skip("only root can make a directory another user's")
    servers.dir.mkdir(mode=0o700)
    os.chown(servers.dir, 65534, 65534)
    try:
        for command in ("status", "start", "stop"):
            done = servers("server", command)
            said = done.stderr.decode()
            assert done.returncode == 1, said
            assert str(servers.dir) in said and "uid 65534" in said and "remove" in said.lower(), said
            assert "Traceback" not in said
        done = servers("profile", "init", "p.toml")
        assert (done.returncode, done.stderr) == (0, b"")
    finally:
        os.chown(servers.dir, 0, 0)


def test_a_server_directory_others_can_enter_is_named_with_what_to_do(servers: Servers) -> None:
    servers.dir.mkdir(mode=0o700)
    servers.dir.chmod(0o751)
    try:
        done = servers("server", "status")
        said = done.stderr.decode()
        assert done.returncode == 1, said
        assert str(servers.dir) in said and "0751" in said and "remove" in said.lower(), said
    finally:
        servers.dir.chmod(0o700)
