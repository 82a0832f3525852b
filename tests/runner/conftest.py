"""Fixtures for the runner's tests: journals on both engines, a memory-provider rig, mount sources.

The PostgreSQL cluster (``pg_cluster``) lives in ``tests/conftest.py``; each journal test
gets a database of its own in it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from checkfu.contract.ceiling import THIRD_PARTY
from checkfu.contract.codec import digest
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.provider import Provider
from checkfu.contract.vocabulary import Platform
from checkfu.core.clock import ManualClock
from checkfu.core.driver import Limits, RunSession
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Adapter, Registry, enrollment_endpoint
from checkfu.core.runner import Attempt, Runner
from checkfu.testing import MemoryProvider, memory_profile
from checkfu.testing.served import serve_in_thread

AMD64 = Platform(os="linux", architecture="amd64")
RUNNER_TAG = "runner-tests"


@pytest.fixture(params=["sqlite", "postgresql"])
def journal_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty journal on each engine: an SQLite file, or a new database in the throwaway cluster."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "journal.sqlite")
    cluster = request.getfixturevalue("pg_cluster")
    return cluster.url(cluster.create_database())


@pytest.fixture
def journal(journal_url: str) -> Iterator[Journal]:
    j = Journal(journal_url)
    try:
        yield j
    finally:
        j.close()


# The rig: a memory provider behind a registry, a runner and a journal -----------------------


@dataclass
class Rig:
    """One runner over one memory provider (possibly wrapped), with a journal and a hand-moved clock.

    ``memory.calls`` is cleared after the registry is built, so it holds exactly the
    members the runner asked for.
    """

    memory: MemoryProvider
    provider: Provider
    journal: Journal
    clock: ManualClock
    registry: Registry
    runner: Runner
    profile: SandboxProfile = field(default_factory=memory_profile)
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def envelope(self) -> SandboxProviderCapabilities:
        return self.memory.envelope

    def start(self, profile: SandboxProfile | None = None, *, mount_count: int = 0, **kw: Any) -> RunSession:
        attempt = self.runner.start(
            self.memory.target, profile or self.profile, platform=AMD64, mount_count=mount_count, **kw
        )
        self.attempts.append(attempt)
        return attempt.session

    def held_keys(self) -> set[str]:
        return {h.allocation_key for h in self.memory.live_objects()}


RigFactory = Callable[..., Rig]


def enroll_for_tests(journal: Journal, envelope: SandboxProviderCapabilities, endpoint: str = "") -> None:
    """Record ``envelope`` as enrolled (at ``endpoint``, for a service), as ``checkfu provider enroll`` would after
    checking its evidence."""
    journal.record_enrollment(
        envelope.target,
        endpoint=endpoint,
        source="test rig",
        kind="evidence",
        envelope_digest=digest(envelope),
        envelope=envelope.model_dump_json(),
        ceiling=THIRD_PARTY.model_dump_json(),
        now=0.0,
    )


@pytest.fixture
def transport() -> str:
    """How the rig's runner reaches its provider: in-process here; lifecycle test modules add ``wire``."""
    return "in-process"


@pytest.fixture
def make_rig(tmp_path: Path, transport: str) -> Iterator[RigFactory]:
    journals: list[Journal] = []
    with contextlib.ExitStack() as services:

        def make(
            *,
            envelope: SandboxProviderCapabilities | None = None,
            wrap: Callable[[MemoryProvider], Provider] | None = None,
            limits: Limits | None = None,
            url: str | None = None,
            runner_tag: str = RUNNER_TAG,
            lease_ttl: float = 600.0,
        ) -> Rig:
            clock = ManualClock()
            memory = MemoryProvider(envelope, wall=clock.now)  # expiries are stated and judged on one clock
            provider: Provider = wrap(memory) if wrap is not None else memory
            journal = Journal(url or sqlite_url(tmp_path / f"journal-{len(journals)}.sqlite"))
            journals.append(journal)
            registry = Registry()
            # Behind the wire the runner drives a RemoteProvider; the test still holds the real one.
            driven = provider if transport == "in-process" else services.enter_context(serve_in_thread(provider))
            adapter = Adapter(envelope=memory.envelope, provider=driven, source=f"test rig ({transport})")
            registry.add(adapter)
            runner = Runner(registry, journal, runner_tag=runner_tag, clock=clock, limits=limits, lease_ttl=lease_ttl)
            # The rig stands for a provider already enrolled (a served one always is: never a test double).
            if memory.target.placement != "test" or adapter.served:
                enroll_for_tests(journal, memory.envelope, enrollment_endpoint(adapter))
            memory.calls.clear()
            return Rig(memory, provider, journal, clock, registry, runner)

        yield make
    for j in journals:
        j.close()


@pytest.fixture
def rig(make_rig: RigFactory) -> Rig:
    return make_rig()


# Mount sources --------------------------------------------------------------------------------

README = b"hello from the workspace\n"
RUN_SH = b"#!/bin/sh\necho run\n"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A local directory: ``README`` and an executable ``src/run.sh``."""
    root = tmp_path / "workspace"
    (root / "src").mkdir(parents=True)
    (root / "README").write_bytes(README)
    (root / "src" / "run.sh").write_bytes(RUN_SH)
    (root / "src" / "run.sh").chmod(0o755)
    return root


def git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        input=stdin,
        capture_output=True,
        check=True,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(repo),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.invalid",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.invalid",
        },
    )
    return done.stdout.decode()


@dataclass(frozen=True)
class GitRepo:
    path: Path
    files: dict[str, bytes]
    commit: str

    def run(self, *args: str, stdin: bytes | None = None) -> str:
        return git(self.path, *args, stdin=stdin)

    def blob_id(self, name: str) -> str:
        return self.run("rev-parse", f"{self.commit}:{name}").strip()


GIT_FILES = {"docs/guide.md": b"# guide\n", "tool.py": b"print('tool')\n", "data.bin": bytes(range(256))}


@pytest.fixture
def git_repo(tmp_path: Path) -> GitRepo:
    """A real Git repository with one commit on ``main``, tagged ``v1``; loose objects only."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for name, data in GIT_FILES.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(data)
    (repo / "tool.py").chmod(0o755)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    git(repo, "tag", "v1")
    return GitRepo(repo, dict(GIT_FILES), git(repo, "rev-parse", "HEAD").strip())


@pytest.fixture
def git_helper() -> Callable[..., str]:
    return git
