"""Selection: exactly one adapter by exact target, then one capability check, before any provider call.

Counting starts after the registry is built: ``describe`` is the registry's own call.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from checkfu.contract import examples as ex
from checkfu.contract.codec import decode_value, digest
from checkfu.contract.enforcement import AXES, EnforcementStatement
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import (
    SandboxAdapterAmbiguous,
    SandboxAdapterUnavailable,
    SandboxCapabilityUnavailable,
    SandboxEnrollmentRefused,
    SandboxProviderFailed,
)
from checkfu.contract.profile import NetworkPolicy, SandboxProfile
from checkfu.contract.target import ExecutionTarget
from checkfu.contract.vocabulary import Platform, Resources
from checkfu.core.clock import ManualClock
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Adapter, Registry, adapter_from_factory, enrollment_endpoint, load_registry
from checkfu.core.runner import Runner
from checkfu.testing import MemoryProvider, memory_envelope, memory_profile

pytestmark = pytest.mark.anyio

AMD64 = Platform(os="linux", architecture="amd64")
ARM64 = Platform(os="linux", architecture="arm64")
FIXED_IMAGE = "sha256:" + "a" * 64


# Third-party factories: defined here, so their module is not under checkfu.providers or checkfu.testing.


def third_party_parity() -> MemoryProvider:
    """A stranger's provider claiming runner_enforced on every axis."""
    env = decode_value(SandboxProviderCapabilities, {**ex.parity_envelope(), "provider": "stranger"})
    return MemoryProvider(env)


def third_party_honest() -> MemoryProvider:
    """A stranger's provider that claims only provider_attested."""
    env = memory_envelope().model_copy(
        update={"provider": "stranger-honest", "enforcement": EnforcementStatement.uniform("provider_attested")}
    )
    return MemoryProvider(env)


CLOSED: list[str] = []
"""The providers ``ClosingStranger`` objects were closed as, in order."""


class ClosingStranger(MemoryProvider):
    """The memory provider, saying when it is closed (a real provider's close lets its client and threads go)."""

    def close(self) -> None:
        CLOSED.append(self.envelope.provider)


def third_party_parity_closing() -> MemoryProvider:
    """``third_party_parity``, saying when it is closed."""
    return ClosingStranger(decode_value(SandboxProviderCapabilities, {**ex.parity_envelope(), "provider": "stranger"}))


def broken_factory() -> MemoryProvider:
    raise RuntimeError("cannot reach the control socket")


def envelope_dict(**changes: Any) -> dict[str, Any]:
    return {**json.loads(memory_envelope().model_dump_json()), **changes}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def adapters_file(tmp_path: Path, *tables: dict[str, Any]) -> Path:
    lines = []
    for table in tables:
        lines.append("[[adapters]]")
        lines.append(f"factory = {toml_value(table['factory'])}")
        if "options" in table:
            lines.append(f"options = {toml_value(table['options'])}")
    path = tmp_path / "adapters.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def memory_of(adapter: Adapter) -> MemoryProvider:
    assert isinstance(adapter.provider, MemoryProvider)
    return adapter.provider


# Loading ---------------------------------------------------------------------------------------


async def test_the_memory_entry_point() -> None:
    registry = await load_registry(entry_point_names=["memory"])
    assert registry.unavailable == {}
    (adapter,) = registry.adapters
    assert not adapter.in_tree  # a test double is never in-tree, even from this package's own entry point
    assert adapter.source == "entry point memory"
    assert adapter.envelope == memory_envelope()
    assert memory_of(adapter).calls == ["describe"]
    assert registry.select(memory_envelope().target) is adapter


async def test_an_adapters_file_with_a_factory_and_options(tmp_path: Path) -> None:
    day_one = ex.day_one_envelope()
    path = adapters_file(
        tmp_path,
        {"factory": "checkfu.testing.memory:create", "options": {"envelope": day_one}},
        {"factory": "memory"},  # an entry point name works too
    )
    registry = await load_registry(entry_point_names=[], config=path)
    assert registry.unavailable == {}
    assert len(registry.adapters) == 2
    want = decode_value(SandboxProviderCapabilities, day_one)
    first = registry.select(want.target)
    assert first.envelope == want and not first.in_tree and first.source == f"{path}#0"
    assert registry.select(memory_envelope().target).source == f"{path}#1"


async def test_entry_point_options() -> None:
    day_one = ex.day_one_envelope()
    registry = await load_registry(entry_point_names=["memory"], options={"memory": {"envelope": day_one}})
    (adapter,) = registry.adapters
    assert adapter.target == decode_value(SandboxProviderCapabilities, day_one).target


async def test_a_third_party_claiming_runner_enforced_is_refused(tmp_path: Path) -> None:
    module = sys.modules[__name__].__name__
    assert not module.startswith(("checkfu.providers.", "checkfu.testing."))
    path = adapters_file(
        tmp_path, {"factory": f"{module}:third_party_parity"}, {"factory": f"{module}:third_party_honest"}
    )
    registry = await load_registry(entry_point_names=[], config=path)
    assert list(registry.unavailable) == [f"{path}#0"]
    why = registry.unavailable[f"{path}#0"]
    assert why.startswith("SandboxEnrollmentRefused:")
    for axis in AXES:
        assert axis in why
    (honest,) = registry.adapters
    assert not honest.in_tree and honest.envelope.provider == "stranger-honest"
    with pytest.raises(SandboxAdapterUnavailable) as caught:
        registry.select(
            decode_value(SandboxProviderCapabilities, {**ex.parity_envelope(), "provider": "stranger"}).target
        )
    assert "SandboxEnrollmentRefused" in caught.value.message  # the refusal is named where selection fails


async def test_an_adapter_refused_at_loading_is_closed_at_once(tmp_path: Path) -> None:
    """Started, described and then refused above its ceiling: nothing will ever hold it, so its connections and
    threads are let go of now rather than left to the collector."""
    CLOSED.clear()
    path = adapters_file(tmp_path, {"factory": f"{__name__}:third_party_parity_closing"})
    registry = await load_registry(entry_point_names=[], config=path)
    assert registry.adapters == ()
    assert registry.unavailable[f"{path}#0"].startswith("SandboxEnrollmentRefused:")
    assert CLOSED == ["stranger"]


async def test_registry_add_refuses_by_axis() -> None:
    adapter = await adapter_from_factory(third_party_parity, "stranger", {})
    assert not adapter.in_tree
    with pytest.raises(SandboxEnrollmentRefused) as caught:
        Registry().add(adapter)
    assert caught.value.field == "enforcement.sandbox_isolation"
    # Claiming to be in-tree does not help: only this package's own provider classes are.
    claimed = Adapter(envelope=adapter.envelope, provider=adapter.provider, source="in-tree?", in_tree=True)
    with pytest.raises(SandboxEnrollmentRefused) as caught:
        Registry().add(claimed)
    assert caught.value.field == "provider"
    assert "not one of this package's providers" in caught.value.message


async def test_an_adapters_file_cannot_make_a_test_double_in_tree(tmp_path: Path) -> None:
    """The bypass: the memory factory, registered from an adapters file under an in-tree provider's name,
    claiming runner_enforced on all nine axes. Its factory lives in checkfu.testing; it is still a third party."""
    parity = {**ex.parity_envelope(), "provider": "docker"}
    assert set(decode_value(SandboxProviderCapabilities, parity).enforcement.runner_enforced()) == set(AXES)
    path = adapters_file(
        tmp_path,
        {"factory": "checkfu.testing.memory:create", "options": {"envelope": parity}},
        {"factory": "checkfu.testing.memory:create", "options": {"envelope": {**parity, "provider": "stranger"}}},
    )
    registry = await load_registry(entry_point_names=[], config=path)
    assert registry.adapters == ()
    for source in (f"{path}#0", f"{path}#1"):
        why = registry.unavailable[source]
        assert why.startswith("SandboxEnrollmentRefused:") and "may not claim runner_enforced" in why
        for axis in AXES:
            assert axis in why


async def test_only_this_packages_own_entry_points_are_in_tree() -> None:
    registry = await load_registry(entry_point_names=["host-process", "memory"])
    by_name = {a.envelope.provider: a for a in registry.adapters}
    assert by_name["host-process"].in_tree
    assert not by_name["memory"].in_tree


async def test_adapters_that_cannot_load_are_recorded_not_fatal(tmp_path: Path) -> None:
    module = sys.modules[__name__].__name__
    path = adapters_file(
        tmp_path,
        {"factory": f"{module}:broken_factory"},
        {"factory": "checkfu.testing.memory:create", "options": {"envelope": {"provider": "x"}}},
        {"factory": "no.such.module:create"},
        {"factory": "no-such-entry-point"},
        {"factory": "checkfu.testing.memory:memory_envelope"},
        {"factory": "memory"},
    )
    registry = await load_registry(entry_point_names=[], config=path)
    assert len(registry.adapters) == 1
    why = registry.unavailable
    assert why[f"{path}#0"].startswith("SandboxProviderFailed:")
    assert why[f"{path}#1"].startswith("SandboxEnvelopeInvalid:")
    assert why[f"{path}#2"].startswith("cannot import")
    assert why[f"{path}#3"].startswith("SandboxAdapterUnavailable:")
    assert why[f"{path}#4"].startswith(("SandboxEnvelopeInvalid:", "SandboxProviderFailed:"))


async def test_an_unreadable_adapters_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[adapters]\nfactory = ", encoding="utf-8")
    with pytest.raises(SandboxAdapterUnavailable):
        await load_registry(entry_point_names=[], config=bad)
    with pytest.raises(SandboxAdapterUnavailable):
        await load_registry(entry_point_names=[], config=tmp_path / "absent.toml")


async def test_describe_failures_are_typed() -> None:
    class Raises(MemoryProvider):
        async def describe(self) -> Any:
            raise OSError("socket closed")

    with pytest.raises(SandboxProviderFailed):
        await adapter_from_factory(Raises, "raises", {})


# Exact selection ------------------------------------------------------------------------------


@pytest.fixture
def journal(tmp_path: Path) -> Any:
    j = Journal(sqlite_url(tmp_path / "j.sqlite"))
    yield j
    j.close()


def enrolled_runner(registry: Registry, journal: Journal) -> Runner:
    """A runner over ``registry`` whose adapters are all enrolled, as ``checkfu provider enroll`` leaves them:
    these tests are about selection and the capability check, which come after enrollment."""
    for adapter in registry.adapters:
        journal.record_enrollment(
            adapter.target,
            endpoint=enrollment_endpoint(adapter),
            source=adapter.source,
            kind="evidence",
            envelope_digest=digest(adapter.envelope),
            envelope=adapter.envelope.model_dump_json(),
            ceiling=adapter.ceiling.model_dump_json(),
            now=0.0,
        )
    return Runner(registry, journal, runner_tag="t", clock=ManualClock())


def registry_of(*envelopes: SandboxProviderCapabilities) -> tuple[Registry, list[MemoryProvider]]:
    registry = Registry()
    providers = []
    for i, env in enumerate(envelopes):
        p = MemoryProvider(env)
        providers.append(p)
        registry.add(Adapter(envelope=env, provider=p, source=f"adapter {i}"))
    return registry, providers


def variants(target: ExecutionTarget) -> list[ExecutionTarget]:
    """The target with each coordinate changed alone (and one changed only by case or a space)."""
    return [
        target.model_copy(update={"provider": "memory2"}),
        target.model_copy(update={"provider_revision": target.provider_revision + " "}),
        target.model_copy(update={"provider_revision": target.provider_revision.upper()}),
        target.model_copy(update={"materialization_revision": "memory-images 2"}),
        target.model_copy(update={"placement": "local"}),
    ]


async def test_exactly_one_adapter_is_selected(journal: Journal) -> None:
    env = memory_envelope()
    other = env.model_copy(update={"placement": "local"})
    registry, (mem, mem_local) = registry_of(env, other)
    runner = enrolled_runner(registry, journal)
    assert runner.select(env.target, memory_profile(), platform=AMD64, mount_count=0).provider is mem
    assert runner.select(other.target, memory_profile(), platform=AMD64, mount_count=0).provider is mem_local
    assert mem.calls == [] and mem_local.calls == []


@pytest.mark.parametrize("which", range(5))
async def test_no_fallback_on_any_coordinate(journal: Journal, which: int) -> None:
    env = memory_envelope()
    registry, (mem,) = registry_of(env)
    runner = enrolled_runner(registry, journal)
    wanted = variants(env.target)[which]
    with pytest.raises(SandboxAdapterUnavailable) as caught:
        runner.start(wanted, memory_profile(), platform=AMD64)
    assert caught.value.field == "target"
    assert mem.calls == []
    assert journal.list_runs() == []


async def test_two_adapters_for_one_target_are_ambiguous(journal: Journal) -> None:
    env = memory_envelope()
    registry, providers = registry_of(env, env)
    runner = enrolled_runner(registry, journal)
    with pytest.raises(SandboxAdapterAmbiguous) as caught:
        runner.start(env.target, memory_profile(), platform=AMD64)
    assert "adapter 0" in caught.value.message and "adapter 1" in caught.value.message
    assert all(p.calls == [] for p in providers)
    assert journal.list_runs() == []


async def test_ambiguity_through_entry_point_and_file(tmp_path: Path, journal: Journal) -> None:
    path = adapters_file(tmp_path, {"factory": "checkfu.testing.memory:create"})
    registry = await load_registry(entry_point_names=["memory"], config=path)
    for a in registry.adapters:
        memory_of(a).calls.clear()
    with pytest.raises(SandboxAdapterAmbiguous):
        Runner(registry, journal, runner_tag="t").start(memory_envelope().target, memory_profile(), platform=AMD64)
    assert all(memory_of(a).calls == [] for a in registry.adapters)


async def test_an_empty_registry() -> None:
    with pytest.raises(SandboxAdapterUnavailable) as caught:
        Registry().select(memory_envelope().target)
    assert "none" in caught.value.message


# The capability check --------------------------------------------------------------------------


def narrow_envelope() -> SandboxProviderCapabilities:
    """Day-one shaped: container, amd64, apt and pip, network none, ephemeral only, 8 mounts."""
    return decode_value(SandboxProviderCapabilities, {**ex.day_one_envelope(), "provider": "narrow"})


def fixed_envelope() -> SandboxProviderCapabilities:
    return decode_value(
        SandboxProviderCapabilities,
        {**ex.day_one_envelope(), "provider": "fixed", "image_mode": "fixed", "fixed_base_images": [FIXED_IMAGE]},
    )


def profile(**changes: Any) -> SandboxProfile:
    return memory_profile().model_copy(update=changes)


def unmet_fields(exc: SandboxCapabilityUnavailable) -> list[str]:
    return [u.field for u in exc.unmet]


async def test_every_unmet_requirement_is_listed_in_one_error(journal: Journal) -> None:
    env = narrow_envelope()
    registry, (mem,) = registry_of(env)
    runner = enrolled_runner(registry, journal)
    everything_wrong = SandboxProfile(
        tier="microvm",
        base_image=memory_profile().base_image,
        packages={"npm": ("left-pad@1.3.0",), "cargo": ("serde@1.0.0",), "pip": ("requests==2.31.0",)},
        network_policy=NetworkPolicy(mode="allowlist", allowlist=("example.com:443",)),
        resource_limits=Resources(cpu_millis=1, memory_mib=100_000, disk_mib=256, pids=64),
        retention_mode="durable",
    )
    with pytest.raises(SandboxCapabilityUnavailable) as caught:
        runner.start(env.target, everything_wrong, platform=ARM64, mount_count=9)
    fields = unmet_fields(caught.value)
    assert sorted(fields) == sorted(
        [
            "profile.tier",
            "platform",
            "profile.packages.npm",
            "profile.packages.cargo",
            "profile.network_policy.mode",
            "profile.retention_mode",  # not offered ...
            "profile.retention_mode",  # ... and durable needs snapshots, which are not served
            "profile.resource_limits.cpu_millis",  # below the minimum
            "profile.resource_limits.memory_mib",  # above the maximum
            "mounts",
        ]
    )
    message = caught.value.message
    assert "snapshots" in message and "below the minimum" in message and "above the maximum" in message
    assert "9 mounts" in message
    assert mem.calls == []
    assert journal.list_runs() == []


async def test_fixed_base_images(journal: Journal) -> None:
    env = fixed_envelope()
    registry, (mem,) = registry_of(env)
    runner = enrolled_runner(registry, journal)
    with pytest.raises(SandboxCapabilityUnavailable) as caught:
        runner.select(env.target, profile(packages={"apt": ("curl=7.88.1-10",)}), platform=AMD64, mount_count=0)
    assert sorted(unmet_fields(caught.value)) == ["profile.base_image", "profile.packages.apt"]
    runner.select(env.target, profile(base_image=FIXED_IMAGE), platform=AMD64, mount_count=0)
    assert mem.calls == []


@pytest.mark.parametrize(
    ("change", "platform", "mounts", "field"),
    [
        ({"tier": "microvm"}, AMD64, 0, "profile.tier"),
        ({}, ARM64, 0, "platform"),
        ({"packages": {"gem": ("rake:13.0.6",)}}, AMD64, 0, "profile.packages.gem"),
        ({"network_policy": NetworkPolicy(mode="unrestricted")}, AMD64, 0, "profile.network_policy.mode"),
        ({"retention_mode": "durable"}, AMD64, 0, "profile.retention_mode"),
        (
            {"resource_limits": Resources(cpu_millis=8000, memory_mib=256, disk_mib=256, pids=64)},
            AMD64,
            0,
            "profile.resource_limits.cpu_millis",
        ),
        (
            {"resource_limits": Resources(cpu_millis=500, memory_mib=256, disk_mib=256, pids=1)},
            AMD64,
            0,
            "profile.resource_limits.pids",
        ),
        ({}, AMD64, 9, "mounts"),
    ],
)
async def test_each_requirement_alone(
    journal: Journal, change: dict[str, Any], platform: Platform, mounts: int, field: str
) -> None:
    env = narrow_envelope()
    registry, (mem,) = registry_of(env)
    runner = enrolled_runner(registry, journal)
    with pytest.raises(SandboxCapabilityUnavailable) as caught:
        runner.start(env.target, profile(**change), platform=platform, mount_count=mounts)
    assert set(unmet_fields(caught.value)) == {field}
    assert caught.value.field == field
    assert mem.calls == [] and journal.list_runs() == []
    # and the profile one step back inside the envelope is served
    runner.select(env.target, memory_profile(), platform=AMD64, mount_count=8)


async def test_the_mount_ceiling_is_64_whatever_max_mounts_says(journal: Journal) -> None:
    env = memory_envelope().model_copy(update={"max_mounts": 1000})
    registry, (mem,) = registry_of(env)
    runner = enrolled_runner(registry, journal)
    runner.select(env.target, memory_profile(), platform=AMD64, mount_count=64)
    with pytest.raises(SandboxCapabilityUnavailable) as caught:
        runner.select(env.target, memory_profile(), platform=AMD64, mount_count=65)
    assert unmet_fields(caught.value) == ["mounts"]
    assert mem.calls == []


async def test_refusals_through_run_job_make_no_provider_call(rig: Any, workspace: Path) -> None:
    from checkfu.core.job import run_job  # noqa: PLC0415
    from checkfu.core.mounts import parse_mount  # noqa: PLC0415

    for target, prof, exc in (
        (rig.memory.target.model_copy(update={"placement": "hosted"}), memory_profile(), SandboxAdapterUnavailable),
        (rig.memory.target, profile(tier="microvm"), SandboxCapabilityUnavailable),
    ):
        with pytest.raises(exc):
            await run_job(rig.runner, target, prof, ["true"], mounts=[parse_mount(f"{workspace}:/w")])
    assert rig.memory.calls == []
    assert rig.journal.list_runs() == []


async def test_a_loud_tier_is_named_at_selection(journal: Journal) -> None:
    env = narrow_envelope()
    registry, _ = registry_of(env)
    attempt = enrolled_runner(registry, journal).start(env.target, memory_profile(), platform=AMD64)
    assert attempt.not_enforced == ("root_read_only", "non_root", "no_new_privileges", "capabilities_dropped")
    warning = attempt.warning()
    assert warning is not None and "non_root (guest_observed)" in warning
    (select,) = journal.events_for_run(attempt.session.run_id)
    assert (select.member, select.outcome, select.detail) == ("select", "warning", warning)


# Enrollment: only enrolled adapters are selected ---------------------------------------------------------


async def test_an_adapter_that_is_not_enrolled_is_never_selected(journal: Journal) -> None:
    env = narrow_envelope()  # hosted: a third party, not a test placement
    registry, (mem,) = registry_of(env)
    runner = Runner(registry, journal, runner_tag="t", clock=ManualClock())
    with pytest.raises(SandboxAdapterUnavailable) as caught:
        runner.start(env.target, profile(), platform=AMD64)
    assert "is not enrolled" in caught.value.message and mem.calls == []
    assert journal.list_runs() == []


async def test_an_adapter_enrolled_for_another_envelope_must_enroll_again(journal: Journal) -> None:
    enrolled, changed = narrow_envelope(), narrow_envelope().model_copy(update={"max_mounts": 2})
    registry, _ = registry_of(enrolled)
    enrolled_runner(registry, journal)
    registry, _ = registry_of(changed)  # the same target, advertising another envelope
    with pytest.raises(SandboxAdapterUnavailable) as caught:
        Runner(registry, journal, runner_tag="t", clock=ManualClock()).start(changed.target, profile(), platform=AMD64)
    assert "enroll again with new evidence" in caught.value.message


async def test_this_packages_own_adapters_are_enrolled_when_a_runner_starts(journal: Journal) -> None:
    registry = await load_registry(entry_point_names=["host-process"])
    Runner(registry, journal, runner_tag="t", clock=ManualClock())
    (row,) = journal.enrollments()
    assert row.kind == "in_tree" and row.target.provider == "host-process"
