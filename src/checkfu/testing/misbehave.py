"""Providers that misbehave on demand: one named fault for each check the runner must make.

``Misbehaving(inner, {"provision": forge_instance_id})`` delegates every call to an
honest provider and corrupts the answers of the members named; every other member
stays honest. The work stays real: the inner provider did allocate, under the
request's allocation key, so a test can prove that compensation by key reclaims
what a lying answer hid. Semantic faults (ids, lease, target, paths, bounds, state)
are built with ``model_copy`` so they are well-formed and only the runner's
cross-checks, not its decoder, can catch them; ``unknown_field`` and
``constructed_garbage`` are the faults the decoder must catch.

A misbehaviour names the members it can corrupt; pairing it with another member
is refused when the rule is set, so a test cannot silently exercise nothing.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import create_model

from checkfu.contract.checks import sha256_digest
from checkfu.contract.envelope import MEMBERS, Member
from checkfu.contract.errors import (
    ERROR_CLASSES,
    SandboxBoundExceeded,
    SandboxCapabilityUnavailable,
    SandboxOperationUnsupported,
    Unmet,
)
from checkfu.contract.members import (
    ActivateRequest,
    CloneRequest,
    CloneResult,
    CompensateRequest,
    CompensateResult,
    DeleteSnapshotRequest,
    DeleteSnapshotResult,
    DescribeResult,
    DirEntry,
    ExecRequest,
    ExecResult,
    FileContent,
    InspectRequest,
    InstanceResult,
    ListAllocationsRequest,
    ListAllocationsResult,
    ListDirRequest,
    ListDirResult,
    MaterializeRequest,
    MaterializeResult,
    OpenProcessRequest,
    ProcessStarted,
    ProvisionRequest,
    ReadFilesRequest,
    ReadFilesResult,
    ReleaseRequest,
    ReleaseResult,
    ResumeRequest,
    ResumeResult,
    SnapshotRequest,
    SnapshotResult,
    WriteFileRequest,
    WriteFileResult,
)
from checkfu.contract.model import MAX_SAFE_INT, Model, format_timestamp
from checkfu.contract.paths import MAX_PATH_BYTES
from checkfu.contract.process import ProcessEvent, ProcessExit, ProcessOutput
from checkfu.contract.provider import ProcessStream, Provider
from checkfu.contract.target import Lease

HANG_SECONDS = 3600.0
"""How long ``hang`` waits: far past any deadline, and cancellable."""

INSTANCE_MEMBERS: frozenset[Member] = frozenset(
    {
        "provision",
        "writeFile",
        "activate",
        "exec",
        "inspect",
        "release",
        "openProcess",
        "readFiles",
        "listDir",
        "snapshot",
        "clone",
        "resume",
    }
)
"""Members whose result echoes an instance id."""
LEASED_MEMBERS: frozenset[Member] = frozenset(MEMBERS) - {"describe"}
"""Members whose result echoes the target and the lease."""


@dataclass(frozen=True)
class Invocation:
    """One call as a misbehaviour sees it. ``proceed`` makes the honest call (once)."""

    member: Member
    request: Any
    proceed: Callable[[], Awaitable[Any]]
    double: Misbehaving


@dataclass(frozen=True)
class Misbehaviour:
    """A named fault and the members it can corrupt."""

    name: str
    members: frozenset[Member]
    act: Callable[[Invocation], Awaitable[Any]]


class _Relabelled:
    """An open process whose ``started`` event lies; everything else is the inner stream's."""

    def __init__(self, inner: ProcessStream, started: ProcessStarted) -> None:
        self._inner = inner
        self._started = started

    @property
    def started(self) -> ProcessStarted:
        return self._started

    async def send_stdin(self, data: bytes) -> None:
        await self._inner.send_stdin(data)

    async def close_stdin(self) -> None:
        await self._inner.close_stdin()

    def events(self) -> AsyncIterator[ProcessEvent]:
        return self._inner.events()

    async def resize(self, rows: int, cols: int) -> None:
        await self._inner.resize(rows, cols)

    async def kill(self) -> None:
        await self._inner.kill()


def _statement(result: Any) -> Any:
    """The model a result's echoes live in: the result itself, or an open process's ``started``."""
    return result if isinstance(result, Model) else result.started


def _restate(result: Any, statement: Any) -> Any:
    return statement if isinstance(result, Model) else _Relabelled(result, statement)


def corrupting(name: str, members: Iterable[Member], corrupt: Callable[[Any, Invocation], Any]) -> Misbehaviour:
    """A misbehaviour that makes the honest call, then answers ``corrupt(statement, invocation)`` instead."""

    async def act(inv: Invocation) -> Any:
        result = await inv.proceed()
        return _restate(result, corrupt(_statement(result), inv))

    return Misbehaviour(name, frozenset(members), act)


def _forged_id(prefix: str = "forged") -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


def _another_instance(name: str, members: Iterable[Member]) -> Misbehaviour:
    """Echo a real instance other than the one acted on: the most recent other one the double has seen.

    For ``provision`` with none seen yet, the inner provider allocates a second
    instance under the same allocation key, so compensating that key reclaims both.
    """

    async def act(inv: Invocation) -> Any:
        result = await inv.proceed()
        statement = _statement(result)
        other = inv.double.other_instance(statement.instance_id)
        if other is None and inv.member == "provision":
            other = (await inv.double.inner.provision(inv.request)).instance_id
        if other is None:
            raise LookupError(f"{name}: no other instance to echo; let the double see one first")
        return _restate(result, statement.model_copy(update={"instance_id": other}))

    return Misbehaviour(name, frozenset(members), act)


def _forge(r: Any, inv: Invocation) -> Any:
    return r.model_copy(update={"instance_id": _forged_id()})


def _source_id(r: Any, inv: Invocation) -> Any:
    return r.model_copy(update={"instance_id": inv.request.source_instance_id})


def _other_lease(r: Any, inv: Invocation) -> Any:
    return r.model_copy(update={"lease": Lease(lease_id=_forged_id("lease"), lease_epoch=r.lease.lease_epoch)})


def _stale_epoch(r: Any, inv: Invocation) -> Any:
    """An older epoch of the same lease (at epoch 0, where none is older, the next one)."""
    epoch = r.lease.lease_epoch - 1 if r.lease.lease_epoch > 0 else 1
    return r.model_copy(update={"lease": r.lease.model_copy(update={"lease_epoch": epoch})})


def _other_target(r: Any, inv: Invocation) -> Any:
    revision = r.target.provider_revision[:240] + "+forged"
    return r.model_copy(update={"target": r.target.model_copy(update={"provider_revision": revision})})


def _over_bound(r: Any, inv: Invocation) -> Any:
    return r.model_copy(update={"stdout": b"x" * (inv.request.max_output_bytes + 1), "stdout_truncated": False})


forge_instance_id = corrupting("forge_instance_id", INSTANCE_MEMBERS, _forge)
foreign_instance_id = _another_instance("foreign_instance_id", INSTANCE_MEMBERS)
snapshot_echoes_other_instance = _another_instance("snapshot_echoes_other_instance", {"snapshot"})
release_echoes_other_instance = _another_instance("release_echoes_other_instance", {"release"})
returns_held_id = _another_instance("returns_held_id", {"clone", "resume"})
clone_returns_source = corrupting("clone_returns_source", {"clone"}, _source_id)
wrong_lease_id = corrupting("wrong_lease_id", LEASED_MEMBERS, _other_lease)
stale_epoch = corrupting("stale_epoch", LEASED_MEMBERS, _stale_epoch)
wrong_target = corrupting("wrong_target", LEASED_MEMBERS, _other_target)
exec_over_bound = corrupting("exec_over_bound", {"exec"}, _over_bound)

PathFault = Literal["unasked", "dotdot", "nul", "overlong"]


def _bad_path(fault: PathFault, inv: Invocation) -> str:
    """A path breaking one rule; the ``unasked`` one lies outside what was asked unless ``/`` was asked."""
    asked: str = inv.request.paths[0] if inv.member == "readFiles" else inv.request.path
    base = asked.rstrip("/")
    if fault == "unasked":
        return "/" + _forged_id("unasked")
    if fault == "dotdot":
        return base + "/../escaped"
    if fault == "nul":
        return base + "/nul\x00byte"
    return base + "/" + "a" * MAX_PATH_BYTES


def _path_fault(fault: PathFault) -> Misbehaviour:
    """Add one entry with a bad path to a ``readFiles`` or ``listDir`` answer."""

    def corrupt(r: Any, inv: Invocation) -> Any:
        path = _bad_path(fault, inv)
        if isinstance(r, ReadFilesResult):
            extra = FileContent(path=path, mode=0o644, digest=sha256_digest(b""), data=b"")
            return r.model_copy(update={"files": (*r.files, extra)})
        return r.model_copy(update={"entries": (*r.entries, DirEntry(path=path, kind="file", size=0, mode=0o644))})

    return corrupting(f"{fault}_path", {"readFiles", "listDir"}, corrupt)


unasked_path = _path_fault("unasked")
dotdot_path = _path_fault("dotdot")
nul_path = _path_fault("nul")
overlong_path = _path_fault("overlong")


def _answers(name: str, corrupt: Callable[[ReadFilesResult, str], ReadFilesResult]) -> Misbehaviour:
    """A ``readFiles`` answer whose paths are each admissible, yet not exactly one answer per asked path."""
    return corrupting(name, {"readFiles"}, lambda r, inv: corrupt(r, inv.request.paths[0]))


def _content(path: str, data: bytes = b"") -> FileContent:
    return FileContent(path=path, mode=0o644, digest=sha256_digest(data), data=data)


duplicate_path = _answers("duplicate_path", lambda r, asked: r.model_copy(update={"files": (*r.files, *r.files)}))
"""Every file answered twice."""
dropped_path = _answers("dropped_path", lambda r, asked: r.model_copy(update={"files": (), "missing": ()}))
"""The asked paths answered neither as a file nor as missing."""
file_and_missing = _answers("file_and_missing", lambda r, asked: r.model_copy(update={"missing": (*r.missing, asked)}))
"""An asked path answered as a file and listed missing too."""
path_below_file = _answers(
    "path_below_file",
    lambda r, asked: r.model_copy(update={"files": (*r.files, _content(asked.rstrip("/") + "/below"))}),
)
"""A file below an asked file: admissible as a path, but never asked for."""


class _Exiting:
    """An open process whose exit status is replaced; everything else is the inner stream's."""

    def __init__(self, inner: ProcessStream, exit_code: int) -> None:
        self._inner = inner
        self._exit_code = exit_code

    @property
    def started(self) -> ProcessStarted:
        return self._inner.started

    async def send_stdin(self, data: bytes) -> None:
        await self._inner.send_stdin(data)

    async def close_stdin(self) -> None:
        await self._inner.close_stdin()

    async def events(self) -> AsyncIterator[ProcessEvent]:
        async for event in self._inner.events():
            # model_copy does not validate: the forged status reaches the runner as a provider would send it
            yield event.model_copy(update={"exit_code": self._exit_code}) if isinstance(event, ProcessExit) else event

    async def kill(self) -> None:
        await self._inner.kill()


def _exit_status(name: str, code: int) -> Misbehaviour:
    """Answer an exit status no process can have (``exec``'s result, or ``openProcess``'s exit event)."""

    async def act(inv: Invocation) -> Any:
        result = await inv.proceed()
        if isinstance(result, ExecResult):
            return result.model_copy(update={"exit_code": code})
        return _Exiting(result, code)

    return Misbehaviour(name, frozenset({"exec", "openProcess"}), act)


exit_status_negative = _exit_status("exit_status_negative", -1)
exit_status_over_255 = _exit_status("exit_status_over_255", 300)


_SMUGGLERS: dict[type[Model], type[Model]] = {}


def _with_unknown_field(r: Model, inv: Invocation) -> Any:
    """The same fields, in a subclass of the result's class that has one field more."""
    cls = type(r)
    if cls not in _SMUGGLERS:
        _SMUGGLERS[cls] = create_model(cls.__name__, __base__=cls, smuggled=(str, ...))
    fields: dict[str, Any] = {name: getattr(r, name) for name in cls.model_fields}
    fields["smuggled"] = "a field the contract does not have"
    return _SMUGGLERS[cls](**fields)


unknown_field = corrupting("unknown_field", MEMBERS, _with_unknown_field)
constructed_garbage = corrupting(
    "constructed_garbage",
    MEMBERS,
    lambda r, inv: type(r).model_construct(**{**dict(r), next(iter(type(r).model_fields)): object()}),
)
"""The exact result class, built with ``model_construct`` around a value that is no value of its field."""


def _expiry(r: Any, inv: Invocation, when: Callable[[int | None], str | None]) -> Any:
    return r.model_copy(update={"expires_at": when(inv.request.keep_seconds)})


def _ago(seconds: float) -> str:
    return format_timestamp(time.time() - seconds)


expiry_in_the_past = corrupting(
    "expiry_in_the_past", {"snapshot"}, lambda r, inv: _expiry(r, inv, lambda keep: _ago(3600))
)
"""Snapshot, then say the snapshot expired an hour ago."""
expiry_past_the_asked = corrupting(
    "expiry_past_the_asked",
    {"snapshot"},
    lambda r, inv: _expiry(r, inv, lambda keep: _ago(-(keep or 0) - 86400)),
)
"""Snapshot, then say it is kept a day longer than asked (meaningful when a lifetime is asked)."""
expiry_never = corrupting("expiry_never", {"snapshot"}, lambda r, inv: _expiry(r, inv, lambda keep: None))
"""Snapshot, then say it is kept until deleted, whatever lifetime was asked."""

_WRONG_STATE = {"provisioning": "active", "active": "provisioning", "released": "active"}
release_keeps = corrupting("release_keeps", {"release"}, lambda r, inv: r.model_copy(update={"destroyed": False}))
"""Release, then say nothing was destroyed: a broken promise where the envelope says ``release_destroys``."""

wrong_state = corrupting(
    "wrong_state",
    {"provision", "activate", "inspect", "clone", "resume"},
    lambda r, inv: r.model_copy(update={"state": _WRONG_STATE[r.state]}),
)


async def _hang(inv: Invocation) -> Any:
    result = await inv.proceed()
    await asyncio.sleep(HANG_SECONDS)
    return result


async def _crash(inv: Invocation) -> Any:
    await inv.proceed()
    raise RuntimeError(f"{inv.member}: the provider crashed after doing the work")


def raising(code: str) -> Misbehaviour:
    """Do the work, then raise the vocabulary error ``code``: whatever its code, the provider has failed."""
    cls = ERROR_CLASSES[code]

    async def act(inv: Invocation) -> Any:
        await inv.proceed()
        if cls is SandboxCapabilityUnavailable:
            raise SandboxCapabilityUnavailable([Unmet("profile", f"{inv.member}: raised on purpose")])
        raise cls(f"{inv.member}: {code} raised on purpose", field="on_purpose")

    return Misbehaviour(f"raises_{code}", frozenset(MEMBERS), act)


RAISING: dict[str, Misbehaviour] = {code: raising(code) for code in ERROR_CLASSES}
"""For every code of the vocabulary, a misbehaviour that raises it after doing the work, by code."""

hang = Misbehaviour("hang", frozenset(MEMBERS), _hang)
"""Do the work, then answer only after an hour: the runner's deadline must fire."""
crash = Misbehaviour("crash", frozenset(MEMBERS), _crash)
"""Do the work, then raise an exception outside the vocabulary."""

# Faults only conformance catches ------------------------------------------------------------------
#
# Each answer below is one the runner takes as it comes (it decodes, echoes and stays within its bounds), so
# only a check of what a declared member must do can find it: the conformance suite's. None of them is in
# ``PRESETS``, which holds the faults the runner's own checks catch.


async def _unsupported(inv: Invocation) -> Any:
    raise SandboxOperationUnsupported(f"{inv.member} is not served here", field="path")


unsupported = Misbehaviour("unsupported", frozenset(MEMBERS), _unsupported)
"""Answer ``SandboxOperationUnsupported`` (over the wire: 501) without doing anything, whatever the envelope says."""

truncation_unflagged = corrupting(
    "truncation_unflagged",
    {"exec"},
    lambda r, inv: r.model_copy(update={"stdout_truncated": False, "stderr_truncated": False}),
)
"""Cut the output at ``max_output_bytes`` as asked, and say nothing was cut."""

timeout_unreported = corrupting(
    "timeout_unreported",
    {"exec"},
    lambda r, inv: r.model_copy(update={"timed_out": False, "exit_code": 0}) if r.timed_out else r,
)
"""A command stopped at its timeout, answered as one that finished well."""


class _Wrapped:
    """An open process that is the inner stream's in all but what a subclass overrides."""

    def __init__(self, inner: ProcessStream) -> None:
        self._inner = inner

    @property
    def started(self) -> ProcessStarted:
        return self._inner.started

    async def send_stdin(self, data: bytes) -> None:
        await self._inner.send_stdin(data)

    async def close_stdin(self) -> None:
        await self._inner.close_stdin()

    def events(self) -> AsyncIterator[ProcessEvent]:
        return self._inner.events()

    async def resize(self, rows: int, cols: int) -> None:
        await self._inner.resize(rows, cols)

    async def kill(self) -> None:
        await self._inner.kill()


class _DropsFirstOutput(_Wrapped):
    async def _events(self) -> AsyncIterator[ProcessEvent]:
        dropped = False
        async for event in self._inner.events():
            if not dropped and isinstance(event, ProcessOutput):
                dropped = True
                continue
            yield event

    def events(self) -> AsyncIterator[ProcessEvent]:
        return self._events()


class _IgnoresKill(_Wrapped):
    async def kill(self) -> None:
        return None


def _streaming(name: str, wrap: Callable[[ProcessStream], Any]) -> Misbehaviour:
    async def act(inv: Invocation) -> Any:
        return wrap(await inv.proceed())

    return Misbehaviour(name, frozenset({"openProcess"}), act)


drops_output = _streaming("drops_output", _DropsFirstOutput)
"""An open process whose first chunk of output never arrives; the rest, the ends and the exit do."""
kill_ignored = _streaming("kill_ignored", _IgnoresKill)
"""An open process that ``kill`` does not end."""
exit_status_zero = _exit_status("exit_status_zero", 0)
"""Every exit answered as 0, whatever the process exited with."""


def _missing_as_files(r: ReadFilesResult, inv: Invocation) -> ReadFilesResult:
    return r.model_copy(update={"files": (*r.files, *(_content(p) for p in r.missing)), "missing": ()})


missing_as_empty_files = corrupting("missing_as_empty_files", {"readFiles"}, _missing_as_files)
"""Every path with no regular file (a directory, nothing at all) answered as an empty file."""


async def _truncate_over_max(inv: Invocation) -> Any:
    try:
        return await inv.proceed()
    except SandboxBoundExceeded:
        request: ReadFilesRequest = inv.request
        whole = await inv.double.inner.read_files(request.model_copy(update={"max_bytes": MAX_SAFE_INT}))
        files, room = [], request.max_bytes
        for f in whole.files:
            data = f.data[:room]
            room -= len(data)
            files.append(f.model_copy(update={"data": data, "digest": sha256_digest(data)}))
        return whole.model_copy(update={"files": tuple(files)})


truncates_over_max = Misbehaviour("truncates_over_max", frozenset({"readFiles"}), _truncate_over_max)
"""Files over ``max_bytes`` answered cut short to fit (each with the digest of what is left), not refused."""

lists_no_entries = corrupting(
    "lists_no_entries", {"listDir"}, lambda r, inv: r.model_copy(update={"entries": (), "truncated": False})
)
"""Every directory answered as empty."""

lists_no_allocations = corrupting(
    "lists_no_allocations", {"listAllocations"}, lambda r, inv: r.model_copy(update={"allocations": ()})
)
"""``listAllocations`` answered empty, whatever is held."""

CONFORMANCE_FAULTS: dict[str, Misbehaviour] = {
    m.name: m
    for m in (
        unsupported,
        truncation_unflagged,
        timeout_unreported,
        drops_output,
        kill_ignored,
        exit_status_zero,
        missing_as_empty_files,
        truncates_over_max,
        lists_no_entries,
        lists_no_allocations,
    )
}
"""Every fault the runner takes as an answer in contract and only the conformance suite finds, by name."""

PRESETS: dict[str, Misbehaviour] = {
    m.name: m
    for m in (
        forge_instance_id,
        foreign_instance_id,
        wrong_lease_id,
        stale_epoch,
        wrong_target,
        snapshot_echoes_other_instance,
        clone_returns_source,
        returns_held_id,
        release_echoes_other_instance,
        exec_over_bound,
        unasked_path,
        dotdot_path,
        nul_path,
        overlong_path,
        duplicate_path,
        dropped_path,
        file_and_missing,
        path_below_file,
        exit_status_negative,
        exit_status_over_255,
        unknown_field,
        constructed_garbage,
        hang,
        crash,
        wrong_state,
        release_keeps,
        expiry_in_the_past,
        expiry_past_the_asked,
        expiry_never,
    )
}
"""Every named misbehaviour, by name."""


class Misbehaving:
    """A ``Provider`` that delegates to ``inner`` and misbehaves on the members ``rules`` names.

    Raises:
        ValueError: a rule is set on a member it cannot corrupt.
    """

    def __init__(self, inner: Provider, rules: Mapping[Member, Misbehaviour] | None = None) -> None:
        self.inner = inner
        self.rules: dict[Member, Misbehaviour] = {}
        self.instance_ids: list[str] = []
        """Every instance id the inner provider has answered with, oldest first."""
        for member, rule in (rules or {}).items():
            self.set(member, rule)

    def set(self, member: Member, rule: Misbehaviour | None) -> None:
        """Misbehave on ``member`` from now on (``None``: be honest again)."""
        if rule is None:
            self.rules.pop(member, None)
            return
        if member not in rule.members:
            raise ValueError(f"misbehaviour {rule.name!r} cannot corrupt {member}")
        self.rules[member] = rule

    def other_instance(self, current: str) -> str | None:
        """The most recently seen instance id other than ``current``."""
        return next((i for i in reversed(self.instance_ids) if i != current), None)

    async def _call(self, member: Member, request: Any, call: Callable[[], Awaitable[Any]]) -> Any:
        async def honest() -> Any:
            result = await call()
            seen = getattr(_statement(result), "instance_id", None)
            if seen is not None and seen not in self.instance_ids:
                self.instance_ids.append(seen)
            return result

        rule = self.rules.get(member)
        if rule is None:
            return await honest()
        return await rule.act(Invocation(member, request, honest, self))

    async def describe(self) -> DescribeResult:
        return cast(DescribeResult, await self._call("describe", None, self.inner.describe))

    async def materialize(self, request: MaterializeRequest) -> MaterializeResult:
        return cast(
            MaterializeResult, await self._call("materialize", request, lambda: self.inner.materialize(request))
        )

    async def provision(self, request: ProvisionRequest) -> InstanceResult:
        return cast(InstanceResult, await self._call("provision", request, lambda: self.inner.provision(request)))

    async def write_file(self, request: WriteFileRequest, data: bytes) -> WriteFileResult:
        return cast(
            WriteFileResult, await self._call("writeFile", request, lambda: self.inner.write_file(request, data))
        )

    async def activate(self, request: ActivateRequest) -> InstanceResult:
        return cast(InstanceResult, await self._call("activate", request, lambda: self.inner.activate(request)))

    async def exec(self, request: ExecRequest) -> ExecResult:
        return cast(ExecResult, await self._call("exec", request, lambda: self.inner.exec(request)))

    async def inspect(self, request: InspectRequest) -> InstanceResult:
        return cast(InstanceResult, await self._call("inspect", request, lambda: self.inner.inspect(request)))

    async def release(self, request: ReleaseRequest) -> ReleaseResult:
        return cast(ReleaseResult, await self._call("release", request, lambda: self.inner.release(request)))

    async def compensate(self, request: CompensateRequest) -> CompensateResult:
        return cast(CompensateResult, await self._call("compensate", request, lambda: self.inner.compensate(request)))

    async def open_process(self, request: OpenProcessRequest) -> ProcessStream:
        return cast(ProcessStream, await self._call("openProcess", request, lambda: self.inner.open_process(request)))

    async def read_files(self, request: ReadFilesRequest) -> ReadFilesResult:
        return cast(ReadFilesResult, await self._call("readFiles", request, lambda: self.inner.read_files(request)))

    async def list_allocations(self, request: ListAllocationsRequest) -> ListAllocationsResult:
        return cast(
            ListAllocationsResult,
            await self._call("listAllocations", request, lambda: self.inner.list_allocations(request)),
        )

    async def list_dir(self, request: ListDirRequest) -> ListDirResult:
        return cast(ListDirResult, await self._call("listDir", request, lambda: self.inner.list_dir(request)))

    async def snapshot(self, request: SnapshotRequest) -> SnapshotResult:
        return cast(SnapshotResult, await self._call("snapshot", request, lambda: self.inner.snapshot(request)))

    async def delete_snapshot(self, request: DeleteSnapshotRequest) -> DeleteSnapshotResult:
        return cast(
            DeleteSnapshotResult,
            await self._call("deleteSnapshot", request, lambda: self.inner.delete_snapshot(request)),
        )

    async def clone(self, request: CloneRequest) -> CloneResult:
        return cast(CloneResult, await self._call("clone", request, lambda: self.inner.clone(request)))

    async def resume(self, request: ResumeRequest) -> ResumeResult:
        return cast(ResumeResult, await self._call("resume", request, lambda: self.inner.resume(request)))
