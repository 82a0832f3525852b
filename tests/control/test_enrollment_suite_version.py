"""Enrollment takes evidence of this runner's conformance suite only: an older suite never exercised what the
envelope declares (suite 1 passed a provider that answered 501 to its declared openProcess and readFiles)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkfu.conformance.evidence import generate_keys, load_private_key, load_public_key, sign
from checkfu.conformance.suite import SUITE_VERSION, Report, run_suite
from checkfu.contract.errors import SandboxEnrollmentRefused
from checkfu.control.enrollment import enroll
from checkfu.core.journal import Journal, sqlite_url

pytestmark = pytest.mark.anyio


async def test_enrollment_refuses_evidence_of_an_older_suite(tmp_path: Path) -> None:
    private, public = generate_keys(tmp_path / "keys" / "conformance")
    report = await run_suite("memory")
    old = Report(**{**report.__dict__, "suite_version": "checkfu-conformance 1"})
    signed = json.dumps(sign(old, load_private_key(private))).encode()
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    try:
        with pytest.raises(SandboxEnrollmentRefused) as caught:
            await enroll(journal, "memory", signed, load_public_key(public), credentials_dir=tmp_path / "cr")
        assert journal.enrollments() == []
    finally:
        journal.close()
    assert caught.value.field == "evidence"
    assert "'checkfu-conformance 1'" in caught.value.message and repr(SUITE_VERSION) in caught.value.message


async def test_enrollment_takes_evidence_of_this_suite(tmp_path: Path) -> None:
    private, public = generate_keys(tmp_path / "keys" / "conformance")
    signed = json.dumps(sign(await run_suite("memory"), load_private_key(private))).encode()
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    try:
        enrolled = await enroll(journal, "memory", signed, load_public_key(public), credentials_dir=tmp_path / "cr")
    finally:
        journal.close()
    assert enrolled.evidence.suite_version == SUITE_VERSION
