"""The runner's front door lets go of every provider it loads: a one-shot call's at once, a live sandbox's when
whoever holds it lets go of it, and whatever is still held when the service closes.

A provider holds connections and threads (the Docker tier's docker-py client and its pool, a wire client's
WebSocket). ``RunnerService`` loads a new registry for each call; before, it closed none, so a long-lived process
standing on it (``checkfu mcp`` above all) left one engine client per tool call to the garbage collector, which
later reported an unclosed socket in whatever code happened to run.

Each test drives the real Docker tier with a state directory and runner tag of its own (``dcli``), and counts the
``DockerProvider`` objects made and how often each was closed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from checkfu.cli.mcp_server import Tools, call
from checkfu.providers.docker.provider import DockerProvider
from checkfu.runner import RunnerConfig, RunnerService

from .test_mcp import PROFILE
from .test_run_cli import Cli
from .test_run_docker import dcli, engine, leftovers  # noqa: F401 - fixtures

pytestmark = pytest.mark.docker


class Tally:
    """Every ``DockerProvider`` made in this process while the test runs, and how often each was closed (the real
    provider does the work; this only counts)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[DockerProvider] = []
        self.closes: Counter[int] = Counter()
        init, close = DockerProvider.__init__, DockerProvider.close

        def counted_init(provider: DockerProvider, *args: Any, **kwargs: Any) -> None:
            init(provider, *args, **kwargs)
            self.made.append(provider)

        def counted_close(provider: DockerProvider) -> None:
            self.closes[id(provider)] += 1
            close(provider)

        monkeypatch.setattr(DockerProvider, "__init__", counted_init)
        monkeypatch.setattr(DockerProvider, "close", counted_close)

    def open(self) -> int:
        """How many providers made are not closed yet."""
        return sum(1 for p in self.made if self.closes[id(p)] == 0)

    def closed_once(self) -> bool:
        """Every provider made was closed, and none twice."""
        return all(self.closes[id(p)] == 1 for p in self.made)


@pytest.fixture
def here(dcli: Cli, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:  # noqa: F811
    """The front door in this process, with the CLI's state directory and tag (nothing left on the way out)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(dcli.state))
    monkeypatch.setenv("CHECKFU_RUNNER_TAG", dcli.tag)
    yield dcli


def test_the_mcp_tools_close_every_provider_once_nothing_uses_it(
    here: Cli,
    monkeypatch: pytest.MonkeyPatch,
    engine: Any,  # noqa: F811
) -> None:
    tally = Tally(monkeypatch)

    async def agent() -> None:
        service = await RunnerService.open_async(RunnerConfig.from_environment())
        tools = Tools(service, "docker", str(PROFILE))
        other = Tools(service, "docker", str(PROFILE))  # a second client attaching to the first one's sandbox
        try:
            for n in range(3):  # one-shot Runs: each loads the Docker tier and lets it go when the Run ends
                ran, failed = await call(tools, "run", {"command": ["echo", str(n)]})
                assert not failed and ran["stdout"] == f"{n}\n", ran
                assert (len(tally.made), tally.open()) == (n + 1, 0)

            made, failed = await call(tools, "sandbox_create", {})
            assert not failed, made
            sid = made["sandbox_id"]
            assert tally.open() == 1  # the sandbox is held, and its provider with it
            ran, failed = await call(tools, "exec", {"sandbox_id": sid, "command": ["true"]})
            assert not failed, ran
            snap, failed = await call(tools, "snapshot", {"sandbox_id": sid})
            assert not failed, snap
            assert (len(tally.made), tally.open()) == (4, 1)  # both through the held sandbox's provider

            resumed, failed = await call(tools, "resume", {"snapshot_id": snap["snapshot_id"]})
            assert not failed, resumed
            assert tally.open() == 2

            attached, failed = await call(other, "exec", {"sandbox_id": sid, "command": ["true"]})
            assert not failed, attached
            assert tally.open() == 3
            await other.close()  # lets go of the sandbox it only attached: it lives on for its maker
            assert tally.open() == 2
            ran, failed = await call(tools, "exec", {"sandbox_id": sid, "command": ["true"]})
            assert not failed, ran

            for gone in (resumed["sandbox_id"], snap["snapshot_id"]):
                removed, failed = await call(tools, "remove", {"id": gone})
                assert not failed, removed
            assert tally.open() == 1  # the first sandbox's, still held (the snapshot's delete closed its own)
            await tools.close()  # releases the sandbox it made
            assert tally.open() == 0
        finally:
            await other.close()
            await tools.close()
            await service.aclose()

    asyncio.run(agent())
    assert tally.closed_once(), [tally.closes[id(p)] for p in tally.made]


def test_a_clone_shares_its_source_s_providers_and_close_lets_go_of_what_is_held(
    here: Cli,
    monkeypatch: pytest.MonkeyPatch,
    engine: Any,  # noqa: F811
) -> None:
    tally = Tally(monkeypatch)
    service = RunnerService.open(RunnerConfig.from_environment())
    try:

        async def make() -> None:
            source = await service.create_sandbox("docker", profile=PROFILE)
            copy = None
            try:
                copy = await service.clone_sandbox(source)
                assert (len(tally.made), tally.open()) == (1, 1)  # the clone is reached through its source's
                await source.release()
                await service.let_go(source)
                assert tally.open() == 1  # the clone still uses it
                got = await copy.exec(["true"])
                assert got.exit_code == 0
            finally:
                await source.release()
                if copy is not None:
                    await copy.release()  # released, and never let go of: the service's close closes it

        asyncio.run(make())
        assert tally.open() == 1
    finally:
        service.close()
    assert len(tally.made) == 1 and tally.closed_once(), [tally.closes[id(p)] for p in tally.made]


def test_keeping_the_house_closes_the_providers_it_loaded(
    here: Cli,
    monkeypatch: pytest.MonkeyPatch,
    engine: Any,  # noqa: F811
) -> None:
    """Reclaiming a sandbox past its time-to-live, as every opening does, loads its provider for that alone."""
    service = RunnerService.open(RunnerConfig.from_environment())
    try:

        async def make() -> str:
            live = await service.create_sandbox("docker", profile=PROFILE, ttl=1, detached=True)
            return live.sandbox_id

        sid = asyncio.run(make())
    finally:
        service.close()
    time.sleep(1.5)
    tally = Tally(monkeypatch)
    reclaimed: list[str] = []
    again = RunnerService.open(RunnerConfig.from_environment(), notice=reclaimed.append)
    try:
        assert any(sid in line for line in reclaimed), reclaimed
        assert len(tally.made) == 1 and tally.closed_once(), [tally.closes[id(p)] for p in tally.made]
    finally:
        again.close()
