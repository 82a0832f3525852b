"""Enrollment: a provider is admitted for selection only on signed evidence and within its ceiling.

``enroll`` fetches the provider's envelope through the runner's door and then, in
order, refuses with ``SandboxEnrollmentRefused`` naming what does not hold:

1. the evidence: its signature verifies with the conformance key the operator
   trusts, and it is for exactly this execution target and this envelope's digest;
2. no case of it failed, and it was made by this runner's suite (``SUITE_VERSION``):
   an older suite did not exercise what the envelope declares, so its passes say less;
3. ``security_boundary`` egress: only with evidence from the operator's own matrix,
   signed by the matrix key (never the provider's key), for this same envelope;
4. the ceiling: every axis and field the envelope claims above the server-owned
   ``RunnerProviderCapability`` (``checkfu.contract.ceiling``), all of them at once.

Then it records the enrollment in the runner's database and issues the credential
the wire will use: a fresh secret written to a file of mode 0600; the database
keeps only its path and fingerprint. Re-enrolling a new revision or envelope needs
new evidence: the old evidence no longer matches.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from checkfu.conformance.evidence import EvidenceError, Verified, verify_evidence
from checkfu.conformance.suite import SUITE_VERSION, resolve_target
from checkfu.contract.ceiling import RunnerProviderCapability, overreach
from checkfu.contract.codec import digest
from checkfu.contract.errors import SandboxEnrollmentRefused
from checkfu.contract.vocabulary import EgressGrade
from checkfu.runner import owner_only
from checkfu.runner.journal import Journal
from checkfu.runner.registry import Adapter, enrollment_endpoint
from checkfu.wire.credentials import Credential


@dataclass(frozen=True)
class Enrolled:
    adapter: Adapter
    ceiling: RunnerProviderCapability
    evidence: Verified
    credential_path: Path | None


def _refuse(message: str, field: str) -> SandboxEnrollmentRefused:
    return SandboxEnrollmentRefused(message, field=field)


def check_evidence(adapter: Adapter, document: bytes, key: Ed25519PublicKey, *, what: str = "evidence") -> Verified:
    """The evidence, verified for exactly this adapter's target and envelope.

    Raises:
        SandboxEnrollmentRefused: a bad signature, another key, another target or envelope (field ``evidence``).
    """
    try:
        return verify_evidence(document, key, envelope=adapter.envelope, target=adapter.target)
    except EvidenceError as exc:
        raise _refuse(f"{what}: {exc}", "evidence") from None


def matrix_grade(adapter: Adapter, document: bytes | None, matrix_key: Ed25519PublicKey | None) -> EgressGrade | None:
    """The egress grade the operator's own matrix vouches for, if its evidence is given and holds.

    Raises:
        SandboxEnrollmentRefused: matrix evidence given without the matrix key, or evidence that does not
            verify with it (a provider's own key never does), or evidence with a failed case.
    """
    if document is None:
        return None
    if matrix_key is None:
        raise _refuse(
            "matrix evidence needs the operator's matrix public key (--matrix-pub); a provider's key never counts",
            "egress_certification",
        )
    verified = check_evidence(adapter, document, matrix_key, what="matrix evidence")
    if verified.failed:
        raise _refuse("matrix evidence records failed cases", "egress_certification")
    return adapter.envelope.egress_certification


def issue_credential(directory: Path, adapter: Adapter) -> tuple[Path, str]:
    """A fresh credential in a file of its own (mode 0600, in ``directory``, made 0700 if it is missing); returns
    the path and the fingerprint."""
    secret = secrets.token_urlsafe(32)
    owner_only.make_dirs(directory)
    path = directory / f"{adapter.envelope.provider}-{hashlib.sha256(secret.encode()).hexdigest()[:12]}.credential"
    owner_only.create_file(path, f"{secret}\n".encode())
    return path, "sha256:" + hashlib.sha256(secret.encode()).hexdigest()


async def enroll(
    journal: Journal,
    target: str,
    evidence: bytes,
    conformance_key: Ed25519PublicKey,
    *,
    credential: Credential | None = None,
    credentials_dir: Path,
    matrix_evidence: bytes | None = None,
    matrix_key: Ed25519PublicKey | None = None,
) -> Enrolled:
    """Enroll the provider at ``target`` (a service URL, or an installed provider's name).

    Raises:
        SandboxEnrollmentRefused: naming every reason: evidence, failed cases, egress, each axis above the ceiling.
        SandboxError: the provider cannot be reached or its envelope does not decode.
    """
    adapter = await resolve_target(target, credential)
    verified = check_evidence(adapter, evidence, conformance_key)
    if verified.failed:
        names = ", ".join(f"{c.get('number')} {c.get('name')}" for c in verified.failed)
        raise _refuse(f"the evidence records failed cases: {names}", "evidence")
    if verified.suite_version != SUITE_VERSION:
        raise _refuse(
            f"the evidence was made by {verified.suite_version!r}, not this runner's {SUITE_VERSION!r}, which "
            "exercises what the envelope declares: run checkfu provider verify again",
            "evidence",
        )
    ceiling = adapter.ceiling
    over = overreach(adapter.envelope, ceiling, matrix_egress=matrix_grade(adapter, matrix_evidence, matrix_key))
    if over:
        raise _refuse(
            f"{adapter.target} claims more than its ceiling allows: {'; '.join(map(str, over))}", over[0].field
        )
    path: Path | None = None
    fingerprint: str | None = None
    if not adapter.in_tree:
        path, fingerprint = issue_credential(credentials_dir, adapter)
    journal.record_enrollment(
        adapter.target,
        source=target,
        kind="in_tree" if adapter.in_tree else "evidence",
        envelope_digest=digest(adapter.envelope),
        envelope=adapter.envelope.model_dump_json(),
        ceiling=ceiling.model_dump_json(),
        now=time.time(),
        evidence={
            "key_id": verified.key_id,
            "suite_version": verified.suite_version,
            "finished_at": verified.finished_at,
            "tally": verified.tally,
            "cases": verified.cases,
        },
        credential_path=str(path) if path else None,
        credential_fingerprint=fingerprint,
        endpoint=enrollment_endpoint(adapter),
    )
    return Enrolled(adapter, ceiling, verified, path)
