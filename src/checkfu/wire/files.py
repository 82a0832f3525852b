"""How ``writeFile`` and ``readFiles`` carry raw bytes over HTTP, with no base64.

``writeFile``: the body is the file's bytes; the ``WriteFileRequest`` (path,
mode, size, digest and the echoes) travels as ASCII JSON in the
``Checkfu-Request`` header.

``readFiles``: the response (``application/x-checkfu-files``) is one line of
JSON, a ``ReadFilesHead`` that lists each file's path, mode, digest and size,
followed by each file's bytes in that order, exactly ``size`` of them, and
nothing after. The receiver rebuilds the ``ReadFilesResult`` and checks every
digest as it always does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from pydantic import Field, Strict

from checkfu.contract.codec import decode
from checkfu.contract.errors import SandboxProtocolViolation, SandboxResultInvalid
from checkfu.contract.members import FileContent, ReadFilesResult, Result, ResultPath
from checkfu.contract.model import Identifier, Model, NonNegInt, Sha256Digest
from checkfu.contract.target import AllocationKey

REQUEST_HEADER = "Checkfu-Request"
FILES_MEDIA_TYPE = "application/x-checkfu-files"
MAX_HEAD_BYTES = 16 << 20


class FileHead(Model):
    path: ResultPath
    mode: Annotated[int, Strict(), Field(ge=0, le=0o7777)]
    digest: Sha256Digest
    size: NonNegInt


class ReadFilesHead(Result):
    """The first line of a ``readFiles`` response: everything but the bytes."""

    allocation_key: AllocationKey
    instance_id: Identifier
    files: tuple[FileHead, ...]
    missing: tuple[ResultPath, ...] = Field(default=(), description="asked-for paths that do not exist")


def head_of(result: ReadFilesResult) -> ReadFilesHead:
    return ReadFilesHead(
        target=result.target,
        lease=result.lease,
        allocation_key=result.allocation_key,
        instance_id=result.instance_id,
        files=tuple(FileHead(path=f.path, mode=f.mode, digest=f.digest, size=len(f.data)) for f in result.files),
        missing=result.missing,
    )


async def stream_files(result: ReadFilesResult) -> AsyncIterator[bytes]:
    """The body of a ``readFiles`` response."""
    yield head_of(result).model_dump_json().encode() + b"\n"
    for f in result.files:
        yield f.data


async def read_files_body(chunks: AsyncIterator[bytes], max_bytes: int) -> ReadFilesResult:
    """Rebuild a ``ReadFilesResult`` from a streamed body, reading no more than the head and ``max_bytes``.

    Raises:
        SandboxResultInvalid: the head does not decode, or the files together exceed ``max_bytes``.
        SandboxProtocolViolation: the body is cut short, or goes on after the last file.
    """
    buf = bytearray()
    head: ReadFilesHead | None = None
    want = 0
    async for chunk in chunks:
        buf += chunk
        if head is None:
            end = buf.find(b"\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise SandboxProtocolViolation("readFiles: the head line is too long", field="files")
                continue
            head = decode(ReadFilesHead, bytes(buf[:end]))
            want = sum(f.size for f in head.files)
            if want > max_bytes:
                raise SandboxResultInvalid(
                    f"readFiles: the files hold {want} bytes, over the {max_bytes} asked for", field="files"
                )
            del buf[: end + 1]
        if len(buf) > want:
            raise SandboxProtocolViolation("readFiles: the body goes on after the last file", field="files")
    if head is None:
        raise SandboxProtocolViolation("readFiles: the body ended before its head", field="files")
    if len(buf) != want:
        raise SandboxProtocolViolation(f"readFiles: the body holds {len(buf)} of {want} bytes", field="files")
    files = []
    at = 0
    for f in head.files:
        files.append(FileContent(path=f.path, mode=f.mode, digest=f.digest, data=bytes(buf[at : at + f.size])))
        at += f.size
    return ReadFilesResult(
        target=head.target,
        lease=head.lease,
        allocation_key=head.allocation_key,
        instance_id=head.instance_id,
        files=tuple(files),
        missing=head.missing,
    )


__all__ = [
    "FILES_MEDIA_TYPE",
    "REQUEST_HEADER",
    "FileHead",
    "ReadFilesHead",
    "head_of",
    "read_files_body",
    "stream_files",
]
