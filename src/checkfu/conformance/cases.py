"""The nine conformance cases of contract.md section 9, as library code.

Every case drives the provider through the runner (its one door, its checks, its
journal), so a provider is graded by exactly the checks a Run would apply. A case
whose requirement the envelope does not declare is skipped, naming the envelope
field; every other case runs and passes or fails with its reason and the evidence
it saw.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from checkfu.conformance.destinations import DestinationUnavailable, beside, destination, loopback, name_server
from checkfu.conformance.probes import (
    NoProbe,
    Ran,
    Route,
    connect,
    dns_query,
    environment,
    listing,
    read_file,
    writable_dir,
    write_file,
)
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import SandboxError, SandboxProviderFailed
from checkfu.contract.members import ListAllocationsResult
from checkfu.contract.profile import NetworkPolicy, SandboxProfile
from checkfu.contract.requirements import require_capabilities
from checkfu.contract.vocabulary import Platform
from checkfu.runner.clock import SystemClock
from checkfu.runner.driver import Instance, RunSession, Snapshot
from checkfu.runner.journal import Journal
from checkfu.runner.leases import LeaseStore
from checkfu.runner.mounts import GitSource, MountSpec, ResolvedMount, resolve_mount
from checkfu.runner.registry import Adapter, in_tree_refusal
from checkfu.runner.runner import new_run_id

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


@dataclass
class CaseResult:
    number: int
    name: str
    outcome: Verdict
    reason: str
    seconds: float = 0.0
    evidence: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "number": self.number,
            "name": self.name,
            "outcome": self.outcome,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
            "evidence": self.evidence,
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
    """materialize, provision, activate, exec, release; every echo cross-checks (the runner's door checks them)."""
    async with ctx.session() as session:
        inst = await ctx.active(session)
        ran = await session.exec(inst, ["echo", "conformance"], timeout=30)
        ctx.saw(f"exec echo -> exit {ran.exit_code}, stdout {ran.stdout[:40]!r}")
        _check(ran.exit_code == 0 and ran.stdout == b"conformance\n", f"echo answered {ran.exit_code} {ran.stdout!r}")
        released = await session.release(inst)
        ctx.saw(f"release -> {released.state}, destroyed {released.destroyed}")
    return "every member answered in contract"


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
    identity; compensate of a half-provisioned allocation reclaims it; a declared listing holds neither."""
    assurances = ctx.envelope.lifecycle_assurances
    async with ctx.session() as session:
        inst = await ctx.active(session)
        first_release = await session.release(inst)
        try:
            after = await session.inspect(inst)
            _check(after.state == "released", f"inspect after release says {after.state}")
            ctx.saw("inspect after release: released")
        except SandboxError as exc:
            _check(_gone(exc), f"inspect after release failed: {exc.code}: {exc.message}")
            ctx.saw("inspect after release: not found (gone)")
        if assurances.release_idempotent:
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
            held = await _listed_keys(session)
            left = held & {inst.allocation_key, half.allocation_key}
            _check(not left, f"listAllocations still holds {', '.join(sorted(left))}")
            ctx.saw("listAllocations holds neither")
    return "release and compensation reclaim"


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
    return "the clone is its own"


async def snapshot_lifecycle(ctx: Context) -> str:
    """deleteSnapshot removes it; a deleted or foreign snapshot cannot be resumed; an ephemeral_zdr release
    leaves no snapshot bytes."""
    _needs_snapshots(ctx)
    async with ctx.session() as session:
        inst = await ctx.active(session)
        snap = await session.snapshot(inst)
        await session.delete_snapshot(snap)
        ctx.saw(f"snapshot {snap.snapshot_id} deleted")
        image = (await session.materialize(ctx.profile, ctx.platform)).image
        # The runner's own table refuses a deleted snapshot; ask the provider as if it did not know.
        stale = Snapshot(allocation_key=snap.allocation_key, snapshot_id=snap.snapshot_id, source=inst)
        await _must_refuse(ctx, session, stale, image, "a deleted snapshot")
        live = await session.snapshot(inst)
        foreign = Snapshot(
            allocation_key=f"ak-foreign-{uuid.uuid4().hex[:8]}", snapshot_id=live.snapshot_id, source=inst
        )
        await _must_refuse(ctx, session, foreign, image, "a snapshot of another allocation")
        await session.delete_snapshot(live)
        if "ephemeral_zdr" in ctx.envelope.retention_modes:
            zdr = ctx.profile.model_copy(update={"retention_mode": "ephemeral_zdr"})
            eph = await ctx.active(session, profile=zdr)
            kept = await session.snapshot(eph)
            await session.release(eph)
            ghost = Snapshot(allocation_key=kept.allocation_key, snapshot_id=kept.snapshot_id, source=eph)
            await _must_refuse(ctx, session, ghost, image, "a snapshot of a released ephemeral_zdr instance", zdr)
            if ctx.envelope.lifecycle_assurances.enumerates_allocations:
                _check(kept.allocation_key not in await _listed_keys(session), "the ephemeral snapshot is still held")
    return "deleted, foreign and ephemeral snapshots cannot be resumed"


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
class Case:
    number: int
    name: str
    requires: str
    run: Callable[[Context], Awaitable[str]]


CASES: tuple[Case, ...] = (
    Case(1, "envelope is honest", "-", envelope_is_honest),
    Case(2, "lifecycle round trip", "-", lifecycle_round_trip),
    Case(3, "git blob without credential", "mounts (max_mounts >= 1)", git_blob_without_credential),
    Case(4, "release reclaims", "-", release_reclaims),
    Case(5, "network none holds", "network-none", network_none_holds),
    Case(6, "snapshot and resume", "snapshot", snapshot_and_resume),
    Case(7, "clone is independent", "snapshot", clone_is_independent),
    Case(8, "snapshot lifecycle", "snapshot", snapshot_lifecycle),
    Case(9, "allowlist egress", "network-allowlist", allowlist_egress),
)
"""The nine cases, in order."""


async def run_case(case: Case, ctx: Context) -> CaseResult:
    """Run one case; never raises (an unexpected error is the case failing, with its code)."""
    ctx.evidence = []
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
    return CaseResult(case.number, case.name, outcome, reason, time.perf_counter() - t0, list(ctx.evidence))
