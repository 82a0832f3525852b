"""The runner: admission, exact selection and the capability check, then a checked session.

Everything that can refuse an attempt refuses it here, before the provider is
asked for any work: the adapter is selected by its exact target, and the profile
and attempt are checked against its envelope, every unmet requirement listed in
one ``SandboxCapabilityUnavailable``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from checkfu.contract.codec import digest
from checkfu.contract.enforcement import Axis
from checkfu.contract.errors import SandboxAdapterUnavailable
from checkfu.contract.mounts import MountPlan
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.requirements import require_capabilities
from checkfu.contract.target import ExecutionTarget, Lease
from checkfu.contract.tiers import assess
from checkfu.contract.vocabulary import Platform
from checkfu.core.admission import BUILD_NETWORK_ENV, build_network_problems, raise_problems
from checkfu.core.clock import Clock, SystemClock
from checkfu.core.driver import Limits, RunSession
from checkfu.core.journal import Journal
from checkfu.core.leases import DEFAULT_TTL, LeaseStore, boot_id
from checkfu.core.registry import Adapter, Registry, enrollment_endpoint


@dataclass(frozen=True)
class Needs:
    """What an attempt asks of the envelope beyond its profile and mount count."""

    terminal: bool = False
    writable_mounts: bool = False
    mount_symlinks: bool = False
    interactive: bool = False
    capture: bool = False
    """Files are read back after the command (``--capture``): ``readFiles``."""
    capture_dirs: tuple[str, ...] = ()
    """Directories read back whole (a ``--capture`` ending in ``/``): ``listDir`` too."""


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:20]}"


STORY_FILES = 10_000
"""Staged files a Run's story lists by name and digest (all mounts together); beyond it they are counted."""


def profile_story(profile: SandboxProfile) -> dict[str, Any]:
    """What a Run's history keeps of its profile: the document as admitted (its tag pinned) and the network
    allowlist (empty unless the network mode is ``allowlist``)."""
    return {
        "profile": profile.model_dump(mode="json"),
        "allowlist": list(profile.network_policy.allowlist),
    }


def story_of(adapter: Adapter, plans: Sequence[tuple[MountPlan, str]] = ()) -> dict[str, Any]:
    """What a Run's page tells besides its events: the adapter and its grade, the nine axes and who enforces each,
    and every staged file with its digest (the first ``STORY_FILES``; the rest counted). ``plans`` pairs each
    mount's plan with a description of its source."""
    env = adapter.envelope
    grade = assess(env, in_tree=adapter.in_tree)
    listed = 0
    mounts: list[dict[str, Any]] = []
    for plan, source in plans:
        room = max(0, STORY_FILES - listed)
        files = [
            {"path": f.path, "size": f.size, "digest": f.digest, "mode": f.mode, "symlink": f.symlink}
            for f in plan.files[:room]
        ]
        listed += len(files)
        mounts.append(
            {
                "target": plan.target,
                "source": source,
                "writable": plan.writable,
                "file_count": len(plan.files),
                "bytes": sum(f.size for f in plan.files),
                "files": files,
            }
        )
    return {
        "adapter": str(adapter.target),
        "source": adapter.source,
        "in_tree": adapter.in_tree,
        "site": adapter.site or None,
        "grade": {"tier": grade.tier, "label": grade.label, "short_of_next": list(grade.short_of_next)},
        "axes": [
            {"axis": axis, "authority": authority, "counts": axis not in grade.not_counting}
            for axis, authority in env.enforcement.items()
        ],
        "mounts": mounts,
        "files_cap": STORY_FILES,
    }


@dataclass(frozen=True)
class Attempt:
    session: RunSession
    adapter: Adapter
    not_enforced: tuple[Axis, ...]
    """Axes this Run does not have enforced; a loud tier says so at selection."""

    def warning(self) -> str | None:
        return not_enforced_warning(self.adapter, self.not_enforced)


def not_enforced_warning(adapter: Adapter, not_enforced: Sequence[Axis]) -> str | None:
    """What a Run on ``adapter`` is warned of at selection: the axes it does not have enforced, if any."""
    if not not_enforced:
        return None
    env = adapter.envelope
    axes = ", ".join(f"{a} ({env.enforcement.authority(a)})" for a in not_enforced)
    return f"{env.target} does not enforce: {axes}"


class Runner:
    def __init__(
        self,
        registry: Registry,
        journal: Journal,
        *,
        runner_tag: str,
        clock: Clock | None = None,
        limits: Limits | None = None,
        lease_ttl: float = DEFAULT_TTL,
    ) -> None:
        self.registry = registry
        self.journal = journal
        self.runner_tag = runner_tag
        self.clock = clock or SystemClock()
        self.limits = limits or Limits()
        self.leases = LeaseStore(journal, self.clock, ttl=lease_ttl)
        self.record_in_tree()

    def select(
        self,
        target: ExecutionTarget,
        profile: SandboxProfile,
        *,
        platform: Platform,
        mount_count: int,
        needs: Needs | None = None,
    ) -> Adapter:
        """The one adapter for ``target`` that can serve ``profile``; no provider call is made.

        Raises:
            SandboxAdapterUnavailable: no adapter advertises ``target``.
            SandboxAdapterAmbiguous: more than one does.
            SandboxCapabilityUnavailable: listing every requirement the envelope does not meet; or the profile names
                packages and ``CHECKFU_BUILD_NETWORK=none`` forbids the image build that would fetch them.
        """
        adapter = self._adapter(target)
        self._admit(adapter)
        raise_problems(build_network_problems(profile.packages.items(), os.environ.get(BUILD_NETWORK_ENV)))
        n = needs or Needs()
        require_capabilities(
            adapter.envelope,
            profile,
            platform=platform,
            mount_count=mount_count,
            terminal=n.terminal,
            writable_mounts=n.writable_mounts,
            mount_symlinks=n.mount_symlinks,
            interactive=n.interactive,
            capture=n.capture,
            capture_dirs=n.capture_dirs,
        )
        return adapter

    def _adapter(self, target: ExecutionTarget) -> Adapter:
        """The adapter advertising ``target`` (a runner of the fleet places among several sites instead)."""
        return self.registry.select(target)

    def _begin(
        self,
        run_id: str,
        adapter: Adapter,
        profile: SandboxProfile,
        command: list[str] | None,
        now: float,
        *,
        owner: str | None = None,
        story: dict[str, Any] | None = None,
        selected: dict[str, str] | None = None,
    ) -> Lease:
        """Journal the Run as started, take its lease and record its ``select`` event (``selected``: its ``outcome``
        and ``detail``); a runner of the fleet has the Run and the lease from its claim.

        ``owner`` is the process the Run lives and dies with (a Run started in place): once it is gone the Run
        is an orphan, reaped by the next command that opens the journal."""
        self.journal.start_run(
            run_id,
            runner_tag=self.runner_tag,
            target=adapter.target,
            now=now,
            profile_digest=profile.digest,
            command=command,
            owner=owner,
            owner_boot=boot_id() if owner is not None else None,
            story=story,
        )
        lease = self.leases.acquire(run_id)
        if selected is not None:
            self.journal.record_event(run_id, "select", started_at=now, duration_ms=0.0, **selected)
        return lease

    def _admit(self, adapter: Adapter) -> None:
        """Only enrolled adapters are selected: this package's own, a test double loaded in this process at
        placement ``test``, or a third party enrolled with evidence for exactly this target, endpoint and envelope.
        A provider service is never a test double, whatever placement it advertises: it is enrolled like any other.

        Raises:
            SandboxAdapterUnavailable: the adapter is not enrolled, or was enrolled for another envelope.
        """
        if adapter.in_tree or (adapter.target.placement == "test" and not adapter.served):
            return
        where = enrollment_endpoint(adapter)
        row = self.journal.enrollment(adapter.target, where)
        how = f"checkfu provider enroll {adapter.source} --evidence FILE --pub KEY"
        if row is None:
            at = f" at {where}" if where else ""
            test = (
                " (placement 'test' admits only a test double loaded in the runner's own process, never a service)"
                if adapter.target.placement == "test"
                else ""
            )
            raise SandboxAdapterUnavailable(
                f"{adapter.target}{at} is not enrolled, so it cannot be selected{test}: enroll it with signed "
                f"conformance evidence ({how})",
                field="target",
            )
        if row.envelope_digest != digest(adapter.envelope):
            raise SandboxAdapterUnavailable(
                f"{adapter.target} was enrolled for envelope {row.envelope_digest}, but now advertises "
                f"{digest(adapter.envelope)}: enroll again with new evidence ({how})",
                field="target",
            )

    def record_in_tree(self) -> None:
        """Enroll this package's own adapters with their own ceiling, as a runner does when it starts."""
        for adapter in self.registry.adapters:
            if not adapter.in_tree or adapter.served:
                continue
            row = self.journal.enrollment(adapter.target)
            if row is None or row.envelope_digest != digest(adapter.envelope):  # evidence already attached stays
                self.journal.record_enrollment(
                    adapter.target,
                    source=adapter.source,
                    kind="in_tree",
                    envelope_digest=digest(adapter.envelope),
                    envelope=adapter.envelope.model_dump_json(),
                    ceiling=adapter.ceiling.model_dump_json(),
                    now=self.clock.now(),
                )

    def start(
        self,
        target: ExecutionTarget,
        profile: SandboxProfile,
        *,
        platform: Platform,
        mount_count: int = 0,
        command: list[str] | None = None,
        run_id: str | None = None,
        needs: Needs | None = None,
        owner: str | None = None,
        mounts: Sequence[tuple[MountPlan, str]] = (),
        noted: dict[str, Any] | None = None,
    ) -> Attempt:
        """Select, check, journal the Run and take its lease; returns the session to drive.

        ``owner`` (``leases.current_owner()``): the Run lives only as long as that process, which is recorded so
        that a Run it leaves behind is reaped as an orphan. ``mounts`` (each plan with its source described) are
        recorded in the Run's story with every file's digest, as are the profile and its network allowlist; ``noted``
        is added to the story as it is (the caller's facts about where the Run went, such as the engine a reaper must
        reach, and the Run's timeout)."""
        adapter = self.select(target, profile, platform=platform, mount_count=mount_count, needs=needs)
        run_id = run_id or new_run_id()
        now = self.clock.now()
        story = {**story_of(adapter, mounts), **profile_story(profile), **(noted or {})}
        not_enforced = tuple(adapter.envelope.enforcement.not_counting())
        warning = not_enforced_warning(adapter, not_enforced)
        selected = {"outcome": "warning" if warning else "ok", "detail": warning or str(adapter.target)}
        lease = self._begin(run_id, adapter, profile, command, now, owner=owner, story=story, selected=selected)
        attempt = Attempt(
            session=RunSession(
                provider=adapter.provider,
                envelope=adapter.envelope,
                journal=self.journal,
                leases=self.leases,
                lease=lease,
                run_id=run_id,
                runner_tag=self.runner_tag,
                clock=self.clock,
                limits=self.limits,
                door=adapter.door,
                site=adapter.site or None,
            ),
            adapter=adapter,
            not_enforced=not_enforced,
        )
        return attempt

    def finish(
        self, attempt: Attempt, *, status: str, exit_code: int | None = None, summary: dict[str, object] | None = None
    ) -> None:
        self.journal.finish_run(
            attempt.session.run_id, status=status, now=self.clock.now(), exit_code=exit_code, summary=summary
        )
        self.leases.end(attempt.session.lease)
