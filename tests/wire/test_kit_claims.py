"""What the author kit states that a stranger once had to guess, held to the code that does it.

A provider written from the kit alone (``examples/provider-node``) listed what the kit left
unsaid or said wrongly: the field of a frame's JSON fault, the code of a fault inside a frame,
the field an ``if``/``then`` refusal names, which patterns are the path rule, each message's
code, what each member must do, the OpenAPI document, the plane route. The kit now states each;
these tests hold every statement to what the runner's decoders, its service and its Run do, so
the statement cannot drift from the behaviour.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import re
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_kit import INDEX, INVALID, KIT, README, TYPES, EcmaValidator, decode_vector, raw_of
from wire_rig import Driven, Service

from checkfu.contract import ERROR_CLASSES, SandboxError
from checkfu.contract import examples as ex
from checkfu.contract.codec import MAX_DOCUMENT_BYTES, build
from checkfu.contract.frames import FRAME_TYPES, parse
from checkfu.contract.members import ActivateRequest, WriteFileRequest
from checkfu.contract.model import Model
from checkfu.contract.mounts import PATH_RULE, MountFile, MountPlan
from checkfu.contract.paths import MAX_PATH_BYTES
from checkfu.core.job import TIMEOUT_EXIT
from checkfu.core.session import Limits
from checkfu.testing import MemoryProvider, Requests
from checkfu.wire.credentials import OPERATION_SECRET
from checkfu.wire.files import REQUEST_HEADER
from checkfu.wire.kit import (
    FRAME_MESSAGES,
    clause_fields,
    largest_request_header,
    message_code,
    object_codes,
    request_header,
)
from checkfu.wire.limits import RequestLimits
from checkfu.wire.openapi import openapi_document

PATH = "SandboxPathRejected"
PROTO = "SandboxProtocolViolation"
WRITE_FILE: dict[str, Any] = KIT["vectors/WriteFileRequest/valid-0.json"]["document"]


def section(title: str) -> str:
    """The README's section under ``title`` (a heading line), up to the next heading of its level or above."""
    level = title.split(" ", 1)[0]
    body = README.split(f"\n{title}\n", 1)[1]
    stops = [f"\n{'#' * n} " for n in range(1, len(level) + 1)]
    end = min((body.find(s) for s in stops if s in body), default=len(body))
    return body[:end]


def flat(text: str) -> str:
    """Markdown with its line breaks and indentation folded into single spaces."""
    return re.sub(r"\s+", " ", text)


# 1. frames: the field of a JSON fault, of a frame that is not an object ---------------------------

FRAME_VECTORS = [p for p in INVALID if KIT[p]["message"] in FRAME_MESSAGES]


def test_the_readme_states_the_frames_field_rule() -> None:
    text = flat(section("### Frames"))
    for words in (
        "every fault is `SandboxProtocolViolation`, never another code",
        "`frame`: the text breaks a JSON text rule",
        "`type`: the frame is not a JSON object, has no `type`",
        "A binary frame that is empty or has an unknown tag is field `frame`",
    ):
        assert words in text, words
    step1 = flat(section("## Step 1: the JSON text rules"))
    assert "a text frame, with `SandboxProtocolViolation`, field `frame`" in step1
    assert "an `openProcess` text frame names `frame` for a JSON text rule and `type` for a frame that is not" in flat(
        README
    )
    assert "`null` when the document as a whole is at fault" not in README


@pytest.mark.parametrize("path", FRAME_VECTORS)
def test_every_frame_vector_follows_the_readmes_frame_rule(path: str) -> None:
    vector = KIT[path]
    assert vector["expect"]["code"] == PROTO
    if vector["refused_by"] == "json":
        assert vector["expect"]["field"] == "frame"
    document = vector.get("document")
    if "document" in vector and (not isinstance(document, dict) or "type" not in document):
        assert vector["expect"]["field"] == "type"


def test_a_path_inside_a_frame_is_the_frames_fault() -> None:
    # What the README says of frames, which no vector shows: the path rule's code stays outside them.
    start = ex.client_frames()[0][1]
    assert start["type"] == "start"
    for cwd in ("tmp", "/a/../b", "/" + "a" * MAX_PATH_BYTES):
        frame = json.loads(json.dumps(start))
        frame["request"]["cwd"] = cwd
        with pytest.raises(SandboxError) as info:
            parse(json.dumps(frame), "client")
        assert (info.value.code, info.value.field) == (PROTO, "request.cwd")
    for raw, field in ((b"", "frame"), (b"\x09", "frame"), (b"\x02out", "out")):
        with pytest.raises(SandboxError) as info:
            parse(raw, "client")
        assert (info.value.code, info.value.field) == (PROTO, field)


# 2. the code table: no "wherever they sit" for an object inside a frame ---------------------------


def test_no_object_code_claims_a_place_inside_a_frame() -> None:
    codes = INDEX["object_codes"]
    assert codes == object_codes()
    assert "ProcessStarted" not in codes  # inside a server start frame it is the frame's fault
    for name, entry in INDEX["messages"].items():
        if name in FRAME_MESSAGES:
            continue
        for title in KIT[entry["schema"]].get("$defs", {}):
            if title in codes:
                assert re.search(rf"^\| `{title}` \| `{codes[title]}` \| .*`{name}`", README, re.M), (title, name)
    assert "wherever they sit" not in README


def test_every_object_code_is_the_decoders() -> None:
    owners: dict[str, type[Model]] = {}

    def walk(model: type[Model]) -> None:
        for info in model.model_fields.values():
            for arg in (info.annotation, *getattr(info.annotation, "__args__", ())):
                for inner in (arg, *getattr(arg, "__args__", ())):
                    if isinstance(inner, type) and issubclass(inner, Model) and inner.__name__ not in owners:
                        owners[inner.__name__] = inner
                        walk(inner)

    for model in TYPES.values():
        walk(model)
    expected = {n: m.decode_error.code for n, m in owners.items() if m.decode_error is not Model.decode_error}
    assert INDEX["object_codes"] == dict(sorted(expected.items()))


# 3. if/then: the field a refusal names is in the clause's $comment ---------------------------------


def _clauses(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if "if" in node and "$comment" in node:
            yield node
        for value in node.values():
            yield from _clauses(value)
    elif isinstance(node, list):
        for value in node:
            yield from _clauses(value)


def _without_clauses(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_clauses(v) for k, v in node.items() if k != "allOf"}
    if isinstance(node, list):
        return [_without_clauses(v) for v in node]
    return node


def _at(document: Any, parts: list[str]) -> Any:
    for part in parts:
        document = document[int(part)] if isinstance(document, list) else document[part]
    return document


def clause_only_vectors() -> list[str]:
    """Schema vectors that only an ``if``/``then`` clause refuses: without every clause the schema accepts them."""
    out = []
    for path in INVALID:
        vector = KIT[path]
        if vector["refused_by"] != "schema":
            continue
        schema = KIT[INDEX["messages"][vector["message"]]["schema"]]
        if not list(_clauses(schema)):
            continue
        if EcmaValidator(_without_clauses(schema)).is_valid(vector["document"]):
            out.append(path)
    return out


CLAUSE_VECTORS = clause_only_vectors()


def test_every_clause_names_its_field() -> None:
    seen = 0
    for path in [p for p in KIT if p.startswith("schemas/")]:
        for clause in _clauses(KIT[path]):
            assert clause_fields(clause), clause["$comment"]
            seen += 1
    assert seen >= 8
    assert len(CLAUSE_VECTORS) >= 12


@pytest.mark.parametrize("path", CLAUSE_VECTORS)
def test_a_clause_vector_names_a_field_its_clause_lists(path: str) -> None:
    vector = KIT[path]
    schema = KIT[INDEX["messages"][vector["message"]]["schema"]]
    field = vector["expect"]["field"]
    parts = field.split(".")
    named = []
    for clause in _clauses(schema):
        for listed in clause_fields(clause):
            tail = listed.split(".")
            if parts[-len(tail) :] != tail:
                continue
            owner = _at(vector["document"], parts[: -len(tail)])
            alone = EcmaValidator({"$defs": schema.get("$defs", {}), "allOf": [clause]})
            if not alone.is_valid(owner):
                named.append(listed)
    assert named, f"{path}: no clause that fails names {field}"


def test_the_readme_gives_the_if_side_field_next_to_each_rule() -> None:
    rules = section("### The capability envelope's cross-field rules")
    for n, field in {
        2: "retention_modes",
        3: "snapshot_custody",
        6: "egress_certification",
        8: "lifecycle_assurances.enumerates_allocations",
    }.items():
        line = next(line for line in rules.splitlines() if line.startswith(f"{n}. "))
        assert f"refused with field `{field}` (the `if` side's field" in line, line
    for n, field in {1: "fixed_base_images", 7: "lifecycle_assurances.release_destroys"}.items():
        line = next(line for line in rules.splitlines() if line.startswith(f"{n}. "))
        assert f"refused with field `{field}`" in line and "`if` side" not in line, line


# 4. the path rule's mark, and a path over maxLength ------------------------------------------------


def test_a_path_over_max_length_in_characters_is_the_path_rule() -> None:
    for name, field in (("WriteFileRequest", "path"), ("MountPlan", "files.0.path")):
        vector = KIT[f"vectors/{name}/invalid-path-over-4096-characters.json"]
        assert vector["refused_by"] == "schema"
        assert vector["expect"] == {"code": PATH, "field": field}
        value = _at(vector["document"], field.split("."))
        assert len(value) == MAX_PATH_BYTES + 1 == len(value.encode())
    text = flat(section("## Step 2: the schema"))
    assert f"a `$comment` that begins `{PATH_RULE}:`" in text
    assert "a path over `maxLength` in characters is refused as the path rule (`SandboxPathRejected`" in text


# 5. each message's code, in index.json -------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(INDEX["messages"]))
def test_every_message_names_its_code(name: str) -> None:
    entry = INDEX["messages"][name]
    assert entry["code"] == message_code(name) in ERROR_CLASSES
    if name in FRAME_MESSAGES:
        assert entry["code"] == PROTO
    else:
        assert entry["code"] == TYPES[name].decode_error.code
    assert re.search(rf"^\| `{entry['code']}` \| .*`{name}`", README, re.M), name
    # A decode failure of the message with no object inside to own another code reports it.
    not_json = KIT[f"vectors/{name}/invalid-not-json.json"]
    with pytest.raises(SandboxError) as info:
        decode_vector(name, raw_of(not_json))
    assert info.value.code == entry["code"]


def _code_by_the_readme(name: str, document: Any, field: str | None) -> str | None:
    """The code the README's three steps give a schema fault at ``field`` (None: a path-rule fault, unknown here)."""
    if name in FRAME_MESSAGES:
        return PROTO
    schema = KIT[INDEX["messages"][name]["schema"]]
    code = INDEX["messages"][name]["code"]
    if field is None:
        return code
    node: Any = schema
    value: Any = document
    for part in field.split(".")[:-1]:
        node = _resolve(schema, node)
        if isinstance(value, list):
            node, value = node.get("items", {}), value[int(part)]
        else:
            props = node.get("properties", {})
            node = props.get(part) or node.get("additionalProperties") or {}
            value = value[part]
        title = _resolve(schema, node).get("title")
        if title in INDEX["object_codes"]:
            code = INDEX["object_codes"][title]
    return code


def _resolve(root: dict[str, Any], node: Any) -> dict[str, Any]:
    while isinstance(node, dict) and ("$ref" in node or "anyOf" in node):
        if "$ref" in node:
            node = root["$defs"][node["$ref"].rsplit("/", 1)[1]]
        else:
            node = next(n for n in node["anyOf"] if n.get("type") != "null")
    return node if isinstance(node, dict) else {}


SCHEMA_VECTORS = [p for p in INVALID if KIT[p]["refused_by"] in ("schema", "json")]


@pytest.mark.parametrize("path", SCHEMA_VECTORS)
def test_every_schema_fault_has_the_code_the_readme_gives(path: str) -> None:
    vector = KIT[path]
    expect = vector["expect"]
    if expect["code"] == PATH and vector["message"] not in FRAME_MESSAGES:
        return  # the path rule comes first; test_kit_patterns holds its marks, Ajv its failures
    if path in CLAUSE_VECTORS:
        return  # the clause's object's own code, which the clause tests hold
    assert expect["code"] == _code_by_the_readme(vector["message"], vector.get("document"), expect["field"]), path


# 6. what each member must do -----------------------------------------------------------------------


def test_the_readme_says_what_each_member_must_do() -> None:
    text = flat(section("## What each member must do"))
    for words in (
        "a request naming another target is refused with `SandboxIdentityMismatch`, field `target`",
        "each planned file once, at its mount's `target` + `/` + the file's `path`",
        "all of them before it calls `activate`",
        "A process killed by signal N exits **128 + N**",
        f"`timed_out: true`, with `exit_code` **{TIMEOUT_EXIT}**",
        f"The runner reports a timed-out command as exit {TIMEOUT_EXIT} whatever `exit_code` says",
        "`max_output_bytes` caps **each** stream separately",
        "drop the rest, and set `stdout_truncated` or `stderr_truncated`",
        f"By default it asks for at most {Limits().max_output_bytes >> 20} MiB per stream",
        "the runner reports `SandboxProviderFailed` naming the code you sent",
        "compensates that allocation key",
        "By default only `SandboxProviderFailed` and `SandboxProviderTimeout` are retryable",
        "It does **not** apply to `writeFile`'s raw body",
        "reads at most `size` + 1 bytes of it",
        "refuses any length but `size` with `SandboxDigestMismatch`, field `size`",
        f"The longest `{REQUEST_HEADER}` header the runner can send is {largest_request_header()} bytes",
        "Accept at least 32 KiB of header",
        f"refuses a head (the request line and every header line) over {RequestLimits().head_bytes >> 10} KiB or "
        f"with over {RequestLimits().header_lines} header lines with `431`",
        f"one not complete {RequestLimits().head_seconds:g} s after its first byte with `408`",
        f"closes a connection whose body pauses for {RequestLimits().idle_seconds:g} s",
        "does not read `Content-Type`",
        "Enrollment **issues a new credential**",
        "restarting it with it",
        "carries **no plane route**",
        "A provider at network `none` offers none (loopback only) and is conformant",
    ):
        assert words in text, words
    assert TIMEOUT_EXIT == 124
    assert {c for c, cls in ERROR_CLASSES.items() if cls.default_retryable} == {
        "SandboxProviderFailed",
        "SandboxProviderTimeout",
    }


def test_the_in_tree_providers_refuse_another_target_as_the_readme_says() -> None:
    memory = MemoryProvider()
    other = memory.target.model_copy(update={"provider_revision": "another revision"})
    request = Requests(other).materialize()

    async def call() -> None:
        await memory.materialize(request)

    with pytest.raises(SandboxError) as info:
        asyncio.run(call())
    assert (info.value.code, info.value.field) == ("SandboxIdentityMismatch", "target")


def test_the_largest_request_header_is_the_largest() -> None:
    largest = largest_request_header()
    assert largest < 32 << 10  # what the README asks a provider to accept
    for path in [p for p in KIT if p.startswith("vectors/WriteFileRequest/valid-")]:
        request = build(WriteFileRequest, **KIT[path]["document"])
        assert len(request_header(request)) < largest
    near = build(WriteFileRequest, **{**WRITE_FILE, "path": "/" + "\x1f" * (MAX_PATH_BYTES - 1)})
    assert len(request_header(near)) > MAX_PATH_BYTES * 5
    assert request_header(near).isascii()


# 7. the OpenAPI document, and what the runner's own service does -------------------------------------


def test_the_kit_holds_the_openapi_document_the_service_serves(serve: Callable[..., Service]) -> None:
    assert INDEX["openapi"] == "openapi.json"
    assert KIT["openapi.json"] == openapi_document()
    assert KIT["openapi.json"]["openapi"].startswith("3.1")
    service = serve(MemoryProvider())
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
    try:
        conn.request("GET", "/openapi.json")  # no credential
        answer = conn.getresponse()
        assert answer.status == 200
        assert json.loads(answer.read()) == KIT["openapi.json"]
    finally:
        conn.close()
    text = flat(README)
    assert "answers `GET <base>/openapi.json` with the OpenAPI 3.1 document of the service" in text
    assert "**without** a credential" in text


def _post(service: Service, member: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=60)
    try:
        conn.request(
            "POST", f"/v1/{member}", body=body, headers={"authorization": f"Bearer {service.secret}", **headers}
        )
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


def test_the_readme_and_the_openapi_document_say_an_operation_belongs_to_its_starter() -> None:
    text = flat(README)
    for words in (
        "An operation belongs to the client that started it.",
        f"sends it as the `{OPERATION_SECRET}` header (22 to 128 base64url characters)",
        "answer a `start` for a known `operation_id` that comes with another secret, or none, exactly as you "
        "answer a reattach to an id you never saw: `SandboxNotFound`, field `operation_id`",
        "An operation started without the header (a client older than it) belongs to nobody: no connection may "
        "reattach to it.",
    ):
        assert words in text, words
    (header,) = KIT["openapi.json"]["paths"]["/v1/openProcess"]["get"]["parameters"]
    assert (header["name"], header["in"], header["required"]) == (OPERATION_SECRET, "header", False)
    pattern = re.compile(header["schema"]["pattern"])
    assert pattern.fullmatch(secrets.token_urlsafe(32)) and not pattern.fullmatch("too-short")


def test_the_service_reads_no_content_type_takes_the_largest_header_and_bounds_the_head(
    serve: Callable[..., Service],
) -> None:
    memory = MemoryProvider()
    service = serve(memory)
    status, body = _post(service, "describe", b"{}", {"content-type": "text/plain"})
    assert status == 200 and "envelope" in body
    # The largest header the runner sends, and then some (JSON allows spaces): it reaches the provider,
    # which has no such instance. Padded past the head's bound, it is refused before the credential is read.
    request = build(
        WriteFileRequest,
        **{**WRITE_FILE, "target": memory.target, "path": "/work/" + "\x01" * (MAX_PATH_BYTES - 6)},
    )
    header = request_header(request)
    assert len(header) > 24 << 10
    limits = RequestLimits()
    for padded, answer in (
        (header, (404, "SandboxNotFound", "instance_id")),
        (header + " " * (limits.head_bytes // 2 - 4096 - len(header)), (404, "SandboxNotFound", "instance_id")),
        (header + " " * limits.head_bytes, (431, "SandboxProtocolViolation", "headers")),
    ):
        status, body = _post(
            service, "writeFile", b"x" * request.size, {REQUEST_HEADER: padded, "content-type": "text/plain"}
        )
        assert (status, body["error"]["code"], body["error"].get("field")) == answer, body


@pytest.mark.anyio
async def test_a_write_file_body_is_bounded_by_its_size_not_the_document_limit(
    memory_wire: tuple[MemoryProvider, Driven],
) -> None:
    _, driven = memory_wire
    r = driven.requests
    big = b"\x5a" * (MAX_DOCUMENT_BYTES + 1)
    digest = "sha256:" + hashlib.sha256(big).hexdigest()
    plan = MountPlan(target="/work", files=(MountFile(path="big", size=len(big), digest=digest),))
    image = (await driven.remote.materialize(r.materialize())).image
    inst = await driven.remote.provision(r.provision("ak-big-body", image, [plan]))
    driven.instances.append(inst)
    request = WriteFileRequest(**r.on(inst), path="/work/big", size=len(big), digest=digest)
    written = await driven.remote.write_file(request, big)  # the runner's own client sends it as it is
    assert written.size == len(big)
    # Up to one byte past the stated size reaches the provider; more is refused before it.
    abc = "sha256:" + hashlib.sha256(b"abc").hexdigest()
    small = request_header(WriteFileRequest(**r.on(inst), path="/work/small", size=3, digest=abc))
    for body, answer in (
        (b"ab", (422, "SandboxDigestMismatch", "size")),
        (b"abcd", (422, "SandboxDigestMismatch", "size")),
        (b"abcde", (400, PROTO, "body")),
    ):
        status, error = _post(
            driven.service, "writeFile", body, {REQUEST_HEADER: small, "content-type": "application/octet-stream"}
        )
        assert (status, error["error"]["code"], error["error"]["field"]) == answer, body
    await driven.remote.activate(ActivateRequest(**r.on(inst)))
    ran = await driven.remote.exec(r.exec(inst, "sha256sum", "/work/big"))
    assert digest.removeprefix("sha256:").encode() in ran.stdout


# 8. the plane route ----------------------------------------------------------------------------------


def test_no_message_carries_a_plane_route() -> None:
    # The README says this version carries none: no field of any message or frame names one.
    for path in [p for p in KIT if p.startswith("schemas/")]:
        text = json.dumps(KIT[path]).lower()
        for word in ("plane", "gateway", "proxy"):
            assert word not in text, (path, word)
    assert FRAME_TYPES
