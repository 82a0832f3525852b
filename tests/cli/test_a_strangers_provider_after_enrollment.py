"""A provider served from another process, after enrollment, through every command that reaches it (issue 30).

Each service is a real process on a loopback port: ``checkfu provider serve memory`` (and ``host-process``,
and ``docker`` for the README's example), and the Node.js provider of ``examples/provider-node``. Each is
enrolled as an operator enrolls one: started with a bootstrap credential, ``checkfu provider verify URL --key``
signs the suite's evidence, ``checkfu provider enroll URL --evidence --pub`` issues the credential, and the
service is restarted with it on the same port. From then on no command is given a credential
(``CHECKFU_PROVIDER_CREDENTIAL`` is scrubbed): the service refuses any other, so every command that reaches it
must present the enrolled one by itself.

What a service holds is observed from outside the commands under test: a ``checkfu`` service through its own
``listAllocations`` under the test's runner tag, the Node.js provider by its state directory (an ``alloc-KEY``
directory per allocation) and the processes labelled with it; the host-process service by its own state
directory, which no ``checkfu`` command of the test shares. Only processes this module started are signalled,
by their pid.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from checkfu.contract.errors import SandboxError
from checkfu.contract.members import ListAllocationsRequest
from checkfu.contract.target import Lease
from checkfu.core.journal import sqlite_url
from checkfu.testing.memory import BASE_IMAGE as MEMORY_IMAGE
from checkfu.wire.client import RemoteProvider
from checkfu.wire.credentials import Credential, read_credential
from listening import wait_listening

from .test_run_cli import CHECKFU, PROFILES, REPO, Cli, Done, profile_file

NODE_SERVER = REPO / "examples" / "provider-node" / "server.js"
NODE_IMAGE = "sha256:" + hashlib.sha256(b"node-day-one host userland").hexdigest()
NODE_LABEL = "CHECKFU_NODE_PROVIDER_INSTANCE"
"""The environment variable every host-side process of a Node.js provider's instance carries."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.05)


# The operator, and the services ---------------------------------------------------------------------------------


@dataclass
class Operator(Cli):
    """``checkfu`` as an operator runs it: a state directory and runner tag of its own, and no credential in the
    environment (whatever the test process had)."""

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        env = super().env(extra)
        if "CHECKFU_PROVIDER_CREDENTIAL" not in extra:
            env.pop("CHECKFU_PROVIDER_CREDENTIAL", None)
        return env

    def ok(self, *args: str, **env: str) -> Done:
        done = self(*args, **env)
        assert done.code == 0, str(done)
        return done

    def refused(self, *args: str) -> dict[str, Any]:
        """The error ``checkfu ARGS --json`` answers with (it must fail, naming a code and a field)."""
        done = self(*args, "--json")
        assert done.code != 0, str(done)
        error = json.loads(done.out)["error"]
        assert error["code"] and error["field"], str(done)
        return dict(error)

    def ps(self) -> dict[str, Any]:
        out: dict[str, Any] = self.json("ps")
        return out

    def tagged(self) -> Operator:
        """The same state directory (journal, keys, enrollments) under a runner tag of a test's own."""
        return Operator(self.home, f"test-{uuid.uuid4().hex[:8]}")

    def enroll(self, url: str, bootstrap: Path) -> Path:
        """Verify and sign the suite's evidence, enroll the service with it; the credential file it issued."""
        keys = self.home / "signer"
        if not keys.exists():
            self.ok("keys", "generate", "--out", str(keys))
        evidence = self.home / f"evidence-{uuid.uuid4().hex[:6]}.json"
        given = ("--credential-file", str(bootstrap))
        self.ok("provider", "verify", url, "--key", str(keys), "--out", str(evidence), *given)
        enrolled = self.json("provider", "enroll", url, "--evidence", str(evidence), "--pub", f"{keys}.pub", *given)
        issued = Path(enrolled["credential_file"])
        assert issued.stat().st_mode & 0o777 == 0o600
        return issued


@dataclass
class Service:
    """A provider service in a process of its own, on one loopback port across restarts."""

    name: str
    argv: Callable[[int, Path], list[str]]
    env: Callable[[int, Path], dict[str, str]]
    root: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    credential: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, credential: Path) -> Service:
        assert self.proc is None
        self.credential = credential
        log = self.root / f"{self.name}.log"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv(self.port, credential),
                env=self.env(self.port, credential),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_listening(self.proc, self.port, log)
        return self

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self.proc = None

    def restart(self, credential: Path) -> Service:
        self.stop()
        return self.start(credential)

    def log(self) -> str:
        path = self.root / f"{self.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def scrubbed() -> dict[str, str]:
    drop = ("CHECKFU_PROVIDER_CREDENTIAL", "CHECKFU_RUNNER_TAG", "XDG_STATE_HOME", "CHECKFU_DEBUG")
    return {k: v for k, v in os.environ.items() if k not in drop}


def served(name: str, root: Path) -> Service:
    """``checkfu provider serve NAME``, with a state directory of its own (never the operator's)."""
    state = root / f"{name}-service-state"

    def argv(port: int, credential: Path) -> list[str]:
        return [str(CHECKFU), "provider", "serve", name, "--listen", f"127.0.0.1:{port}", "--credential-file",
                str(credential)]  # fmt: skip

    return Service(name, argv, lambda _, __: {**scrubbed(), "XDG_STATE_HOME": str(state)}, root)


def node_service(node: str, root: Path) -> Service:
    """``node examples/provider-node/server.js`` as its README starts it, its state in ``root/node-state``."""
    state = root / "node-state"

    def env(port: int, credential: Path) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "TMPDIR": str(root),
            "PORT": str(port),
            "CHECKFU_PROVIDER_CREDENTIAL": credential.read_text().splitlines()[0].strip(),
            "CHECKFU_NODE_PROVIDER_STATE": str(state),
            "CHECKFU_NODE_PROVIDER_LOG": "1",
        }

    return Service("node", lambda _, __: [node, str(NODE_SERVER)], env, root)


def bootstrap(root: Path) -> Path:
    path = root / f"bootstrap-{uuid.uuid4().hex[:6]}"
    path.write_text(f"bootstrap-{uuid.uuid4().hex}\n")
    path.chmod(0o600)
    return path


def enrolled(operator: Operator, service: Service) -> Service:
    """``service`` enrolled by ``operator`` and restarted with the credential enrollment issued."""
    first = bootstrap(service.root)
    service.start(first)
    issued = operator.enroll(service.url, first)
    service.restart(issued)
    assert issued.read_text() != first.read_text()
    return service


def held(service: Service, tag: str) -> list[tuple[str, str]]:
    """What a ``checkfu`` service holds under ``tag``, asked over the wire: (kind, allocation key) pairs."""
    assert service.credential is not None

    async def ask() -> list[tuple[str, str]]:
        remote = RemoteProvider(service.url, read_credential(service.credential))
        try:
            target = (await remote.describe()).envelope.target
            lease = Lease(lease_id="the-tests-observer", lease_epoch=1)
            listed = await remote.list_allocations(ListAllocationsRequest(target=target, lease=lease, runner_tag=tag))
            return sorted((a.kind, a.allocation_key) for a in listed.allocations)
        finally:
            await remote.aclose()

    return asyncio.run(ask())


def refuses_anyone_else(service: Service) -> None:
    """The service answers no request without its credential: what reaches it presented the enrolled one."""

    async def ask(credential: Credential | None) -> None:
        remote = RemoteProvider(service.url, credential)
        try:
            await remote.describe()
        finally:
            await remote.aclose()

    for credential in (None, Credential("not-the-issued-credential")):
        with pytest.raises(SandboxError) as refused:
            asyncio.run(ask(credential))
        assert refused.value.code == "SandboxUnauthenticated", refused.value


# Fixtures -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """One operator's state directory for the module (its journal holds the enrollments); each test runs under a
    runner tag of its own (``tagged``)."""
    op = Operator(tmp_path_factory.mktemp("operator"), "enrolling")
    yield op
    op.stop_all()


@pytest.fixture(scope="module")
def memory(home: Operator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    service = served("memory", tmp_path_factory.mktemp("memory-service"))
    try:
        enrolled(home, service)
        refuses_anyone_else(service)
        yield service
    finally:
        service.stop()


@pytest.fixture
def op(home: Operator) -> Iterator[Operator]:
    """The operator under a runner tag of this test's own; on the way out, nothing of its tag is open in the
    journal."""
    tagged = home.tagged()
    try:
        yield tagged
    finally:
        tagged.stop_all()
    assert tagged.open_allocations() == [], "open allocations left in the journal"


@pytest.fixture(scope="module")
def node() -> str:
    found = shutil.which("node")
    if found is None:
        if os.environ.get("CHECKFU_REQUIRE_NODE") == "1":
            pytest.fail("Node.js is not installed and CHECKFU_REQUIRE_NODE=1")
        pytest.skip("Node.js is not installed")
    if os.geteuid() != 0:
        pytest.skip("the Node.js provider builds namespaces and mounts, so it runs as root")
    return found


def memory_profile(where: Path) -> Path:
    return profile_file(where, base_image=MEMORY_IMAGE, name="memory.toml")


def only(boxes: list[dict[str, Any]], ident: str) -> dict[str, Any]:
    """The one row of ``ident`` (a sandbox listed twice is a failure)."""
    rows = [b for b in boxes if b["id"] == ident]
    assert len(rows) == 1, boxes
    return rows[0]


# The served memory provider ---------------------------------------------------------------------------------------


def test_every_sandbox_command_reaches_the_enrolled_service_with_its_credential(
    memory: Service, op: Operator, tmp_path: Path
) -> None:
    profile = memory_profile(tmp_path)
    sid = op.json("sandbox", "create", "--provider", memory.url, "--profile", str(profile))["sandbox_id"]
    assert [kind for kind, _ in held(memory, op.tag)] == ["instance"]
    assert op.ok("exec", sid, "--", "write", "/data/a.txt", "hello").code == 0
    assert op.ok("exec", sid, "--", "cat", "/data/a.txt").out == b"hello"
    # cp out of the sandbox: a file, then a directory (the memory double has no sh, so nothing is copied in)
    assert op.json("cp", f"{sid}:/data/a.txt", str(tmp_path / "a.txt"))["copied"] == [str(tmp_path / "a.txt")]
    assert (tmp_path / "a.txt").read_bytes() == b"hello"
    op.ok("cp", f"{sid}:/data", str(tmp_path / "copied"))
    assert (tmp_path / "copied" / "a.txt").read_bytes() == b"hello"

    snap = op.json("snapshot", sid)["snapshot_id"]
    op.ok("exec", sid, "--", "write", "/data/a.txt", "changed")
    resumed = op.json("resume", snap)["sandbox_id"]
    assert op.ok("exec", resumed, "--", "cat", "/data/a.txt").out == b"hello"
    assert sorted(kind for kind, _ in held(memory, op.tag)) == ["instance", "instance", "snapshot"]
    # ps lists each once, naming the service it lives on
    listed = op.ps()
    for ident in (sid, resumed):
        row = only(listed["sandboxes"], ident)
        assert (row["provider"], row["endpoint"], row["state"]) == ("memory", memory.url, "live"), row
    assert [(s["id"], s["provider"], s["endpoint"]) for s in listed["snapshots"]] == [(snap, "memory", memory.url)]
    table = op.ok("ps").out.decode()
    assert [table.count(ident) for ident in (sid, resumed)] == [2, 1], table  # sid: its row, and its snapshot's
    assert f"memory at {memory.url}" in table, table

    assert op.json("sandbox", "rm", sid, snap)["removed"] == [sid, snap]
    assert op.json("kill", resumed)["killed"] == [resumed]
    assert held(memory, op.tag) == []
    assert op.ps() == {"ok": True, "sandboxes": [], "runs": [], "snapshots": []}


def test_a_run_killed_mid_run_is_reclaimed_from_the_service_by_one_reconcile(
    memory: Service, op: Operator, tmp_path: Path
) -> None:
    profile = memory_profile(tmp_path)
    running = op.start("run", "--provider", memory.url, "--profile", str(profile), "--", "sleep", "120")
    until("the Run's sandbox on the service", lambda: held(memory, op.tag))
    running.proc.send_signal(signal.SIGKILL)
    running.proc.wait(timeout=20)
    done = op.json("runner", "reconcile")
    assert len(done["compensated"]) == 1 and done["failed"] == {} and done["skipped"] == {}, done
    assert held(memory, op.tag) == []
    assert op.ps()["runs"] == []


def test_a_sandbox_whose_time_to_live_passed_is_reclaimed_from_the_service_by_the_next_command(
    memory: Service, op: Operator, tmp_path: Path
) -> None:
    sid = op.json("sandbox", "create", "--provider", memory.url, "--profile", str(memory_profile(tmp_path)),
                  "--ttl", "1s")["sandbox_id"]  # fmt: skip
    assert held(memory, op.tag) != []
    time.sleep(1.5)
    listed = op.ps()
    assert held(memory, op.tag) == []
    row = only(listed["sandboxes"], sid)
    assert (row["state"], row["reclaimed"], row["endpoint"]) == ("expired", True, memory.url), row


# The name a service advertises is not where it lives ----------------------------------------------------------------


def test_a_service_advertising_an_in_tree_name_is_reached_at_its_url(home: Operator, tmp_path: Path) -> None:
    """``checkfu provider serve host-process`` advertises the in-tree host-process tuple; its sandboxes live in the
    service's own state directory, which the operator's local host-process provider never sees."""
    from enrolled import enroll_service  # noqa: PLC0415 - enrollment itself is the other tests' (and tests/control's)

    service = served("host-process", tmp_path)
    op = home.tagged()
    try:
        service.start(bootstrap(tmp_path))
        assert service.credential is not None
        assert op.ps()["sandboxes"] == []  # the journal is made as every command makes it
        enroll_service(sqlite_url(op.journal_path), service.url, service.credential)
        mine = tmp_path / "host-process-service-state" / "checkfu" / "host-process" / "instances"
        sid = op.json("sandbox", "create", "--provider", service.url, "--profile", str(PROFILES / "host.toml"))[
            "sandbox_id"
        ]
        (there,) = list(mine.iterdir())
        where = op.ok("exec", sid, "--", "sh", "-c", "pwd; echo from-the-service > made-here").out.decode()
        assert Path(where.strip()).is_relative_to(there), where
        assert (there / "work" / "made-here").read_text() == "from-the-service\n"
        local = op.state / "checkfu" / "host-process" / "instances"
        assert not local.exists() or list(local.iterdir()) == []
        assert only(op.ps()["sandboxes"], sid)["endpoint"] == service.url
        op.ok("sandbox", "rm", sid)
        assert list(mine.iterdir()) == []
    finally:
        service.stop()
    assert op.open_allocations() == []


# The Node.js provider a stranger wrote from the author kit --------------------------------------------------------


def node_allocations(service: Service) -> list[str]:
    state = service.root / "node-state"
    return sorted(p.name for p in state.iterdir() if p.name.startswith("alloc-")) if state.exists() else []


def node_processes(service: Service) -> list[int]:
    want = f"{NODE_LABEL}={service.root / 'node-state'}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if any(var.startswith(want) for var in environ.split(b"\0")):
                found.append(int(entry.name))
    return found


def nothing_left(service: Service) -> bool:
    return node_allocations(service) == [] and node_processes(service) == []


def test_the_node_provider_after_enrollment(node: str, home: Operator, tmp_path: Path) -> None:
    service = node_service(node, tmp_path)
    op = home.tagged()
    profile = profile_file(tmp_path, base_image=NODE_IMAGE, name="node.toml")
    try:
        enrolled(op, service)
        # create, exec, and what it does not declare refused by name, the sandbox untouched
        sid = op.json("sandbox", "create", "--provider", service.url, "--profile", str(profile))["sandbox_id"]
        assert len(node_allocations(service)) == 1
        assert op.ok("exec", sid, "--", "sh", "-c", "echo hi; id -u").out == b"hi\n65534\n"
        (tmp_path / "x.txt").write_text("x\n")
        cp = op.refused("cp", str(tmp_path / "x.txt"), f"{sid}:/tmp/x.txt")
        assert (cp["code"], cp["field"]) == ("SandboxOperationUnsupported", "listDir"), cp
        snapshot = op.refused("snapshot", sid)
        assert (snapshot["code"], snapshot["field"]) == ("SandboxOperationUnsupported", "snapshot"), snapshot
        assert op.ok("exec", sid, "--", "true").code == 0
        op.ok("kill", sid)
        assert until("the sandbox gone from the provider", lambda: nothing_left(service))

        # a Run killed mid-Run, then one reconcile
        running = op.start("run", "--provider", service.url, "--profile", str(profile), "--", "sleep", "120")
        until("the Run's sandbox on the provider", lambda: node_processes(service))
        running.proc.send_signal(signal.SIGKILL)
        running.proc.wait(timeout=20)
        done = op.json("runner", "reconcile")
        assert len(done["compensated"]) == 1 and done["failed"] == {}, done
        assert until("the Run's sandbox gone from the provider", lambda: nothing_left(service))

        # while the provider is down (a crash: it keeps each allocation's directory), a sandbox's time-to-live
        # passes and a Run's process is killed: each is listed once, with where it lives and why it is still held,
        # and nothing says it was reclaimed; once the provider is back, the next command reclaims both
        made = op.json("sandbox", "create", "--provider", service.url, "--profile", str(profile), "--ttl", "4s")
        sid, expires = made["sandbox_id"], datetime.fromisoformat(made["expires_at"]).timestamp()
        running = op.start("run", "--provider", service.url, "--profile", str(profile), "--", "sleep", "120")
        running.wait_for("activate")
        assert len(node_allocations(service)) == 2
        running.proc.send_signal(signal.SIGKILL)
        running.proc.wait(timeout=20)
        assert service.credential is not None
        issued = service.credential
        service.stop(signal.SIGKILL)
        time.sleep(max(0.0, expires + 1 - time.time()))  # the deadline is said in whole seconds
        listed = op.ps()
        row = only(listed["sandboxes"], sid)
        assert (row["state"], row["reclaimed"], row["endpoint"]) == ("expired", False, service.url), row
        assert service.url in row["error"], row
        (run,) = listed["runs"]
        assert (run["state"], run["endpoint"]) == ("orphaned", service.url), run
        killed = op.refused("kill", run["id"])
        assert killed["field"] == "provider" and "could not be reclaimed" in killed["message"], killed
        assert len(node_allocations(service)) == 2
        service.start(issued)
        listed = op.ps()
        assert (only(listed["sandboxes"], sid)["reclaimed"], listed["runs"]) == (True, []), listed
        assert until("nothing left on the provider", lambda: nothing_left(service))
        assert op.ps() == {"ok": True, "sandboxes": [], "runs": [], "snapshots": []}
    finally:
        op.stop_all()
        service.stop()
    assert op.open_allocations() == []
    assert "internal error" not in service.log()


# The README's example: the Docker tier served --------------------------------------------------------------------


@pytest.mark.docker
def test_the_readmes_served_docker_example_as_written(home: Operator, tmp_path: Path) -> None:
    """README, "Providers behind the wire": serve docker with a bootstrap credential, sign the suite's evidence,
    enroll, serve again with the issued credential, then ``run --provider URL`` and a sandbox on it, files copied
    both ways. Served, the Docker tier is a third party within its ceiling (its runner_enforced axes stated
    provider_attested), so enrollment admits it."""
    from .test_run_docker import connect, leftovers  # noqa: PLC0415 - the Docker client only for this test

    engine = connect()
    service = served("docker", tmp_path)
    op = home.tagged()
    busybox = str(PROFILES / "busybox-none.toml")
    try:
        enrolled(op, service)
        assert op.ok("run", "--provider", service.url, "--profile", busybox, "--", "echo", "hi").out == b"hi\n"
        sid = op.json("sandbox", "create", "--provider", service.url, "--profile", busybox)["sandbox_id"]
        (tmp_path / "in.txt").write_bytes(b"copied in\n")
        op.ok("cp", str(tmp_path / "in.txt"), f"{sid}:/tmp/in.txt")
        assert op.ok("exec", sid, "--", "cat", "/tmp/in.txt").out == b"copied in\n"
        op.ok("exec", sid, "--", "sh", "-c", "mkdir /tmp/d && echo copied out > /tmp/d/out.txt")
        op.ok("cp", f"{sid}:/tmp/d", str(tmp_path / "d"))
        assert (tmp_path / "d" / "out.txt").read_bytes() == b"copied out\n"
        assert only(op.ps()["sandboxes"], sid)["endpoint"] == service.url
        op.ok("sandbox", "rm", sid)
        assert leftovers(engine, op.tag) == []
    finally:
        op.stop_all()
        service.stop()
        engine.close()
    assert op.open_allocations() == []
