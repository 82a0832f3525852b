"""Table tests for the pure cross-checks of ``checkfu.contract.checks``."""

from __future__ import annotations

import contextlib
import copy
import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from checkfu.contract import (
    ExecutionTarget,
    FileContent,
    InstanceResult,
    Lease,
    ListAllocationsResult,
    ReadFilesResult,
    SandboxBoundExceeded,
    SandboxDigestMismatch,
    SandboxError,
    SandboxIdentityMismatch,
    SandboxLeaseFenced,
    SandboxPathRejected,
    SandboxResultInvalid,
    SandboxStateConflict,
    WriteFileRequest,
    WriteFileResult,
    check_bound,
    check_content,
    check_echo,
    check_equal,
    check_lease,
    check_new_identity,
    check_read_files,
    check_returned_paths,
    check_state,
    check_write,
    decode_value,
    sha256_digest,
)
from checkfu.contract import examples as ex

TARGET = decode_value(ExecutionTarget, ex.target())
LEASE = decode_value(Lease, ex.lease())


@contextlib.contextmanager
def raises(error: type[SandboxError], field: str | None) -> Iterator[None]:
    """Expect exactly ``error`` (not a subclass or a sibling) naming ``field``."""
    with pytest.raises(error) as info:
        yield
    assert type(info.value) is error
    assert info.value.field == field, info.value.message


# --- check_lease ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("returned", "field"),
    [
        ({"lease_id": "lease-0001", "lease_epoch": 3}, None),
        ({"lease_id": "lease-0002", "lease_epoch": 3}, "lease.lease_id"),
        ({"lease_id": "LEASE-0001", "lease_epoch": 3}, "lease.lease_id"),
        ({"lease_id": "lease-0001", "lease_epoch": 2}, "lease.lease_epoch"),  # older
        ({"lease_id": "lease-0001", "lease_epoch": 4}, "lease.lease_epoch"),  # newer is not ours either
        ({"lease_id": "lease-0002", "lease_epoch": 2}, "lease.lease_id"),
    ],
)
def test_check_lease(returned: dict[str, Any], field: str | None) -> None:
    lease = decode_value(Lease, returned)
    if field is None:
        check_lease(lease, LEASE)
    else:
        with raises(SandboxLeaseFenced, field):  # another lease or epoch is fenced (contract section 6)
            check_lease(lease, LEASE)


# --- check_echo ----------------------------------------------------------------------------------


def instance_result(**changes: Any) -> InstanceResult:
    doc = ex.instance_echo("active")
    for key, value in changes.items():
        if key in ("target", "lease"):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return decode_value(InstanceResult, doc)


@pytest.mark.parametrize(
    ("changes", "error", "field"),
    [
        ({}, None, None),
        ({"target": {"provider": "other"}}, SandboxIdentityMismatch, "target"),
        ({"target": {"provider_revision": "acme-sandbox 1.4.3"}}, SandboxIdentityMismatch, "target"),
        ({"target": {"provider_revision": "acme-sandbox 1.4.2 "}}, SandboxIdentityMismatch, "target"),
        ({"target": {"materialization_revision": "ACME-IMAGES 7"}}, SandboxIdentityMismatch, "target"),
        ({"target": {"placement": "byoc"}}, SandboxIdentityMismatch, "target"),
        ({"lease": {"lease_epoch": 2}}, SandboxLeaseFenced, "lease.lease_epoch"),
        ({"lease": {"lease_id": "lease-9"}}, SandboxLeaseFenced, "lease.lease_id"),
        ({"allocation_key": "ak-0002"}, SandboxIdentityMismatch, "allocation_key"),
        ({"instance_id": "i-43"}, SandboxIdentityMismatch, "instance_id"),
        # the target is checked before the lease, the lease before the ids
        ({"target": {"placement": "byoc"}, "lease": {"lease_epoch": 2}}, SandboxIdentityMismatch, "target"),
        ({"lease": {"lease_epoch": 2}, "instance_id": "i-43"}, SandboxLeaseFenced, "lease.lease_epoch"),
    ],
)
def test_check_echo(changes: dict[str, Any], error: type[SandboxError] | None, field: str | None) -> None:
    result = instance_result(**changes)
    if error is None:
        check_echo(result, target=TARGET, lease=LEASE, allocation_key="ak-0001", instance_id="i-42")
    else:
        with raises(error, field):
            check_echo(result, target=TARGET, lease=LEASE, allocation_key="ak-0001", instance_id="i-42")


def test_check_echo_skips_ids_it_is_not_given() -> None:
    result = instance_result(allocation_key="ak-0009", instance_id="i-99")
    check_echo(result, target=TARGET, lease=LEASE)


def test_check_echo_refuses_a_result_that_cannot_echo_an_expected_id() -> None:
    listing = decode_value(
        ListAllocationsResult, {"target": ex.target(), "lease": ex.lease(), "runner_tag": "r", "allocations": []}
    )
    check_echo(listing, target=TARGET, lease=LEASE)
    with raises(SandboxIdentityMismatch, "instance_id"):
        check_echo(listing, target=TARGET, lease=LEASE, instance_id="i-42")


# --- check_equal, check_new_identity, check_state, check_bound -----------------------------------


@pytest.mark.parametrize(
    ("returned", "expected", "equal"),
    [("a", "a", True), ("a", "A", False), ("a", "a ", False), (1, 1, True), (1, "1", False), (None, "a", False)],
)
def test_check_equal(returned: object, expected: object, equal: bool) -> None:
    if equal:
        check_equal("snapshot_id", returned, expected)
    else:
        with raises(SandboxIdentityMismatch, "snapshot_id"):
            check_equal("snapshot_id", returned, expected)


@pytest.mark.parametrize(
    ("returned", "held", "fresh"),
    [
        ("i-43", {"i-42"}, True),
        ("i-42", {"i-42"}, False),
        ("i-42", ["i-1", "i-42"], False),
        ("i-42", (), True),
        ("I-42", {"i-42"}, True),
    ],
)
def test_check_new_identity(returned: str, held: Any, fresh: bool) -> None:
    if fresh:
        check_new_identity("instance_id", returned, held)
    else:
        with raises(SandboxIdentityMismatch, "instance_id"):
            check_new_identity("instance_id", returned, held)


@pytest.mark.parametrize(
    ("returned", "expected", "member"),
    [
        ("active", "active", "activate"),
        ("provisioning", "active", "activate"),
        ("released", "provisioning", "provision"),
        ("active", "released", "release"),
    ],
)
def test_check_state(returned: str, expected: str, member: str) -> None:
    if returned == expected:
        check_state(returned, expected, member=member)
    else:
        with raises(SandboxStateConflict, "state"):
            check_state(returned, expected, member=member)
        try:
            check_state(returned, expected, member=member)
        except SandboxStateConflict as exc:
            assert member in exc.message
            assert returned in exc.message


@pytest.mark.parametrize(("size", "limit", "within"), [(0, 0, True), (10, 10, True), (11, 10, False), (1, 0, False)])
def test_check_bound(size: int, limit: int, within: bool) -> None:
    if within:
        check_bound("stdout", size, limit)
    else:
        with raises(SandboxBoundExceeded, "stdout"):
            check_bound("stdout", size, limit)


# --- check_write ---------------------------------------------------------------------------------


def write_request() -> WriteFileRequest:
    return decode_value(WriteFileRequest, ex.messages()["WriteFileRequest"][0])


@pytest.mark.parametrize(
    ("changes", "error", "field"),
    [
        ({}, None, None),
        ({"path": "/workspace/README2"}, SandboxIdentityMismatch, "path"),
        ({"path": "/workspace/./README"}, SandboxIdentityMismatch, "path"),
        ({"size": 7}, SandboxIdentityMismatch, "size"),
        ({"digest": "sha256:" + "0" * 64}, SandboxDigestMismatch, "digest"),
        ({"path": "/x", "digest": "sha256:" + "0" * 64}, SandboxIdentityMismatch, "path"),
    ],
)
def test_check_write(changes: dict[str, Any], error: type[SandboxError] | None, field: str | None) -> None:
    doc = {**ex.messages()["WriteFileResult"][0], **changes}
    result = decode_value(WriteFileResult, doc)
    if error is None:
        check_write(result, write_request())
    else:
        with raises(error, field):
            check_write(result, write_request())


# --- digests and contents ------------------------------------------------------------------------


@pytest.mark.parametrize("data", [b"", b"hello\n", bytes(range(256)), b"\x00" * 70000])
def test_sha256_digest(data: bytes) -> None:
    assert sha256_digest(data) == "sha256:" + hashlib.sha256(data).hexdigest()


def test_sha256_digest_known_value() -> None:
    assert sha256_digest(b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def file_content(data: bytes, digest: str | None = None, path: str = "/workspace/README") -> FileContent:
    return FileContent(path=path, mode=0o644, digest=digest or sha256_digest(data), data=data)


def test_check_content() -> None:
    check_content(file_content(b"hello\n"), field="files.0")
    with raises(SandboxDigestMismatch, "files.2.digest"):
        check_content(file_content(b"hello\n", digest=sha256_digest(b"hello")), field="files.2")


# --- check_returned_paths ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("paths", "asked", "error", "field"),
    [
        (["/workspace/a"], ["/workspace/a"], None, None),
        (["/workspace/a/b", "/workspace/c"], ["/workspace"], None, None),
        (["/workspace"], ["/workspace"], None, None),
        (["/anything"], ["/"], None, None),
        ([], [], None, None),
        (["/workspace/a", "/etc/passwd"], ["/workspace"], SandboxPathRejected, "entries.1"),
        (["/workspacefoo"], ["/workspace"], SandboxPathRejected, "entries.0"),
        (["/workspace/../etc"], ["/workspace"], SandboxPathRejected, "entries.0"),
        (["/workspace/a/"], ["/workspace"], SandboxPathRejected, "entries.0"),
        (["workspace/a"], ["/workspace"], SandboxPathRejected, "entries.0"),
        (["/workspace/a\x00"], ["/workspace"], SandboxPathRejected, "entries.0"),
        (["/workspace/\ud800"], ["/workspace"], SandboxPathRejected, "entries.0"),
        (["/workspace/" + "x" * 5000], ["/workspace"], SandboxPathRejected, "entries.0"),
        (["/a"], [], SandboxPathRejected, "entries.0"),
        (["/workspace"], ["/workspace/a"], SandboxPathRejected, "entries.0"),  # a parent was not asked for
    ],
)
def test_check_returned_paths(
    paths: list[str], asked: list[str], error: type[SandboxError] | None, field: str | None
) -> None:
    if error is None:
        check_returned_paths("entries", paths, asked)
    else:
        with raises(error, field):
            check_returned_paths("entries", paths, asked)


# --- check_read_files ----------------------------------------------------------------------------


def read_result(**changes: Any) -> ReadFilesResult:
    doc = copy.deepcopy(ex.messages()["ReadFilesResult"][0])
    doc.update(changes)
    return decode_value(ReadFilesResult, doc)


def file_doc(path: str, data: bytes, digest: str | None = None) -> dict[str, Any]:
    return {"path": path, "mode": 0o644, "digest": digest or sha256_digest(data), "data": ex.b64(data)}


@pytest.mark.parametrize(
    ("changes", "asked", "max_bytes", "error", "field"),
    [
        ({}, ["/workspace/README"], 1 << 20, None, None),
        ({"missing": ["/workspace/gone"]}, ["/workspace/README", "/workspace/gone"], 6, None, None),
        ({}, ["/workspace/README"], 5, SandboxBoundExceeded, "files"),
        ({}, ["/other"], 1 << 20, SandboxPathRejected, "files.0"),
        ({"missing": ["/etc/shadow"]}, ["/workspace/README"], 1 << 20, SandboxPathRejected, "missing.0"),
        ({"missing": ["/workspace/../x"]}, ["/workspace/README"], 1 << 20, SandboxPathRejected, "missing.0"),
        # exactly the asked paths, each once: nothing below, nothing twice, nothing dropped
        ({}, ["/workspace"], 1 << 20, SandboxResultInvalid, "files.0"),
        ({"files": [file_doc("/workspace/README/x", b"")]}, ["/workspace/README"], 9, SandboxResultInvalid, "files.0"),
        (
            {"files": [file_doc("/workspace/a", b"a"), file_doc("/workspace/a", b"a")]},
            ["/workspace/a"],
            1 << 20,
            SandboxResultInvalid,
            "files.1",
        ),
        ({"missing": ["/workspace/README"]}, ["/workspace/README"], 1 << 20, SandboxResultInvalid, "missing.0"),
        ({"files": []}, ["/workspace/README"], 1 << 20, SandboxResultInvalid, "missing"),
        ({}, ["/workspace/README", "/workspace/gone"], 1 << 20, SandboxResultInvalid, "missing"),
        (
            {"files": [file_doc("/workspace/a", b"a"), file_doc("/workspace/b", b"b", sha256_digest(b"c"))]},
            ["/workspace/a", "/workspace/b"],
            1 << 20,
            SandboxDigestMismatch,
            "files.1.digest",
        ),
        (
            {"files": [file_doc("/workspace/a", b"a" * 4), file_doc("/workspace/b", b"b" * 4)]},
            ["/workspace/a", "/workspace/b"],
            7,
            SandboxBoundExceeded,
            "files",
        ),
        (
            {"files": [file_doc("/workspace/a", b"a" * 4), file_doc("/workspace/b", b"b" * 4)]},
            ["/workspace/a", "/workspace/b"],
            8,
            None,
            None,
        ),
        # paths before answers, answers before bounds, bounds before digests
        ({"files": [file_doc("/x", b"a" * 10, sha256_digest(b""))]}, ["/workspace"], 1, SandboxPathRejected, "files.0"),
        ({"files": [file_doc("/workspace/a", b"a" * 10)]}, ["/workspace"], 1, SandboxResultInvalid, "files.0"),
        (
            {"files": [file_doc("/workspace/a", b"a" * 10, sha256_digest(b""))]},
            ["/workspace/a"],
            1,
            SandboxBoundExceeded,
            "files",
        ),
    ],
)
def test_check_read_files(
    changes: dict[str, Any],
    asked: list[str],
    max_bytes: int,
    error: type[SandboxError] | None,
    field: str | None,
) -> None:
    result = read_result(**changes)
    if error is None:
        check_read_files(result, asked, max_bytes)
    else:
        with raises(error, field):
            check_read_files(result, asked, max_bytes)
