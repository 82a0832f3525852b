"""The decoders a fuzzer drives, each as ``target(data: bytes) -> None``, shared by hypothesis and atheris.

Each target hands bytes to the same function the product uses on bytes from outside: a file a person
names, a body a provider service answers, a frame a peer sends. The property is the same for all:
a target returns, or raises a member of the closed vocabulary (``checkfu.contract.errors``); any
other exception is a finding. ``check`` applies it.

Targets (the corpus of each is ``corpus/<name>/``):

- ``envelope``: a provider's ``describe`` envelope, as ``decode`` reads it off the wire.
- ``profile-json``, ``profile-toml``: a profile file as ``checkfu run --profile`` and ``checkfu profile
  check`` read it.
- ``results``: the answer to each of the seventeen members as the wire client decodes it: the first byte
  picks the member and whether the answer is a 200 (the result) or an error status (the wire error);
  ``readFiles`` goes through its streamed body, split into chunks where the data says.
- ``frames``: ``openProcess`` WebSocket messages, text and binary, from either side, received by a
  channel that has started, in sequence.
- ``http-answer``: the bytes on the socket of a service answering a member over HTTP/1.1 (the status line,
  headers, chunked or sized framing and the body), read by the wire client's own pool and decoded.
- ``adapters``: an adapters file (``--adapters``).
- ``evidence``: an evidence file, as ``checkfu provider enroll`` checks it against a key.
- ``evidence-statement``: the Statement inside the DSSE envelope, signed with the key checked against,
  so that what comes after the signature check is fuzzed too.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from functools import cache
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib.dsse import Envelope
from securesystemslib.signer import CryptoSigner

from checkfu.conformance.evidence import PAYLOAD_TYPE, _sslib_key, sign
from checkfu.conformance.suite import Report
from checkfu.contract import examples as ex
from checkfu.contract.codec import decode, digest
from checkfu.contract.envelope import MEMBERS, SandboxProviderCapabilities
from checkfu.contract.errors import ERROR_CLASSES, SandboxError
from checkfu.contract.frames import ProcessChannel, StartFrame
from checkfu.contract.members import MESSAGES, OpenProcessRequest
from checkfu.contract.profile import SandboxProfile
from checkfu.control.enrollment import check_evidence
from checkfu.core.files import decode_document
from checkfu.core.registry import Adapter, decode_adapters
from checkfu.testing import MemoryProvider
from checkfu.wire.client import RemoteProvider, decode_answer
from checkfu.wire.files import FILES_MEDIA_TYPE, read_files_body
from checkfu.wire.http import MAX_HEAD, _Conn

VOCABULARY = frozenset(ERROR_CLASSES.values())

Target = Callable[[bytes], None]


def check(target: Target, data: bytes) -> None:
    """Run ``target`` on ``data``; a vocabulary error is an answer, anything else escapes as the finding."""
    try:
        target(data)
    except SandboxError as exc:
        if type(exc) not in VOCABULARY or not exc.message:
            raise AssertionError(f"{type(exc).__name__} is not a well-formed vocabulary error: {exc!r}") from exc


# the targets ------------------------------------------------------------------------------------


def envelope(data: bytes) -> None:
    decode(SandboxProviderCapabilities, data)


def profile_json(data: bytes) -> None:
    decode_document(SandboxProfile, data, Path("profile.json"))


def profile_toml(data: bytes) -> None:
    decode_document(SandboxProfile, data, Path("profile.toml"))


RESULT_OF = [(member, MESSAGES[member][1]) for member in MEMBERS]
"""Each member with the result its answer decodes to (in the contract's order)."""


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def _split(body: bytes, cuts: int) -> list[bytes]:
    """``body`` in pieces: cut where ``cuts`` (a byte) says, so a fuzzer controls chunk boundaries."""
    if not body or cuts == 0:
        return [body]
    step = max(1, len(body) // (cuts % 7 + 1))
    return [body[at : at + step] for at in range(0, len(body), step)]


def results(data: bytes) -> None:
    if len(data) < 2:
        return
    member, model = RESULT_OF[data[0] % len(RESULT_OF)]
    status = 200 if data[0] < 128 else (400, 404, 409, 500, 502)[data[1] % 5]
    body = data[2:]
    if member == "readFiles" and status == 200:
        asyncio.run(read_files_body(_chunks(_split(body, data[1])), max_bytes=1 << 20))
        return
    decode_answer(member, model, status, body)


@cache
def _process_request() -> OpenProcessRequest:
    return OpenProcessRequest(**ex.messages()["OpenProcessRequest"][0])


def _started_channel() -> ProcessChannel:
    channel = ProcessChannel("client")
    request = _process_request()
    channel.send(StartFrame(type="start", operation_id="op-1", request=request, window=1 << 20))
    return channel


def frames(data: bytes) -> None:
    """Messages separated by ``\\x00\\xff``; a message starting ``\\x01`` is binary (the rest), else text."""
    if not data:
        return
    role_is_server = data[0] & 1
    channel = ProcessChannel("server") if role_is_server else _started_channel()
    for message in data[1:].split(b"\x00\xff"):
        if message[:1] == b"\x01":
            channel.receive(message[1:])
        else:
            channel.receive(message.decode("utf-8", "surrogateescape"))


class _Unplugged:
    """The pool's end of a socket whose far end already said everything: writes go nowhere."""

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


HTTP_MEMBERS = [m for m in MEMBERS if m not in ("describe", "openProcess")]
"""Members the client asks over plain HTTP with a request (``openProcess`` is the frames target's)."""


def _snake(member: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in member)


@cache
def _example_request(member: str) -> Any:
    model = MESSAGES[member][0]
    return model(**ex.messages()[model.__name__][0])


async def _http_answer(member: str, answer: bytes) -> None:
    remote = RemoteProvider("http://127.0.0.1:9", "wire-secret-fuzz")
    pool = remote._http()

    async def connected() -> _Conn:
        reader = asyncio.StreamReader(limit=MAX_HEAD)
        reader.feed_data(answer)
        reader.feed_eof()
        return _Conn(reader, _Unplugged())  # type: ignore[arg-type]

    pool._open = connected  # type: ignore[method-assign]
    call = getattr(remote, _snake(member))
    try:
        if member == "writeFile":
            await call(_example_request(member), ex.HELLO)
        else:
            await call(_example_request(member))
    finally:
        await remote.aclose()


def http_answer(data: bytes) -> None:
    """The raw bytes a service answers on the socket (status line, headers, framing, body) to one member."""
    if not data:
        return
    asyncio.run(_http_answer(HTTP_MEMBERS[data[0] % len(HTTP_MEMBERS)], data[1:]))


def adapters(data: bytes) -> None:
    decode_adapters(data, "adapters.toml")


@cache
def _evidence_rig() -> tuple[Ed25519PrivateKey, Adapter]:
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    memory = MemoryProvider()
    return key, Adapter(envelope=memory.envelope, provider=memory, source="fuzz", in_tree=False)


def evidence(data: bytes) -> None:
    key, adapter = _evidence_rig()
    check_evidence(adapter, data, key.public_key())


def signed(payload: bytes) -> bytes:
    """A DSSE envelope of ``payload``, signed with the evidence rig's key."""
    key, _ = _evidence_rig()
    env = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    env.sign(CryptoSigner(key, _sslib_key(key.public_key())))
    return json.dumps(env.to_dict()).encode()


def evidence_statement(data: bytes) -> None:
    evidence(signed(data))


TARGETS: dict[str, Target] = {
    "envelope": envelope,
    "profile-json": profile_json,
    "profile-toml": profile_toml,
    "results": results,
    "frames": frames,
    "http-answer": http_answer,
    "adapters": adapters,
    "evidence": evidence,
    "evidence-statement": evidence_statement,
}


# seeds: one valid input (or a few) per target, the start of each corpus --------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def toml_of(doc: dict[str, Any]) -> bytes:
    """A flat TOML rendering of ``doc`` (tables inline), enough for seeds."""
    return "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in doc.items() if v is not None).encode()


def answer_body(member: str) -> bytes:
    return json.dumps(ex.messages()[MESSAGES[member][1].__name__][0]).encode()


def _http(status: int, body: bytes, *, chunked: bool, kind: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\n"
    if chunked:
        half = len(body) // 2
        framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:half], body[half:]) if p) + b"0\r\n\r\n"
        return (head + "transfer-encoding: chunked\r\n\r\n").encode() + framed
    return (head + f"content-length: {len(body)}\r\n\r\n").encode() + body


def _evidence_seed() -> bytes:
    key, adapter = _evidence_rig()
    report = Report(target="fuzz", envelope=adapter.envelope, cases=[], started_at=0.0, finished_at=1.0)
    assert digest(adapter.envelope) == report.envelope_digest
    return json.dumps(sign(report, key)).encode()


def seeds() -> dict[str, list[bytes]]:
    messages = ex.messages()
    envelopes = [json.dumps(make()).encode() for make in ex.ENVELOPE_EXAMPLES.values()]
    profiles = [ex.profile(), ex.minimal_profile(), ex.allowlist_profile()]
    answers: list[bytes] = []
    for i, (member, model) in enumerate(RESULT_OF):
        for doc in messages.get(model.__name__, [])[:2] if member != "readFiles" else []:
            answers.append(bytes((i, 0)) + json.dumps(doc).encode())
    answers.append(bytes((128, 3)) + json.dumps(ex.wire_error()).encode())
    files = json.dumps(ex.read_files_head()).encode() + b"\n" + ex.HELLO
    answers.append(bytes((MEMBERS.index("readFiles"), 3)) + files)
    server = [json.dumps(doc).encode() for _, doc in ex.server_frames()]
    client = [json.dumps(doc).encode() for _, doc in ex.client_frames()]
    evidence_doc = _evidence_seed()
    statement = base64.b64decode(json.loads(evidence_doc)["payload"])
    return {
        "envelope": envelopes,
        "profile-json": [json.dumps(p).encode() for p in profiles],
        "profile-toml": [toml_of(p) for p in profiles],
        "results": answers,
        "frames": [
            b"\x00" + b"\x00\xff".join([server[0], b"\x01\x02hello", *server[1:4]]),
            b"\x01" + b"\x00\xff".join([client[0], *client[2:]]),
        ],
        "http-answer": [
            bytes((HTTP_MEMBERS.index("inspect"),)) + _http(200, answer_body("inspect"), chunked=False),
            bytes((HTTP_MEMBERS.index("exec"),)) + _http(200, answer_body("exec"), chunked=True),
            bytes((HTTP_MEMBERS.index("release"),)) + _http(404, json.dumps(ex.wire_error()).encode(), chunked=False),
            bytes((HTTP_MEMBERS.index("readFiles"),)) + _http(200, files, chunked=True, kind=FILES_MEDIA_TYPE),
        ],
        "adapters": [
            b'[[adapters]]\nfactory = "memory"\n',
            b'[[adapters]]\nfactory = "host-process"\noptions = { cgroups = "off", kill_grace_ms = "500" }\n',
        ],
        "evidence": [evidence_doc],
        "evidence-statement": [statement],
    }
