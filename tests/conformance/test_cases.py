"""The nine cases, as library code, against real providers and deliberately broken ones.

The suite must pass what conforms, skip exactly what the envelope does not declare
(naming the field), and fail exactly the cases a defect breaks.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from checkfu.conformance.cases import CASES, Context, run_case
from checkfu.conformance.suite import Report, Suite, default_profile, host_platform_value, resolve_target, run_suite
from checkfu.contract.enforcement import EnforcementStatement
from checkfu.contract.members import ReleaseRequest, ReleaseResult
from checkfu.core.door import ProviderDoor
from checkfu.core.registry import Adapter, describe
from checkfu.testing import MemoryProvider, day_one_envelope, memory_envelope
from checkfu.testing.served import serve_in_thread

pytestmark = pytest.mark.anyio


def outcomes(report: Report) -> dict[int, str]:
    return {c.number: c.outcome for c in report.cases}


def failing(report: Report) -> set[int]:
    return {c.number for c in report.cases if c.outcome == "fail"}


async def suite_for(provider: Any, *, source: str = "test") -> Report:
    envelope = await describe(ProviderDoor(provider, source=source))
    adapter = Adapter(envelope=envelope, provider=provider, source=source)
    return await Suite(adapter, default_profile(envelope), source).run()


def explain(report: Report) -> str:
    return "\n".join(f"{c.number} {c.outcome}: {c.reason} | {c.evidence}" for c in report.cases)


async def test_the_memory_provider_passes_all_it_declares() -> None:
    report = await run_suite("memory")
    assert outcomes(report) == {**dict.fromkeys(range(1, 9), "pass"), 9: "skip"}, explain(report)
    (nine,) = [c for c in report.cases if c.number == 9]
    assert "network_modes" in nine.reason and "allowlist" in nine.reason


async def test_the_seeds_day_one_tier_records_four_skips_of_nine() -> None:
    report = await suite_for(MemoryProvider(day_one_envelope()))
    assert outcomes(report) == {
        1: "pass",
        2: "pass",
        3: "pass",
        4: "pass",
        5: "pass",
        6: "skip",
        7: "skip",
        8: "skip",
        9: "skip",
    }, explain(report)
    reasons = {c.number: c.reason for c in report.cases}
    assert all("snapshots is false" in reasons[n] for n in (6, 7, 8))
    assert "allowlist" in reasons[9]


async def test_the_host_process_tier_skips_what_its_envelope_implies() -> None:
    report = await run_suite("host-process")
    assert outcomes(report) == {
        1: "pass",
        2: "pass",
        3: "skip",
        4: "pass",
        5: "skip",
        6: "pass",
        7: "pass",
        8: "pass",
        9: "skip",
    }, explain(report)
    reasons = {c.number: c.reason for c in report.cases}
    assert "max_mounts is 0" in reasons[3]
    assert "'none'" in reasons[5] and "'allowlist'" in reasons[9]


@pytest.mark.docker
async def test_the_docker_tier_passes_every_case_it_does_not_skip() -> None:
    if os.environ.get("CHECKFU_REQUIRE_DOCKER") != "1":
        pytest.importorskip("docker").from_env().ping()
    report = await run_suite("docker")
    assert failing(report) == set(), explain(report)
    assert outcomes(report) == dict.fromkeys(range(1, 10), "pass"), explain(report)  # 9 passes, 0 skips


# Deliberately broken providers fail exactly the cases their defects break -----------------------------


def _docker_or_skip() -> None:
    if os.environ.get("CHECKFU_REQUIRE_DOCKER") != "1":
        pytest.importorskip("docker").from_env().ping()


@pytest.mark.docker
async def test_case_9_fails_a_docker_proxy_that_lets_any_address_through(monkeypatch: pytest.MonkeyPatch) -> None:
    _docker_or_skip()
    from checkfu.providers.docker import egress  # noqa: PLC0415

    real = egress.source
    permissive = real("proxy").replace(
        "            if (canonical, port) not in self.addresses:\n", "            if False:\n"
    )
    assert permissive != real("proxy")
    monkeypatch.setattr(egress, "source", lambda role: permissive if role == "proxy" else real(role))
    report = await run_suite("docker", only=(9,))
    assert failing(report) == {9}, explain(report)
    assert "the sandbox says it reached the unlisted" in report.cases[0].reason


@pytest.mark.docker
async def test_case_9_fails_a_docker_sandbox_with_a_route_around_its_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    _docker_or_skip()
    from checkfu.providers.docker import DockerProvider, egress, spec  # noqa: PLC0415

    real_spec, real_source = spec.sandbox_spec, egress.source

    def routed(api: Any, **kw: Any) -> dict[str, Any]:
        config = real_spec(api, **kw)
        config["host_config"]["NetworkMode"] = "bridge"  # the sandbox gets a route of its own
        return config

    door = real_source("door").replace('if interfaces != ["lo"]:', "if False:")  # and its door does not object
    assert door != real_source("door")
    monkeypatch.setattr(spec, "sandbox_spec", routed)
    monkeypatch.setattr(DockerProvider, "_verify_sealed", lambda self, instance: None)
    monkeypatch.setattr(egress, "source", lambda role: door if role == "door" else real_source(role))
    report = await run_suite("docker", only=(9,))
    assert failing(report) == {9}, explain(report)
    assert "a direct connection reached the unlisted" in report.cases[0].reason


class KeepsWhatItReleases(MemoryProvider):
    """Answers release as if it destroyed the instance, and keeps it running."""

    async def release(self, request: ReleaseRequest) -> ReleaseResult:
        state = await self.inspect(request)  # type: ignore[arg-type]
        return ReleaseResult(**{**state.model_dump(), "state": "released", "destroyed": True})


async def test_a_provider_that_keeps_what_it_releases_fails_cases_4_and_8_over_the_wire() -> None:
    broken = KeepsWhatItReleases()
    with serve_in_thread(broken) as remote:
        report = await suite_for(remote, source=remote.url)
    assert failing(report) == {4, 8}, explain(report)
    reasons = {c.number: c.reason for c in report.cases}
    assert "inspect left the instance active, expected released" in reasons[4]
    assert "resumed a snapshot of a released ephemeral_zdr instance" in reasons[8]
    await remote.aclose()


async def test_a_remote_claiming_runner_enforced_fails_case_1_only() -> None:
    claims = MemoryProvider(
        memory_envelope().model_copy(
            update={"provider": "claims", "enforcement": EnforcementStatement.uniform("runner_enforced")}
        )
    )
    with serve_in_thread(claims, attest_enforcement=False) as remote:
        envelope = await describe(ProviderDoor(remote, source=remote.url))
        adapter = Adapter(envelope=envelope, provider=remote, source=remote.url)  # never added to a Registry
        ctx = Context(adapter, default_profile(memory_envelope()), host_platform_value())
        try:
            result = await run_case(CASES[0], ctx)
        finally:
            ctx.close()
    assert result.outcome == "fail"
    assert "claims runner_enforced" in result.reason and "only an in-tree adapter may" in result.reason


async def test_an_unknown_target_is_refused_with_its_reason() -> None:
    from checkfu.contract.errors import SandboxAdapterUnavailable  # noqa: PLC0415

    with pytest.raises(SandboxAdapterUnavailable) as caught:
        await resolve_target("no-such-provider")
    assert "no-such-provider" in caught.value.message
