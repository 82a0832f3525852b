"""A command run through the start-up server keeps its caller's process context, or runs in the caller's own process.

A server's child has the server's credentials, capabilities, namespaces, limits, priority and confinement, not its
caller's: a caller confined with ``setpriv``, ``unshare -n``, ``ulimit``, ``nice``, ``ionice``, ``taskset`` or
Landlock must never get the server's wider context back by running ``checkfu`` (issue 28). Each case runs one probe
(a shell command run by the host-process provider, so in a process the command's own process starts) four ways:
through the server unconfined (the positive control: the probe sees the server's context, and the server ran it),
confined in its own process (``CHECKFU_SERVER=off``: the confinement the probe must see), and confined through the
server, which must see the same and must not have been run by the server.

Every test starts its own server and stops it (``Servers``), and ends only the processes it started.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from checkfu.cli import process_context, startup

from .test_startup_server import CHECKFU, Servers

LANDLOCKED = Path(__file__).with_name("landlocked.py")
SECCOMPED = Path(__file__).with_name("seccomped.py")
ROOT = os.geteuid() == 0


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    s = Servers(tmp_path)
    try:
        yield s
    finally:
        s.stop_all()


@dataclass(frozen=True)
class Confinement:
    wrapper: tuple[str, ...]
    """What runs ``checkfu`` confined: the command line put before it."""
    probe: str
    """A shell command whose output shows the confinement."""
    exact: bool = True
    """Whether the confined output is the same every time (a new network namespace is a new one each time)."""


def _ulimit(option: str, value: str) -> tuple[str, ...]:
    return ("sh", "-c", f'ulimit {option} {value} && exec "$@"', "sh")


CONFINEMENTS = {
    "setpriv": Confinement(
        ("setpriv", "--bounding-set=-all", "--no-new-privs"), "grep -E '^(CapBnd|NoNewPrivs)' /proc/self/status"
    ),
    "unshare-net": Confinement(("unshare", "-n"), "readlink /proc/self/ns/net", exact=False),
    "ulimit-fsize": Confinement(_ulimit("-f", "100000"), "ulimit -f"),
    "ulimit-cpu": Confinement(_ulimit("-t", "1000"), "ulimit -t"),
    "nice": Confinement(("nice", "-n", "5"), "nice"),
    "ionice": Confinement(("ionice", "-c", "3"), "ionice"),
    "taskset": Confinement(("taskset", "-c", "0"), "grep Cpus_allowed_list /proc/self/status"),
}
NEEDS_ROOT = {"setpriv", "unshare-net"}


def _probe(servers: Servers, wrapper: tuple[str, ...], probe: str, **env: str) -> str:
    done = subprocess.run(
        [*wrapper, str(CHECKFU), "run", "-q", "--provider", "host-process", "--", "sh", "-c", probe],
        cwd=servers.home,
        env={**servers.env, **env},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert not done.stderr, done.stderr.decode()  # running it here instead is silent
    return done.stdout.decode()


def _keeps(servers: Servers, confinement: Confinement) -> None:
    servers.start()
    servers.spare()
    wide = _probe(servers, (), confinement.probe)
    assert servers.served() == 1, "the positive control ran through the server"
    here = _probe(servers, confinement.wrapper, confinement.probe, CHECKFU_SERVER="off")
    assert here != wide, f"the probe cannot tell the confinement from the server's context: {here!r}"
    servers.spare()
    through = _probe(servers, confinement.wrapper, confinement.probe)
    assert through != wide, "a confined caller got the server's context"
    if confinement.exact:
        assert through == here
    assert servers.served() == 1, "the server ran a command whose caller's context differs from its own"
    assert servers.current()["refused"] == 1


@pytest.mark.parametrize("name", sorted(CONFINEMENTS))
def test_a_confined_caller_keeps_its_confinement(servers: Servers, name: str) -> None:
    if name in NEEDS_ROOT and not ROOT:
        pytest.skip("only root can confine a process this way")
    confinement = CONFINEMENTS[name]
    if shutil.which(confinement.wrapper[0]) is None:
        pytest.skip(f"no {confinement.wrapper[0]} here")
    if name == "taskset" and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one processor: a caller cannot be confined to fewer")
    _keeps(servers, confinement)


def test_a_landlocked_caller_keeps_its_confinement(servers: Servers, tmp_path: Path) -> None:
    """Landlock shows nowhere in ``/proc``: only the caller can tell, by finding that it may not look at the server
    (a Landlock domain hides every process outside it). Run as root, nothing else of the caller's differs."""
    if not ROOT:
        pytest.skip("without root, Landlock needs no_new_privs, which the server sees by itself")
    outside = tmp_path / "outside"
    outside.mkdir()
    allowed = (servers.env["XDG_STATE_HOME"], str(servers.home))
    wrapper = (sys.executable, str(LANDLOCKED), *allowed, "--")
    probe = f"{{ echo x > {outside}/f; }} 2>/dev/null && echo wrote || echo denied"
    check = subprocess.run([*wrapper, "/bin/true"], capture_output=True, check=False)
    if check.returncode == 3:
        pytest.skip("this kernel has no Landlock")
    Path(servers.env["XDG_STATE_HOME"]).mkdir(exist_ok=True)
    servers.start()
    servers.spare()
    assert _probe(servers, (), probe) == "wrote\n"
    assert servers.served() == 1
    (outside / "f").unlink()
    assert _probe(servers, wrapper, probe, CHECKFU_SERVER="off") == "denied\n"
    servers.spare()
    assert _probe(servers, wrapper, probe) == "denied\n"
    assert not (outside / "f").exists()
    assert servers.served() == 1


RAW_CLIENT = """
import json, os, socket, sys
from checkfu.cli import process_context, startup
sock = startup.connect(sys.argv[1], sys.argv[2])
assert sock is not None
request = {"op": "run", "argv": ["profile", "init", "p.toml"], "argv0": "checkfu", "cwd": os.getcwd(),
           "env": dict(os.environ), "umask": 0o022, "stdio": [[None, None]] * 3}
request["own"] = startup.own_context()  # what an honest client says of itself
claim = json.loads(sys.argv[3])  # and what this one claims besides
request["own"].update(claim.pop("own", {}))
request.update(claim)
fds = [0, 1, 2]
server = startup.UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, startup.UCRED.size))[0]
proof, link = sys.argv[5], f"/proc/{server}/fd/3"  # where the server makes its proof file
try:
    if proof == "honest":  # as the client does: the server's proof file when this process may open it, else none
        fds += [fd for fd in [startup.proof(sock)] if fd is not None]
    elif proof == "environ":  # the server's environ (root may read it from inside a Landlock domain)
        fds.append(os.open(f"/proc/{server}/environ", os.O_RDONLY))
    elif proof == "o-path":  # the proof file for no access at all, or else the link to it
        try:
            fds.append(os.open(link, os.O_PATH))
        except OSError:
            fds.append(os.open(link, os.O_PATH | os.O_NOFOLLOW))
    elif proof == "read-write":
        fds.append(os.open(link, os.O_RDWR))
    elif proof == "own-memfd":  # a file of the same name, this process's
        fds.append(os.memfd_create(startup.PROOF_NAME))
except OSError:
    pass  # what this process may not open, it cannot send
if sys.argv[4] == "orphaned":  # the process that connected is gone before the request is sent
    parent = os.getpid()
    if os.fork():
        os._exit(0)
    while os.getppid() == parent:
        os.sched_yield()
startup.send_message(sock, request, fds)
said, _ = startup.recv_message(sock)
print("ANSWER", json.dumps({**said, "sent": len(fds)}), flush=True)
"""


def _raw(servers: Servers, wrapper: tuple[str, ...], claim: str, how: str, proof: str = "honest") -> dict[str, object]:
    """What the server answers a request sent by hand: ``claim`` (JSON) is put in it, ``how`` is ``connected`` or
    ``orphaned`` (the process that connected is gone when it is sent), ``proof`` the descriptor passed after the
    streams: ``honest`` (``startup.proof``), ``none``, ``environ`` (the server's ``/proc/<pid>/environ``),
    ``o-path`` (the server's proof file opened ``O_PATH``), ``read-write`` (opened for writing too) or
    ``own-memfd`` (a file of the client's own by the same name); none, when the client may not open it."""
    key = servers.current()["key"]
    done = subprocess.run(
        [*wrapper, sys.executable, "-c", RAW_CLIENT, str(servers.dir), key, claim, how, proof],
        cwd=servers.home,
        env=servers.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    # A command the server ran writes to the same stdout, before or after the answer.
    (answer,) = [line for line in done.stdout.decode().splitlines() if line.startswith("ANSWER ")]
    said: dict[str, object] = json.loads(answer.removeprefix("ANSWER "))
    return said


def test_the_server_reads_the_callers_context_itself(servers: Servers) -> None:
    """A caller's word about its context is not taken: a client in another network namespace that says it has the
    server's (every field an honest client reports, copied from the server's own) is refused, and nothing runs."""
    if not ROOT:
        pytest.skip("only root can make a network namespace here")
    servers.start()
    claim = {"net": os.readlink("/proc/self/ns/net"), "ns": {"net": os.readlink("/proc/self/ns/net")}}
    said = _raw(servers, ("unshare", "-n"), json.dumps(claim), "connected")
    assert "pid" not in said and said.get("refused") == "context", said
    assert "ns.net" in str(said.get("differs")), said
    assert not (servers.home / "p.toml").exists()
    assert servers.served() == 0


@pytest.mark.parametrize("proof", ["honest", "environ", "o-path", "own-memfd"])
def test_a_landlocked_caller_that_says_it_sees_the_server_is_refused(
    servers: Servers, tmp_path: Path, proof: str
) -> None:
    """Landlock shows nowhere in ``/proc``, and a Landlock domain may still connect to the server's socket: a
    client in one that says it may look at the server, and passes what it can for a proof (none, as it may not open
    the server's proof file; the server's environ, which root may open from inside the domain; the link to the proof
    file; a file of its own by the same name), is refused, and its command does not write outside the domain (it may
    write only beneath ``inside``, not the work directory the command writes to)."""
    if not ROOT:
        pytest.skip("without root, Landlock needs no_new_privs, which the server sees by itself")
    inside = tmp_path / "inside"
    inside.mkdir()
    wrapper = (sys.executable, str(LANDLOCKED), str(inside), "--")
    if subprocess.run([*wrapper, "/bin/true"], capture_output=True, check=False).returncode == 3:
        pytest.skip("this kernel has no Landlock")
    servers.start()
    said = _raw(servers, wrapper, json.dumps({"own": {"sees_server": True}}), "connected", proof)
    if proof == "honest":
        assert said["sent"] == 3, "a process in a Landlock domain opened the server's proof file"
    assert "pid" not in said and said.get("refused") == "context", said
    assert said.get("differs") == ["sees_server"], said  # Landlock alone: all else is the server's
    assert not (servers.home / "p.toml").exists()
    assert servers.served() == 0


@pytest.mark.parametrize("proof", ["none", "environ", "o-path", "read-write", "own-memfd"])
def test_a_caller_that_does_not_prove_it_sees_the_server_is_refused(servers: Servers, proof: str) -> None:
    """An unconfined caller that passes no proof, or one that is not the server's proof file opened for reading
    alone, is refused for that alone: the proof is what the server goes by, not whether the caller could have made
    it."""
    servers.start()
    said = _raw(servers, (), "{}", "connected", proof)
    assert "pid" not in said and said.get("refused") == "context", said
    assert said.get("differs") == ["sees_server"], said
    assert not (servers.home / "p.toml").exists()
    assert servers.served() == 0


def test_the_same_number_of_seccomp_filters_is_not_the_same_filters(servers: Servers) -> None:
    """``/proc`` shows how many seccomp filters a process has, not what they are: a server started under one filter
    refuses a caller under one filter of its own (another, which the count cannot tell), and keeps no spare, since
    no caller's context can ever be taken for its own."""
    wrapper = (sys.executable, str(SECCOMPED), "--")
    if subprocess.run([*wrapper, "/bin/true"], capture_output=True, check=False).returncode == 3:
        pytest.skip("this kernel takes no seccomp filter from this process")
    started = subprocess.run(
        [*wrapper, str(CHECKFU), "server", "start", "--json"],
        cwd=servers.home,
        env=servers.env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert started.returncode == 0, started.stderr.decode()
    pid = int(json.loads(started.stdout)["pid"])
    servers.pids.add(pid)
    assert "Seccomp_filters:\t1" in Path(f"/proc/{pid}/status").read_text()
    said = _raw(servers, wrapper, "{}", "connected")
    assert "pid" not in said and said.get("refused") == "context", said
    assert said.get("differs") == ["Seccomp_filters"], said
    assert not (servers.home / "p.toml").exists()
    time.sleep(1.0)  # past the moment a spare would be made
    assert servers.current()["spare"] is None
    assert servers.served() == 0


def test_a_caller_gone_before_its_request_is_refused(servers: Servers) -> None:
    """The process that connected is the one whose context is read: when it is gone (its socket handed on to a child
    that outlived it), nothing can be read of it and the command is not run."""
    servers.start()
    said = _raw(servers, (), "{}", "orphaned")
    assert "pid" not in said and said.get("refused") == "context", said
    assert "unread" in str(said.get("differs")), said
    assert not (servers.home / "p.toml").exists()
    assert servers.served() == 0


def test_a_matching_caller_is_served(servers: Servers) -> None:
    """The same raw request from a caller in the server's context, with the proof an honest client passes, runs
    (the cases above fail for their reason, not for the request's shape)."""
    servers.start()
    said = _raw(servers, (), "{}", "connected")
    assert isinstance(said.get("pid"), int), said
    assert servers.served() == 1


def test_own_context_says_what_only_the_process_itself_can_see() -> None:
    """The honest client's report: its securebits and personality; whether it sees its server is not its to say."""
    own = startup.own_context()
    assert isinstance(own["securebits"], int) and isinstance(own["personality"], int)
    assert "sees_server" not in own


def test_a_proof_is_the_servers_proof_file_opened_for_reading() -> None:
    """``startup.proof`` opens the proof file of the process at the other end of its socket (here a socket pair's,
    this process, which makes one as a server does) through ``/proc``, and ``proves_access`` takes it; nothing else
    is taken for it: none, the same file opened ``O_PATH`` or for writing too, another file of the same name, this
    process's environ. A process that keeps no proof file, or none at the other end of a socket, gives none."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as lone:
        assert startup.proof(ours) is None  # this process keeps none yet
        own = os.memfd_create(startup.PROOF_NAME, os.MFD_CLOEXEC)
        fds = []
        try:
            proof = startup.proof(ours)
            assert proof is not None
            fds.append(proof)
            assert process_context.proves_access(proof, own)
            assert not process_context.proves_access(proof, None)  # a server that could make none serves none
            assert startup.proof(lone) is None
            assert not process_context.proves_access(None, own)
            link = f"/proc/self/fd/{own}"
            fds += [
                os.open(link, os.O_PATH),
                os.open(link, os.O_RDWR),
                os.memfd_create(startup.PROOF_NAME),
                os.open(f"/proc/{os.getpid()}/environ", os.O_RDONLY),
            ]
            assert [process_context.proves_access(fd, own) for fd in fds[1:]] == [False] * 4
        finally:
            for fd in [own, *fds]:
                os.close(fd)


# the comparison, on its own ----------------------------------------------------------------------


BASE = {"Uid": "0 0 0 0", "ns.net": "net:[1]", "limits": "x", "own.securebits": "0"}


@pytest.mark.parametrize(
    ("theirs", "differs"),
    [
        (BASE, []),
        ({**BASE, "ns.net": "net:[2]"}, ["ns.net"]),
        ({**BASE, "Uid": "0 0 0 1", "limits": "y"}, ["Uid", "limits"]),
        ({k: v for k, v in BASE.items() if k != "limits"}, ["limits"]),  # a name one side lacks differs
        ({**BASE, "lsm": "none"}, ["lsm"]),
    ],
)
def test_differences_names_what_differs(theirs: dict[str, str], differs: list[str]) -> None:
    assert process_context.differences(BASE, theirs) == differs


def test_what_a_client_does_not_say_or_prove_differs() -> None:
    own = startup.own_context()
    ours = process_context.with_report({"personality": "0"}, own, sees_server=True)
    same = process_context.with_report({"personality": "0"}, dict(own), sees_server=True)
    assert process_context.differences(ours, same) == []
    assert process_context.differences(ours, process_context.with_report({"personality": "0"}, None, True)) == [
        f"own.{name}" for name in sorted(process_context.REPORTED)
    ]
    unproved = process_context.with_report({"personality": "0"}, {**own, "sees_server": True}, sees_server=False)
    assert process_context.differences(ours, unproved) == ["sees_server"]  # saying so is not proving it
    unreadable = process_context.with_report({}, {**own, "personality": 8}, True)  # the server could not read it
    assert unreadable["personality"] == "8"


@pytest.mark.parametrize(
    ("ours", "theirs", "differs"),
    [
        (("0", "0"), ("0", "0"), []),
        (("0", "0"), ("2", "1"), ["Seccomp", "Seccomp_filters"]),
        (("2", "1"), ("2", "1"), ["Seccomp_filters"]),  # the same number of filters: not known to be the same ones
        (("2", "3"), ("2", "3"), ["Seccomp_filters"]),
        (("1", "0"), ("1", "0"), ["Seccomp_filters"]),  # strict mode
    ],
)
def test_a_seccomp_filter_is_never_the_same(ours: tuple[str, str], theirs: tuple[str, str], differs: list[str]) -> None:
    def context(mode: str, filters: str) -> dict[str, str]:
        return {**BASE, "Seccomp": mode, "Seccomp_filters": filters}

    assert process_context.differences(context(*ours), context(*theirs)) == differs


def test_a_process_is_read_as_it_is() -> None:
    """Another process of the same context reads the same as this one; one started with ``nice`` or ``ionice``
    differs in that alone; one started after the moment given, or gone, cannot be read."""
    me = process_context.read(os.getpid())
    assert {f"ns.{n}" for n in process_context.NAMESPACES} | {"root", "limits", "scheduling"} <= set(me)
    procs = {
        how: subprocess.Popen([*wrapper, "sleep", "30"])
        for how, wrapper in (("same", ()), ("nice", ("nice", "-n", "5")), ("ionice", ("ionice", "-c", "3")))
    }
    try:
        for proc in procs.values():  # once ``nice`` and ``ionice`` have set what they set, and run ``sleep``
            comm = Path(f"/proc/{proc.pid}/comm")
            deadline = time.monotonic() + 30
            while comm.read_text() != "sleep\n" and time.monotonic() < deadline:
                time.sleep(0.01)
        read = {how: process_context.read(proc.pid) for how, proc in procs.items()}
        assert process_context.differences(me, read["same"]) == []
        assert process_context.differences(me, read["nice"]) == ["scheduling"]
        assert process_context.differences(me, read["ionice"]) == ["ioprio"]
        with pytest.raises(process_context.Unreadable, match="another took its id"):
            process_context.read(procs["same"].pid, started_by=process_context.boottime() - 3600)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    with pytest.raises(process_context.Unreadable, match="gone"):
        process_context.read(procs["same"].pid)


def test_a_refused_command_says_why_only_when_asked(servers: Servers) -> None:
    servers.start()
    asked = subprocess.run(
        ["nice", "-n", "5", str(CHECKFU), "profile", "init", "p.toml"],
        cwd=servers.home,
        env={**servers.env, startup.DEBUG_ENV: "1"},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert asked.returncode == 0, asked.stderr.decode()
    said = asked.stderr.decode()
    assert "running here" in said and "scheduling" in said, said
    assert servers.current()["last_refused"] == ["scheduling"]
    assert servers.served() == 0
