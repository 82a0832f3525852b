"""What the author kit's README says about conformance, the envelope digest and the eleven questions a stranger had
to guess, held to what the code and its served endpoints really do.

Every answer that names a code, a field, a status or a value is checked against the runner's own service (real
HTTP and WebSockets on loopback) or its own code; the envelope digest is recomputed here from the rule as the README
writes it, by hand, and must give the golden digest.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.client
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

import pytest
from test_kit import KIT, README
from test_kit_claims import flat, section
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from wire_rig import Driven, Service, host_profile

from checkfu.conformance.author_kit import DEFAULT_PATH, FEATURES
from checkfu.conformance.cases import CASES, ITEMS, NOT_EXERCISED
from checkfu.conformance.evidence import statement
from checkfu.conformance.suite import SUITE_VERSION, Report
from checkfu.contract import examples as ex
from checkfu.contract.codec import decode_value, digest
from checkfu.contract.deadlines import DEFAULT_DEADLINES
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import (
    SandboxCapabilityUnavailable,
    SandboxOperationUnsupported,
    SandboxPathRejected,
    SandboxProviderTimeout,
)
from checkfu.contract.members import ActivateRequest, ExecRequest, OpenProcessRequest
from checkfu.contract.process import ProcessExit
from checkfu.contract.requirements import require_capabilities
from checkfu.contract.tiers import assess
from checkfu.core.session import SessionCore
from checkfu.providers.host_process import HostProcessProvider
from checkfu.providers.host_process.spawning import BASE_PATH
from checkfu.testing import MemoryProvider, Requests, day_one_envelope, memory_envelope, memory_profile
from checkfu.testing.memory import AMD64, TEST_LEASE
from checkfu.testing.served import serve_in_thread
from checkfu.wire.client import REATTACH_PAUSE
from checkfu.wire.credentials import OPERATION_SECRET
from checkfu.wire.errors import WireError
from checkfu.wire.server import STDIN_WINDOW

ANSWERS = "## What the contract leaves open, answered"
OPEN_PROCESS_DEADLINE = DEFAULT_DEADLINES["openProcess"]
"""The deadline the README was written with (a test below lowers the live one)."""


def answer(letter: str) -> str:
    (title,) = [line for line in section(ANSWERS).splitlines() if line.startswith(f"### ({letter}) ")]
    return flat(section(title))


def request(service: Service, method: str, path: str, body: bytes = b"", **headers: str) -> tuple[int, Any, Any]:
    """One HTTP request to the service with its credential (unless ``authorization`` is given)."""
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers={"authorization": f"Bearer {service.secret}", **headers})
        answer = conn.getresponse()
        data = answer.read()
        kind = answer.headers.get("content-type", "")
        return answer.status, answer.headers, json.loads(data) if kind.startswith("application/json") else data
    finally:
        conn.close()


def error_of(body: Any) -> tuple[str, str | None]:
    return body["error"]["code"], body["error"].get("field")


# The sections -------------------------------------------------------------------------------------------------


def test_the_readme_answers_all_eleven_questions() -> None:
    headings = [line for line in section(ANSWERS).splitlines() if line.startswith("### (")]
    assert [h[5] for h in headings] == list("abcdefghijk")


def test_the_readme_lists_the_nine_cases_each_check_and_what_turns_it_on() -> None:
    text = section("## Conformance: the nine cases")
    assert SUITE_VERSION in text
    assert len(CASES) == 9
    for case in CASES:
        body = section(f"### Case {case.number}: {case.name}")
        assert ("Runs always." in body) == (case.requires == "-"), case.number
        for check in case.checks:
            assert f"| {check.does} | {check.when} |" in body, (case.number, check.does)
    table = section("### Each optional member and assurance, and the case that exercises it")
    for item in ITEMS:
        (row,) = [line for line in table.splitlines() if line.startswith(f"| `{item}` |")]
        cases = [str(c.number) for c in CASES if item in c.items]
        assert (f"| {', '.join(cases)} |" in row) or (item in NOT_EXERCISED and "| none | not exercised" in row), row


# The envelope digest --------------------------------------------------------------------------------------------

GOLDEN = "sha256:6eaedbd63024928c1f4cec4dc4fe40350db9a07045d6853b0ca09fe47a039213"
"""The digest of ``examples.seed_day_one_envelope()``: a change to the canonical form changes it, on purpose only."""


def by_the_readme(written: dict[str, Any]) -> str:
    """The envelope digest as the README's rule says, by hand: every default it lists, rule 7, JCS, SHA-256."""
    text = section("## The envelope digest")
    defaults: dict[str, Any] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("- `") and "`: `" in line:  # "- `name`: `value`"
            name, value = line[3:].split("`: `", 1)
            defaults[name] = json.loads(value.rstrip("`"))
    assert set(defaults) | {"lifecycle_assurances"} == {
        n for n, f in SandboxProviderCapabilities.model_fields.items() if not f.is_required()
    }
    filled = {**defaults, **written}
    assurances = dict.fromkeys(
        ["release_destroys", "release_idempotent", "reaps_process_tree", "cold_compensation", "enumerates_allocations"],
        False,
    )
    if "ephemeral_zdr" in written["retention_modes"]:
        assurances["release_destroys"] = True  # rule 7, as the README states it
    filled["lifecycle_assurances"] = {**assurances, **written.get("lifecycle_assurances", {})}
    # RFC 8785 of ASCII strings, integers and booleans: sorted keys, no whitespace.
    canonical = json.dumps(filled, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def test_the_envelope_digest_recomputed_from_the_documented_rule_is_the_golden_one() -> None:
    written = ex.seed_day_one_envelope()
    assert by_the_readme(written) == GOLDEN
    assert digest(decode_value(SandboxProviderCapabilities, written)) == GOLDEN  # what evidence binds to
    example = KIT["envelope-digest-example.json"]
    assert example["envelope_as_written"] == written and example["digest"] == GOLDEN
    assert GOLDEN in section("## The envelope digest") and example["canonical"] in README


def test_array_order_is_part_of_the_envelope_digest_as_the_readme_says() -> None:
    written = {**ex.seed_day_one_envelope(), "network_modes": ["none", "allowlist"]}
    swapped = {**written, "network_modes": ["allowlist", "none"]}
    ours = [digest(decode_value(SandboxProviderCapabilities, w)) for w in (written, swapped)]
    assert ours == [by_the_readme(written), by_the_readme(swapped)] and ours[0] != ours[1]
    assert '`["none", "allowlist"]` and `["allowlist", "none"]` are two envelopes' in flat(README)


def test_signed_evidence_binds_to_the_documented_envelope_digest() -> None:
    written = json.loads(memory_envelope().model_dump_json())
    report = Report("memory", memory_envelope(), [], 0.0, 1.0)
    stmt = statement(report)
    assert stmt["predicate"]["envelope_digest"] == by_the_readme(written)
    assert "sha256:" + stmt["subject"][0]["digest"]["sha256"] == by_the_readme(written)


# (a), (b): faults of a nullable field, and integers written as integers, as the service answers them -------------


@pytest.mark.anyio
async def test_a_fault_inside_a_nullable_field_is_named_by_its_plain_path(
    memory_wire: tuple[MemoryProvider, Driven],
) -> None:
    _, driven = memory_wire
    inst = await driven.active()
    r = driven.requests
    exec_doc = json.loads(
        ExecRequest(**r.on(inst), argv=["true"], timeout_ms=1000, max_output_bytes=10).model_dump_json()
    )
    for cwd, expected in (
        ("relative", (422, "SandboxPathRejected", "cwd")),
        (5, (400, "SandboxProtocolViolation", "cwd")),
    ):
        status, _, body = request(driven.service, "POST", "/v1/exec", json.dumps({**exec_doc, "cwd": cwd}).encode())
        assert (status, *error_of(body)) == expected
    snap = {**r.on(inst), "snapshot_allocation_key": "ak-snap", "keep_seconds": 0}
    status, _, body = request(
        driven.service, "POST", "/v1/snapshot", json.dumps(json.loads(json.dumps(snap, default=_plain))).encode()
    )
    assert (status, *error_of(body)) == (400, "SandboxProtocolViolation", "keep_seconds")
    start = {
        "type": "start",
        "operation_id": "op-nullable",
        "request": {
            **json.loads(driven.process_request(inst, "cat").model_dump_json()),
            "tty": {"rows": 0, "cols": 80},
        },
        "window": 1024,
    }
    frame = await _first_frame(driven.service, start)
    assert (frame["error"]["code"], frame["error"]["field"]) == ("SandboxProtocolViolation", "request.tty.rows")
    text = answer("a")
    for words in ("`tty.rows`", "`cwd`", "`keep_seconds`", "`request.tty.rows`", "never by a branch of the `anyOf`"):
        assert words in text


def _plain(value: Any) -> Any:
    return json.loads(value.model_dump_json())


def test_an_integer_written_with_a_fraction_gets_the_code_the_readme_gives(serve: Callable[..., Service]) -> None:
    memory = MemoryProvider()
    service = serve(memory)
    doc = Requests(memory.target).materialize().model_dump_json()
    in_profile = doc.replace('"memory_mib":256', '"memory_mib":256.0')
    in_lease = doc.replace('"lease_epoch":1', '"lease_epoch":1.0')
    assert in_profile != doc and in_lease != doc
    status, _, body = request(service, "POST", "/v1/materialize", in_profile.encode())
    assert (status, *error_of(body)) == (422, "SandboxProfileInvalid", "profile.resource_limits.memory_mib")
    status, _, body = request(service, "POST", "/v1/materialize", in_lease.encode())
    assert (status, *error_of(body)) == (400, "SandboxProtocolViolation", "lease.lease_epoch")
    text = answer("b")
    assert "`SandboxProfileInvalid` (`422`)" in text and "`SandboxProtocolViolation` (`400`)" in text
    rule = flat(section("## Step 3: the rules beyond the schema")).split("**`integers-written-as-integers`**")[1]
    rule = rule.split("**`", 1)[0]
    assert "with the code of the message that owns the field" not in rule
    assert "the innermost object containing the value that owns a code" in rule


# (c) the openProcess deadline --------------------------------------------------------------------------------


class SlowToStart(MemoryProvider):
    async def open_process(self, request: OpenProcessRequest) -> Any:
        await asyncio.sleep(3)
        return await super().open_process(request)


@pytest.mark.anyio
async def test_the_open_process_deadline_bounds_the_start_not_the_process(
    serve: Callable[..., Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(DEFAULT_DEADLINES, "openProcess", 1.0)
    for provider in (MemoryProvider(), SlowToStart()):
        service = serve(provider)
        driven = Driven(service, service.remote(), Requests(provider.target))
        try:
            inst = await driven.active()
            started = time.monotonic()
            if isinstance(provider, SlowToStart):
                with pytest.raises(SandboxProviderTimeout):
                    await driven.remote.open_process(driven.process_request(inst, "sleep", "2"))
                assert time.monotonic() - started < 2.5
                continue
            proc = await driven.remote.open_process(driven.process_request(inst, "sleep", "2"))
            await proc.close_stdin()
            events = [e async for e in proc.events()]
            assert isinstance(events[-1], ProcessExit) and events[-1].exit_code == 0
            assert time.monotonic() - started >= 2.0  # ran twice as long as the deadline, and was not cut
        finally:
            await driven.release_all()
    text = answer("c")
    assert f"What the {OPEN_PROCESS_DEADLINE:g} s `openProcess` deadline bounds" in section(ANSWERS)
    assert "It does **not** bound the process" in text


# (d), (e), (f): the WebSocket, as the service speaks it -------------------------------------------------------


async def _first_frame(service: Service, start: dict[str, Any], **headers: str) -> dict[str, Any]:
    secret = headers.pop("secret", "s" * 30)
    auth = headers.pop("authorization", f"Bearer {service.secret}")
    async with connect(
        service.remote().ws_url(), additional_headers={"authorization": auth, OPERATION_SECRET: secret}
    ) as ws:
        with contextlib.suppress(ConnectionClosed):  # a refusal may come, and the close, before the start is sent
            await ws.send(json.dumps(start))
        frame: dict[str, Any] = json.loads(await ws.recv())
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        frame["close_code"] = ws.close_code
        return frame


@pytest.mark.anyio
async def test_an_error_frame_is_followed_by_close_1000(memory_wire: tuple[MemoryProvider, Driven]) -> None:
    _, driven = memory_wire
    inst = await driven.active()
    start = {
        "type": "start",
        "operation_id": "op-1",
        "request": _plain(driven.process_request(inst, "cat")),
        "window": 1024,
    }
    frame = await _first_frame(driven.service, start, authorization="Bearer wrong")
    assert (frame["type"], frame["error"]["code"], frame["close_code"]) == ("error", "SandboxUnauthenticated", 1000)
    assert answer("d").strip().startswith("`1000`.")


@pytest.mark.anyio
async def test_reattaching_to_an_unknown_operation_is_not_found_and_starts_nothing(
    memory_wire: tuple[MemoryProvider, Driven],
) -> None:
    memory, driven = memory_wire
    inst = await driven.active()
    start = {
        "type": "start",
        "operation_id": "op-never-started",
        "request": _plain(driven.process_request(inst, "cat")),
        "window": 1024,
        "resume": {"out": 0, "err": 0, "ended": []},
    }
    frame = await _first_frame(driven.service, start)
    assert (frame["error"]["code"], frame["error"]["field"], frame["close_code"]) == (
        "SandboxNotFound",
        "operation_id",
        1000,
    )
    assert "openProcess" not in memory.calls
    assert "`SandboxNotFound`, field `operation_id`, then close 1000" in answer("e")


@pytest.mark.anyio
async def test_a_reattach_gets_a_fresh_stdin_grant_and_how_much_stdin_arrived(
    memory_wire: tuple[MemoryProvider, Driven],
) -> None:
    _, driven = memory_wire
    inst = await driven.active()
    secret = secrets.token_urlsafe(24)
    op = f"op-{secrets.token_hex(6)}"
    start = {
        "type": "start",
        "operation_id": op,
        "request": _plain(driven.process_request(inst, "cat")),
        "window": 1 << 20,
    }
    headers = {"authorization": f"Bearer {driven.service.secret}", OPERATION_SECRET: secret}
    sent = b"x" * 5000
    async with connect(driven.remote.ws_url(), additional_headers=headers) as ws:
        await ws.send(json.dumps(start))
        first = json.loads(await ws.recv())
        assert first["type"] == "start" and first["stdin"] == 0 and first["window"] == STDIN_WINDOW
        await ws.send(b"\x01" + sent)
        echoed = b""
        while len(echoed) < len(sent):
            message = await ws.recv()
            if isinstance(message, bytes) and message[:1] == b"\x02":
                echoed += message[1:]
        ws.transport.abort()  # dropped: no close, nothing acknowledged
    async with connect(driven.remote.ws_url(), additional_headers=headers) as ws:
        await ws.send(json.dumps({**start, "resume": {"out": 0, "err": 0, "ended": []}}))
        again = json.loads(await ws.recv())
        assert again["type"] == "start" and again["stdin"] == len(sent)
        assert 1 <= again["window"] <= STDIN_WINDOW  # fresh: the credit of the first connection is gone
        resent = b""
        while len(resent) < len(sent):
            message = await ws.recv()
            if isinstance(message, bytes) and message[:1] == b"\x02":
                resent += message[1:]
        assert resent == sent  # nothing was acknowledged, so all of it again
        await ws.send(json.dumps({"type": "kill"}))
    text = answer("f")
    assert f"grants {STDIN_WINDOW} bytes less the stdin it holds" in text and "none carries over" in text


# (g) cwd and PATH ---------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_without_path_in_env_the_default_path_is_searched_and_a_bad_cwd_is_refused(tmp_path: Any) -> None:
    from checkfu.providers.docker.process import DEFAULT_PATH as DOCKER_PATH  # noqa: PLC0415

    assert DEFAULT_PATH == BASE_PATH == DOCKER_PATH
    provider = HostProcessProvider(state_dir=tmp_path / "state", kill_grace=0.2, drain_grace=0.05)
    envelope = (await provider.describe()).envelope
    profile = host_profile()
    r = Requests(envelope.target, profile=profile, platform=envelope.platforms[0])
    image = (await provider.materialize(r.materialize())).image
    inst = await provider.provision(r.provision("ak-path", image))
    from checkfu.contract.members import ReleaseRequest  # noqa: PLC0415

    inst = await provider.activate(ActivateRequest(**r.on(inst)))
    try:
        ran = await provider.exec(r.exec(inst, "env"))
        assert f"PATH={DEFAULT_PATH}" in ran.stdout.decode().splitlines()
        assert (await provider.exec(r.exec(inst, "sh", "-c", "echo found"))).stdout == b"found\n"
        with pytest.raises(SandboxPathRejected) as caught:
            await provider.exec(r.exec(inst, "pwd", cwd="/no/such/directory"))
        assert caught.value.field == "cwd"
    finally:
        await provider.release(ReleaseRequest(**r.on(inst)))
    text = answer("g")
    assert f"`{DEFAULT_PATH}`" in text and "`SandboxPathRejected`, field `cwd` (the host-process tier)" in text


# (h) readFiles, (i) the method of /v1/openProcess ---------------------------------------------------------------


@pytest.mark.anyio
async def test_read_files_answers_a_directory_missing_and_refuses_more_than_max_bytes(
    memory_wire: tuple[MemoryProvider, Driven],
) -> None:
    _, driven = memory_wire
    inst = await driven.active()
    assert (await driven.remote.exec(driven.requests.exec(inst, "write", "/data/f", "123456"))).exit_code == 0
    base = driven.requests.on(inst)
    status, _, body = request(
        driven.service,
        "POST",
        "/v1/readFiles",
        json.dumps({**_jsonable(base), "paths": ["/data", "/data/f"], "max_bytes": 100}).encode(),
    )
    head = json.loads(body.split(b"\n", 1)[0])
    assert status == 200 and head["missing"] == ["/data"] and [f["path"] for f in head["files"]] == ["/data/f"]
    status, _, body = request(
        driven.service,
        "POST",
        "/v1/readFiles",
        json.dumps({**_jsonable(base), "paths": ["/data/f"], "max_bytes": 5}).encode(),
    )
    assert (status, *error_of(body)) == (413, "SandboxBoundExceeded", "max_bytes")
    text = answer("h")
    assert "`SandboxBoundExceeded`, field `max_bytes` (`413`)" in text and "answered in `missing`" in text


def _jsonable(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: json.loads(v.model_dump_json()) if hasattr(v, "model_dump_json") else v for k, v in fields.items()}


def test_the_method_rule_of_open_process_is_the_services(serve: Callable[..., Service]) -> None:
    service = serve(MemoryProvider())
    for method in ("POST", "PUT", "DELETE"):
        status, headers, body = request(service, method, "/v1/openProcess")
        assert (status, headers["allow"], *error_of(body)) == (405, "GET", "SandboxProtocolViolation", "method")
    status, _, body = request(service, "GET", "/v1/openProcess")
    assert (status, *error_of(body)) == (400, "SandboxProtocolViolation", "method")
    status, _, body = request(service, "POST", "/v1/openProcess", authorization="Bearer wrong")
    assert (status, *error_of(body)) == (401, "SandboxUnauthenticated", "authorization")
    status, headers, body = request(service, "GET", "/v1/exec")
    assert (status, headers["allow"]) == (405, "POST")
    text = answer("i")
    assert "any other method is `405` with `Allow: GET`" in text and "a `GET` without the upgrade is `400`" in text


def _upgrade_refused(app: Any) -> Any:
    """A gateway that answers every WebSocket upgrade 501 with the wire's error body, as a service that does not
    serve openProcess may."""
    body = WireError.of(SandboxOperationUnsupported("openProcess is not served", field="path")).model_dump_json()

    async def gateway(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await app(scope, receive, send)
            return
        headers = [(b"content-type", b"application/json")]
        await send({"type": "websocket.http.response.start", "status": 501, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body.encode()})

    return gateway


@pytest.mark.anyio
async def test_an_upgrade_answered_501_is_raised_at_once_not_retried() -> None:
    memory = MemoryProvider()
    r = Requests(memory.target)
    with serve_in_thread(memory, front=_upgrade_refused) as remote:
        try:
            image = (await remote.materialize(r.materialize())).image
            inst = await remote.provision(r.provision("ak-upgrade", image))
            inst = await remote.activate(ActivateRequest(**r.on(inst)))
            started = time.monotonic()
            with pytest.raises(SandboxOperationUnsupported) as caught:
                await remote.open_process(OpenProcessRequest(**r.on(inst), argv=["cat"]))
            assert time.monotonic() - started < REATTACH_PAUSE * 2  # the first answer, not six attempts
            assert caught.value.field == "path"
        finally:
            await remote.aclose()
    assert "raises that error at once instead of retrying" in answer("i")


# (j) enumeration, (k) features --------------------------------------------------------------------------------


def test_enumeration_is_list_dir_as_the_tiers_name_it() -> None:
    durable = memory_envelope().model_copy(update={"list_dir": False})
    assert "enumeration (list_dir)" in assess(durable).short_of_next
    assert 'names it "enumeration (list_dir)"' in answer("j")


def test_each_feature_is_in_the_table_and_a_missing_member_is_refused_as_it_says() -> None:
    table = section("### (k) Which runner features need which members")
    for feature, needs, without in FEATURES:
        assert f"| {feature} | {needs} | {without} |" in table
    with pytest.raises(SandboxCapabilityUnavailable) as caught:
        require_capabilities(day_one_envelope(), memory_profile(), platform=AMD64, mount_count=0, interactive=True)
    assert "stdin" in caught.value.message and "openProcess" in caught.value.message
    core = SessionCore(envelope=day_one_envelope(), lease=TEST_LEASE, runner_tag="t")
    for member in ("readFiles", "listDir", "openProcess"):
        with pytest.raises(SandboxOperationUnsupported):
            core.require_declared(member)  # type: ignore[arg-type]
