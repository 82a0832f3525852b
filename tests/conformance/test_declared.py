"""Conformance exercises what the envelope declares (issue 30).

A provider whose envelope declared ``openProcess`` and ``readFiles`` answered 501 to both and still
passed eight cases of nine. Each test below is a provider that answers wrong in one declared
respect, and that the suite passed before: every one of them must now fail the case that owns the
check, with a reason that names what it declared. Most are the memory provider behind a named
fault (``checkfu.testing.misbehave``), several served over real loopback HTTP and WebSockets, as a
stranger's service is reached.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from checkfu.conformance import cases
from checkfu.conformance.evidence import statement
from checkfu.conformance.suite import SUITE_VERSION, Report, Suite, default_profile, resolve_target
from checkfu.contract.envelope import LifecycleAssurances, SandboxProviderCapabilities
from checkfu.contract.errors import SandboxOperationUnsupported
from checkfu.core.door import ProviderDoor
from checkfu.core.registry import Adapter, describe
from checkfu.testing import MemoryProvider, day_one_envelope, memory_envelope
from checkfu.testing.misbehave import (
    Misbehaving,
    Misbehaviour,
    drops_output,
    exit_status_zero,
    expiry_never,
    expiry_past_the_asked,
    kill_ignored,
    lists_no_allocations,
    lists_no_entries,
    missing_as_empty_files,
    timeout_unreported,
    truncates_over_max,
    truncation_unflagged,
    unsupported,
)
from checkfu.testing.served import serve_in_thread
from checkfu.wire import operations as wire_operations
from checkfu.wire import server as wire_server
from checkfu.wire.errors import WireError

pytestmark = pytest.mark.anyio


async def suite_for(provider: Any, *, source: str = "test") -> Report:
    envelope = await describe(ProviderDoor(provider, source=source))
    adapter = Adapter(envelope=envelope, provider=provider, source=source)
    return await Suite(adapter, default_profile(envelope), source).run()


async def served_suite(provider: Any, **options: Any) -> Report:
    with serve_in_thread(provider, **options) as remote:
        try:
            return await suite_for(remote, source=remote.url)
        finally:
            await remote.aclose()


def explain(report: Report) -> str:
    return "\n".join(f"{c.number} {c.outcome}: {c.reason} | {c.evidence}" for c in report.cases)


def failing(report: Report) -> set[int]:
    return {c.number for c in report.cases if c.outcome == "fail"}


def reason(report: Report, number: int) -> str:
    (case,) = [c for c in report.cases if c.number == number]
    return case.reason


@pytest.fixture
def impatient(monkeypatch: pytest.MonkeyPatch) -> None:
    """What must end is given 2 s, not 15: these providers never end it."""
    monkeypatch.setattr(cases, "PATIENCE", 2.0, raising=False)


def faulty(rules: dict[str, Misbehaviour], envelope: SandboxProviderCapabilities | None = None) -> Misbehaving:
    return Misbehaving(MemoryProvider(envelope), rules)  # type: ignore[arg-type]


# The stranger's provider: 501 to what it declared --------------------------------------------------------


async def test_a_service_answering_501_to_declared_open_process_and_read_files_fails_naming_both() -> None:
    report = await served_suite(faulty({"openProcess": unsupported, "readFiles": unsupported}))
    assert 2 in failing(report), explain(report)
    why = reason(report, 2)
    assert "openProcess (declared by operations)" in why and "readFiles (declared by operations)" in why, why
    assert "SandboxOperationUnsupported" in why
    (two,) = [c for c in report.cases if c.number == 2]
    assert set(two.faulted) == {"openProcess", "readFiles"} and "listDir" in two.exercised
    # what it signs says so: evidence of this run cannot enroll (enrollment refuses failed cases)
    signed = statement(report)["predicate"]["cases"][1]
    assert signed["outcome"] == "fail" and set(signed["faulted"]) == {"openProcess", "readFiles"}
    assert statement(report)["predicate"]["suite_version"] == SUITE_VERSION != "checkfu-conformance 1"


@pytest.mark.parametrize("member", ["openProcess", "readFiles"])
async def test_a_service_answering_501_to_one_declared_member_fails_naming_it(member: str) -> None:
    report = await served_suite(faulty({member: unsupported}))
    why = reason(report, 2)
    assert f"{member} (declared by operations)" in why and "SandboxOperationUnsupported" in why, explain(report)
    other = {"openProcess": "readFiles", "readFiles": "openProcess"}[member]
    assert other not in why, why  # the other member was tried as well, and held


def _refuse_upgrades(app: Any) -> Any:
    """A gateway in front of the service that answers the openProcess upgrade with HTTP 501 and a wire error."""
    body = WireError.of(SandboxOperationUnsupported("openProcess is not served", field="path")).model_dump_json()

    async def gateway(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await send(
                {
                    "type": "websocket.http.response.start",
                    "status": 501,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "websocket.http.response.body", "body": body.encode()})
            return
        await app(scope, receive, send)

    return gateway


async def test_a_service_refusing_the_open_process_upgrade_with_501_fails_naming_it() -> None:
    report = await served_suite(MemoryProvider(), front=_refuse_upgrades)
    why = reason(report, 2)
    assert "openProcess (declared by operations)" in why and "SandboxOperationUnsupported" in why, explain(report)


async def test_list_dir_answered_501_fails_case_2_naming_it() -> None:
    report = await suite_for(faulty({"listDir": unsupported}))
    assert "listDir (declared by list_dir)" in reason(report, 2), explain(report)


async def test_list_allocations_declared_without_enumeration_is_still_called() -> None:
    envelope = memory_envelope().model_copy(
        update={"lifecycle_assurances": LifecycleAssurances(release_destroys=True, enumerates_allocations=False)}
    )
    report = await suite_for(faulty({"listAllocations": unsupported}, envelope))
    assert failing(report) == {4}, explain(report)
    assert "listAllocations (declared by operations)" in reason(report, 4)


# exec's bounds ---------------------------------------------------------------------------------------


async def test_output_cut_without_saying_so_fails_case_2() -> None:
    report = await suite_for(faulty({"exec": truncation_unflagged}))
    assert failing(report) == {2}, explain(report)
    assert "max_output_bytes" in reason(report, 2) and "stdout_truncated False" in reason(report, 2)


async def test_a_timeout_answered_as_a_clean_exit_fails_case_2() -> None:
    report = await suite_for(faulty({"exec": timeout_unreported}))
    assert failing(report) == {2}, explain(report)
    assert "1 s timeout answered exit 0, timed_out False" in reason(report, 2)


# openProcess --------------------------------------------------------------------------------------------


async def test_an_open_process_that_loses_output_fails_case_2() -> None:
    report = await suite_for(faulty({"openProcess": drops_output}))
    assert 2 in failing(report), explain(report)
    assert "openProcess (declared by operations): stdin past the credit window" in reason(report, 2)


async def test_an_open_process_that_misreports_its_exit_fails_case_2() -> None:
    report = await suite_for(faulty({"openProcess": exit_status_zero}))
    assert failing(report) == {2}, explain(report)
    assert "exited 0 through openProcess and 1 through exec" in reason(report, 2)


async def test_an_open_process_that_kill_does_not_end_fails_case_2(impatient: None) -> None:
    report = await suite_for(faulty({"openProcess": kill_ignored}))
    assert 2 in failing(report), explain(report)
    assert "kill: sleep 600 was still running" in reason(report, 2)


async def test_a_service_that_forgets_a_dropped_operation_fails_case_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire_operations, "OPERATION_TTL", -1.0)  # a detached operation is dropped at once
    report = await served_suite(MemoryProvider())
    why = reason(report, 2)
    assert "openProcess (declared by operations)" in why and "to reattach to" in why, explain(report)


async def test_a_service_that_never_grants_stdin_credit_again_fails_case_2(
    monkeypatch: pytest.MonkeyPatch, impatient: None
) -> None:
    async def writes_but_never_grants(self: Any) -> None:
        while (data := await self.stdin_queue.get()) is not None:
            await self.stream.send_stdin(data)
            self.stdin_written += len(data)  # and no window frame back: the client never gets more credit
        await self.stream.close_stdin()

    monkeypatch.setattr(wire_server, "STDIN_WINDOW", 64 << 10)
    monkeypatch.setattr(wire_operations.Operation, "_run_stdin", writes_but_never_grants)
    report = await served_suite(MemoryProvider())
    why = reason(report, 2)
    assert "stdin past the credit window" in why and "granted 65536 bytes of stdin credit" in why, explain(report)


# readFiles and listDir ----------------------------------------------------------------------------------


async def test_a_directory_read_as_a_file_fails_case_2() -> None:
    report = await suite_for(faulty({"readFiles": missing_as_empty_files}))
    assert failing(report) == {2}, explain(report)
    assert "readFiles (declared by operations)" in reason(report, 2) and "is a directory" in reason(report, 2)


async def test_files_cut_short_at_max_bytes_fail_case_2() -> None:
    report = await suite_for(faulty({"readFiles": truncates_over_max}))
    assert failing(report) == {2}, explain(report)
    assert "max_bytes 5 were answered" in reason(report, 2)


async def test_a_listing_that_drops_entries_fails_case_2() -> None:
    report = await suite_for(faulty({"listDir": lists_no_entries}))
    assert failing(report) == {2}, explain(report)
    assert "listDir (declared by list_dir)" in reason(report, 2)


# release and what it reclaims ---------------------------------------------------------------------------


async def test_an_enumeration_that_lists_nothing_fails_case_4() -> None:
    report = await suite_for(faulty({"listAllocations": lists_no_allocations}))
    assert failing(report) == {4}, explain(report)
    assert "enumerates_allocations (declared by lifecycle_assurances.enumerates_allocations)" in reason(report, 4)


class LeavesItsProcesses(MemoryProvider):
    """Releases an instance as it should, except that the processes running in it keep running."""

    async def _destroy(self, obj: Any) -> None:
        if hasattr(obj, "processes"):
            obj.processes = set()
        await super()._destroy(obj)


async def test_a_release_that_leaves_processes_running_fails_case_4(impatient: None) -> None:
    report = await suite_for(LeavesItsProcesses())
    assert failing(report) == {4}, explain(report)
    assert "reaps_process_tree (declared by lifecycle_assurances.reaps_process_tree)" in reason(report, 4)


class KeepsEphemeralSnapshots(MemoryProvider):
    """Releases an ephemeral_zdr instance as it should, except that its snapshots outlive it."""

    async def _destroy(self, obj: Any) -> None:
        if getattr(obj, "retention", None) == "ephemeral_zdr" and hasattr(obj, "processes"):
            obj.retention = "durable"  # so its snapshots are left alone
        await super()._destroy(obj)


async def test_snapshots_outliving_their_ephemeral_instance_fail_case_8() -> None:
    report = await suite_for(KeepsEphemeralSnapshots())
    assert failing(report) == {8}, explain(report)
    assert "resumed a snapshot of a released ephemeral_zdr instance" in reason(report, 8)
    (eight,) = [c for c in report.cases if c.number == 8]
    assert eight.faulted == ["release_destroys"]
    assert {"snapshot", "deleteSnapshot", "resume"} <= set(eight.exercised)  # those checks came first, and held
    assert "release_destroys (declared by lifecycle_assurances.release_destroys)" in reason(report, 8)


# snapshot lifetimes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", [expiry_never, expiry_past_the_asked], ids=lambda f: f.name)
async def test_a_snapshot_kept_other_than_asked_fails_case_8(fault: Misbehaviour) -> None:
    report = await suite_for(faulty({"snapshot": fault}))
    assert failing(report) == {8}, explain(report)
    assert "snapshot (declared by snapshots)" in reason(report, 8) and "expires_at" in reason(report, 8)


def _provider_custody() -> SandboxProviderCapabilities:
    return memory_envelope().model_copy(
        update={"provider_revision": "memory custody 1", "snapshot_custody": "provider"}
    )


class KeepsWhatExpired(MemoryProvider):
    """Holds its snapshots' bytes (provider custody) and never deletes one whose expiry passed."""

    def _expire(self) -> list[str]:
        return []


async def test_provider_custody_deletes_a_snapshot_once_its_keep_passes() -> None:
    report = await suite_for(MemoryProvider(_provider_custody()))
    assert failing(report) == set(), explain(report)
    assert any("kept 1 s" in line for c in report.cases if c.number == 8 for line in c.evidence)


async def test_provider_custody_that_keeps_an_expired_snapshot_fails_case_8() -> None:
    report = await suite_for(KeepsWhatExpired(_provider_custody()))
    assert failing(report) == {8}, explain(report)
    assert "resumed a snapshot whose 1 s had passed" in reason(report, 8)


# What a run records -------------------------------------------------------------------------------------


async def test_each_case_records_what_it_exercised_and_the_statement_signs_it() -> None:
    report = await suite_for(MemoryProvider())
    assert failing(report) == set(), explain(report)
    exercised = {c.number: c.exercised for c in report.cases}
    assert set(exercised[2]) == {"listDir", "readFiles", "openProcess"}
    assert set(exercised[4]) == {
        "listAllocations",
        "enumerates_allocations",
        "release_destroys",
        "release_idempotent",
        "reaps_process_tree",
    }
    assert set(exercised[6]) == {"snapshot", "resume"} and exercised[7] == ["clone"]
    assert "deleteSnapshot" in exercised[8]
    assert not any("cold_compensation" in e for e in exercised.values())  # nothing can exercise it
    signed = statement(report)["predicate"]["cases"]
    assert [c["exercised"] for c in signed] == [c.exercised for c in report.cases]
    assert json.loads(json.dumps(report.as_json()))["cases"][1]["exercised"] == exercised[2]


async def test_over_the_wire_a_dropped_connection_is_reattached() -> None:
    report = await served_suite(MemoryProvider())
    assert failing(report) == set(), explain(report)
    (two,) = [c for c in report.cases if c.number == 2]
    assert any(line.startswith("a dropped connection:") for line in two.evidence), two.evidence


async def test_what_is_not_declared_is_never_called() -> None:
    day_one = MemoryProvider(day_one_envelope())
    report = await suite_for(day_one)
    assert failing(report) == set(), explain(report)
    optional = {"openProcess", "readFiles", "listDir", "listAllocations", "snapshot", "deleteSnapshot"}
    assert optional.isdisjoint(day_one.calls)
    assert {c.number: c.exercised for c in report.cases if c.exercised} == {4: ["release_destroys"]}


# The in-tree tiers behind the wire: the credit and the reattach of a real process ---------------------------


@pytest.mark.parametrize("name", ["host-process", pytest.param("docker", marks=pytest.mark.docker)])
async def test_an_in_tree_tier_served_over_the_wire_holds_case_2(name: str) -> None:
    if name == "docker" and os.environ.get("CHECKFU_REQUIRE_DOCKER") != "1":
        pytest.importorskip("docker").from_env().ping()
    adapter = await resolve_target(name)
    with serve_in_thread(adapter.provider) as remote:
        try:
            envelope = await describe(ProviderDoor(remote, source=remote.url))
            served = Adapter(envelope=envelope, provider=remote, source=remote.url)
            report = await Suite(served, default_profile(adapter.envelope), remote.url, only=(2, 4)).run()
        finally:
            await remote.aclose()
    assert failing(report) == set(), explain(report)
    (two,) = [c for c in report.cases if c.number == 2]
    assert "openProcess" in two.exercised
    assert any(line.startswith("a dropped connection: 262144 bytes in, 262144 out") for line in two.evidence)
