"""Property tests of the decoders: they either decode or refuse in the vocabulary, never anything else.

For every wire message type of the author kit:

- any JSON value, and any text or bytes at all, either decodes or raises a
  ``SandboxError`` (deep nesting, huge numbers, duplicate keys, NaN, lone
  surrogates included);
- a valid example with random leaves replaced, removed or added does the same,
  and whatever it decodes to survives ``decode(encode(x)) == x``;
- ``decode(encode(x)) == x`` for every example and for generated valid
  envelopes and profiles;
- the digest does not depend on key order.

The default runs are sized to finish in well under a minute; the ``slow`` variants
(``CHECKFU_SLOW=1``) run many more examples.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkfu.contract import (
    AUTHORITIES,
    AXES,
    ERROR_CLASSES,
    Model,
    SandboxError,
    SandboxProfile,
    SandboxProviderCapabilities,
    canonical,
    decode,
    digest,
    encode,
)
from checkfu.contract import examples as ex
from checkfu.contract.vocabulary import (
    EGRESS_GRADES,
    NETWORK_MODES,
    OPTIONAL_OPERATIONS,
    PACKAGE_MANAGERS,
    PLACEMENTS,
    RETENTION_MODES,
    TIERS,
)
from checkfu.wire.kit import message_types

TYPES: dict[str, type[Model]] = message_types()
NAMES = sorted(TYPES)
EXAMPLES: list[tuple[str, int, dict[str, Any]]] = [
    (name, i, doc)
    for name, docs in sorted(
        {**ex.messages(), "WireError": [ex.wire_error()], "ReadFilesHead": [ex.read_files_head()]}.items()
    )
    for i, doc in enumerate(docs)
]
VOCABULARY = tuple(ERROR_CLASSES.values())

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SINGLE = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LONG = settings(
    max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def decodes_or_refuses(model: type[Model], raw: str | bytes) -> Model | None:
    """The property: an instance of ``model``, or a member of the vocabulary; nothing else escapes."""
    try:
        value = decode(model, raw)
    except SandboxError as exc:
        assert type(exc) in VOCABULARY, type(exc)
        assert ERROR_CLASSES[exc.code] is type(exc)
        assert isinstance(exc.message, str)
        assert exc.message
        assert exc.field is None or isinstance(exc.field, str)
        return None
    assert type(value) is model
    again = decode(model, encode(value))
    assert again == value
    return value


# --- strategies: arbitrary JSON ------------------------------------------------------------------

FIELD_NAMES = sorted({f for m in TYPES.values() for f in m.model_fields})
INTERESTING_TEXT = [
    "",
    "linux",
    "amd64",
    "container",
    "none",
    "allowlist",
    "durable",
    "ephemeral_zdr",
    "runner_enforced",
    "host",
    ex.IMAGE_ID,
    ex.HELLO_SHA256,
    ex.HELLO_GIT,
    "/",
    "/workspace",
    "/workspace/../etc",
    "a\x00b",
    "\ud800",
    "\udfff\ud800",
    "x" * 70000,
    "AAAA",
    "***",
    "a.example:443",
    "[::1]:443",
]
INTERESTING_INTS = [
    0,
    -1,
    1,
    63,
    64,
    65,
    0o777,
    0o1000,
    65535,
    65536,
    1 << 32,
    (1 << 32) + 1,
    2**53 - 1,
    2**53,
    -(2**53),
    2**63,
    2**64,
    10**100,
    10**4000,
]

text_with_surrogates = st.text(alphabet=st.characters(exclude_categories=()), max_size=20)
keys = st.one_of(st.sampled_from(FIELD_NAMES), text_with_surrogates)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(INTERESTING_INTS),
    st.floats(allow_nan=False, allow_infinity=False),
    text_with_surrogates,
    st.sampled_from(INTERESTING_TEXT),
)
json_values = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(keys, children, max_size=6),
    ),
    max_leaves=16,
)
shallow = st.one_of(leaves, st.lists(leaves, max_size=4), st.dictionaries(keys, leaves, max_size=4))
json_objects = st.dictionaries(keys, shallow, max_size=8)
"""Objects with many top-level keys; ``json_values`` covers depth."""


def dumps(value: Any, ascii_only: bool) -> str:
    return json.dumps(value, ensure_ascii=ascii_only)


def _any_json(name: str, value: Any, ascii_only: bool) -> None:
    decodes_or_refuses(TYPES[name], dumps(value, ascii_only))


@pytest.mark.parametrize("name", NAMES)
@FAST
@given(value=st.one_of(json_values, json_objects), ascii_only=st.booleans())
def test_any_json_value_decodes_or_is_refused(name: str, value: Any, ascii_only: bool) -> None:
    _any_json(name, value, ascii_only)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
@LONG
@given(value=st.one_of(json_values, json_objects), ascii_only=st.booleans())
def test_any_json_value_decodes_or_is_refused_long(name: str, value: Any, ascii_only: bool) -> None:
    _any_json(name, value, ascii_only)


# --- raw text and bytes --------------------------------------------------------------------------


@SINGLE
@given(name=st.sampled_from(NAMES), raw=st.one_of(st.text(alphabet=st.characters(exclude_categories=())), st.binary()))
def test_any_text_or_bytes_decodes_or_is_refused(name: str, raw: str | bytes) -> None:
    decodes_or_refuses(TYPES[name], raw)


@pytest.mark.slow
@LONG
@given(name=st.sampled_from(NAMES), raw=st.one_of(st.text(alphabet=st.characters(exclude_categories=())), st.binary()))
def test_any_text_or_bytes_decodes_or_is_refused_long(name: str, raw: str | bytes) -> None:
    decodes_or_refuses(TYPES[name], raw)


NASTY_DOCUMENTS: list[str | bytes] = [
    "",
    " ",
    "\x00",
    "null",
    "true",
    "0",
    '""',
    "[]",
    "{}",
    "[{}]",
    "[" * 100_000,
    "[" * 100_000 + "]" * 100_000,
    "{" * 100_000,
    '{"a":' * 100_000 + "1" + "}" * 100_000,
    '{"a":' * 500 + "1" + "}" * 500,
    "[" * 900 + "]" * 900,
    "1" + "0" * 5000,
    "-" + "9" * 5000,
    '{"max_mounts": 1' + "0" * 5000 + "}",
    "1e999999",
    '{"x": 1e999999}',
    "0." + "0" * 5000 + "1",
    '{"a":1,"a":2}',
    '{"a":{"b":1,"b":1}}',
    "{" + '"a":1,' * 20_000 + '"a":2}',
    "[" + "1," * 100_000 + "1]",
    "NaN",
    "[NaN]",
    '{"x": NaN}',
    "Infinity",
    "-Infinity",
    '{"x": -Infinity}',
    '"\\ud800"',
    '"\\udc00\\ud800"',
    '{"\\ud800": 1}',
    '{"provider": "\\ud800"}',
    "\ufeff{}",
    '{"a": "\ud800"}',
    "{'a': 1}",
    '{"a": 1,}',
    "[1, 2,]",
    '{"a": 01}',
    '{"a": 0x10}',
    '{"a": .5}',
    '{"a": "\x01"}',
    "/* comment */ {}",
    b"\xff\xfe{\x00}\x00",
    b"\xef\xbb\xbf{}",
    b"\xc0\xaf",
    b"\xed\xa0\x80",
    b'{"a": "\xff"}',
    b"\x00" * 64,
    '{"__proto__": {}, "constructor": 1}',
]


@pytest.mark.parametrize("name", NAMES)
def test_nasty_documents_are_refused_in_the_vocabulary(name: str) -> None:
    for raw in NASTY_DOCUMENTS:
        decodes_or_refuses(TYPES[name], raw)


def _inject(doc: dict[str, Any], text: str) -> str:
    """``doc`` as JSON with raw ``text`` spliced in as the value of its first key."""
    sentinel = "@@splice@@"
    body = json.dumps({**doc, next(iter(doc)): sentinel})
    assert body.count(json.dumps(sentinel)) == 1
    return body.replace(json.dumps(sentinel), text)


SPLICES = ["NaN", "Infinity", "1" + "0" * 5000, "[" * 5000 + "]" * 5000, '"\\ud800"', '{"k":1,"k":2}', "1e400"]


@pytest.mark.parametrize(
    ("name", "index", "doc"), [e for e in EXAMPLES if e[2]], ids=[f"{n}-{i}" for n, i, d in EXAMPLES if d]
)
def test_nasty_values_inside_valid_examples_are_refused(name: str, index: int, doc: dict[str, Any]) -> None:
    for splice in SPLICES:
        raw = _inject(doc, splice)
        assert decodes_or_refuses(TYPES[name], raw) is None, splice[:20]
    duplicated = json.dumps(doc)[:-1] + ", " + json.dumps(next(iter(doc))) + ": null}"
    assert decodes_or_refuses(TYPES[name], duplicated) is None


# --- mutations of valid examples -----------------------------------------------------------------

Path = tuple[str | int, ...]


def _paths(node: Any, prefix: Path = ()) -> list[Path]:
    out: list[Path] = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((*prefix, k))
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append((*prefix, i))
            out.extend(_paths(v, (*prefix, i)))
    return out


def _get(doc: Any, path: Path) -> Any:
    node = doc
    for part in path:
        node = node[part]
    return node


replacements = st.one_of(leaves, json_values, st.sampled_from(INTERESTING_INTS), st.sampled_from(INTERESTING_TEXT))


@st.composite
def mutated(draw: st.DrawFn, doc: dict[str, Any]) -> Any:
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(doc)
        op = draw(st.sampled_from(["replace", "replace", "delete", "add"] if paths else ["add"]))
        if op == "add":
            containers: list[Path] = [(), *(p for p in paths if isinstance(_get(doc, p), dict))]
            _get(doc, draw(st.sampled_from(containers)))[draw(keys)] = draw(replacements)
            continue
        path = draw(st.sampled_from(paths))
        parent = _get(doc, path[:-1])
        if op == "replace":
            parent[path[-1]] = draw(replacements)
        else:
            del parent[path[-1]]
    return doc


def _mutation_case(name: str, doc: dict[str, Any]) -> Callable[..., None]:
    @given(value=mutated(doc), ascii_only=st.booleans())
    def check(value: Any, ascii_only: bool) -> None:
        decodes_or_refuses(TYPES[name], dumps(value, ascii_only))

    return check


@pytest.mark.parametrize(("name", "index", "doc"), EXAMPLES, ids=[f"{n}-{i}" for n, i, _ in EXAMPLES])
def test_mutated_examples_decode_or_are_refused(name: str, index: int, doc: dict[str, Any]) -> None:
    FAST(_mutation_case(name, doc))()


@pytest.mark.slow
@pytest.mark.parametrize(("name", "index", "doc"), EXAMPLES, ids=[f"{n}-{i}" for n, i, _ in EXAMPLES])
def test_mutated_examples_decode_or_are_refused_long(name: str, index: int, doc: dict[str, Any]) -> None:
    LONG(_mutation_case(name, doc))()


# --- round trips ---------------------------------------------------------------------------------


def _states(dumped: Any, stated: Any) -> bool:
    """Whether ``dumped`` holds everything ``stated`` says (objects may gain defaults)."""
    if isinstance(stated, dict):
        return isinstance(dumped, dict) and all(k in dumped and _states(dumped[k], v) for k, v in stated.items())
    if isinstance(stated, list):
        return isinstance(dumped, list) and len(dumped) == len(stated) and all(map(_states, dumped, stated))
    return type(dumped) is type(stated) and dumped == stated


def test_every_message_type_has_an_example() -> None:
    assert {name for name, _, _ in EXAMPLES} == set(NAMES)


@pytest.mark.parametrize(("name", "index", "doc"), EXAMPLES, ids=[f"{n}-{i}" for n, i, _ in EXAMPLES])
def test_examples_round_trip(name: str, index: int, doc: dict[str, Any]) -> None:
    model = TYPES[name]
    value = decode(model, json.dumps(doc))
    wire = encode(value)
    assert decode(model, wire) == value
    assert encode(decode(model, wire)) == wire
    assert canonical(decode(model, wire)) == canonical(value)
    assert digest(decode(model, wire)) == digest(value)
    # Every field the example states survives unchanged; the rest are defaults filled in.
    assert _states(json.loads(wire), doc)


hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
image_refs = st.one_of(
    st.just("host"),
    hex64.map(lambda h: "sha256:" + h),
    st.tuples(st.from_regex(r"[a-z0-9][a-z0-9._/:-]{0,40}", fullmatch=True), hex64).map(
        lambda t: f"{t[0]}@sha256:{t[1]}"
    ),
)
positive = st.integers(min_value=1, max_value=2**53 - 1)


@st.composite
def resource_pairs(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, int]]:
    low: dict[str, int] = {}
    high: dict[str, int] = {}
    for dim in ("cpu_millis", "memory_mib", "disk_mib", "pids"):
        a, b = sorted((draw(positive), draw(positive)))
        low[dim], high[dim] = a, b
    return low, high


def unique_nonempty(values: tuple[str, ...]) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(values), min_size=1, max_size=len(values), unique=True)


def unique_any(values: tuple[str, ...]) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(values), max_size=len(values), unique=True)


@st.composite
def valid_envelopes(draw: st.DrawFn) -> dict[str, Any]:
    """Envelope documents drawn field by field so that every cross-field rule holds."""
    image_mode = draw(st.sampled_from(["profile", "fixed"]))
    network_modes = draw(unique_nonempty(NETWORK_MODES))
    retention_modes = draw(unique_nonempty(RETENTION_MODES))
    snapshots = True if "durable" in retention_modes else draw(st.booleans())
    operations = draw(unique_any(OPTIONAL_OPERATIONS))
    low, high = draw(resource_pairs())
    zdr = "ephemeral_zdr" in retention_modes
    assurances = {
        "release_destroys": True if zdr else draw(st.booleans()),
        "release_idempotent": draw(st.booleans()),
        "reaps_process_tree": draw(st.booleans()),
        "cold_compensation": draw(st.booleans()),
        "enumerates_allocations": draw(st.booleans()) if "listAllocations" in operations else False,
    }
    doc: dict[str, Any] = {
        "provider": draw(st.from_regex(r"[a-z0-9][a-z0-9._-]{0,30}", fullmatch=True)),
        "provider_revision": draw(
            st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=40)
        ),
        "materialization_revision": draw(
            st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=40)
        ),
        "placement": draw(st.sampled_from(PLACEMENTS)),
        "tiers": draw(unique_nonempty(TIERS)),
        "platforms": [{"os": "linux", "architecture": a} for a in draw(unique_nonempty(("amd64", "arm64")))],
        "image_mode": image_mode,
        "fixed_base_images": draw(st.lists(image_refs, min_size=1, max_size=3, unique=True))
        if image_mode == "fixed"
        else [],
        "package_managers": draw(unique_any(PACKAGE_MANAGERS)),
        "network_modes": network_modes,
        "retention_modes": retention_modes,
        "snapshots": snapshots,
        "enforcement": {axis: draw(st.sampled_from(AUTHORITIES)) for axis in AXES},
        "minimum_resources": low,
        "maximum_resources": high,
        "max_mounts": draw(st.one_of(st.integers(min_value=0, max_value=128), st.integers(0, 2**53 - 1))),
    }
    optional: dict[str, Any] = {
        "snapshot_custody": draw(st.sampled_from(["runner", "provider"])) if snapshots else "runner",
        "egress_certification": draw(st.sampled_from(EGRESS_GRADES[1:]))
        if "allowlist" in network_modes
        else "unsupported",
        "list_dir": draw(st.booleans()),
        "operations": operations,
        "lifecycle_assurances": assurances,
    }
    weakest = {
        "snapshot_custody": "runner",
        "egress_certification": "unsupported",
        "list_dir": False,
        "operations": [],
        # beside ephemeral_zdr an absent release_destroys is true (rule 7); elsewhere false
        "lifecycle_assurances": {**dict.fromkeys(assurances, False), "release_destroys": zdr},
    }
    for key, value in optional.items():
        # an optional field at its weakest value may be omitted: silence means exactly that
        if value != weakest[key] or draw(st.booleans()):
            doc[key] = value
    if zdr and "lifecycle_assurances" in doc and draw(st.booleans()):
        del doc["lifecycle_assurances"]["release_destroys"]  # absent beside ephemeral_zdr: decodes to true
    return doc


label = st.from_regex(r"[a-z0-9](?:[a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
semver = st.tuples(*(st.integers(min_value=0, max_value=999) for _ in range(3))).map(lambda v: ".".join(map(str, v)))
PINS: dict[str, st.SearchStrategy[str]] = {
    "apt": st.tuples(label, semver).map(lambda t: f"{t[0]}={t[1]}-1"),
    "pip": st.tuples(label, semver).map(lambda t: f"{t[0]}=={t[1]}"),
    "npm": st.tuples(label, semver).map(lambda t: f"{t[0]}@{t[1]}"),
    "cargo": st.tuples(label, semver).map(lambda t: f"{t[0]}@{t[1]}"),
    "gem": st.tuples(label, semver).map(lambda t: f"{t[0]}:{t[1]}"),
    "go": st.tuples(label, label, semver).map(lambda t: f"{t[0]}.example/{t[1]}@v{t[2]}"),
}
hosts = st.one_of(
    st.lists(label, min_size=1, max_size=3).map(".".join),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
)
destinations = st.tuples(hosts, st.integers(min_value=1, max_value=65535)).map(lambda t: f"{t[0]}:{t[1]}")


@st.composite
def valid_profiles(draw: st.DrawFn) -> dict[str, Any]:
    managers = draw(unique_any(PACKAGE_MANAGERS))
    mode = draw(st.sampled_from(NETWORK_MODES))
    policy: dict[str, Any] = {"mode": mode}
    if mode == "allowlist":
        policy["allowlist"] = draw(st.lists(destinations, min_size=1, max_size=5, unique=True))
    elif draw(st.booleans()):
        policy["allowlist"] = []
    doc: dict[str, Any] = {
        "tier": draw(st.sampled_from(TIERS)),
        "base_image": draw(image_refs),
        "network_policy": policy,
        "resource_limits": draw(resource_pairs())[0],
        "retention_mode": draw(st.sampled_from(RETENTION_MODES)),
    }
    state_empty_packages = draw(st.booleans())
    if managers or state_empty_packages:
        doc["packages"] = {m: draw(st.lists(PINS[m], max_size=4, unique=True)) for m in managers}
    return doc


def _round_trip(model: type[Model], doc: dict[str, Any]) -> None:
    value = decode(model, json.dumps(doc))
    assert decode(model, encode(value)) == value
    assert decode(model, json.dumps(json.loads(encode(value)), ensure_ascii=False)) == value
    assert _states(json.loads(encode(value)), doc)


@SINGLE
@given(doc=valid_envelopes())
def test_generated_envelopes_decode_and_round_trip(doc: dict[str, Any]) -> None:
    _round_trip(SandboxProviderCapabilities, doc)
    env = decode(SandboxProviderCapabilities, json.dumps(doc))
    stated = doc.get("lifecycle_assurances", {}).get("release_destroys")
    zdr = "ephemeral_zdr" in doc["retention_modes"]
    assert env.lifecycle_assurances.release_destroys is (zdr if stated is None else stated)


@SINGLE
@given(doc=valid_profiles())
def test_generated_profiles_decode_and_round_trip(doc: dict[str, Any]) -> None:
    _round_trip(SandboxProfile, doc)


@pytest.mark.slow
@LONG
@given(envelope=valid_envelopes(), profile=valid_profiles())
def test_generated_values_round_trip_long(envelope: dict[str, Any], profile: dict[str, Any]) -> None:
    _round_trip(SandboxProviderCapabilities, envelope)
    _round_trip(SandboxProfile, profile)


# --- digests do not depend on key order ----------------------------------------------------------


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


@SINGLE
@given(doc=valid_profiles(), rng=st.randoms(use_true_random=False))
def test_profile_digest_does_not_depend_on_key_order(doc: dict[str, Any], rng: random.Random) -> None:
    a = decode(SandboxProfile, json.dumps(doc))
    b = decode(SandboxProfile, json.dumps(_shuffled(doc, rng)))
    assert a.digest == b.digest
    assert canonical(a) == canonical(b)


@SINGLE
@given(doc=valid_envelopes(), rng=st.randoms(use_true_random=False))
def test_envelope_digest_does_not_depend_on_key_order(doc: dict[str, Any], rng: random.Random) -> None:
    a = decode(SandboxProviderCapabilities, json.dumps(doc))
    b = decode(SandboxProviderCapabilities, json.dumps(_shuffled(doc, rng)))
    assert digest(a) == digest(b)


def test_the_example_profile_digest_survives_every_reordering() -> None:
    doc = ex.profile()
    expected = decode(SandboxProfile, json.dumps(doc)).digest
    for seed in range(25):
        assert decode(SandboxProfile, json.dumps(_shuffled(doc, random.Random(seed)))).digest == expected
