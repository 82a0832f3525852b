"""Cross-checks of provider results against what the runner asked and holds.

Pure functions: given the request, the runner's own record and the decoded
result, accept or raise the one vocabulary member the failure amounts to.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence

from checkfu.contract.errors import (
    SandboxBoundExceeded,
    SandboxDigestMismatch,
    SandboxIdentityMismatch,
    SandboxLeaseFenced,
    SandboxPathRejected,
    SandboxResultInvalid,
    SandboxStateConflict,
)
from checkfu.contract.members import FileContent, ReadFilesResult, Result, WriteFileRequest, WriteFileResult
from checkfu.contract.model import format_timestamp, parse_timestamp
from checkfu.contract.paths import admit_path, is_within
from checkfu.contract.target import ExecutionTarget, Lease


def check_lease(returned: Lease, held: Lease) -> None:
    """A result must echo the caller's own lease at its own epoch.

    A result carrying another lease, or another epoch of it, is fenced (contract section 6, and the
    author kit): the provider answered for a lease this call does not hold, so the answer is not this
    runner's to act on. The runner's own lease store fences a real takeover before any call; this is
    the same refusal found in an answer, so the caller compensates what the call may have allocated
    and cannot tell it from a takeover by its code alone (the lease store can).

    Raises:
        SandboxLeaseFenced: another lease id, or another (older or newer) epoch, naming the field.
    """
    if returned.lease_id != held.lease_id:
        raise SandboxLeaseFenced(
            f"lease.lease_id: result echoes lease {returned.lease_id!r}, the request carried {held.lease_id!r}: "
            "the provider answered for a lease this call does not hold",
            field="lease.lease_id",
        )
    if returned.lease_epoch != held.lease_epoch:
        raise SandboxLeaseFenced(
            f"lease.lease_epoch: result echoes epoch {returned.lease_epoch}, the request carried {held.lease_epoch}: "
            "the provider answered for an epoch this call does not hold",
            field="lease.lease_epoch",
        )


def check_echo(
    result: Result,
    *,
    target: ExecutionTarget,
    lease: Lease,
    allocation_key: str | None = None,
    instance_id: str | None = None,
) -> None:
    """Every echo of ``result`` equals the runner's record.

    Raises:
        SandboxIdentityMismatch: the target tuple, allocation key or instance id differs.
        SandboxLeaseFenced: the lease differs.
    """
    if result.target != target:
        raise SandboxIdentityMismatch(
            f"target: result echoes {result.target}, the runner selected {target}", field="target"
        )
    check_lease(result.lease, lease)
    if allocation_key is not None:
        check_equal("allocation_key", getattr(result, "allocation_key", None), allocation_key)
    if instance_id is not None:
        check_equal("instance_id", getattr(result, "instance_id", None), instance_id)


def check_equal(field: str, returned: object, expected: object) -> None:
    """Raises SandboxIdentityMismatch when a returned identity differs from the runner's own."""
    if returned != expected:
        raise SandboxIdentityMismatch(
            f"{field}: result echoes {returned!r}, the runner holds {expected!r}", field=field
        )


def check_new_identity(field: str, returned: str, held: Collection[str]) -> None:
    """A clone or a resumed instance must have an id the runner does not already hold.

    Raises:
        SandboxIdentityMismatch: the id is one the runner already holds.
    """
    if returned in held:
        raise SandboxIdentityMismatch(f"{field}: {returned!r} is an id the runner already holds", field=field)


def check_state(returned: str, expected: str, *, member: str) -> None:
    """Raises SandboxStateConflict when a result reports a state the member cannot leave behind."""
    if returned != expected:
        raise SandboxStateConflict(f"state: {member} left the instance {returned}, expected {expected}", field="state")


def check_bound(field: str, size: int, limit: int) -> None:
    """Raises SandboxBoundExceeded when ``size`` is over the runner's ``limit``."""
    if size > limit:
        raise SandboxBoundExceeded(f"{field}: {size} is over the limit of {limit}", field=field)


def check_write(result: WriteFileResult, request: WriteFileRequest) -> None:
    """A staged write must echo the path, size and digest the runner sent."""
    check_equal("path", result.path, request.path)
    check_equal("size", result.size, request.size)
    if result.digest != request.digest:
        raise SandboxDigestMismatch(
            f"digest: provider staged {result.digest}, the runner sent {request.digest}", field="digest"
        )


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_returned_paths(field: str, paths: Iterable[str], asked: Collection[str]) -> None:
    """Every returned path is admissible and is one the runner asked for, or below one.

    Raises:
        SandboxPathRejected: naming the index of the first path at fault.
    """
    for i, path in enumerate(paths):
        where = f"{field}.{i}"
        admit_path(path, field=where)
        if not any(is_within(path, root) for root in asked):
            raise SandboxPathRejected(f"{where}: {path!r} was not asked for", field=where)


def check_read_files(result: ReadFilesResult, asked: Collection[str], max_bytes: int) -> None:
    """``readFiles`` answers exactly the asked paths, each once, as a file or as missing, within the byte
    bound, each file matching its digest.

    Raises:
        SandboxPathRejected: a returned path is not admissible, or lies outside every asked path.
        SandboxResultInvalid: a path below an asked one but not asked itself, a path answered twice (twice as a
            file, or as a file and as missing), or an asked path not answered at all.
        SandboxBoundExceeded: the files hold more than ``max_bytes`` together.
        SandboxDigestMismatch: a file's bytes do not match its stated digest.
    """
    check_returned_paths("files", (f.path for f in result.files), asked)
    check_returned_paths("missing", result.missing, asked)
    check_answers_exactly(
        {"files": [f.path for f in result.files], "missing": list(result.missing)}, asked, member="readFiles"
    )
    check_bound("files", sum(len(f.data) for f in result.files), max_bytes)
    for i, f in enumerate(result.files):
        check_content(f, field=f"files.{i}")


def check_answers_exactly(answers: Mapping[str, Sequence[str]], asked: Collection[str], *, member: str) -> None:
    """Every asked path is answered exactly once, in one of the lists of ``answers``, and nothing else is.

    Raises:
        SandboxResultInvalid: naming the first answer at fault (``files.2``), or ``missing`` for a dropped path.
    """
    wanted = set(asked)
    seen: dict[str, str] = {}
    for name, paths in answers.items():
        for i, path in enumerate(paths):
            where = f"{name}.{i}"
            if path not in wanted:
                raise SandboxResultInvalid(
                    f"{where}: {path!r} was not asked for ({member} answers exactly the paths asked, nothing below)",
                    field=where,
                )
            if path in seen:
                raise SandboxResultInvalid(f"{where}: {path!r} is answered twice, also as {seen[path]}", field=where)
            seen[path] = where
    dropped = [p for p in asked if p not in seen]
    if dropped:
        listed = ", ".join(repr(p) for p in dropped[:5]) + (f" and {len(dropped) - 5} more" if len(dropped) > 5 else "")
        raise SandboxResultInvalid(
            f"missing: {member} answered neither a file nor missing for {listed}", field="missing"
        )


def check_content(content: FileContent, *, field: str) -> None:
    """Raises SandboxDigestMismatch when a returned file's bytes do not match its stated digest."""
    actual = sha256_digest(content.data)
    if actual != content.digest:
        raise SandboxDigestMismatch(
            f"{field}.digest: states {content.digest}, the bytes are {actual}", field=f"{field}.digest"
        )


EXPIRY_SLACK_SECONDS = 30.0
"""How far past the asked lifetime a snapshot's ``expires_at`` may fall before it is refused: room for a
provider's clock running a little ahead of the runner's. Never any room below the runner's now."""


def check_expiry(expires_at: str | None, *, now: float, keep_seconds: int | None) -> float | None:
    """A snapshot's stated expiry, as seconds since the epoch (``None``: kept until deleted).

    ``now`` is the runner's clock when the answer arrived; the provider's own clock read the request
    before that, so an honest expiry is at most ``now + keep_seconds`` (plus ``EXPIRY_SLACK_SECONDS``).

    Raises:
        SandboxResultInvalid: (field ``expires_at``) the snapshot has expired already, or it is kept
            longer than asked, or for ever although a lifetime was asked.
    """
    if expires_at is None:
        if keep_seconds is not None:
            raise SandboxResultInvalid(
                f"expires_at: null (kept until deleted), but the runner asked to keep it {keep_seconds} s at most",
                field="expires_at",
            )
        return None
    at = parse_timestamp(expires_at)
    if at <= now:
        raise SandboxResultInvalid(
            f"expires_at: {expires_at} is not after now ({format_timestamp(now)}): the snapshot would be gone already",
            field="expires_at",
        )
    if keep_seconds is not None and at > now + keep_seconds + EXPIRY_SLACK_SECONDS:
        raise SandboxResultInvalid(
            f"expires_at: {expires_at} is later than the {keep_seconds} s asked "
            f"(by {format_timestamp(now + keep_seconds)})",
            field="expires_at",
        )
    return at
