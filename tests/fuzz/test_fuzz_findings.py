"""What the fuzzers found, each as a test that names the refusal it now gets (the raw crashers are
replayed from ``crashers/`` by ``test_fuzz_decoders``)."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from fuzz_targets import HTTP_MEMBERS, _evidence_rig, _evidence_seed, _http_answer, signed

from checkfu.conformance.evidence import EvidenceError, verify_evidence
from checkfu.contract.errors import SandboxEnrollmentRefused, SandboxProtocolViolation
from checkfu.contract.members import InstanceResult
from checkfu.control.enrollment import check_evidence
from checkfu.wire.client import decode_answer


def _verify(document: bytes) -> None:
    key, adapter = _evidence_rig()
    verify_evidence(document, key.public_key(), envelope=adapter.envelope)


@pytest.mark.parametrize(
    ("document", "why"),
    [
        (b'{"payload": [{"keyid": "k", "sig": "c2ln"}]}', "payload is missing or not a string"),  # found by atheris
        (b'{"payload": "", "payloadType": "x", "signatures": ["k"]}', "signatures must be a list"),
        (b'{"payload": "", "payloadType": "x", "signatures": [{"keyid": 1, "sig": ""}]}', "signatures must be"),
        (b"[" * 100_000, "not a JSON document"),  # a RecursionError before
        (b"\xff\xfe", "not a JSON document"),
        (b'{"payload": "", "payload": ""}', "not a JSON document"),  # a duplicate key is not read either way
        (b"[]", "not a JSON object"),
    ],
)
def test_an_evidence_file_of_the_wrong_shape_is_refused_by_name(document: bytes, why: str) -> None:
    with pytest.raises(EvidenceError, match=why):
        _verify(document)
    key, adapter = _evidence_rig()
    with pytest.raises(SandboxEnrollmentRefused, match=why):
        check_evidence(adapter, document, key.public_key())


@pytest.mark.parametrize(
    ("statement", "why"),
    [
        ([], "not a JSON object"),
        ({"predicate": [], "subject": []}, "holds no envelope"),
        ({"predicate": {"envelope": {}}, "subject": "s"}, "exactly one subject object"),
        ({"predicate": {"envelope": {}}, "subject": ["s"]}, "exactly one subject object"),
        ({"predicate": {"envelope": {}}, "subject": [{"digest": "d"}]}, "no digest object"),
    ],
)
def test_a_signed_statement_of_the_wrong_shape_is_refused_by_name(statement: object, why: str) -> None:
    """Before, a subject that is not an object was an AttributeError past the signature check."""
    with pytest.raises(EvidenceError, match=why):
        _verify(signed(json.dumps(statement).encode()))


def test_cases_and_tally_of_the_wrong_shape_are_refused() -> None:
    key, _ = _evidence_rig()
    good = json.loads(base64.b64decode(json.loads(_evidence_seed())["payload"]))
    verify_evidence(signed(json.dumps(good).encode()), key.public_key())
    for field, value, why in [("cases", 3, "cases must be"), ("tally", [["pass", 1]], "tally must map")]:
        bad = {**good, "predicate": {**good["predicate"], field: value}}
        with pytest.raises(EvidenceError, match=why):
            verify_evidence(signed(json.dumps(bad).encode()), key.public_key())


def test_an_error_body_nested_too_deeply_is_a_protocol_violation() -> None:
    """Before, a 500 whose body was ``[`` 5000 times was a RecursionError out of the wire client."""
    with pytest.raises(SandboxProtocolViolation, match="not JSON"):
        decode_answer("inspect", InstanceResult, 500, b"[" * 5000)


@pytest.mark.parametrize("status_line", [b"HTTP/1.1 2\xb20 OK", b"HTTP/1.1 \xb2\xb2\xb2 OK", b"HTTP/1.1 20 OK"])
def test_a_status_code_that_is_not_three_ascii_digits_is_a_protocol_violation(status_line: bytes) -> None:
    """Before, ``2²0`` passed ``str.isdigit`` and ``int()`` raised a ValueError out of the pool."""
    assert "inspect" in HTTP_MEMBERS
    with pytest.raises(SandboxProtocolViolation, match=r"not an HTTP/1\.1 answer"):
        asyncio.run(_http_answer("inspect", status_line + b"\r\ncontent-length: 0\r\n\r\n"))
