"""Enrollment against the server-owned ceiling: a provider behind the wire is selectable only once enrolled with
signed evidence for exactly its target and envelope, and never with a claim above its ceiling."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from checkfu.conformance.evidence import generate_keys, load_private_key, load_public_key, sign
from checkfu.conformance.suite import run_suite
from checkfu.contract.enforcement import EnforcementStatement
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import SandboxAdapterUnavailable, SandboxEnrollmentRefused
from checkfu.contract.vocabulary import Platform
from checkfu.control.enrollment import enroll
from checkfu.core.clock import ManualClock
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Adapter, Registry, adapter_from_factory
from checkfu.core.runner import Runner
from checkfu.testing import MemoryProvider, day_one_envelope, memory_profile
from checkfu.testing.memory import BASE_IMAGE
from checkfu.testing.served import serve_in_thread
from checkfu.wire.client import RemoteProvider

pytestmark = pytest.mark.anyio

AMD64 = Platform(os="linux", architecture="amd64")
BOOTSTRAP = "bootstrap-credential-for-enrollment"


def hosted(**changes: Any) -> SandboxProviderCapabilities:
    """A stranger's day-one provider, hosted: not a test placement, so it must be enrolled."""
    return day_one_envelope().model_copy(update={"provider": "stranger", "placement": "hosted", **changes})


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Any]:
    conformance, conformance_pub = generate_keys(tmp_path / "keys" / "conformance")
    return {
        "conformance": load_private_key(conformance),
        "conformance_pub": load_public_key(conformance_pub),
    }


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    yield j
    j.close()


async def evidence(url: str, key: Ed25519PrivateKey, *, only: tuple[int, ...] = ()) -> bytes:
    report = await run_suite(url, credential=_cred(), only=only)
    assert report.ok, [(c.number, c.reason) for c in report.failed]
    return json.dumps(sign(report, key)).encode()


def _cred() -> Any:
    from checkfu.wire.credentials import Credential  # noqa: PLC0415

    return Credential(BOOTSTRAP)


async def runner_for(url: str, journal: Journal) -> tuple[Runner, Adapter]:
    adapter = await adapter_from_factory(lambda: RemoteProvider(url, BOOTSTRAP), url, {})
    registry = Registry()
    registry.add(adapter)
    return Runner(registry, journal, runner_tag="enrollment-test", clock=ManualClock()), adapter


def profile() -> Any:
    return memory_profile().model_copy(update={"base_image": BASE_IMAGE, "retention_mode": "ephemeral_zdr"})


async def test_a_day_one_provider_behind_the_wire_is_selectable_once_enrolled_and_not_before(
    keys: dict[str, Any], journal: Journal, tmp_path: Path
) -> None:
    with serve_in_thread(MemoryProvider(hosted()), credential=BOOTSTRAP) as remote:
        runner, adapter = await runner_for(remote.url, journal)
        with pytest.raises(SandboxAdapterUnavailable) as caught:
            runner.start(adapter.target, profile(), platform=AMD64)
        assert "is not enrolled" in caught.value.message and "checkfu provider enroll" in caught.value.message
        assert journal.list_runs() == []  # refused before anything was journaled

        signed = await evidence(remote.url, keys["conformance"])
        enrolled = await enroll(
            journal, remote.url, signed, keys["conformance_pub"], credential=_cred(), credentials_dir=tmp_path / "cr"
        )
        assert enrolled.evidence.tally == {"pass": 5, "fail": 0, "skip": 4}
        assert enrolled.credential_path is not None
        assert stat.S_IMODE(enrolled.credential_path.stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / "cr").stat().st_mode) == 0o700  # made for it: the user's alone
        assert journal.enrollment(adapter.target) is None  # keyed by its endpoint too: an in-process twin is apart
        row = journal.enrollment(adapter.target, adapter.site)
        assert adapter.site == remote.url.rstrip("/")  # a service's adapter is placed at its endpoint
        assert row is not None and row.kind == "evidence" and row.credential_fingerprint
        assert enrolled.credential_path.read_text().strip() not in json.dumps(row.__dict__, default=str)

        attempt = runner.start(adapter.target, profile(), platform=AMD64)  # selectable now
        session = attempt.session
        image = (await session.materialize(profile(), AMD64)).image
        inst = await session.provision(profile(), AMD64, image)
        await session.activate(inst)
        assert (await session.exec(inst, ["echo", "enrolled"])).stdout == b"enrolled\n"
        await session.release_all()
        await remote.aclose()


async def test_evidence_for_another_envelope_or_revision_is_refused(
    keys: dict[str, Any], journal: Journal, tmp_path: Path
) -> None:
    with serve_in_thread(MemoryProvider(hosted()), credential=BOOTSTRAP) as first:
        signed = await evidence(first.url, keys["conformance"])
        await first.aclose()
    for changed in (hosted(provider_revision="memory 2"), hosted(max_mounts=3)):
        with serve_in_thread(MemoryProvider(changed), credential=BOOTSTRAP) as other:
            with pytest.raises(SandboxEnrollmentRefused) as caught:
                await enroll(
                    journal,
                    other.url,
                    signed,
                    keys["conformance_pub"],
                    credential=_cred(),
                    credentials_dir=tmp_path / "cr",
                )
            assert caught.value.field == "evidence"
            assert "the evidence is for" in caught.value.message
            await other.aclose()
    assert journal.enrollments() == []


async def test_a_third_party_claiming_runner_enforced_is_refused_by_name(
    keys: dict[str, Any], journal: Journal, tmp_path: Path
) -> None:
    claims = hosted(
        enforcement=EnforcementStatement.uniform("provider_attested").model_copy(
            update={"mounts_sealed": "runner_enforced", "disk_limit": "runner_enforced"}
        )
    )
    with serve_in_thread(MemoryProvider(claims), credential=BOOTSTRAP, attest_enforcement=False) as remote:
        # Case 1 fails for such a provider; evidence of the other cases alone still meets the ceiling.
        signed = await evidence(remote.url, keys["conformance"], only=(2, 3, 4))
        with pytest.raises(SandboxEnrollmentRefused) as caught:
            await enroll(
                journal,
                remote.url,
                signed,
                keys["conformance_pub"],
                credential=_cred(),
                credentials_dir=tmp_path / "cr",
            )
        message = caught.value.message
        assert (
            "enforcement.mounts_sealed: claims runner_enforced, the ceiling allows at most provider_attested" in message
        )
        assert "enforcement.disk_limit" in message and "enforcement.sandbox_isolation" not in message
        # And the registry refuses it outright, by the same names.
        adapter = await adapter_from_factory(lambda: RemoteProvider(remote.url, BOOTSTRAP), remote.url, {})
        with pytest.raises(SandboxEnrollmentRefused) as again:
            Registry().add(adapter)
        assert "mounts_sealed" in again.value.message and "disk_limit" in again.value.message
        await remote.aclose()
    assert journal.enrollments() == []


async def test_security_boundary_is_not_admissible_for_a_provider_that_is_not_in_tree(
    keys: dict[str, Any], journal: Journal, tmp_path: Path
) -> None:
    """The ceiling holds a third party at advisory_filter; no evidence, whoever signed it, lifts it (the "matrix
    evidence" path was ordinary evidence under another key, and is gone)."""
    boundary = hosted(network_modes=("none", "allowlist"), egress_certification="security_boundary")
    with serve_in_thread(MemoryProvider(boundary), credential=BOOTSTRAP) as remote:
        signed = await evidence(remote.url, keys["conformance"], only=(1, 2, 4))
        with pytest.raises(SandboxEnrollmentRefused) as caught:
            await enroll(
                journal,
                remote.url,
                signed,
                keys["conformance_pub"],
                credential=_cred(),
                credentials_dir=tmp_path / "cr",
            )
        assert caught.value.field == "egress_certification"
        assert "security_boundary" in caught.value.message and "advisory_filter" in caught.value.message
        assert "no evidence stands in for it" in caught.value.message
        assert not (tmp_path / "cr").exists() and journal.enrollments() == []
    # The API no longer takes matrix evidence at all.
    with pytest.raises(TypeError):
        await enroll(journal, "memory", b"", keys["conformance_pub"], credentials_dir=tmp_path, matrix_evidence=b"")  # type: ignore[call-arg]
    # And the grade it would have admitted is refused by run and grade alike: the registry holds it to the ceiling.
    adapter = Adapter(envelope=boundary, provider=MemoryProvider(boundary), source="stranger")
    with pytest.raises(SandboxEnrollmentRefused) as again:
        Registry().add(adapter)
    assert again.value.field == "egress_certification"


async def test_evidence_with_a_failed_case_is_refused(keys: dict[str, Any], journal: Journal, tmp_path: Path) -> None:
    from checkfu.conformance.suite import Report  # noqa: PLC0415

    with serve_in_thread(MemoryProvider(hosted()), credential=BOOTSTRAP) as remote:
        report = await run_suite(remote.url, credential=_cred())
        report.cases[3].outcome = "fail"
        report.cases[3].reason = "made to fail by the test"
        signed = json.dumps(sign(Report(**{**report.__dict__}), keys["conformance"])).encode()
        with pytest.raises(SandboxEnrollmentRefused) as caught:
            await enroll(
                journal,
                remote.url,
                signed,
                keys["conformance_pub"],
                credential=_cred(),
                credentials_dir=tmp_path / "cr",
            )
        assert "failed cases: 4 release reclaims" in caught.value.message
        await remote.aclose()
