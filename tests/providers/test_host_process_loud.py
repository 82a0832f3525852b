"""The host-process tier is loud at selection: the warning names every axis it does not
enforce, the Run's events record it, and a profile asking for a network it cannot serve
is refused before the provider does any work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from checkfu.contract import METHOD_NAMES, SandboxCapabilityUnavailable, SandboxProfile
from checkfu.contract.codec import decode_value
from checkfu.contract.tiers import assess
from checkfu.core.clock import ManualClock
from checkfu.core.job import host_platform_value
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Registry, adapter_from_factory
from checkfu.core.runner import Runner
from checkfu.providers.host_process import WHY_NOT_ENFORCED, HostProcessProvider


class Counting:
    """Counts every member called on one provider after selection.

    The members are replaced on the instance itself, so the provider keeps its own
    class: the registry trusts an in-tree adapter only as this package's own class.
    """

    def __init__(self, provider: HostProcessProvider) -> None:
        self.calls: list[str] = []
        for name in METHOD_NAMES.values():
            setattr(provider, name, self._counted(name, getattr(provider, name)))

    def _counted(self, name: str, method: Any) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await method(*args, **kwargs)

        return call


def profile(mode: str) -> SandboxProfile:
    return decode_value(
        SandboxProfile,
        {
            "tier": "container",
            "base_image": "host",
            "retention_mode": "durable",
            "network_policy": {"mode": mode, **({"allowlist": ["example.org:443"]} if mode == "allowlist" else {})},
            "resource_limits": {"cpu_millis": 500, "memory_mib": 256, "disk_mib": 256, "pids": 64},
        },
    )


@pytest.fixture
async def setup(tmp_path: Path) -> Any:
    inner = HostProcessProvider(state_dir=tmp_path / "state")
    adapter = await adapter_from_factory(lambda: inner, "host-process", {})
    counting = Counting(inner)
    registry = Registry()
    registry.add(type(adapter)(envelope=adapter.envelope, provider=inner, source="test", in_tree=True))
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    yield Runner(registry, journal, runner_tag="runner-loud", clock=ManualClock()), adapter.envelope, counting
    journal.close()


@pytest.mark.anyio
async def test_selection_warns_and_records_every_axis_not_enforced(setup: Any) -> None:
    runner, envelope, counting = setup
    attempt = runner.start(envelope.target, profile("unrestricted"), platform=host_platform_value())
    warning = attempt.warning()
    assert warning is not None
    not_counting = envelope.enforcement.not_counting()
    assert not_counting, "the host-process tier must not claim to enforce everything"
    for axis in not_counting:
        assert axis in warning
        assert axis in WHY_NOT_ENFORCED
    events = runner.journal.events_for_run(attempt.session.run_id)
    assert [(e.member, e.outcome) for e in events] == [("select", "warning")]
    assert events[0].detail == warning
    assert assess(envelope).tier == "below_day_one"
    assert counting.calls == []
    await runner.registry.adapters[0].provider.describe()
    assert counting.calls == ["describe"], "the count sees a call made through the registry's adapter"


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["none", "allowlist"])
async def test_a_network_it_cannot_serve_is_refused_before_any_provider_work(setup: Any, mode: str) -> None:
    runner, envelope, counting = setup
    with pytest.raises(SandboxCapabilityUnavailable) as caught:
        runner.start(envelope.target, profile(mode), platform=host_platform_value())
    assert caught.value.field == "profile.network_policy.mode"
    assert repr(mode) in caught.value.message
    assert counting.calls == []
    assert runner.journal.list_runs() == []
