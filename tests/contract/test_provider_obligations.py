"""The ``Provider`` protocol states its obligations, and every in-tree provider keeps them.

First, the statement: each member's docstring says what it echoes, whether it is
idempotent, what a cancelled call may have done, and under ``Raises:`` exactly the
codes ``MAY_RAISE`` lists for it.

Then the providers: the memory provider (under its own envelope and under the
seed's day-one envelope, which declares no optional member), the host-process
provider and the Docker provider (against the real engine) are driven through a
good call of every member they declare and bad calls of every kind: another
target, an unknown instance, another allocation key, the wrong state, a bad path
or digest, a profile they cannot serve, an undeclared member. Every error raised
must be a ``SandboxError`` whose code ``MAY_RAISE`` lists for the member; where
the contract fixes the code (another target, an unknown instance, the wrong
state, an undeclared member) it must be that code; and every good result must
echo its request.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from checkfu.contract import (
    ERROR_CLASSES,
    LABEL_ALLOCATION_KEY,
    LABEL_RUNNER_TAG,
    MAY_RAISE,
    MEMBERS,
    METHOD_NAMES,
    OPTIONAL_MEMBERS,
    TRANSITIONS,
    ActivateRequest,
    CompensateRequest,
    DeleteSnapshotRequest,
    InspectRequest,
    InstanceResult,
    Lease,
    ListAllocationsRequest,
    ListDirRequest,
    ListDirResult,
    Member,
    MountFile,
    MountPlan,
    NetworkPolicy,
    OpenProcessRequest,
    ProcessExit,
    ProcessOutput,
    ProcessStream,
    Provider,
    ReadFilesRequest,
    ReleaseRequest,
    SandboxAdapterUnavailable,
    SandboxBoundExceeded,
    SandboxError,
    SandboxProfile,
    SandboxProviderCapabilities,
    SnapshotRequest,
    SnapshotResult,
    State,
    WriteFileRequest,
    decode_value,
    echo,
)
from checkfu.contract import examples as ex
from checkfu.contract.members import Call
from checkfu.providers.docker import DockerProvider, pin_base_image
from checkfu.providers.docker.engine import require_engine
from checkfu.providers.host_process import HostProcessProvider
from checkfu.testing import MemoryProvider, Requests, memory_profile

README = b"hello\n"
README_PATH = "/workspace/README"
UNSUPPORTED = "SandboxOperationUnsupported"
MISMATCH = "SandboxIdentityMismatch"
NOT_FOUND = "SandboxNotFound"
CONFLICT = "SandboxStateConflict"
INSTANCE_MEMBERS: tuple[Member, ...] = (
    "writeFile",
    "activate",
    "exec",
    "inspect",
    "release",
    "openProcess",
    "readFiles",
    "listDir",
    "snapshot",
    "clone",  # on its source
)
"""Members that act on an instance the request names."""


# The statement -----------------------------------------------------------------------------------


def docstring(owner: type, name: str) -> str:
    doc = inspect.getdoc(getattr(owner, name))
    assert doc, f"{owner.__name__}.{name} has no docstring"
    return doc


def raises(doc: str) -> frozenset[str]:
    """The codes a docstring's ``Raises:`` section names, one per condition."""
    _, found, section = doc.partition("\nRaises:\n")
    assert found, "no Raises: section"
    return frozenset(re.findall(r"^ {4}(Sandbox\w+): ", section, re.MULTILINE))


@pytest.mark.parametrize("member", MEMBERS)
def test_the_docstring_raises_exactly_what_may_raise_lists(member: Member) -> None:
    assert raises(docstring(Provider, METHOD_NAMES[member])) == MAY_RAISE[member]


@pytest.mark.parametrize("member", MEMBERS)
def test_the_docstring_states_echoes_idempotence_and_cancellation(member: Member) -> None:
    doc = docstring(Provider, METHOD_NAMES[member])
    for heading in ("Echoes: ", "Idempotent: ", "Cancelled: "):
        assert f"\n{heading}" in doc, f"{member}: no {heading.strip()} line"


@pytest.mark.parametrize("method", ["send_stdin", "close_stdin", "events", "kill"])
def test_the_process_stream_states_its_obligations(method: str) -> None:
    doc = docstring(ProcessStream, method)
    assert "\nIdempotent: " in doc and "\nCancelled: " in doc
    assert raises(doc) <= set(ERROR_CLASSES)


def test_may_raise_covers_every_member_with_vocabulary_codes() -> None:
    assert set(MAY_RAISE) == set(MEMBERS)
    for member, codes in MAY_RAISE.items():
        assert codes <= set(ERROR_CLASSES), member
        assert "SandboxProviderFailed" in codes, f"{member}: a provider may always fail"
        # Only a member that may be undeclared may answer that it is.
        assert (UNSUPPORTED in codes) == (member in OPTIONAL_MEMBERS), member
        # Every member with a request checks its target.
        assert (MISMATCH in codes) == (member != "describe"), member


@pytest.mark.parametrize("provider", [MemoryProvider, HostProcessProvider, DockerProvider])
@pytest.mark.parametrize("member", MEMBERS)
def test_no_provider_documents_an_error_its_member_may_not_raise(provider: type, member: Member) -> None:
    doc = inspect.getdoc(getattr(provider, METHOD_NAMES[member])) or ""
    _, _, after = doc.partition("Raises")
    assert set(re.findall(r"\b(Sandbox\w+)\b", after)) <= MAY_RAISE[member]


# The checker -------------------------------------------------------------------------------------


@dataclass
class Outcome:
    member: Member
    case: str
    code: str | None
    """The error code raised, or ``None`` for an answer."""


@dataclass
class Checker:
    """Calls one provider's members and holds each outcome to the contract."""

    provider: Any
    envelope: SandboxProviderCapabilities
    outcomes: list[Outcome] = field(default_factory=list)

    async def attempt(self, member: Member, case: str, request: Call | None, *args: Any) -> Any:
        """The member's answer, or the ``SandboxError`` it raised (which must be one ``MAY_RAISE`` lists)."""
        method = getattr(self.provider, METHOD_NAMES[member])
        try:
            answer = await (method() if request is None else method(request, *args))
        except SandboxError as exc:
            self.outcomes.append(Outcome(member, case, exc.code))
            assert exc.code in MAY_RAISE[member], f"{member} ({case}) raised {exc!r}, outside MAY_RAISE"
            return exc
        except Exception as exc:
            pytest.fail(f"{member} ({case}) raised {type(exc).__name__}: {exc}, outside the vocabulary")
        self.outcomes.append(Outcome(member, case, None))
        return answer

    async def good(self, member: Member, case: str, request: Call | None, *args: Any) -> Any:
        answer = await self.attempt(member, case, request, *args)
        assert not isinstance(answer, SandboxError), f"{member} ({case}) was refused: {answer!r}"
        if request is not None:
            result = answer.started if member == "openProcess" else answer
            for name, value in echo(request).items():
                assert getattr(result, name) == value, f"{member} ({case}) echoes another {name}"
        return answer

    async def bad(self, member: Member, case: str, request: Call, *args: Any, expect: set[str] | None = None) -> str:
        """The code of the refusal; the call must be refused, with a code in ``expect`` when given."""
        if not self.envelope.declares(member):
            expect = {UNSUPPORTED}
        answer = await self.attempt(member, case, request, *args)
        assert isinstance(answer, SandboxError), f"{member} ({case}) was answered, not refused: {answer!r}"
        assert expect is None or answer.code in expect, f"{member} ({case}): {answer!r}, expected one of {expect}"
        return answer.code

    async def maybe(self, member: Member, case: str, request: Call, *args: Any) -> Any:
        """An answer or a refusal; either way within the contract."""
        return await self.attempt(member, case, request, *args)


# The subjects ------------------------------------------------------------------------------------


@dataclass
class Subject:
    """One provider to drive, with requests it can serve."""

    name: str
    provider: Any
    requests: Requests
    keys: list[str] = field(default_factory=list)
    """Every allocation key the scenario used, so the fixture can reclaim them whatever happens."""

    def key(self, name: str) -> str:
        key = f"{self.requests.runner_tag}-{name}"
        self.keys.append(key)
        return key


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def memory_subject(envelope: SandboxProviderCapabilities | None) -> Subject:
    provider = MemoryProvider(envelope)
    return Subject("memory", provider, Requests(provider.target, profile=memory_profile()))


def host_subject(tmp_path: Path) -> Subject:
    provider = HostProcessProvider(state_dir=tmp_path / "host-state", kill_grace=0.2, drain_grace=0.05)
    envelope = provider._envelope
    profile = SandboxProfile(
        tier="container",
        base_image="host",
        network_policy=NetworkPolicy(mode="unrestricted"),
        resource_limits={"cpu_millis": 1000, "memory_mib": 512, "disk_mib": 256, "pids": 256},
        retention_mode="durable",
    )
    tag = "obl-" + uuid.uuid4().hex[:10]
    return Subject(
        "host-process",
        provider,
        Requests(envelope.target, runner_tag=tag, profile=profile, platform=envelope.platforms[0]),
    )


def docker_subject(tmp_path: Path) -> Subject:
    try:
        require_engine()
    except SandboxAdapterUnavailable as exc:
        if os.environ.get("CHECKFU_REQUIRE_DOCKER") == "1":
            raise
        pytest.skip(f"no Docker Engine: {exc.message}")
    tag = "obl-" + uuid.uuid4().hex[:10]
    provider = DockerProvider(state_dir=tmp_path / "docker-state", cache_tag=tag, workers=8)
    profile = SandboxProfile(
        tier="container",
        base_image=pin_base_image("checkfu/busybox:1"),
        network_policy=NetworkPolicy(mode="none"),
        resource_limits={"cpu_millis": 500, "memory_mib": 64, "disk_mib": 16, "pids": 64},
        retention_mode="ephemeral_zdr",
    )
    platform = provider.envelope.platforms[0]
    return Subject("docker", provider, Requests(provider.target, runner_tag=tag, profile=profile, platform=platform))


def docker_leftovers(provider: DockerProvider, tag: str) -> list[str]:
    """The allocation keys of every container, volume and image labelled with ``tag``."""
    api = provider.engine.api
    flt = {"label": [f"{LABEL_RUNNER_TAG}={tag}"]}
    labels = [c.get("Labels") or {} for c in api.containers(all=True, filters=flt)]
    labels += [v.get("Labels") or {} for v in api.volumes(filters=flt).get("Volumes") or []]
    labels += [i.get("Labels") or {} for i in api.images(filters=flt)]
    return sorted(label.get(LABEL_ALLOCATION_KEY, "") for label in labels)


SUBJECTS = ["memory", "memory-day-one", "host-process", pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture(params=SUBJECTS)
async def subject(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Subject]:
    name = request.param
    if name == "memory":
        made = memory_subject(None)
    elif name == "memory-day-one":
        made = memory_subject(decode_value(SandboxProviderCapabilities, ex.day_one_envelope()))
    elif name == "host-process":
        made = host_subject(tmp_path)
    else:
        made = docker_subject(tmp_path)
    try:
        yield made
    finally:
        r = made.requests
        keys = set(made.keys)
        if isinstance(made.provider, DockerProvider):
            keys |= set(docker_leftovers(made.provider, r.runner_tag))
        for key in sorted(keys):
            await made.provider.compensate(CompensateRequest(**r.call(), allocation_key=key, runner_tag=r.runner_tag))
        if isinstance(made.provider, DockerProvider):
            left = docker_leftovers(made.provider, r.runner_tag)
            made.provider.close()
            assert left == [], f"left behind on the engine: {left}"


# The scenario ------------------------------------------------------------------------------------


@dataclass
class Calls:
    """One well-formed request of every member (with its extra arguments), acting on one instance."""

    r: Requests
    instance: InstanceResult
    image: str
    snapshot: SnapshotResult
    new_key: str

    def all(self) -> dict[Member, tuple[Call, tuple[Any, ...]]]:
        r, on = self.r, self.r.on(self.instance)
        snap = self.snapshot
        return {
            "materialize": (r.materialize(), ()),
            "provision": (r.provision(self.new_key, self.image), ()),
            "writeFile": (
                WriteFileRequest(**on, path=README_PATH, size=len(README), digest=sha256(README)),
                (README,),
            ),
            "activate": (ActivateRequest(**on), ()),
            "exec": (r.exec(self.instance, "true"), ()),
            "inspect": (InspectRequest(**on), ()),
            "release": (ReleaseRequest(**on), ()),
            "compensate": (CompensateRequest(**r.call(), allocation_key=self.new_key, runner_tag=r.runner_tag), ()),
            "openProcess": (OpenProcessRequest(**on, argv=["true"]), ()),
            "readFiles": (ReadFilesRequest(**on, paths=[README_PATH], max_bytes=1024), ()),
            "listAllocations": (ListAllocationsRequest(**r.call(), runner_tag=r.runner_tag), ()),
            "listDir": (ListDirRequest(**on, path="/", max_entries=10), ()),
            "snapshot": (SnapshotRequest(**on, snapshot_allocation_key=self.new_key), ()),
            "deleteSnapshot": (
                DeleteSnapshotRequest(
                    **r.call(), snapshot_allocation_key=snap.snapshot_allocation_key, snapshot_id=snap.snapshot_id
                ),
                (),
            ),
            "clone": (r.clone(self.instance, self.new_key, self.image), ()),
            "resume": (r.resume(snap, self.new_key, self.image), ()),
        }


async def refuse_in_state(c: Checker, calls: Calls, state: State) -> None:
    """Every instance member the lifecycle table does not allow in ``state`` is refused."""
    every = calls.all()
    for member in INSTANCE_MEMBERS:
        if member not in TRANSITIONS[state]:
            request, args = every[member]
            # A released instance may be remembered (a state conflict) or forgotten (not found).
            expect = {CONFLICT} if state != "released" else {CONFLICT, NOT_FOUND}
            await c.bad(member, f"wrong state: {state}", request, *args, expect=expect)


async def drive(s: Subject) -> Checker:
    p, r = s.provider, s.requests
    env = (await p.describe()).envelope
    c = Checker(p, env)
    assert (await c.good("describe", "good", None)).envelope == env
    declares = env.declares
    mounts: tuple[MountPlan, ...] = ()
    if env.effective_max_mounts >= 1:
        mounts = (MountPlan(target="/workspace", files=(MountFile(path="README", size=6, digest=sha256(README)),)),)

    # materialize: a profile it serves, one it cannot
    image = (await c.good("materialize", "good", r.materialize())).image
    mode = next(m for m in ("unrestricted", "none") if m not in env.network_modes)
    unserved = SandboxProfile(**{**r.profile.model_dump(), "network_policy": {"mode": mode}})
    r_unserved = dataclasses.replace(r, profile=unserved)
    await c.bad("materialize", "profile not served", r_unserved.materialize(), expect={"SandboxCapabilityUnavailable"})

    # provision: good, the key taken, a profile it cannot serve, a root image it does not hold
    key_a = s.key("a")
    a = await c.good("provision", "good", r.provision(key_a, image, mounts))
    # The runner never provisions a key twice; Docker and host-process refuse it, memory allocates again.
    taken = await c.maybe("provision", "allocation key taken", r.provision(key_a, image, mounts))
    assert not isinstance(taken, SandboxError) or taken.code == CONFLICT
    await c.bad("provision", "profile not served", r_unserved.provision(s.key("unserved"), image))
    await c.bad("provision", "root image not held", r.provision(s.key("no-image"), "sha256:" + "0" * 64))

    # writeFile: good where there is a mount; a path below no mount target; bytes that are not as stated
    on_a = r.on(a)
    staged = WriteFileRequest(**on_a, path=README_PATH, size=len(README), digest=sha256(README))
    if mounts:
        await c.good("writeFile", "good", staged, README)
        wrong = staged.model_copy(update={"digest": sha256(b"other\n")})
        await c.bad("writeFile", "digest differs", wrong, README, expect={"SandboxDigestMismatch"})
    outside = staged.model_copy(update={"path": "/etc/passwd"})
    await c.bad("writeFile", "below no mount target", outside, README, expect={"SandboxPathRejected"})

    new_key = s.key("n")
    placeholder = SnapshotResult(**on_a, snapshot_allocation_key=s.key("no-snap"), snapshot_id="snap-none")
    await refuse_in_state(c, Calls(r, a, image, placeholder, new_key), "provisioning")
    assert (await c.good("inspect", "provisioning", InspectRequest(**on_a))).state == "provisioning"

    # activate
    await c.good("activate", "good", ActivateRequest(**on_a))
    await refuse_in_state(c, Calls(r, a, image, placeholder, new_key), "active")
    assert (await c.good("inspect", "active", InspectRequest(**on_a))).state == "active"

    # exec: a process, a program that is not there (an answer), a working directory that is not there
    ran = await c.good("exec", "good", r.exec(a, "echo", "hi"))
    assert (ran.exit_code, ran.stdout, ran.timed_out) == (0, b"hi\n", False)
    lost = await c.good("exec", "no such program", r.exec(a, "/no/such/program"))
    assert lost.exit_code in (126, 127)
    await c.maybe("exec", "no such cwd", r.exec(a, "true", cwd="/no/such/dir"))

    # openProcess, and the stream's own obligations
    if declares("openProcess"):
        stream = await c.good("openProcess", "good", OpenProcessRequest(**on_a, argv=["cat"]))
        await stream.send_stdin(b"x")
        await stream.close_stdin()
        events = [e async for e in stream.events()]
        assert isinstance(events[-1], ProcessExit) and events[-1].exit_code == 0
        assert not any(isinstance(e, ProcessExit) for e in events[:-1])
        assert b"".join(e.data for e in events if isinstance(e, ProcessOutput) and e.stream == "out") == b"x"
        with pytest.raises(SandboxError) as closed:
            await stream.send_stdin(b"late")
        assert closed.value.code in raises(docstring(ProcessStream, "send_stdin"))
        await stream.kill()
        await stream.kill()

    # readFiles: a file and a path with nothing (an answer); more bytes than allowed (refused)
    if declares("readFiles"):
        read = await c.good(
            "readFiles", "good", ReadFilesRequest(**on_a, paths=[README_PATH, "/no/such"], max_bytes=64)
        )
        assert read.missing == ("/no/such",) and [f.data for f in read.files] == ([README] if mounts else [])
        if mounts:
            over = ReadFilesRequest(**on_a, paths=[README_PATH], max_bytes=1)
            await c.bad("readFiles", "over max_bytes", over, expect={"SandboxBoundExceeded"})

    # listDir: a directory; what is not one is an answer, not an error
    if declares("listDir"):
        root = await c.good("listDir", "good", ListDirRequest(**on_a, path="/", max_entries=100))
        assert root.kind == "dir"
        nothing = await c.good("listDir", "nothing there", ListDirRequest(**on_a, path="/no/such", max_entries=10))
        assert (nothing.kind, nothing.entries) == ("missing", ())
        if mounts:
            file = await c.good("listDir", "a file", ListDirRequest(**on_a, path=README_PATH, max_entries=10))
            assert (file.kind, file.entries) == ("file", ())

    if declares("listAllocations"):
        listed = await c.good("listAllocations", "good", ListAllocationsRequest(**r.call(), runner_tag=r.runner_tag))
        assert key_a in {entry.allocation_key for entry in listed.allocations}

    # the snapshot family
    snap = placeholder
    if declares("snapshot"):
        snap = await c.good("snapshot", "good", SnapshotRequest(**on_a, snapshot_allocation_key=s.key("s")))
        cloned = await c.good("clone", "good", r.clone(a, s.key("c"), image))
        resumed = await c.good("resume", "good", r.resume(snap, s.key("r"), image))
        assert len({a.instance_id, cloned.instance_id, resumed.instance_id}) == 3, "new instances have new ids"

    # another target, an unknown instance, another allocation key: each declared member refuses them
    calls = Calls(r, a, image, snap, new_key)
    other = r.target.model_copy(update={"provider_revision": r.target.provider_revision + " (another)"})
    for member, (request, args) in Calls(dataclasses.replace(r, target=other), a, image, snap, new_key).all().items():
        if declares(member):
            await c.bad(member, "another target", request, *args, expect={MISMATCH})
    for case, instance in (
        ("unknown instance", a.model_copy(update={"instance_id": "i-unknown"})),
        ("another allocation key", a.model_copy(update={"allocation_key": s.key("other")})),
    ):
        every = Calls(r, instance, image, snap, new_key).all()
        for member in INSTANCE_MEMBERS:
            if declares(member):
                request, args = every[member]
                await c.bad(member, case, request, *args, expect={NOT_FOUND})
    if declares("resume"):
        unknown = snap.model_copy(update={"snapshot_id": "snap-unknown"})
        await c.bad("resume", "unknown snapshot", r.resume(unknown, new_key, image), expect={NOT_FOUND})
        await c.maybe(
            "deleteSnapshot",
            "unknown snapshot",
            DeleteSnapshotRequest(**r.call(), snapshot_allocation_key=snap.snapshot_allocation_key, snapshot_id="x"),
        )
        deleting = DeleteSnapshotRequest(
            **r.call(), snapshot_allocation_key=snap.snapshot_allocation_key, snapshot_id=snap.snapshot_id
        )
        await c.good("deleteSnapshot", "good", deleting)
        await c.maybe("deleteSnapshot", "deleted already", deleting)
        await c.bad("resume", "deleted snapshot", r.resume(snap, new_key, image), expect={NOT_FOUND})

    # undeclared members are refused as such
    for member, (request, args) in calls.all().items():
        if not declares(member):
            await c.bad(member, "undeclared", request, *args, expect={UNSUPPORTED})

    # release: good, again, then every member that needs a live instance is refused
    await c.good("release", "good", ReleaseRequest(**on_a))
    again = c.good if env.lifecycle_assurances.release_idempotent else c.maybe
    await again("release", "again", ReleaseRequest(**on_a))
    await refuse_in_state(c, calls, "released")
    await c.maybe("inspect", "released", InspectRequest(**on_a))

    # compensate every key, twice: the second time reclaims nothing
    for key in sorted(set(s.keys)):
        await c.good("compensate", "good", CompensateRequest(**r.call(), allocation_key=key, runner_tag=r.runner_tag))
    twice = await c.good(
        "compensate", "again", CompensateRequest(**r.call(), allocation_key=key_a, runner_tag=r.runner_tag)
    )
    assert twice.reclaimed == 0
    if declares("listAllocations"):
        left = await c.good("listAllocations", "after", ListAllocationsRequest(**r.call(), runner_tag=r.runner_tag))
        assert left.allocations == ()
    return c


@pytest.mark.anyio
async def test_every_error_is_in_may_raise_and_every_answer_echoes(subject: Subject) -> None:
    c = await drive(subject)
    answered = {o.member for o in c.outcomes if o.code is None}
    refused = {o.member for o in c.outcomes if o.code is not None}
    declared = {m for m in MEMBERS if c.envelope.declares(m)}
    if c.envelope.effective_max_mounts == 0:
        declared.discard("writeFile")  # with no mount target, there is no path a file may be staged at
    assert answered == declared, f"members never answered: {sorted(declared - answered)}"
    assert refused >= set(MEMBERS) - {"describe"}, f"members never refused: {sorted(set(MEMBERS) - refused)}"


# The checker catches what it is for ---------------------------------------------------------------


class RaisesOutOfList(MemoryProvider):
    async def inspect(self, request: InspectRequest) -> InstanceResult:
        raise SandboxBoundExceeded("inspect: not a condition inspect has", field="instance_id")


class RaisesForeign(MemoryProvider):
    async def list_dir(self, request: ListDirRequest) -> ListDirResult:
        raise KeyError(request.path)


class EchoesAnotherLease(MemoryProvider):
    async def activate(self, request: ActivateRequest) -> InstanceResult:
        result = await super().activate(request)
        return result.model_copy(update={"lease": Lease(lease_id="lease-other", lease_epoch=1)})


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("provider", "finding"),
    [
        (RaisesOutOfList(), "inspect .* raised SandboxBoundExceeded.*outside MAY_RAISE"),
        (RaisesForeign(), "listDir .* raised KeyError.*outside the vocabulary"),
        (EchoesAnotherLease(), "activate .* echoes another lease"),
    ],
    ids=["code-outside-may-raise", "foreign-exception", "wrong-echo"],
)
async def test_the_checker_finds_a_provider_out_of_contract(provider: MemoryProvider, finding: str) -> None:
    subject = Subject("memory", provider, Requests(provider.target, profile=memory_profile()))
    with pytest.raises((AssertionError, pytest.fail.Exception), match=finding):
        await drive(subject)
