"""A sandbox removed through ``checkfu mcp`` while another tool call on it is still running keeps its providers
open until that call ends: a provider closed under a call (the Docker tier's engine client and thread pool) would
fail it with an error of no code of ours, a traceback for the agent instead of the sandbox's end.

The provider is the in-memory one loaded from an adapters file through the front door, as a stranger's provider
is, whose reads wait at a gate the test opens, and which says when it is closed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from checkfu.cli.mcp_server import Tools, call
from checkfu.contract.enforcement import EnforcementStatement
from checkfu.runner import RunnerConfig, RunnerService
from checkfu.testing import MemoryProvider, memory_envelope, memory_profile

pytestmark = pytest.mark.anyio

MADE: list[Gated] = []


class Gated(MemoryProvider):
    """The memory provider (as a third party: provider ``gated``), whose ``read_files`` waits for ``gate``."""

    def __init__(self) -> None:
        super().__init__(
            memory_envelope().model_copy(
                update={"provider": "gated", "enforcement": EnforcementStatement.uniform("provider_attested")}
            )
        )
        self.reading = asyncio.Event()
        self.gate = asyncio.Event()
        self.closed = 0

    async def read_files(self, request: Any) -> Any:
        self.reading.set()
        await self.gate.wait()
        return await super().read_files(request)

    def close(self) -> None:
        self.closed += 1


def gated() -> Gated:
    MADE.append(Gated())
    return MADE[-1]


async def test_a_removed_sandbox_s_providers_wait_for_the_call_still_running_on_it(tmp_path: Path) -> None:
    MADE.clear()
    adapters = tmp_path / "adapters.toml"
    adapters.write_text(f'[[adapters]]\nfactory = "{__name__}:gated"\n', encoding="utf-8")
    config = RunnerConfig(state_dir=tmp_path / "state", adapters=adapters, tag="mcp-outlives")
    service = await RunnerService.open_async(config)
    tools = Tools(service, "gated", None)
    try:
        made, failed = await call(tools, "sandbox_create", {"profile": memory_profile().model_dump(mode="json")})
        assert not failed, made
        (provider,) = MADE
        reading = asyncio.ensure_future(
            call(tools, "read_file", {"sandbox_id": made["sandbox_id"], "path": "/home/sandbox/x"})
        )
        await asyncio.wait_for(provider.reading.wait(), 10)
        removed, failed = await asyncio.wait_for(call(tools, "remove", {"id": made["sandbox_id"]}), 10)
        assert not failed, removed
        assert provider.closed == 0  # the read still runs on it
        provider.gate.set()
        answer, failed = await asyncio.wait_for(reading, 10)
        assert failed and answer["error"]["code"].startswith("Sandbox"), answer  # a code of ours, no traceback
        assert provider.closed == 1  # and once it has ended, the providers go
    finally:
        for p in MADE:
            p.gate.set()
        await tools.close()
        await service.aclose()
    assert [p.closed for p in MADE] == [1]
