"""Enrollment: a provider is admitted for selection only on signed evidence and within its ceiling.

``enroll`` fetches the provider's envelope through the runner's door and then, in
order, refuses with ``SandboxEnrollmentRefused`` naming what does not hold:

1. the evidence: its signature verifies with the conformance key the operator
   trusts, and it is for exactly this execution target and this envelope's digest;
2. no case of it failed, and it was made by this runner's suite (``SUITE_VERSION``):
   an older suite did not exercise what the envelope declares, so its passes say less;
3. the ceiling: every axis and field the envelope claims above the server-owned
   ``RunnerProviderCapability`` (``checkfu.contract.ceiling``), all of them at once.
   Among them ``security_boundary`` egress, which no provider that is not in-tree may
   claim: that grade belongs to an egress matrix the control plane runs itself, which
   this runner does not have, and no signed evidence stands in for it (evidence signed
   by another key under the name of a matrix proves conformance, nothing more).

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
from checkfu.core import owner_only
from checkfu.core.journal import Journal
from checkfu.core.registry import Adapter, enrollment_endpoint
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


MATRIX_REFUSED = (
    "security_boundary egress is not admissible for a provider that is not in-tree: the server-owned ceiling holds "
    "every such provider at advisory_filter, and this runner runs no egress matrix of its own, so evidence given as "
    "'matrix evidence' is ordinary conformance evidence under another key and proves nothing more. Declare "
    "egress_certification advisory_filter (or lower) in the provider's envelope and enroll with --evidence alone"
)
"""Why ``--matrix-evidence``/``--matrix-pub`` are refused, and what to do instead."""


def refuse_matrix_evidence(given: str) -> SandboxEnrollmentRefused:
    """The refusal of an enrollment that offers "matrix evidence" (``given`` names the option), by name: field
    ``egress_certification``, saying why and what the operator can do instead."""
    return _refuse(f"{given}: {MATRIX_REFUSED}", "egress_certification")


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
    over = overreach(adapter.envelope, ceiling)
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
