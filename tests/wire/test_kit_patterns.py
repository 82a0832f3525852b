"""The kit's regular expressions say exactly what the decoder's checks say.

Where a rule is code in the decoder (path admission, base64, a destination's port and
IPv6 address, package pins) and a pattern in the published schema, the two are held to
each other here: exhaustively over every short string of a telling alphabet, and on
generated values. The patterns are read from the exported schemas, with ECMA-262
semantics (JSON Schema's dialect: ``$`` ends the string, where Python's ``re`` would
also let it match before a final newline).
"""

from __future__ import annotations

import base64
import ipaddress
import itertools
import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from checkfu.contract.model import BASE64_PATTERN, Bytes
from checkfu.contract.mounts import ABSOLUTE_PATH_PATTERN, MOUNT_TARGET_PATTERN, PATH_RULE, RELATIVE_PATH_PATTERN
from checkfu.contract.paths import MAX_PATH_BYTES, path_problem
from checkfu.contract.profile import DESTINATION_PATTERN, PIN_PATTERNS
from checkfu.wire.kit import build_kit

KIT = build_kit()


def ecma(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled for Python with ECMA-262's meaning of ``$`` (the end of the string only)."""
    out: list[str] = []
    escaped = in_class = False
    for ch in pattern:
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            out.append(ch)
            escaped = True
        elif ch == "[":
            in_class = True
            out.append(ch)
        elif ch == "]":
            in_class = False
            out.append(ch)
        elif ch == "$" and not in_class:
            out.append(r"\Z")
        else:
            out.append(ch)
    return re.compile("".join(out))


def test_ecma_anchors_refuse_a_final_newline() -> None:
    assert re.search("^a$", "a\n")  # the difference a Python-based validator must mind
    assert not ecma("^a$").search("a\n")
    assert ecma("^[$]$").search("$")


def strings(alphabet: str, longest: int) -> Iterator[str]:
    for n in range(longest + 1):
        for chars in itertools.product(alphabet, repeat=n):
            yield "".join(chars)


def _nodes(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value)


def published_patterns() -> set[str]:
    return {n["pattern"] for path, s in KIT.items() if path.startswith("schemas/") for n in _nodes(s) if "pattern" in n}


def test_the_schemas_publish_these_patterns() -> None:
    published = published_patterns()
    for pattern in (ABSOLUTE_PATH_PATTERN, MOUNT_TARGET_PATTERN, RELATIVE_PATH_PATTERN, DESTINATION_PATTERN):
        assert pattern in published
    for pin in PIN_PATTERNS.values():
        assert pin.pattern in published


@pytest.mark.parametrize("pattern", sorted(published_patterns()))
def test_every_published_pattern_compiles(pattern: str) -> None:
    ecma(pattern)


PATH_PATTERNS = {ABSOLUTE_PATH_PATTERN, MOUNT_TARGET_PATTERN, RELATIVE_PATH_PATTERN}
NAMED = {
    BASE64_PATTERN: "base64 rule:",
    DESTINATION_PATTERN: "destination rule:",
    **{pin.pattern: "pin rule:" for pin in PIN_PATTERNS.values()},
    **dict.fromkeys(PATH_PATTERNS, f"{PATH_RULE}:"),
}
"""Each pattern that is a named rule, and how its ``$comment`` begins."""


def test_every_path_pattern_is_marked_as_the_path_rule_and_nothing_else_is() -> None:
    # The README: a path that breaks the rule is SandboxPathRejected, and this mark is how a
    # validator of another language finds the patterns that are the rule.
    marked = 0
    for path, schema in KIT.items():
        if not path.startswith("schemas/"):
            continue
        for node in _nodes(schema):
            comment = node.get("$comment", "")
            if node.get("pattern") in PATH_PATTERNS or comment.startswith(PATH_RULE):
                assert comment.startswith(f"{PATH_RULE}:"), (path, node)
                assert node.get("pattern") in PATH_PATTERNS, (path, node)
                assert node.get("maxLength") == MAX_PATH_BYTES, (path, node)
                assert node.get("type") == "string", (path, node)
                marked += 1
    assert marked >= 15


def test_every_named_rules_pattern_says_its_name() -> None:
    seen = set()
    for path, schema in KIT.items():
        if path.startswith("schemas/"):
            for node in _nodes(schema):
                if node.get("pattern") in NAMED:
                    assert node.get("$comment", "").startswith(NAMED[node["pattern"]]), (path, node)
                    seen.add(node["pattern"])
    assert seen == set(NAMED)


# --- paths ----------------------------------------------------------------------------------------

PATH_ALPHABET = "/.a\x00\n"


def test_absolute_path_pattern_is_path_admission() -> None:
    rx = ecma(ABSOLUTE_PATH_PATTERN)
    for s in strings(PATH_ALPHABET, 7):
        assert (path_problem(s) is None) == bool(rx.search(s)), repr(s)


def test_mount_target_pattern_is_path_admission_without_the_root() -> None:
    rx = ecma(MOUNT_TARGET_PATTERN)
    for s in strings(PATH_ALPHABET, 7):
        assert (path_problem(s) is None and s != "/") == bool(rx.search(s)), repr(s)


def test_relative_path_pattern_is_relative_path_admission() -> None:
    rx = ecma(RELATIVE_PATH_PATTERN)
    for s in strings(PATH_ALPHABET, 7):
        assert (path_problem(s, relative=True) is None) == bool(rx.search(s)), repr(s)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["/", ".", "..", "a", "é", "\x00", " ", "\n"]), max_size=30).map("".join))
def test_path_patterns_agree_on_longer_paths(text: str) -> None:
    for s in (text, "/" + text):
        assert (path_problem(s) is None) == bool(ecma(ABSOLUTE_PATH_PATTERN).search(s)), repr(s)
        assert (path_problem(s, relative=True) is None) == bool(ecma(RELATIVE_PATH_PATTERN).search(s)), repr(s)


# --- base64 ---------------------------------------------------------------------------------------


def _decoder_takes(s: str) -> bool:
    """Whether the contract's own ``Bytes`` decoder takes ``s``."""
    try:
        TypeAdapter(Bytes).validate_python(s)
    except ValidationError:
        return False
    return True


def base64_pattern() -> str:
    found = {n["pattern"] for n in _nodes(KIT["schemas/ExecRequest.schema.json"]) if n.get("contentEncoding")}
    assert len(found) == 1
    return found.pop()


def test_base64_pattern_is_the_decoders_rule() -> None:
    rx = ecma(base64_pattern())
    for s in strings("Aa+/=\n ", 6):
        assert bool(rx.search(s)) == _decoder_takes(s), repr(s)  # the schema and the decoder agree exactly
    assert not _decoder_takes("AAAA="), "padding that completes nothing is not standard base64"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_every_encoding_matches_the_base64_pattern(data: bytes) -> None:
    assert ecma(base64_pattern()).search(base64.b64encode(data).decode())


# --- destinations ---------------------------------------------------------------------------------


def _decoder_destination(s: str) -> bool:
    """The decoder's own check, written out: a host, a port in 1..65535, a valid bracketed IPv6."""
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit() or port.startswith("0") or not 1 <= int(port) <= 65535:
        return False
    if host.startswith("["):
        if not host.endswith("]"):
            return False
        inner = host[1:-1]
        if not re.fullmatch(r"[0-9a-f:.]{2,45}", inner):
            return False
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            return False
        return True
    label = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
    return re.fullmatch(rf"{label}(?:\.{label})*", host) is not None


def test_destination_pattern_on_ipv6_is_ipaddress() -> None:
    rx = ecma(DESTINATION_PATTERN)
    for inner in strings("0a:.1", 7):
        s = f"[{inner}]:443"
        assert bool(rx.search(s)) == _decoder_destination(s), s


PORTS = {
    **dict.fromkeys(["1", "9", "80", "443", "9999", "10000", "59999", "60000", "64999", "65000"], True),
    **dict.fromkeys(["65499", "65500", "65529", "65530", "65535"], True),
    **dict.fromkeys(["0", "65536", "65540", "65600", "66000", "70000", "99999", "100000", "01", ""], False),
}


@pytest.mark.parametrize(("port", "ok"), PORTS.items())
def test_destination_pattern_ports(port: str, ok: bool) -> None:
    for host in ("a.example", "10.0.0.1", "[::1]"):
        assert bool(ecma(DESTINATION_PATTERN).search(f"{host}:{port}")) is ok
        assert _decoder_destination(f"{host}:{port}") is ok


def test_every_port_agrees() -> None:
    rx = ecma(DESTINATION_PATTERN)
    for port in range(0, 100_001):
        assert bool(rx.search(f"h:{port}")) == (1 <= port <= 65535), port


@st.composite
def ipv6_spellings(draw: st.DrawFn) -> str:
    address = draw(st.ip_addresses(v=6))
    assert isinstance(address, ipaddress.IPv6Address)
    v4 = ipaddress.IPv4Address(draw(st.integers(min_value=0, max_value=2**32 - 1)))
    six = ":".join(address.exploded.split(":")[:6])
    return draw(st.sampled_from([address.compressed, address.exploded, f"{six}:{v4}", f"::ffff:{v4}", f"::{v4}"]))


@settings(max_examples=500, deadline=None)
@given(spelling=ipv6_spellings(), edit=st.tuples(st.integers(0, 50), st.sampled_from(["", "0", "f", ":", ".", "9"])))
def test_destination_pattern_on_generated_ipv6(spelling: str, edit: tuple[int, str]) -> None:
    rx = ecma(DESTINATION_PATTERN)
    at, insert = edit
    at = min(at, len(spelling))
    for inner in (spelling, spelling[:at] + insert + spelling[at:], spelling[:at] + spelling[at + 1 :]):
        s = f"[{inner}]:8443"
        assert bool(rx.search(s)) == _decoder_destination(s), s


def test_the_decoder_refuses_what_the_destination_pattern_refuses() -> None:
    # The written-out check above is the decoder's: hold it to the real decoder on samples.
    import json  # noqa: PLC0415

    from checkfu.contract import SandboxError, SandboxProfile, decode  # noqa: PLC0415
    from checkfu.contract import examples as ex  # noqa: PLC0415

    for s in ["[::1]:443", "[::1]:0", "[::1]:65536", "[1::2::3]:1", "[::01.2.3.4]:1", "[::1.2.3.4]:1", "a.b:1"]:
        doc = ex.profile()
        doc["network_policy"] = {"mode": "allowlist", "allowlist": [s]}
        try:
            decode(SandboxProfile, json.dumps(doc))
            took = True
        except SandboxError:
            took = False
        assert took == _decoder_destination(s) == bool(ecma(DESTINATION_PATTERN).search(s)), s


# --- package pins ---------------------------------------------------------------------------------


def test_each_managers_pin_pattern_is_in_the_profile_schema() -> None:
    packages = KIT["schemas/SandboxProfile.schema.json"]["properties"]["packages"]
    assert set(packages["propertyNames"]["enum"]) == set(PIN_PATTERNS)
    for manager, pattern in PIN_PATTERNS.items():
        assert packages["properties"][manager]["items"]["pattern"] == pattern.pattern
        assert pattern.pattern.startswith("^") and pattern.pattern.endswith("$")
