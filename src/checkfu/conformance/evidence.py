"""Signed conformance evidence: an in-toto Statement in a DSSE envelope, signed with Ed25519.

The Statement's subject is the execution target tuple, with the SHA-256 of the
envelope's RFC 8785 canonical JSON as its digest; the predicate holds the suite
version, the envelope itself, each case's outcome and reason with the declared
optional members and lifecycle assurances it exercised (``exercised``: seen to
hold; ``faulted``: seen to fail), and the time. The
DSSE envelope and the signature come from ``securesystemslib`` (the in-toto
project's DSSE implementation), the key from ``cryptography``.

``verify_evidence`` refuses, each with a message that says which: a file that is
not a DSSE envelope of a Statement, a signature that does not verify with the
given public key (a changed byte, another key), a subject that does not match the
envelope in the predicate, and, when asked, another envelope or execution target
than the one expected.
"""

from __future__ import annotations

import binascii
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey

from checkfu.conformance.suite import SUITE_VERSION, Report
from checkfu.contract.codec import canonical, decode_value, strict_json
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.target import ExecutionTarget
from checkfu.core import owner_only
from checkfu.core.documents import DocumentError, read_bounded

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_TYPE = "https://checkfu.dev/conformance/v1"


class EvidenceError(Exception):
    """Evidence that cannot be trusted, or a key that cannot be used; the message says why."""


# keys -------------------------------------------------------------------------------------------


def generate_keys(path: Path) -> tuple[Path, Path]:
    """A new Ed25519 key pair: the private key (PEM, mode 0600) at ``path``, the public one (0644) at ``path.pub``.

    Each file is made new: whatever exists at either path (a file, a directory, a symbolic link, dangling or
    not) is refused, never overwritten and never followed, so no key is written anywhere but where it was
    asked. The pair is made whole or not at all: a private key whose public key could not be written is
    removed again. A directory it makes for them is 0700.

    Raises:
        EvidenceError: something exists at either path, or either cannot be written (naming which).
    """
    public_path = path.with_name(path.name + ".pub")
    for p in (path, public_path):
        _refuse_existing(p)
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        owner_only.make_dirs(path.parent)
    except OSError as exc:
        raise EvidenceError(f"cannot make {path.parent}: {exc.strerror or exc}") from None
    _create(path, private_pem, 0o600)
    try:
        _create(public_path, public_pem, 0o644)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path, public_path


def _refuse_existing(path: Path) -> None:
    """Raises EvidenceError: something exists at ``path`` (a link is named as one, with where it leads)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise EvidenceError(f"cannot look at {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise EvidenceError(
            f"{path} is a symbolic link (to {os.readlink(path)!r}); a key is never written through a link "
            "(choose another --out)"
        )
    raise EvidenceError(f"{path} exists; a key is never overwritten (choose another --out)")


def _create(path: Path, data: bytes, mode: int) -> None:
    """Make ``path`` new with ``mode``, never through a link (``O_EXCL``: a link at ``path`` is not followed).

    Raises:
        EvidenceError: something appeared at ``path`` since it was looked at, or it cannot be written.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileExistsError:
        _refuse_existing(path)
        raise EvidenceError(f"{path} exists; a key is never overwritten (choose another --out)") from None
    except OSError as exc:
        raise EvidenceError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise EvidenceError(f"cannot write {path}: {exc.strerror or exc}") from None


def _read(path: Path, what: str) -> bytes:
    try:
        return read_bounded(path)
    except DocumentError as exc:
        raise EvidenceError(f"the {what}: {exc}") from None


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Raises EvidenceError: not a PEM Ed25519 private key."""
    try:
        key = serialization.load_pem_private_key(_read(path, "private key"), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise EvidenceError(f"{path} is not a PEM private key without a password: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise EvidenceError(f"{path} is not an Ed25519 key (checkfu keys generate makes one)")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Raises EvidenceError: not a PEM Ed25519 public key."""
    try:
        key = serialization.load_pem_public_key(_read(path, "public key"))
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise EvidenceError(f"{path} is not a PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise EvidenceError(f"{path} is not an Ed25519 public key")
    return key


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def _sslib_key(public: Ed25519PublicKey) -> SSlibKey:
    return SSlibKey.from_crypto(public, keyid=key_id(public), scheme="ed25519")


# the statement ----------------------------------------------------------------------------------


def subject_name(target: ExecutionTarget) -> str:
    return str(target)


def statement(report: Report) -> dict[str, Any]:
    """The in-toto Statement of a suite run."""
    env = report.envelope
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {
                "name": subject_name(env.target),
                "digest": {"sha256": report.envelope_digest.removeprefix("sha256:")},
            }
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "suite_version": report.suite_version,
            "execution_target": env.target.model_dump(),
            "envelope": json.loads(canonical(env)),
            "envelope_digest": report.envelope_digest,
            "cases": [
                {
                    "number": c.number,
                    "name": c.name,
                    "outcome": c.outcome,
                    "reason": c.reason,
                    "exercised": c.exercised,
                    "faulted": c.faulted,
                }
                for c in report.cases
            ],
            "tally": report.tally(),
            "started_at": _iso(report.started_at),
            "finished_at": _iso(report.finished_at),
        },
    }


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def sign(report: Report, private: Ed25519PrivateKey) -> dict[str, Any]:
    """The DSSE envelope (as JSON) of the report's Statement, signed with ``private``."""
    payload = json.dumps(statement(report), sort_keys=True, separators=(",", ":")).encode()
    envelope = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(CryptoSigner(private, _sslib_key(private.public_key())))
    return dict(envelope.to_dict())


@dataclass(frozen=True)
class Verified:
    """Evidence whose signature, subject and envelope all check."""

    target: ExecutionTarget
    envelope: SandboxProviderCapabilities
    envelope_digest: str
    cases: list[dict[str, Any]]
    tally: dict[str, int]
    suite_version: str
    finished_at: str
    key_id: str

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [c for c in self.cases if c.get("outcome") == "fail"]


def verify_evidence(
    document: bytes,
    public: Ed25519PublicKey,
    *,
    envelope: SandboxProviderCapabilities | None = None,
    target: ExecutionTarget | None = None,
) -> Verified:
    """Check evidence signed by ``public``; with ``envelope`` or ``target``, also that it is for them.

    Raises:
        EvidenceError: naming what does not hold.
    """
    dsse = _dsse(document)
    if dsse.payload_type != PAYLOAD_TYPE:
        raise EvidenceError(f"the payload is {dsse.payload_type!r}, not an in-toto Statement")
    ours = key_id(public)
    try:
        dsse.verify([_sslib_key(public)], 1)
    except VerificationError:
        others = sorted({s.keyid for s in dsse.signatures.values()} - {ours})
        if others and ours not in dsse.signatures:
            raise EvidenceError(
                f"signed by another key ({', '.join(k[:16] for k in others)}), not this one ({ours[:16]})"
            ) from None
        raise EvidenceError("the signature does not verify with this public key: the file was changed") from None
    stmt, predicate, subject = _statement(dsse.payload)
    try:
        claimed = decode_value(SandboxProviderCapabilities, predicate["envelope"])
    except Exception as exc:
        raise EvidenceError(f"the envelope in the evidence does not decode: {exc}") from None
    if stmt.get("_type") != STATEMENT_TYPE or stmt.get("predicateType") != PREDICATE_TYPE:
        raise EvidenceError("the Statement is not checkfu conformance evidence")
    digest = "sha256:" + hashlib.sha256(canonical(claimed)).hexdigest()
    if (
        subject.get("digest", {}).get("sha256") != digest.removeprefix("sha256:")
        or predicate.get("envelope_digest") != digest
    ):
        raise EvidenceError(f"the subject's digest is not the digest of the envelope it carries ({digest})")
    if subject.get("name") != subject_name(claimed.target):
        raise EvidenceError("the subject's name is not the envelope's execution target")
    if target is not None and claimed.target != target:
        raise EvidenceError(f"the evidence is for {claimed.target}, not {target}")
    if envelope is not None:
        expected = "sha256:" + hashlib.sha256(canonical(envelope)).hexdigest()
        if expected != digest:
            raise EvidenceError(f"the evidence is for envelope {digest}, not this envelope {expected}")
    return Verified(
        target=claimed.target,
        envelope=claimed,
        envelope_digest=digest,
        cases=_cases(predicate.get("cases", [])),
        tally=_tally(predicate.get("tally", {})),
        suite_version=str(predicate.get("suite_version", "")),
        finished_at=str(predicate.get("finished_at", "")),
        key_id=key_id(public),
    )


def _dsse(document: bytes) -> Envelope:
    """The DSSE envelope ``document`` holds, its shape checked before any library reads it.

    Raises:
        EvidenceError: not JSON, or not an object with a string ``payload`` and ``payloadType`` and a list of
            ``signatures``, each an object with a string ``keyid`` and ``sig``.
    """
    try:
        doc = strict_json(document.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise EvidenceError(f"not a DSSE envelope: not a JSON document: {str(exc)[:200]}") from None
    if not isinstance(doc, dict):
        raise EvidenceError("not a DSSE envelope: not a JSON object")
    for name in ("payload", "payloadType"):
        if not isinstance(doc.get(name), str):
            raise EvidenceError(f"not a DSSE envelope: {name} is missing or not a string")
    signatures = doc.get("signatures")
    if not isinstance(signatures, list) or not all(
        isinstance(sig, dict) and isinstance(sig.get("keyid"), str) and isinstance(sig.get("sig"), str)
        for sig in signatures
    ):
        raise EvidenceError("not a DSSE envelope: signatures must be a list of {keyid, sig} strings")
    try:
        return Envelope.from_dict(doc)
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise EvidenceError(f"not a DSSE envelope: {str(exc)[:200]}") from None


def _statement(payload: bytes) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The signed Statement, its predicate and its one subject, each checked to be an object.

    Raises:
        EvidenceError: the payload is not such a Statement.
    """
    try:
        stmt = strict_json(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise EvidenceError(f"the Statement is not conformance evidence: not JSON: {str(exc)[:200]}") from None
    if not isinstance(stmt, dict):
        raise EvidenceError("the Statement is not conformance evidence: not a JSON object")
    predicate, subjects = stmt.get("predicate"), stmt.get("subject")
    if not isinstance(predicate, dict) or "envelope" not in predicate:
        raise EvidenceError("the Statement is not conformance evidence: its predicate holds no envelope")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        raise EvidenceError("the Statement is not conformance evidence: it must have exactly one subject object")
    subject = subjects[0]
    if not isinstance(subject.get("digest"), dict):
        raise EvidenceError("the Statement is not conformance evidence: the subject has no digest object")
    return stmt, predicate, subject


def _cases(value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(case, dict) for case in value):
        raise EvidenceError("the Statement is not conformance evidence: cases must be a list of objects")
    return list(value)


def _tally(value: object) -> dict[str, int]:
    if not isinstance(value, dict) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value.values()
    ):
        raise EvidenceError("the Statement is not conformance evidence: tally must map outcomes to counts")
    return dict(value)


__all__ = [
    "SUITE_VERSION",
    "EvidenceError",
    "Verified",
    "generate_keys",
    "load_private_key",
    "load_public_key",
    "sign",
    "statement",
    "verify_evidence",
]
