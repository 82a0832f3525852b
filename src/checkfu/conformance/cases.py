"""The nine conformance cases of contract.md section 9, as library code.

Every case drives the provider through the runner (its one door, its checks, its
journal), so a provider is graded by exactly the checks a Run would apply. A case
whose requirement the envelope does not declare is skipped, naming the envelope
field; every other case runs and passes or fails with its reason and the evidence
it saw.

What the envelope declares beyond the nine required members is exercised by the
case it belongs to, and only where declared: listDir, readFiles and openProcess in
case 2 (with exec's own bounds), listAllocations and the lifecycle assurances in
case 4, the snapshot family in cases 6 to 8 (with ``keep_seconds``). A failure names
the member or assurance and the field that declared it. Each case records which
declared items it exercised and saw hold (``exercised``) or fail (``faulted``), so
evidence and the grade card can say what conformance did and did not exercise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from checkfu.conformance.destinations import DestinationUnavailable, beside, destination, loopback, name_server
from checkfu.conformance.probes import (
    NoProbe,
    Ran,
    Route,
    connect,
    dns_query,
    environment,
    has_shell,
    listing,
    read_file,
    writable_dir,
    write_file,
    write_new,
)
from checkfu.contract.envelope import OPTIONAL_MEMBERS, LifecycleAssurances, SandboxProviderCapabilities
from checkfu.contract.errors import SandboxError, SandboxProviderFailed
from checkfu.contract.members import ListAllocationsResult
from checkfu.contract.model import format_timestamp
from checkfu.contract.process import ProcessExit, ProcessOutput
from checkfu.contract.profile import NetworkPolicy, SandboxProfile
from checkfu.contract.requirements import require_capabilities
from checkfu.contract.vocabulary import Platform
from checkfu.core.clock import SystemClock
from checkfu.core.driver import CheckedProcess, Instance, RunSession, Snapshot
from checkfu.core.journal import Journal
from checkfu.core.leases import LeaseStore
from checkfu.core.mounts import GitSource, MountSpec, ResolvedMount, resolve_mount
from checkfu.core.registry import Adapter, in_tree_refusal
from checkfu.core.runner import new_run_id
from checkfu.wire.client import RemoteProcess

Verdict = Literal["pass", "fail", "skip"]

CREDENTIAL_NAMES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "ACCESS_KEY", "AUTH")
"""Environment names that would carry a credential of some store."""
CREDENTIAL_FILES = (
    "~/.git-credentials",
    "~/.netrc",
    "~/.config/git/credentials",
    "~/.docker/config.json",
    "~/.ssh/id_rsa",
    "~/.ssh/id_ed25519",
    "/root/.git-credentials",
    "/root/.netrc",
    "/root/.docker/config.json",
)
SOCKETS = ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock", "/var/run/ssh-agent.sock")

PATIENCE = 15.0
"""How long the suite waits for something the contract says must end (a timed-out command, a killed process,
the processes of a released instance) before it says it did not."""
ECHO_FLOOR = 1 << 20
"""The least stdin an open process is sent (and must echo back): past any credit a pipe or a small window holds."""
ECHO_CEILING = 16 << 20
"""The most: a service that grants more stdin credit than this is not made to spend all of it."""
EXEC_CAP = 16
"""``max_output_bytes`` of the exec whose output must be cut and flagged."""
KEEP_SECONDS = 3600
"""The lifetime asked of a snapshot whose stated expiry is checked."""
SHORT_KEEP = 1
"""The lifetime asked of a snapshot that must be gone once it passes (provider custody)."""

Item = Literal[
    "openProcess",
    "readFiles",
    "listDir",
    "listAllocations",
    "snapshot",
    "deleteSnapshot",
    "clone",
    "resume",
    "release_destroys",
    "release_idempotent",
    "reaps_process_tree",
    "cold_compensation",
    "enumerates_allocations",
]
"""What an envelope may declare beyond the required members: the eight optional members and the five lifecycle
assurances. A case records each it exercised and saw hold, and each it saw fail."""
ITEMS: tuple[Item, ...] = get_args(Item)
ASSURANCES: tuple[Item, ...] = tuple(i for i in ITEMS if i in LifecycleAssurances.model_fields)


def declared_by(item: str) -> str:
    """The envelope field that declares ``item``."""
    if item == "listDir":
        return "list_dir"
    if item in ("snapshot", "deleteSnapshot", "clone", "resume"):
        return "snapshots"
    if item in LifecycleAssurances.model_fields:
        return f"lifecycle_assurances.{item}"
    return "operations"


def declared(envelope: SandboxProviderCapabilities, item: str) -> bool:
    """Whether ``envelope`` declares ``item`` (an optional member it serves, or an assurance it makes)."""
    if item in LifecycleAssurances.model_fields:
        return bool(getattr(envelope.lifecycle_assurances, item))
    return any(envelope.declares(member) for member in OPTIONAL_MEMBERS if member == item)


def said(exc: SandboxError) -> str:
    """A failed call in words: the code the provider answered when it answered one, else the runner's finding."""
    if isinstance(exc, SandboxProviderFailed) and exc.reported_code:
        return exc.message  # "<member>: the provider raised <code>: ..."
    return f"{exc.code}: {exc.message}"


@dataclass
class CaseResult:
    number: int
    name: str
    outcome: Verdict
    reason: str
    seconds: float = 0.0
    evidence: list[str] = field(default_factory=list)
    exercised: list[str] = field(default_factory=list)
    """Declared optional members and lifecycle assurances this case exercised and saw hold."""
    faulted: list[str] = field(default_factory=list)
    """Declared optional members and lifecycle assurances this case exercised and saw fail."""

    def as_json(self) -> dict[str, object]:
        return {
            "number": self.number,
            "name": self.name,
            "outcome": self.outcome,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
            "evidence": self.evidence,
            "exercised": self.exercised,
            "faulted": self.faulted,
        }


class Failed(Exception):
    """A case's own check failed: the reason, for the report."""


class Skipped(Exception):
    """A case's requirement is not declared: the reason names the envelope field."""


@dataclass
class Context:
    """What every case needs: the adapter under test, a profile it can serve, and a runner of its own."""

    adapter: Adapter
    chosen_profile: SandboxProfile | None
    platform: Platform
    secret: str | None = None
    profile_problem: str = "no profile was given"
    """Why there is no profile, when there is none: every case that needs a sandbox fails with it."""
    """The wire credential, if any: it must never be visible inside a sandbox."""
    runner_tag: str = field(default_factory=lambda: f"conformance-{uuid.uuid4().hex[:10]}")
    evidence: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    """Declared items (``ITEMS``) a check of this case exercised and saw hold."""
    faulted: list[str] = field(default_factory=list)
    """Declared items a check of this case exercised and saw fail."""
    _journal: Journal | None = None

    @property
    def envelope(self) -> SandboxProviderCapabilities:
        return self.adapter.envelope

    @property
    def profile(self) -> SandboxProfile:
        if self.chosen_profile is None:
            raise Failed(f"no sandbox to run in: {self.profile_problem}")
        return self.chosen_profile

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            self._journal = Journal("sqlite://")
        return self._journal

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()

    def saw(self, line: str) -> None:
        self.evidence.append(line[:500])

    def holds(self, item: Item) -> None:
        if item not in self.held:
            self.held.append(item)

    @contextlib.asynccontextmanager
    async def checking(self, item: Item) -> AsyncIterator[None]:
        """Check what ``item`` (declared by the envelope) must do: a failure, or an error of any call inside, fails
        the case with a reason that starts with the item and the field that declares it."""
        try:
            yield
        except Failed as exc:
            self._fault(item)
            raise Failed(f"{item} (declared by {declared_by(item)}): {exc}") from None
        except SandboxError as exc:
            self._fault(item)
            raise Failed(f"{item} (declared by {declared_by(item)}): {said(exc)}") from None
        self.holds(item)

    def _fault(self, item: Item) -> None:
        if item not in self.faulted:
            self.faulted.append(item)

    def with_policy(self, policy: NetworkPolicy) -> SandboxProfile:
        return self.profile.model_copy(update={"network_policy": policy})

    @contextlib.asynccontextmanager
    async def session(self, *, mounts: int = 0, profile: SandboxProfile | None = None) -> AsyncIterator[RunSession]:
        """A Run of its own, through the runner's checked session and door; everything it allocated is released
        (or compensated) on the way out.

        The suite examines a provider before anyone selects it (enrollment needs the evidence it makes), so it
        holds the provider to the capability check a selection makes, but not to enrollment or a ceiling.
        """
        prof = profile or self.profile
        require_capabilities(self.envelope, prof, platform=self.platform, mount_count=mounts)
        clock = SystemClock()
        leases = LeaseStore(self.journal, clock)
        run_id = new_run_id()
        self.journal.start_run(
            run_id,
            runner_tag=self.runner_tag,
            target=self.adapter.target,
            now=clock.now(),
            profile_digest=prof.digest,
            command=["conformance"],
        )
        lease = leases.acquire(run_id)
        session = RunSession(
            provider=self.adapter.provider,
            envelope=self.envelope,
            journal=self.journal,
            leases=leases,
            lease=lease,
            run_id=run_id,
            runner_tag=self.runner_tag,
            clock=clock,
            door=self.adapter.door,
        )
        status = "failed"
        try:
            yield session
            status = "succeeded"
        finally:
            await session.release_all()
            self.journal.finish_run(run_id, status=status, now=clock.now())
            leases.end(lease)

    async def active(
        self, session: RunSession, mounts: list[ResolvedMount] | None = None, profile: SandboxProfile | None = None
    ) -> Instance:
        prof = profile or self.profile
        image = (await session.materialize(prof, self.platform)).image
        inst = await session.provision(prof, self.platform, image, mounts or [])
        await session.stage(inst, mounts or [])
        await session.activate(inst)
        return inst


def _check(condition: bool, reason: str) -> None:
    if not condition:
        raise Failed(reason)


# 1 ----------------------------------------------------------------------------------------------


async def envelope_is_honest(ctx: Context) -> str:
    """The advertised envelope decodes, obeys every cross-field rule, and claims no runner_enforced unless in-tree."""
    env = ctx.envelope  # it got here through the runner's strict decoder, cross-field rules and all
    claimed = env.enforcement.runner_enforced()
    ctx.saw(f"envelope of {env.target}: decoded; runner_enforced on {', '.join(claimed) or 'no axis'}")
    if claimed:
        why = in_tree_refusal(ctx.adapter) if ctx.adapter.in_tree else "it is not one of this package's providers"
        _check(
            ctx.adapter.in_tree and why is None,
            f"claims runner_enforced on {', '.join(claimed)}, but {why}: only an in-tree adapter may",
        )
    return "decodes, obeys the cross-field rules" + ("; in-tree, may claim runner_enforced" if claimed else "")


# 2 ----------------------------------------------------------------------------------------------


async def lifecycle_round_trip(ctx: Context) -> str:
    """materialize, provision, activate, exec, release; every echo cross-checks (the runner's door checks them).

    On the way, exec's two bounds (the output cap and the timeout), and every optional member of an active
    instance the envelope declares: listDir, readFiles (a directory and a read over ``max_bytes`` too) and
    openProcess (stdin past the credit window, the exit status after all output, kill, and over the wire a
    dropped connection reattached). An undeclared member is not called. A declared member that fails does not
    stop the others: each is tried, on a new instance if a fault cost the first, and every failure is named.
    """
    env = ctx.envelope
    problems: list[str] = []
    async with ctx.session() as session:
        inst = await ctx.active(session)
        ran = await session.exec(inst, ["echo", "conformance"], timeout=30)
        ctx.saw(f"exec echo -> exit {ran.exit_code}, stdout {ran.stdout[:40]!r}")
        _check(ran.exit_code == 0 and ran.stdout == b"conformance\n", f"echo answered {ran.exit_code} {ran.stdout!r}")
        await _exec_bounds(ctx, session, inst)
        checks: tuple[tuple[Item, Callable[[Context, RunSession, Instance], Awaitable[None]]], ...] = (
            ("listDir", _list_dir_holds),
            ("readFiles", _read_files_holds),
            ("openProcess", _open_process_holds),
        )
        for item, check in checks:
            if not declared(env, item):
                ctx.saw(f"{item}: not declared ({declared_by(item)}), so not called")
                continue
            if inst.state != "active":  # a fault of the check before reclaimed the instance
                inst = await ctx.active(session)
            try:
                async with ctx.checking(item):
                    await check(ctx, session, inst)
            except Failed as exc:
                problems.append(str(exc))
        if inst.state == "active":
            released = await session.release(inst)
            ctx.saw(f"release -> {released.state}, destroyed {released.destroyed}")
        if env.declares("readFiles"):
            try:
                async with ctx.checking("readFiles"):
                    await _read_files_refuses_over_max(ctx, session)
            except Failed as exc:
                problems.append(str(exc))
    if problems:
        raise Failed("; ".join(problems))
    return "every member answered in contract, and every declared one did what it must"


async def _exec_bounds(ctx: Context, session: RunSession, inst: Instance) -> None:
    """exec cuts each stream at ``max_output_bytes`` and says so; at its timeout it ends the command and says so."""
    text = "o" * 200
    ran = await session.exec(inst, ["echo", text], timeout=30, max_output_bytes=EXEC_CAP)
    ctx.saw(
        f"exec echo of {len(text) + 1} bytes, max_output_bytes {EXEC_CAP}: {ran.stdout!r}, "
        f"stdout_truncated {ran.stdout_truncated}"
    )
    _check(
        ran.stdout == (text + "\n").encode()[:EXEC_CAP] and ran.stdout_truncated,
        f"exec: {len(text) + 1} bytes of output with max_output_bytes {EXEC_CAP} answered {len(ran.stdout)} bytes "
        f"with stdout_truncated {ran.stdout_truncated}; the first {EXEC_CAP} bytes, flagged, are due",
    )
    started = time.monotonic()
    try:
        async with asyncio.timeout(PATIENCE):
            ran = await session.exec(inst, ["sleep", "30"], timeout=1)
    except TimeoutError:
        raise Failed(f"exec: sleep 30 with a 1 s timeout had not answered after {PATIENCE:g} s") from None
    took = time.monotonic() - started
    ctx.saw(f"exec sleep 30, timeout 1 s -> exit {ran.exit_code}, timed_out {ran.timed_out}, after {took:.1f} s")
    _check(ran.exit_code not in (126, 127), f"cannot probe exec's timeout: no sleep in the sandbox ({ran.exit_code})")
    _check(
        ran.timed_out and ran.exit_code != 0,
        f"exec: sleep 30 with a 1 s timeout answered exit {ran.exit_code}, timed_out {ran.timed_out} after "
        f"{took:.1f} s; timed_out true and a failing status are due",
    )


async def _tree(ctx: Context, session: RunSession, inst: Instance, name: str) -> str:
    """A new directory holding ``a`` (``alpha``) and ``b`` (``bravo!``), in the sandbox's writable directory."""
    where = f"{(await writable_dir(session, inst)).rstrip('/')}/conformance-{name}-{uuid.uuid4().hex[:8]}"
    for leaf, text in (("a", "alpha"), ("b", "bravo!")):
        try:
            ran = await write_new(session, inst, f"{where}/{leaf}", text)
        except NoProbe as exc:
            raise Failed(f"cannot write a file inside (no shell and no write command): {exc}") from None
        _check(ran.code == 0, f"writing {where}/{leaf} inside failed: {ran}")
    return where


async def _list_dir_holds(ctx: Context, session: RunSession, inst: Instance) -> None:
    """A directory lists its files with their sizes; a bound of one entry truncates it; a file and nothing are
    answered as such, in-band."""
    where = await _tree(ctx, session, inst, "ls")
    listed = await session.list_dir(inst, where)
    entries = {e.path: (e.kind, e.size) for e in listed.entries}
    ctx.saw(f"listDir {where}: {listed.kind}, {sorted(entries.items())}, truncated {listed.truncated}")
    _check(listed.kind == "dir", f"{where} (a directory) is answered as {listed.kind}")
    for leaf, size in (("a", 5), ("b", 6)):
        got = entries.get(f"{where}/{leaf}")
        _check(got == ("file", size), f"{where}/{leaf} (a file of {size} bytes) is listed as {got}")
    _check(not listed.truncated, f"{where} holds two entries and was answered truncated")
    one = await session.list_dir(inst, where, max_entries=1)
    ctx.saw(f"listDir {where}, max_entries 1: {len(one.entries)} entry, truncated {one.truncated}")
    _check(one.truncated, f"{where} holds two entries and max_entries 1 did not answer truncated")
    file_kind = (await session.list_dir(inst, f"{where}/a")).kind
    nothing_kind = (await session.list_dir(inst, f"{where}/nothing")).kind
    ctx.saw(f"listDir of a file: {file_kind}; of nothing: {nothing_kind}")
    _check(file_kind == "file", f"{where}/a (a file) is answered as {file_kind}")
    _check(nothing_kind == "missing", f"{where}/nothing (nothing there) is answered as {nothing_kind}")


async def _read_files_holds(ctx: Context, session: RunSession, inst: Instance) -> None:
    """A file is answered with its bytes; a directory and nothing are answered missing, in-band."""
    where = await _tree(ctx, session, inst, "read")
    asked = [f"{where}/a", where, f"{where}/nothing"]
    res = await session.read_files(inst, asked)
    files = {f.path: f.data for f in res.files}
    ctx.saw(f"readFiles {asked}: files {files}, missing {list(res.missing)}")
    _check(files.get(f"{where}/a") == b"alpha", f"{where}/a holds 'alpha', answered {files.get(f'{where}/a')!r}")
    _check(
        where in res.missing,
        f"{where} is a directory: it must be answered missing (readFiles reads regular files), not as a file",
    )
    _check(f"{where}/nothing" in res.missing, f"{where}/nothing (nothing there) is not answered missing")


async def _read_files_refuses_over_max(ctx: Context, session: RunSession) -> None:
    """Files over ``max_bytes`` are refused whole (SandboxBoundExceeded), never cut short. The refusal costs the
    instance (the runner reclaims after any error), so it has one of its own."""
    inst = await ctx.active(session)
    where = await _tree(ctx, session, inst, "max")
    try:
        res = await session.read_files(inst, [f"{where}/b"], max_bytes=5)
    except SandboxProviderFailed as exc:
        ctx.saw(f"readFiles of 6 bytes, max_bytes 5: {said(exc)}")
        _check(
            exc.reported_code == "SandboxBoundExceeded",
            f"6 bytes asked with max_bytes 5 were refused with {exc.reported_code}, not SandboxBoundExceeded",
        )
        return
    got = [(f.path, len(f.data)) for f in res.files]
    raise Failed(
        f"6 bytes asked with max_bytes 5 were answered ({got}, missing {list(res.missing)}) instead of refused "
        "with SandboxBoundExceeded"
    )


@dataclass
class _Drained:
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    exit_code: int | None = None
    out_at_exit: int = -1
    """How many bytes of stdout had arrived when the exit did."""


async def _drain(proc: CheckedProcess, on_output: Callable[[], None] | None = None) -> _Drained:
    """Every event of ``proc`` up to its exit."""
    got = _Drained()
    async for event in proc.events():
        if isinstance(event, ProcessOutput):
            (got.out if event.stream == "out" else got.err).extend(event.data)
            if on_output is not None:
                on_output()
        elif isinstance(event, ProcessExit):
            got.exit_code, got.out_at_exit = event.exit_code, len(got.out)
    return got


async def _feed(proc: CheckedProcess, data: bytes, *, pause: asyncio.Event | None = None) -> None:
    """Send ``data`` as stdin in pieces (waiting on ``pause`` half-way, if given), then end it."""
    piece = 64 << 10
    for at in range(0, len(data), piece):
        if pause is not None and at >= len(data) // 2:
            await pause.wait()
            pause = None
        await proc.send_stdin(data[at : at + piece])
    await proc.close_stdin()


async def _echoed(ctx: Context, proc: CheckedProcess, data: bytes, what: str, *, interrupt: bool = False) -> None:
    """``cat`` echoes ``data`` whole, in order, every byte before its exit, and exits 0. With ``interrupt``, the
    connection is dropped once output flows, with half of stdin still unsent: the stream must reattach."""
    half_way = asyncio.Event() if interrupt else None
    stream = proc.stream

    def first_output() -> None:
        if half_way is not None and not half_way.is_set() and isinstance(stream, RemoteProcess):
            stream.interrupt()
            half_way.set()

    feeding = asyncio.ensure_future(_feed(proc, data, pause=half_way))
    ended = False
    try:
        async with asyncio.timeout(PATIENCE):
            got = await _drain(proc, first_output if interrupt else None)
            ended = True
            await feeding
    except TimeoutError:
        grant = getattr(stream, "stdin_grant", None)
        granted = f"; the service granted {grant} bytes of stdin credit" if grant is not None else ""
        raise Failed(
            f"{what}: cat of {len(data)} bytes of stdin had not exited after {PATIENCE:g} s{granted}"
        ) from None
    finally:
        if not feeding.done():
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
        if not ended:
            await proc.kill()
    ctx.saw(f"{what}: {len(data)} bytes in, {len(got.out)} out, exit {got.exit_code}")
    _check(
        bytes(got.out) == data,
        f"{what}: cat of {len(data)} bytes echoed {len(got.out)} bytes"
        + ("" if len(got.out) != len(data) else ", not the same ones")
        + f" (stderr {bytes(got.err[:120])!r})",
    )
    _check(got.out_at_exit == len(data), f"{what}: the exit came after {got.out_at_exit} of {len(data)} bytes")
    _check(got.exit_code == 0, f"{what}: cat exited {got.exit_code}, not 0")


async def _open_process_holds(ctx: Context, session: RunSession, inst: Instance) -> None:
    """stdin past every credit window is echoed whole with the exit after it; a failing command's status is
    exec's; kill ends a process; over the wire, a dropped connection reattaches without a byte lost."""
    proc = await session.open_process(inst, ["cat"])
    remote = proc.stream if isinstance(proc.stream, RemoteProcess) else None
    size = ECHO_FLOOR
    if remote is not None:
        size = max(size, remote.stdin_grant or 0, remote.window)
        ctx.saw(f"over the wire: the service granted {remote.stdin_grant} bytes of stdin, the suite {remote.window}")
    size = min(size + (64 << 10), ECHO_CEILING)
    await _echoed(ctx, proc, os.urandom(size), "stdin past the credit window")
    if remote is not None:
        proc = await session.open_process(inst, ["cat"])
        await _echoed(ctx, proc, os.urandom(256 << 10), "a dropped connection", interrupt=True)
        again = proc.stream.reattached if isinstance(proc.stream, RemoteProcess) else 0
        _check(again >= 1, "a dropped connection: the stream never reattached")
    else:
        ctx.saw("reattach: not applicable, the provider is not reached over the wire")
    argv = ["cat", f"/nonexistent-conformance-{uuid.uuid4().hex[:8]}"]
    ran = await session.exec(inst, argv, timeout=30)
    proc = await session.open_process(inst, argv)
    await proc.close_stdin()
    try:
        async with asyncio.timeout(PATIENCE):
            got = await _drain(proc)
    except TimeoutError:
        raise Failed(f"{' '.join(argv)} had not exited after {PATIENCE:g} s") from None
    ctx.saw(f"{' '.join(argv)}: exec exit {ran.exit_code}, openProcess exit {got.exit_code}")
    _check(
        got.exit_code == ran.exit_code and ran.exit_code != 0,
        f"{' '.join(argv)} exited {got.exit_code} through openProcess and {ran.exit_code} through exec",
    )
    proc = await session.open_process(inst, ["sleep", "600"])
    await proc.kill()
    try:
        async with asyncio.timeout(PATIENCE):
            got = await _drain(proc)
    except TimeoutError:
        raise Failed(f"kill: sleep 600 was still running {PATIENCE:g} s after it was killed") from None
    ctx.saw(f"kill: sleep 600 ended with exit {got.exit_code}")
    _check(got.exit_code != 0, "kill: the killed sleep 600 exited 0")


# 3 ----------------------------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(repo),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "conformance",
        "GIT_AUTHOR_EMAIL": "conformance@example.invalid",
        "GIT_COMMITTER_NAME": "conformance",
        "GIT_COMMITTER_EMAIL": "conformance@example.invalid",
    }
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=True, env=env, timeout=60)
    return done.stdout.decode()


async def git_blob_without_credential(ctx: Context) -> str:
    """The runner stages an immutable Git blob by writeFile; the sandbox sees exactly those bytes and no
    credential of any store: not in its environment, its files, its mounted sockets or a Git remote URL."""
    if ctx.envelope.effective_max_mounts < 1:
        raise Skipped(f"max_mounts is {ctx.envelope.max_mounts}: the case stages a mount")
    token = f"ghp_conformance{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory(prefix="checkfu-conformance-") as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        _git(repo, "init", "-q", "-b", "main")
        blob = bytes(range(256)) + b"\nconformance blob " + uuid.uuid4().hex.encode() + b"\n"
        (repo / "data.bin").write_bytes(blob)
        (repo / "notes.txt").write_text("the runner read this, not the provider\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "conformance")
        _git(repo, "remote", "add", "origin", f"https://conformance:{token}@git.example.invalid/repo.git")
        commit = _git(repo, "rev-parse", "HEAD").strip()
        blob_id = _git(repo, "rev-parse", f"{commit}:data.bin").strip()
        mount = resolve_mount(MountSpec(GitSource(repo, commit), "/workspace"))
        # The repository stays until the sandbox is gone: staging reads each blob again from it (never held).
        ctx.saw(f"git blob {blob_id} ({len(blob)} bytes) from commit {commit[:12]}, remote URL carrying a token")
        (f,) = [f for f in mount.plan.files if f.path == "data.bin"]
        _check(f.digest == f"git:{blob_id}", f"the mount plan names {f.digest}, the blob is {blob_id}")
        secrets_to_find = [token] + ([ctx.secret] if ctx.secret else [])
        async with ctx.session(mounts=1) as session:
            inst = await ctx.active(session, [mount])
            seen = await read_file(session, inst, "/workspace/data.bin")
            _check(seen == blob, f"the sandbox read {len(seen or b'')} bytes, not the blob's {len(blob)}")
            ctx.saw("inside: /workspace/data.bin is exactly the blob's bytes")
            env_text = await environment(session, inst)
            names = [line.split("=", 1)[0] for line in env_text.splitlines() if "=" in line]
            suspicious = [n for n in names if any(w in n.upper() for w in CREDENTIAL_NAMES) or n.startswith("GIT_")]
            _check(not suspicious, f"the environment names credentials: {', '.join(suspicious)}")
            ctx.saw(f"inside: environment of {len(names)} variables, none a credential")
            places = ["/workspace/data.bin", "/workspace/notes.txt", *CREDENTIAL_FILES]
            for place in places:
                path = place.replace("~", _home(env_text), 1) if place.startswith("~") else place
                content = await read_file(session, inst, path)
                if content is None:
                    continue
                leaked = [s for s in secrets_to_find if s.encode() in content]
                _check(not leaked, f"{path} holds a credential")
                if place in CREDENTIAL_FILES:
                    raise Failed(f"{path} exists inside the sandbox: a credential store")
            for text in (env_text,):
                _check(not any(s in text for s in secrets_to_find), "a credential is in the environment")
            workspace = await listing(session, inst, "/workspace") or ""
            _check(".git" not in workspace.split(), "/workspace holds a .git directory (and so the remote URL)")
            ctx.saw(f"inside: /workspace lists {' '.join(sorted(workspace.split()))}; no .git, no credential files")
            for sock in SOCKETS:
                _check(await listing(session, inst, sock) is None, f"{sock} is mounted in the sandbox")
            ctx.saw(f"inside: none of {', '.join(SOCKETS)} is present")
    return "the sandbox saw exactly the blob's bytes and no credential"


def _home(env_text: str) -> str:
    for line in env_text.splitlines():
        if line.startswith("HOME="):
            return line[5:] or "/"
    return "/root"


# 4 ----------------------------------------------------------------------------------------------


def _gone(exc: SandboxError) -> bool:
    return isinstance(exc, SandboxProviderFailed) and exc.reported_code == "SandboxNotFound"


async def _listed_keys(session: RunSession) -> set[str]:
    listing_: ListAllocationsResult = await session.list_allocations()
    return {a.allocation_key for a in listing_.allocations}


async def release_reclaims(ctx: Context) -> str:
    """After release, inspect shows it released or gone; a declared idempotent release returns the same
    identity; compensate of a half-provisioned allocation reclaims it; a declared listing holds a live instance
    and neither reclaimed one; where openProcess and reaps_process_tree are declared, a process tree still
    running at release ends with it."""
    async with ctx.session() as session:
        inst = await ctx.active(session)
        reaps = ctx.envelope.lifecycle_assurances.reaps_process_tree
        watched = await _tree_running(ctx, session, inst) if reaps else None
        try:
            await _release_reclaims(ctx, session, inst, watched)
        finally:
            if watched is not None and not watched.done():
                watched.cancel()
            if watched is not None:
                await asyncio.gather(watched, return_exceptions=True)
    return "release and compensation reclaim"


async def _release_reclaims(
    ctx: Context, session: RunSession, inst: Instance, watched: asyncio.Task[_Drained] | None
) -> None:
    """Case 4 on ``inst``: the listing, the release, inspect, the watched tree, a second release, compensation."""
    env = ctx.envelope
    assurances = env.lifecycle_assurances
    if env.declares("listAllocations"):
        async with ctx.checking("listAllocations"):
            held = await _listed_keys(session)
            ctx.saw(f"listAllocations while {inst.allocation_key} is active: {len(held)} allocation(s)")
        if assurances.enumerates_allocations:
            async with ctx.checking("enumerates_allocations"):
                _check(inst.allocation_key in held, f"the active {inst.allocation_key} is not listed")
    first_release = await session.release(inst)
    try:
        after = await session.inspect(inst)
        _check(after.state == "released", f"inspect after release says {after.state}")
        ctx.saw("inspect after release: released")
    except SandboxError as exc:
        _check(_gone(exc), f"inspect after release failed: {exc.code}: {exc.message}")
        ctx.saw("inspect after release: not found (gone)")
    if assurances.release_destroys:
        ctx.holds("release_destroys")  # release answered destroyed (the runner refuses false), and it is gone
    if watched is not None:
        async with ctx.checking("reaps_process_tree"):
            await _reaped(ctx, watched)
    if assurances.release_idempotent:
        async with ctx.checking("release_idempotent"):
            again = await session.release(inst)
            _check(
                (again.instance_id, again.allocation_key) == (first_release.instance_id, first_release.allocation_key),
                "a second release returned another identity",
            )
            ctx.saw("second release: same identity")
    image = (await session.materialize(ctx.profile, ctx.platform)).image
    half = await session.provision(ctx.profile, ctx.platform, image)
    await session.compensate(half.allocation_key)
    ctx.saw(f"compensate of half-provisioned {half.allocation_key}: ok")
    try:
        state = (await session.inspect(half)).state if half.state != "released" else "released"
        _check(state == "released", f"inspect after compensate says {state}")
    except SandboxError as exc:
        _check(_gone(exc), f"inspect after compensate failed: {exc.code}: {exc.message}")
    if assurances.enumerates_allocations:
        async with ctx.checking("enumerates_allocations"):
            held = await _listed_keys(session)
            left = held & {inst.allocation_key, half.allocation_key}
            _check(not left, f"listAllocations still holds {', '.join(sorted(left))}")
            ctx.saw("listAllocations holds neither")


async def _tree_running(ctx: Context, session: RunSession, inst: Instance) -> asyncio.Task[_Drained] | None:
    """A process tree left running in ``inst`` (a shell with a child in the background, or a bare sleep), watched
    through openProcess: its output ends only when every process holding it does. ``None`` where openProcess is
    not declared: nothing else can watch a process across a release."""
    if not ctx.envelope.declares("openProcess"):
        ctx.saw("reaps_process_tree: not exercised, openProcess (to watch a process across release) is not declared")
        return None
    argv = ["sh", "-c", "sleep 600 & sleep 600"] if await has_shell(session, inst) else ["sleep", "600"]
    async with ctx.checking("reaps_process_tree"):
        proc = await session.open_process(inst, argv)
        await proc.close_stdin()
    ctx.saw(f"left running before release: {' '.join(argv)}")
    return asyncio.ensure_future(_drain(proc))


async def _reaped(ctx: Context, watched: asyncio.Task[_Drained]) -> None:
    """The watched tree's stream ends (an exit, or a typed error) soon after release."""
    try:
        async with asyncio.timeout(PATIENCE):
            got = await watched
        ctx.saw(f"after release the tree's stream ended: exit {got.exit_code}")
    except TimeoutError:
        raise Failed(f"a process tree started before release was still running {PATIENCE:g} s after it") from None
    except SandboxError as exc:
        ctx.saw(f"after release the tree's stream ended: {said(exc)}")


# 5 ----------------------------------------------------------------------------------------------


async def network_none_holds(ctx: Context) -> str:
    """network_modes none holds: nothing inside reaches any address but the provider's own plane route."""
    if "none" not in ctx.envelope.network_modes:
        raise Skipped(f"network_modes is {list(ctx.envelope.network_modes)}: no 'none' to hold")
    profile = ctx.with_policy(NetworkPolicy(mode="none"))
    with contextlib.ExitStack() as stack:
        try:
            dest = stack.enter_context(destination())
            dest.control()
        except DestinationUnavailable as exc:
            raise Failed(f"no destination to probe: {exc}") from None
        where = f" in namespace {dest.namespace}" if dest.namespace else ""
        ctx.saw(f"destination {dest.address}{where}: reachable from the runner (the control)")
        before = dest.count()
        async with ctx.session(profile=profile) as session:
            inst = await ctx.active(session, profile=profile)
            try:
                ran = await connect(session, inst, dest.host, dest.port)
            except NoProbe as exc:
                raise Failed(f"cannot probe the network from inside (no shell, python3 or nc): {exc}") from None
            ctx.saw(f"inside: {ran}")
            reached = dest.count() - before
            _check(reached == 0, f"the destination accepted {reached} connection(s) from the sandbox")
            _check(ran.code != 0, f"the sandbox says it connected to {dest.address}")
    return f"{dest.address} unreachable from inside; the destination saw no connection"


# 6, 7, 8 ----------------------------------------------------------------------------------------


def _needs_snapshots(ctx: Context) -> None:
    if not ctx.envelope.snapshots:
        raise Skipped("snapshots is false: no snapshot, clone or resume")


async def _mark(ctx: Context, session: RunSession, inst: Instance, name: str, text: str) -> str:
    """Write ``name`` in the instance's own writable directory (its home, else /tmp); returns the path."""
    path = f"{(await writable_dir(session, inst)).rstrip('/')}/{name}"
    try:
        ran = await write_file(session, inst, path, text)
    except NoProbe as exc:
        raise Failed(f"cannot write a file inside (no shell and no write command): {exc}") from None
    _check(ran.code == 0, f"writing {path} inside failed: {ran}")
    return path


async def _seen(session: RunSession, inst: Instance, name: str) -> bytes | None:
    """``name`` in the instance's own writable directory, as the instance sees it."""
    return await read_file(session, inst, f"{(await writable_dir(session, inst)).rstrip('/')}/{name}")


def _durable(ctx: Context) -> SandboxProfile:
    """Snapshots serve durable Sessions: the profile is durable wherever the envelope serves it."""
    if "durable" in ctx.envelope.retention_modes:
        return ctx.profile.model_copy(update={"retention_mode": "durable"})
    return ctx.profile


async def snapshot_and_resume(ctx: Context) -> str:
    """A file written before the snapshot is there after resume."""
    _needs_snapshots(ctx)
    profile = _durable(ctx)
    text = f"before the snapshot {uuid.uuid4().hex}"
    async with ctx.session(profile=profile) as session:
        inst = await ctx.active(session, profile=profile)
        path = await _mark(ctx, session, inst, "conformance-6", text)
        snap = await session.snapshot(inst)
        await _mark(ctx, session, inst, "conformance-6-after", "after the snapshot")
        ctx.saw(f"wrote {path}; snapshot {snap.snapshot_id} ({profile.retention_mode})")
        image = (await session.materialize(profile, ctx.platform)).image
        resumed = await session.resume(snap, profile, ctx.platform, image)
        _check(resumed.instance_id != inst.instance_id, "resume returned the source instance's id")
        await session.activate(resumed)
        await session.release(inst)
        seen = await _seen(session, resumed, "conformance-6")
        _check(seen == text.encode(), f"after resume conformance-6 holds {seen!r}")
        _check(await _seen(session, resumed, "conformance-6-after") is None, "a write after the snapshot was resumed")
        ctx.saw(f"resumed as {resumed.instance_id}: conformance-6 is there")
        await session.delete_snapshot(snap)
    ctx.holds("snapshot")
    ctx.holds("resume")
    return "the file survived snapshot and resume"


async def clone_is_independent(ctx: Context) -> str:
    """A clone has a new identity, and writes in either do not reach the other."""
    _needs_snapshots(ctx)
    profile = _durable(ctx)
    async with ctx.session(profile=profile) as session:
        source = await ctx.active(session, profile=profile)
        await _mark(ctx, session, source, "conformance-7", "before the clone")
        image = (await session.materialize(profile, ctx.platform)).image
        clone = await session.clone(source, profile, ctx.platform, image)
        _check(clone.instance_id != source.instance_id, "the clone has the source's id")
        await session.activate(clone)
        ctx.saw(f"clone {clone.instance_id} of {source.instance_id}")
        _check(await _seen(session, clone, "conformance-7") == b"before the clone", "the clone lacks the source's file")
        await _mark(ctx, session, clone, "conformance-7-clone", "clone only")
        await _mark(ctx, session, source, "conformance-7-source", "source only")
        await _mark(ctx, session, clone, "conformance-7", "changed in the clone")
        _check(await _seen(session, source, "conformance-7-clone") is None, "a write in the clone reached the source")
        _check(await _seen(session, clone, "conformance-7-source") is None, "a write in the source reached the clone")
        _check(
            await _seen(session, source, "conformance-7") == b"before the clone",
            "a change in the clone reached the source",
        )
        ctx.saw("writes in either stayed in it")
    ctx.holds("clone")
    return "the clone is its own"


async def snapshot_lifecycle(ctx: Context) -> str:
    """deleteSnapshot removes it; a deleted or foreign snapshot cannot be resumed; an ephemeral_zdr release
    leaves no snapshot bytes; a snapshot asked to be kept ``keep_seconds`` states an expiry within it, and with
    provider custody one kept a second is gone once that passes."""
    _needs_snapshots(ctx)
    async with ctx.session() as session:
        inst = await ctx.active(session)
        async with ctx.checking("snapshot"):
            await _kept_as_asked(ctx, session, inst)
    await _deleted_foreign_and_ephemeral(ctx)
    return "deleted, foreign and ephemeral snapshots cannot be resumed; expiries as asked"


async def _kept_as_asked(ctx: Context, session: RunSession, inst: Instance) -> None:
    """The stated expiry of a snapshot kept ``KEEP_SECONDS`` is within it (the runner refuses one past it, one
    already gone and none at all); with provider custody, a snapshot kept ``SHORT_KEEP`` cannot be resumed once
    its expiry has passed (the provider deletes it; with runner custody the runner does, so nothing is owed)."""
    asked = time.time()
    kept = await session.snapshot(inst, keep_seconds=KEEP_SECONDS)
    stated = kept.expires_at
    ctx.saw(
        f"snapshot kept {KEEP_SECONDS} s: expires_at "
        + (f"{format_timestamp(stated)} ({stated - asked:.0f} s on)" if stated is not None else "null")
    )
    await session.delete_snapshot(kept)
    if ctx.envelope.snapshot_custody != "provider":
        ctx.saw("runner custody: the runner deletes an expired snapshot, so its deletion is not the provider's")
        return
    short = await session.snapshot(inst, keep_seconds=SHORT_KEEP)
    due = short.expires_at if short.expires_at is not None else time.time() + SHORT_KEEP
    await asyncio.sleep(max(0.0, min(due - time.time(), PATIENCE)) + 1.0)
    ctx.saw(f"snapshot kept {SHORT_KEEP} s, asked to resume after its expiry passed")
    image = (await session.materialize(ctx.profile, ctx.platform)).image
    stale = Snapshot(allocation_key=short.allocation_key, snapshot_id=short.snapshot_id, source=inst)
    await _must_refuse(ctx, session, stale, image, f"a snapshot whose {SHORT_KEEP} s had passed")


async def _deleted_foreign_and_ephemeral(ctx: Context) -> None:
    async with ctx.session() as session:
        inst = await ctx.active(session)
        image = (await session.materialize(ctx.profile, ctx.platform)).image
        async with ctx.checking("deleteSnapshot"):
            snap = await session.snapshot(inst)
            await session.delete_snapshot(snap)
            ctx.saw(f"snapshot {snap.snapshot_id} deleted")
            # The runner's own table refuses a deleted snapshot; ask the provider as if it did not know.
            stale = Snapshot(allocation_key=snap.allocation_key, snapshot_id=snap.snapshot_id, source=inst)
            await _must_refuse(ctx, session, stale, image, "a deleted snapshot")
        async with ctx.checking("resume"):
            live = await session.snapshot(inst)
            foreign = Snapshot(
                allocation_key=f"ak-foreign-{uuid.uuid4().hex[:8]}", snapshot_id=live.snapshot_id, source=inst
            )
            await _must_refuse(ctx, session, foreign, image, "a snapshot of another allocation")
            await session.delete_snapshot(live)
        if "ephemeral_zdr" in ctx.envelope.retention_modes:  # where release destroys, by rule 7
            async with ctx.checking("release_destroys"):
                zdr = ctx.profile.model_copy(update={"retention_mode": "ephemeral_zdr"})
                eph = await ctx.active(session, profile=zdr)
                kept = await session.snapshot(eph)
                await session.release(eph)
                ghost = Snapshot(allocation_key=kept.allocation_key, snapshot_id=kept.snapshot_id, source=eph)
                await _must_refuse(ctx, session, ghost, image, "a snapshot of a released ephemeral_zdr instance", zdr)
                if ctx.envelope.lifecycle_assurances.enumerates_allocations:
                    _check(
                        kept.allocation_key not in await _listed_keys(session), "the ephemeral snapshot is still held"
                    )


async def _must_refuse(
    ctx: Context,
    session: RunSession,
    snap: Snapshot,
    image: str,
    what: str,
    profile: SandboxProfile | None = None,
) -> None:
    try:
        resumed = await session.resume(snap, profile or ctx.profile, ctx.platform, image)
    except SandboxError as exc:
        ctx.saw(f"resume of {what}: refused ({exc.code}: {exc.message[:120]})")
        return
    await session.release(resumed)
    raise Failed(f"the provider resumed {what}")


# 9 ----------------------------------------------------------------------------------------------


async def allowlist_egress(ctx: Context) -> str:
    """allowlist egress: a listed destination is reachable the way a program inside reaches it (the proxy the
    standard variables advertise, if any); an unlisted host, an unlisted port of a listed host, a listed name that
    resolves elsewhere, a raw connection bypassing the proxy and a DNS query all fail, and the destinations, the
    runner's loopback and the suite's name server see none of them."""
    if "allowlist" not in ctx.envelope.network_modes:
        raise Skipped(f"network_modes is {list(ctx.envelope.network_modes)}: no 'allowlist' to test")
    with contextlib.ExitStack() as stack:
        try:
            listed = stack.enter_context(destination())
            other_port = stack.enter_context(beside(listed))
            unlisted = stack.enter_context(destination())
            local = stack.enter_context(loopback())
            names = stack.enter_context(name_server())
            for dest in (listed, other_port, unlisted, local):
                dest.control()
            names.control("control.checkfu.test")
        except DestinationUnavailable as exc:
            raise Failed(f"no destination to probe: {exc}") from None
        # "localhost" is a name every resolver answers with a loopback address: listed with the port of a listener
        # on the runner's loopback, it is a listed name that resolves elsewhere (an address nobody listed).
        elsewhere = f"localhost:{local.port}"
        secret = f"x{uuid.uuid4().hex[:12]}.checkfu.test"
        ctx.saw(
            f"listed {listed.address} and {elsewhere}; unlisted {unlisted.address}, port {other_port.port} of the "
            f"listed host, name server {names.host}:{names.port}; each reachable from the runner (the controls)"
        )
        profile = ctx.with_policy(NetworkPolicy(mode="allowlist", allowlist=(listed.address, elsewhere)))
        watched = {"listed": listed, "unlisted": unlisted, "unlisted port": other_port, "loopback": local}
        async with ctx.session(profile=profile) as session:
            inst = await ctx.active(session, profile=profile)
            before = {k: d.count() for k, d in watched.items()}
            asked = len(names.questions())

            def reached(name: str) -> int:
                return watched[name].count() - before[name]

            try:
                yes = await connect(session, inst, listed.host, listed.port)
                ctx.saw(f"inside, listed: {_said(yes)}")
                _check(yes.code == 0 and reached("listed") == 1, f"the listed {listed.address} was not reached: {yes}")
                proxied = b"via proxy" in yes.out
                no_host = await connect(session, inst, unlisted.host, unlisted.port)
                ctx.saw(f"inside, unlisted host: {_said(no_host)}")
                _check(no_host.code != 0, f"the sandbox says it reached the unlisted {unlisted.address}")
                no_port = await connect(session, inst, listed.host, other_port.port)
                ctx.saw(f"inside, unlisted port {other_port.port} of the listed host: {_said(no_port)}")
                _check(no_port.code != 0, f"the sandbox says it reached the unlisted port {other_port.address}")
                via: Route = "proxy" if proxied else "auto"
                other = await connect(session, inst, "localhost", local.port, via)
                ctx.saw(f"inside, the listed name {elsewhere} (resolves to loopback, not listed): {_said(other)}")
                _check(other.code != 0, f"the sandbox says it reached {elsewhere}")
                raw_unlisted = await connect(session, inst, unlisted.host, unlisted.port, "direct")
                raw_listed = await connect(session, inst, listed.host, listed.port, "direct")
                ctx.saw(f"inside, bypassing the proxy: unlisted {_said(raw_unlisted)}; listed {_said(raw_listed)}")
                _check(raw_unlisted.code != 0, f"a direct connection reached the unlisted {unlisted.address}")
                if proxied:
                    _check(raw_listed.code != 0, "a raw connection to the listed destination bypassed the proxy")
                else:
                    ctx.saw("no proxy is advertised: a direct connection is the listed way out")
                dns = await dns_query(session, inst, secret, names.host, names.port)
                ctx.saw(f"inside, a DNS question for {secret} to {names.host}:{names.port}: {_said(dns)}")
                _check(dns.code != 0, f"a DNS question from inside was answered by {names.host}:{names.port}")
                tunnel = await connect(session, inst, secret, 53, via)
                ctx.saw(f"inside, the unlisted name {secret}:53 through the way out: {_said(tunnel)}")
                _check(tunnel.code != 0, f"the unlisted name {secret} was reached")
            except NoProbe as exc:
                raise Failed(f"cannot probe the network from inside: {exc}") from None
            for name in ("unlisted", "unlisted port", "loopback"):
                _check(reached(name) == 0, f"the {name} destination accepted {reached(name)} connection(s)")
            _check(reached("listed") == 1 + (not proxied), f"the listed destination saw {reached('listed')}")
            heard = names.questions()[asked:]
            _check(not heard, f"the suite's name server was asked {heard}: DNS carried data out")
            ctx.saw("the destinations counted only the listed connection; the name server heard nothing from inside")
    return "listed reachable; unlisted host, unlisted port, a name resolving elsewhere, a bypass and DNS all fail"


def _said(ran: Ran) -> str:
    out = ran.out.decode("utf-8", "replace").strip().replace("\n", " ")[:160]
    return f"exit {ran.code}" + (f" ({out})" if out else "")


@dataclass(frozen=True)
class Check:
    """One check of a case, as the author kit lists it: what it does, and what in the envelope turns it on."""

    does: str
    when: str = "always"


@dataclass(frozen=True)
class Case:
    number: int
    name: str
    requires: str
    run: Callable[[Context], Awaitable[str]]
    checks: tuple[Check, ...] = ()
    items: tuple[Item, ...] = ()
    """The declared items (optional members, assurances) this case exercises where the envelope declares them."""


CASES: tuple[Case, ...] = (
    Case(
        1,
        "envelope is honest",
        "-",
        envelope_is_honest,
        (
            Check("the envelope decodes and obeys every cross-field rule"),
            Check("no axis claims runner_enforced unless the adapter is in-tree", "enforcement"),
        ),
    ),
    Case(
        2,
        "lifecycle round trip",
        "-",
        lifecycle_round_trip,
        (
            Check("materialize, provision, activate, exec echo, release; every echo cross-checks"),
            Check(
                f"exec of 201 bytes of output with max_output_bytes {EXEC_CAP}: the first {EXEC_CAP} bytes, "
                "stdout_truncated true"
            ),
            Check(f"exec of sleep 30 with a 1 s timeout: timed_out true and a failing status, within {PATIENCE:g} s"),
            Check(
                "listDir of a directory of two files: both, with kind and size; max_entries 1: truncated; "
                "a file: kind file; nothing: kind missing",
                "list_dir: true",
            ),
            Check(
                "readFiles of a file, its directory and nothing: the file's bytes; the directory and nothing "
                "in missing",
                "operations: readFiles",
            ),
            Check(
                "readFiles of 6 bytes with max_bytes 5: refused with SandboxBoundExceeded, not cut short "
                "(on an instance of its own: the refusal costs it)",
                "operations: readFiles",
            ),
            Check(
                f"openProcess cat of more stdin than any credit window (at least {ECHO_FLOOR >> 20} MiB, "
                "past the service's first stdin grant and the suite's output grant of "
                "256 KiB): every byte echoed in order, the exit (0) after all of them",
                "operations: openProcess",
            ),
            Check(
                "openProcess of a command that fails (cat of nothing): the exit status exec gives it",
                "operations: openProcess",
            ),
            Check(
                f"openProcess sleep 600, then kill: the stream ends with a failing exit within {PATIENCE:g} s",
                "operations: openProcess",
            ),
            Check(
                "openProcess over the wire: the connection dropped with half of stdin unsent; the stream "
                "reattaches and every byte is echoed once",
                "operations: openProcess, tested by URL",
            ),
        ),
        ("listDir", "readFiles", "openProcess"),
    ),
    Case(
        3,
        "git blob without credential",
        "mounts (max_mounts >= 1)",
        git_blob_without_credential,
        (
            Check("a Git blob staged by writeFile is exactly its bytes inside", "max_mounts >= 1"),
            Check(
                "no credential inside: environment, credential files, engine sockets, a .git with the remote URL",
                "max_mounts >= 1",
            ),
        ),
    ),
    Case(
        4,
        "release reclaims",
        "-",
        release_reclaims,
        (
            Check("after release, inspect says released or not found"),
            Check("release answers destroyed true", "lifecycle_assurances.release_destroys, or ephemeral_zdr"),
            Check("a second release answers the same identity", "lifecycle_assurances.release_idempotent"),
            Check("compensate of a half-provisioned allocation reclaims it"),
            Check("listAllocations answers for the runner tag", "operations: listAllocations"),
            Check(
                "the listing holds the active instance, and neither it nor the compensated one once reclaimed",
                "lifecycle_assurances.enumerates_allocations",
            ),
            Check(
                f"a process tree (sh -c 'sleep 600 & sleep 600') left running at release: its stream ends "
                f"within {PATIENCE:g} s",
                "lifecycle_assurances.reaps_process_tree and operations: openProcess",
            ),
        ),
        ("listAllocations", "release_destroys", "release_idempotent", "enumerates_allocations", "reaps_process_tree"),
    ),
    Case(
        5,
        "network none holds",
        "network-none",
        network_none_holds,
        (Check("nothing inside reaches a listener the runner reaches", "network_modes: none"),),
    ),
    Case(
        6,
        "snapshot and resume",
        "snapshot",
        snapshot_and_resume,
        (
            Check(
                "a file written before the snapshot is there after resume; one written after is not", "snapshots: true"
            ),
        ),
        ("snapshot", "resume"),
    ),
    Case(
        7,
        "clone is independent",
        "snapshot",
        clone_is_independent,
        (Check("a clone has a new identity; writes in either do not reach the other", "snapshots: true"),),
        ("clone",),
    ),
    Case(
        8,
        "snapshot lifecycle",
        "snapshot",
        snapshot_lifecycle,
        (
            Check(
                f"a snapshot kept {KEEP_SECONDS} s states an expiry, not past and not later than asked",
                "snapshots: true",
            ),
            Check(
                f"a snapshot kept {SHORT_KEEP} s cannot be resumed once its expiry passed",
                "snapshots: true and snapshot_custody: provider",
            ),
            Check("a deleted snapshot, and one under another allocation key, cannot be resumed", "snapshots: true"),
            Check(
                "a snapshot of a released ephemeral_zdr instance cannot be resumed (and is not listed)",
                "snapshots: true and ephemeral_zdr in retention_modes",
            ),
        ),
        ("snapshot", "deleteSnapshot", "resume", "release_destroys"),
    ),
    Case(
        9,
        "allowlist egress",
        "network-allowlist",
        allowlist_egress,
        (
            Check(
                "a listed destination is reachable; an unlisted host or port, a name resolving elsewhere, a "
                "bypass of the proxy and DNS are not",
                "network_modes: allowlist",
            ),
        ),
    ),
)
"""The nine cases, in order."""

NOT_EXERCISED: dict[Item, str] = {
    "cold_compensation": "the suite cannot make a provider lose its records, so compensation after a restart is "
    "not exercised (case 4 compensates an allocation the provider still knows)",
}
"""Declared items no case can exercise, and why."""


async def run_case(case: Case, ctx: Context) -> CaseResult:
    """Run one case; never raises (an unexpected error is the case failing, with its code)."""
    ctx.evidence, ctx.held, ctx.faulted = [], [], []
    t0 = time.perf_counter()
    try:
        reason = await case.run(ctx)
        outcome: Verdict = "pass"
    except Skipped as exc:
        outcome, reason = "skip", str(exc)
    except Failed as exc:
        outcome, reason = "fail", str(exc)
    except SandboxError as exc:
        outcome, reason = "fail", f"{exc.code}: {exc.message}"
    except (OSError, subprocess.SubprocessError) as exc:
        outcome, reason = "fail", f"{type(exc).__name__}: {exc}"
    faulted = list(ctx.faulted)
    if outcome == "fail" and not faulted:  # a check of no one item: every declared one it had not seen hold
        faulted = [i for i in case.items if declared(ctx.envelope, i) and i not in ctx.held]
    exercised = [i for i in ctx.held if i not in faulted]
    return CaseResult(
        case.number,
        case.name,
        outcome,
        reason,
        time.perf_counter() - t0,
        list(ctx.evidence),
        exercised=exercised,
        faulted=faulted,
    )
