"""The provider author kit cannot drift from the code: every vector runs through the decoders.

Every schema is a valid draft 2020-12 schema, every valid vector validates and
decodes, every invalid vector is refused with exactly its expected code and
field, and the exported folder is plain JSON a provider in another language can
read without Python.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from checkfu.contract import ERROR_CLASSES, MEMBERS, MESSAGES, SandboxError, decode
from checkfu.wire.kit import KIT_VERSION, RULES, SCHEMA_DIALECT, build_kit, export_kit, message_types

KIT: dict[str, Any] = build_kit()
INDEX: dict[str, Any] = KIT["index.json"]
TYPES = message_types()
SCHEMAS = sorted(p for p in KIT if p.startswith("schemas/"))
VECTORS = sorted(p for p in KIT if p.startswith("vectors/"))
VALID = [p for p in VECTORS if KIT[p]["valid"]]
INVALID = [p for p in VECTORS if not KIT[p]["valid"]]


def raw_of(vector: dict[str, Any]) -> str:
    if "document_text" in vector:
        text: str = vector["document_text"]
        return text
    return json.dumps(vector["document"])


def validator_for(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(KIT[INDEX["messages"][name]["schema"]])


def test_the_kit_has_every_message_type() -> None:
    assert set(INDEX["messages"]) == set(TYPES)
    assert INDEX["version"] == KIT_VERSION
    assert INDEX["dialect"] == SCHEMA_DIALECT == "https://json-schema.org/draft/2020-12/schema"
    assert len(VALID) >= len(TYPES)
    assert len(INVALID) > 5 * len(TYPES)


@pytest.mark.parametrize("path", SCHEMAS)
def test_every_schema_is_a_draft_2020_12_schema(path: str) -> None:
    schema = KIT[path]
    assert schema["$schema"] == SCHEMA_DIALECT
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$id"].startswith(f"urn:checkfu:{KIT_VERSION}:")


def test_schema_ids_are_unique() -> None:
    ids = [KIT[p]["$id"] for p in SCHEMAS]
    assert len(ids) == len(set(ids))


def _walk(node: Any, at: str = "#") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((at, node))
        for key, value in node.items():
            out.extend(_walk(value, f"{at}/{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.extend(_walk(value, f"{at}/{i}"))
    return out


@pytest.mark.parametrize("path", SCHEMAS)
def test_schemas_are_self_contained(path: str) -> None:
    # A Go or TypeScript validator must not need to fetch anything: every $ref is local.
    for _, node in _walk(KIT[path]):
        ref = node.get("$ref")
        if isinstance(ref, str):
            assert ref.startswith("#/"), ref


@pytest.mark.parametrize("path", SCHEMAS)
def test_array_schemas_use_array_keywords(path: str) -> None:
    # minLength/maxLength constrain strings; on an array they are silently ignored by every
    # validator, so a non-empty or bounded list would not be enforced by the schema.
    for where, node in _walk(KIT[path]):
        if node.get("type") == "array":
            assert "minLength" not in node, f"{where}: minLength on an array (should be minItems)"
            assert "maxLength" not in node, f"{where}: maxLength on an array (should be maxItems)"


@pytest.mark.parametrize("path", VALID)
def test_every_valid_vector_validates_and_decodes(path: str) -> None:
    vector = KIT[path]
    name = vector["message"]
    assert path.startswith(f"vectors/{name}/valid-")
    errors = [e.message for e in validator_for(name).iter_errors(vector["document"])]
    assert errors == []
    value = decode(TYPES[name], json.dumps(vector["document"]))
    assert type(value) is TYPES[name]


@pytest.mark.parametrize("path", INVALID)
def test_every_invalid_vector_is_refused_with_its_code_and_field(path: str) -> None:
    vector = KIT[path]
    name = vector["message"]
    assert path.startswith(f"vectors/{name}/invalid-")
    expect = vector["expect"]
    assert expect["code"] in ERROR_CLASSES
    assert expect["field"] is None or isinstance(expect["field"], str)
    with pytest.raises(SandboxError) as info:
        decode(TYPES[name], raw_of(vector))
    assert info.value.code == expect["code"], info.value.message
    assert info.value.field == expect["field"], info.value.message


SHAPE_FAULTS = {
    "unknown-field",
    "not-an-object",
    "duplicate-tier",
    "empty-network-modes",
    "unknown-operation",
    "unknown-authority",
    "missing-axis",
    "provider-coordinate",
    "bool-as-string",
    "rule9-os",
    "rule9-architecture",
    "rule4-resource-zero",
    "rule5-negative-mounts",
    "unknown-manager",
    "unpinned-image",
    "zero-memory",
    "setuid-mode",
    "bad-digest",
    "too-many-mounts",
    "empty-argv",
    "bad-env-name",
    "unknown-state",
    "foreign-lease-shape",
    "duplicate-path",
    "unknown-path-kind",
}
"""Faults of shape (type, enum, pattern, bounds, uniqueness, cardinality) that JSON Schema can express."""


def _slug(path: str) -> str:
    return path.rsplit("/", 1)[1].removeprefix("invalid-").removesuffix(".json")


SHAPE_VECTORS = [
    p
    for p in INVALID
    if "document" in KIT[p] and (_slug(p) in SHAPE_FAULTS or _slug(p).startswith(("missing-", "wrong-type-")))
]


def test_the_shape_fault_list_names_real_vectors() -> None:
    slugs = {_slug(p) for p in INVALID}
    assert slugs >= SHAPE_FAULTS


@pytest.mark.parametrize("path", SHAPE_VECTORS)
def test_shape_faults_are_refused_by_the_schema_too(path: str) -> None:
    # A provider in another language that validates with the schema alone must refuse these.
    vector = KIT[path]
    accepted = not list(validator_for(vector["message"]).iter_errors(vector["document"]))
    assert not accepted, f"the schema accepts {path}: {vector['description']}"


def test_every_message_has_a_schema_and_valid_and_invalid_vectors() -> None:
    for name, entry in INDEX["messages"].items():
        assert entry["schema"] == f"schemas/{name}.schema.json"
        assert entry["schema"] in KIT
        valid = [v for v in entry["vectors"] if KIT[v]["valid"]]
        invalid = [v for v in entry["vectors"] if not KIT[v]["valid"]]
        assert valid, name
        assert invalid, name
        for v in entry["vectors"]:
            assert KIT[v]["message"] == name


def test_the_index_lists_every_vector_exactly_once() -> None:
    listed = [v for entry in INDEX["messages"].values() for v in entry["vectors"]]
    assert sorted(listed) == VECTORS


def test_every_rule_vector_is_in_the_kit() -> None:
    for name, rules in RULES.items():
        for rule in rules:
            assert f"vectors/{name}/invalid-{rule.slug}.json" in KIT


@pytest.mark.parametrize("member", MEMBERS)
def test_every_member_has_its_request_and_result_in_the_index(member: str) -> None:
    request, result = MESSAGES[member]  # type: ignore[index]
    assert request.__name__ in INDEX["messages"]
    assert result.__name__ in INDEX["messages"]
    assert INDEX["messages"][request.__name__]["member"] == member
    assert INDEX["messages"][request.__name__]["role"] == "request"
    assert INDEX["messages"][result.__name__]["role"] == "result"


def test_the_index_says_which_request_and_result_each_member_uses() -> None:
    # activate and inspect return the same InstanceResult as provision, whose index entry names
    # only provision; an author reading the index alone (no Python) must still be able to tell
    # which schema each member's result uses.
    expected = {m: {"request": req.__name__, "result": res.__name__} for m, (req, res) in MESSAGES.items()}
    assert INDEX.get("members") == expected


def test_export_writes_plain_json_files(tmp_path: Path) -> None:
    count = export_kit(tmp_path)
    assert (tmp_path / "index.json").is_file()
    assert (tmp_path / "README.md").is_file()
    assert (tmp_path / "schemas").is_dir()
    assert (tmp_path / "vectors").is_dir()
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert count == len(written) == len(KIT) + 1
    assert sorted(set(written) - {"README.md"}) == sorted(KIT)
    for rel, value in KIT.items():
        assert json.loads((tmp_path / rel).read_text(encoding="utf-8")) == value
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert KIT_VERSION in readme
    assert "without Python" in readme


def test_export_is_readable_without_checkfu(tmp_path: Path) -> None:
    export_kit(tmp_path)
    script = """
import json, pathlib, sys
try:
    import checkfu
except ImportError:
    pass
else:
    sys.exit("checkfu is importable; the check proves nothing")
root = pathlib.Path(sys.argv[1])
index = json.loads((root / "index.json").read_text(encoding="utf-8"))
n = 0
for name, entry in index["messages"].items():
    json.loads((root / entry["schema"]).read_text(encoding="utf-8"))
    for v in entry["vectors"]:
        vector = json.loads((root / v).read_text(encoding="utf-8"))
        assert vector["message"] == name
        if "document_text" not in vector:
            assert "document" in vector
        n += 1
print(n)
"""
    # -S: no site-packages (so neither checkfu nor pydantic); -I: no user environment.
    out = subprocess.run(
        [sys.executable, "-S", "-I", "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(VECTORS)


def test_export_overwrites_an_existing_kit(tmp_path: Path) -> None:
    export_kit(tmp_path)
    (tmp_path / "index.json").write_text("stale", encoding="utf-8")
    export_kit(tmp_path)
    assert json.loads((tmp_path / "index.json").read_text(encoding="utf-8")) == INDEX
