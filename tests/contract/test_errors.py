"""The closed error vocabulary: exactly the 19 codes of contract.md section 7, by table, never by name."""

from __future__ import annotations

import typing

import pytest

from checkfu.contract import (
    ERROR_CLASSES,
    ErrorCode,
    SandboxCapabilityUnavailable,
    SandboxError,
    SandboxNotFound,
    SandboxProviderError,
    SandboxProviderFailed,
    SandboxRequestError,
    SandboxStateError,
    SandboxTransportError,
    Unmet,
    error_for_code,
)
from checkfu.wire.errors import WireError

CONTRACT_CODES = {
    "SandboxEnvelopeInvalid",
    "SandboxProfileInvalid",
    "SandboxCapabilityUnavailable",
    "SandboxAdapterUnavailable",
    "SandboxAdapterAmbiguous",
    "SandboxResultInvalid",
    "SandboxIdentityMismatch",
    "SandboxLeaseFenced",
    "SandboxPathRejected",
    "SandboxBoundExceeded",
    "SandboxStateConflict",
    "SandboxOperationUnsupported",
    "SandboxNotFound",
    "SandboxProviderTimeout",
    "SandboxProviderFailed",
    "SandboxProtocolViolation",
    "SandboxUnauthenticated",
    "SandboxEnrollmentRefused",
    "SandboxDigestMismatch",
}
"""Copied from contract.md section 7."""

BRANCHES: dict[type[SandboxError], tuple[str, set[str]]] = {
    SandboxRequestError: (
        "request",
        {
            "SandboxProfileInvalid",
            "SandboxCapabilityUnavailable",
            "SandboxAdapterUnavailable",
            "SandboxAdapterAmbiguous",
            "SandboxDigestMismatch",
            "SandboxOperationUnsupported",
            "SandboxUnauthenticated",
            "SandboxEnrollmentRefused",
        },
    ),
    SandboxProviderError: (
        "provider",
        {
            "SandboxEnvelopeInvalid",
            "SandboxResultInvalid",
            "SandboxIdentityMismatch",
            "SandboxPathRejected",
            "SandboxBoundExceeded",
            "SandboxProviderFailed",
        },
    ),
    SandboxStateError: ("state", {"SandboxLeaseFenced", "SandboxStateConflict", "SandboxNotFound"}),
    SandboxTransportError: ("transport", {"SandboxProviderTimeout", "SandboxProtocolViolation"}),
}
"""The tree drawn in the docstring of ``checkfu.contract.errors``: the first split is who is at fault."""

RETRYABLE = {"SandboxProviderFailed", "SandboxProviderTimeout"}


def make(cls: type[SandboxError], message: str = "m", **kwargs: typing.Any) -> SandboxError:
    if cls is SandboxCapabilityUnavailable:
        return SandboxCapabilityUnavailable([Unmet(kwargs.get("field") or "tier", message)])
    return cls(message, **kwargs)


def all_subclasses(cls: type[SandboxError]) -> set[type[SandboxError]]:
    out: set[type[SandboxError]] = set()
    stack: list[type[SandboxError]] = [cls]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                stack.append(sub)
    return out


@pytest.mark.parametrize(
    "cls", [SandboxError, SandboxRequestError, SandboxProviderError, SandboxStateError, SandboxTransportError]
)
def test_the_root_and_the_branches_cannot_be_raised(cls: type[SandboxError]) -> None:
    with pytest.raises(TypeError, match="abstract"):
        cls("boom")
    with pytest.raises(TypeError):
        cls("boom", field="x", retryable=True)


def test_the_vocabulary_is_exactly_the_contracts() -> None:
    assert set(ERROR_CLASSES) == CONTRACT_CODES
    assert len(ERROR_CLASSES) == 19
    assert set(typing.get_args(ErrorCode)) == CONTRACT_CODES


@pytest.mark.parametrize("code", sorted(CONTRACT_CODES))
def test_each_code_is_its_class_name(code: str) -> None:
    cls = ERROR_CLASSES[code]
    assert cls.__name__ == code
    assert cls.code == code
    assert issubclass(cls, SandboxError)
    assert make(cls).code == code


def test_the_classes_in_the_table_are_the_only_leaves() -> None:
    leaves = {c for c in all_subclasses(SandboxError) if c.__module__ == "checkfu.contract.errors" and c.code}
    assert leaves == set(ERROR_CLASSES.values())


@pytest.mark.parametrize("branch", list(BRANCHES))
def test_the_first_split_is_who_is_at_fault(branch: type[SandboxError]) -> None:
    fault, codes = BRANCHES[branch]
    assert {c for c, cls in ERROR_CLASSES.items() if issubclass(cls, branch)} == codes
    for code in codes:
        assert ERROR_CLASSES[code].fault == fault
        assert make(ERROR_CLASSES[code]).fault == fault


def test_the_branches_partition_the_vocabulary() -> None:
    union: set[str] = set()
    for _, codes in BRANCHES.values():
        assert not (union & codes)
        union |= codes
    assert union == CONTRACT_CODES


@pytest.mark.parametrize("code", sorted(CONTRACT_CODES))
def test_retryable_defaults(code: str) -> None:
    cls = ERROR_CLASSES[code]
    assert make(cls).retryable is (code in RETRYABLE)
    if cls is not SandboxCapabilityUnavailable:
        assert cls("m", retryable=True).retryable is True
        assert cls("m", retryable=False).retryable is False


@pytest.mark.parametrize("code", sorted(CONTRACT_CODES))
def test_message_and_field(code: str) -> None:
    err = make(ERROR_CLASSES[code], "the message", field="a.b.0")
    assert err.field == "a.b.0"
    assert "the message" in err.message
    assert "the message" in str(err)
    assert code in repr(err)


@pytest.mark.parametrize("code", sorted(CONTRACT_CODES))
def test_error_for_code_round_trips(code: str) -> None:
    original = make(ERROR_CLASSES[code], "what went wrong", field="instance_id")
    body = original.to_wire()
    assert body["code"] == code
    assert body["field"] == "instance_id"
    rebuilt = error_for_code(body["code"], body["message"], field=body["field"], retryable=body["retryable"])
    assert type(rebuilt) is ERROR_CLASSES[code]
    assert rebuilt.code == code
    assert rebuilt.field == "instance_id"
    assert rebuilt.retryable == original.retryable
    if code != "SandboxCapabilityUnavailable":
        assert rebuilt.message == "what went wrong"
    else:
        assert isinstance(rebuilt, SandboxCapabilityUnavailable)
        assert rebuilt.unmet == (Unmet("instance_id", original.message),)


@pytest.mark.parametrize("code", sorted(CONTRACT_CODES))
def test_error_for_code_keeps_the_retryable_flag_a_peer_sent(code: str) -> None:
    if code == "SandboxCapabilityUnavailable":
        return
    assert error_for_code(code, "m", retryable=True).retryable is True
    assert error_for_code(code, "m", retryable=False).retryable is False
    assert error_for_code(code, "m").retryable is (code in RETRYABLE)


@pytest.mark.parametrize(
    "code",
    [
        "SandboxExploded",
        "",
        "SandboxError",
        "SandboxRequestError",
        "SandboxProviderError",
        "sandboxnotfound",
        "SandboxNotFound ",
        "KeyError",
        "Exception",
        "SystemExit",
        "__class__",
        "x" * 10_000,
    ],
)
def test_unknown_codes_become_provider_failed_without_new_classes(code: str) -> None:
    before = all_subclasses(SandboxError)
    err = error_for_code(code, "peer says", field="f")
    assert type(err) is SandboxProviderFailed
    assert err.field == "f"
    assert err.retryable is True
    assert "peer says" in err.message
    assert repr(code[:64]) in err.message
    assert len(err.message) < 200
    assert all_subclasses(SandboxError) == before
    assert set(ERROR_CLASSES) == CONTRACT_CODES


def test_capability_unavailable_lists_every_unmet_requirement() -> None:
    unmet = [
        Unmet("network_policy.mode", "'allowlist' is not among network_modes none"),
        Unmet("retention_mode", "'durable' is not among retention_modes ephemeral_zdr"),
        Unmet("packages.cargo", "cargo is not among package_managers apt, pip"),
    ]
    err = SandboxCapabilityUnavailable(unmet, provider="acme-sandbox")
    assert err.unmet == tuple(unmet)
    assert err.field == "network_policy.mode"
    assert "'acme-sandbox'" in err.message
    for u in unmet:
        assert f"{u.field}: {u.reason}" in err.message
    anonymous = SandboxCapabilityUnavailable(unmet[:1])
    assert anonymous.message.startswith("the envelope cannot serve")


def test_to_wire_omits_a_missing_field() -> None:
    assert SandboxNotFound("gone").to_wire() == {"code": "SandboxNotFound", "message": "gone", "retryable": False}
    assert SandboxNotFound("gone", field="instance_id").to_wire()["field"] == "instance_id"


@pytest.mark.parametrize("code", sorted(CONTRACT_CODES))
def test_wire_error_body_round_trips(code: str) -> None:
    original = make(ERROR_CLASSES[code], "bad", field="x.y")
    body = WireError.of(original)
    assert body.error.code == code
    back = body.to_exception()
    assert type(back) is type(original)
    assert back.field == "x.y"
    assert back.retryable == original.retryable
