"""The provider author kit cannot drift from the code: every vector runs through the decoders and the schemas.

Every schema is a valid draft 2020-12 schema; every valid vector validates and
decodes; every invalid vector is refused by the decoder with exactly its expected
code and field, and by the layer it names: the schema (which must refuse it), a
rule beyond the schema (the schema must accept it, and the rule is one of the few
listed), or the JSON text itself. The README states what a stranger needs: the
rules beyond the schema, every default, the digest's canonical form worked through,
and the wire form. ``test_kit_ajv`` checks the same vectors with a validator of
another language.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import rfc8785
from test_kit_patterns import ecma

from checkfu.conformance.author_kit import export_kit, readme
from checkfu.contract import ERROR_CLASSES, MEMBERS, MESSAGES, SandboxError, SandboxProfile, decode
from checkfu.contract.frames import FRAME_TYPES, parse
from checkfu.contract.model import Model
from checkfu.wire.errors import STATUS
from checkfu.wire.kit import (
    BEYOND_SCHEMA,
    FRAME_MESSAGES,
    JSON_RULES,
    KIT_VERSION,
    RULES,
    SCHEMA_DIALECT,
    build_kit,
    frame_models,
    message_types,
)

KIT: dict[str, Any] = build_kit()
INDEX: dict[str, Any] = KIT["index.json"]
README = readme(KIT)
TYPES = message_types()
SCHEMAS = sorted(p for p in KIT if p.startswith("schemas/"))
VECTORS = sorted(p for p in KIT if p.startswith("vectors/"))
VALID = [p for p in VECTORS if KIT[p]["valid"]]
INVALID = [p for p in VECTORS if not KIT[p]["valid"]]

EXPECTED_BEYOND_SCHEMA = {
    "minimum-not-above-maximum",
    "path-staged-once",
    "mount-targets-apart",
    "profile-digest",
    "path-utf8-bytes",
    "integers-written-as-integers",
    "timestamp-real-date",
}
"""The rules a decoder applies that JSON Schema cannot express. The first four compare values
within one document; a UTF-8 byte count is a weighted sum no practical pattern states; and
``8.0`` is an integer to JSON Schema 2020-12 and indistinguishable from ``8`` once parsed; a pattern
cannot count the days of each month (let alone leap years) in any practical way."""


def decode_vector(name: str, raw: str) -> object:
    """Decode as the runner does: a frame with the receiver's parser, any other message with the codec."""
    if name in FRAME_MESSAGES:
        return parse(raw, FRAME_MESSAGES[name])
    return decode(TYPES[name], raw)


def raw_of(vector: dict[str, Any]) -> str:
    if "document_text" in vector:
        text: str = vector["document_text"]
        return text
    return json.dumps(vector["document"])


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not ecma(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


EcmaValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _ecma_pattern})
"""Draft 2020-12 with ECMA-262 patterns (``$`` ends the string), as the dialect says."""


@cache
def validator_for(name: str) -> Any:
    return EcmaValidator(KIT[INDEX["messages"][name]["schema"]])


def schema_errors(name: str, document: Any) -> list[str]:
    return [e.message for e in validator_for(name).iter_errors(document)]


def _strict_loads(text: str) -> Any:
    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=no_constant)


# --- shape of the kit ----------------------------------------------------------------------------


def test_the_kit_has_every_message_type() -> None:
    assert set(INDEX["messages"]) == set(TYPES) | set(FRAME_MESSAGES)
    assert {"WireError", "ReadFilesHead", "ClientFrame", "ServerFrame"} <= set(INDEX["messages"])
    assert INDEX["version"] == KIT_VERSION
    assert INDEX["dialect"] == SCHEMA_DIALECT == "https://json-schema.org/draft/2020-12/schema"
    assert len(VALID) >= len(INDEX["messages"])
    assert len(INVALID) > 5 * len(INDEX["messages"])


@pytest.mark.parametrize("path", SCHEMAS)
def test_every_schema_is_a_draft_2020_12_schema(path: str) -> None:
    schema = KIT[path]
    assert schema["$schema"] == SCHEMA_DIALECT
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$id"] == f"urn:checkfu:{KIT_VERSION}:{path.removeprefix('schemas/').removesuffix('.schema.json')}"


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


@pytest.mark.parametrize("path", SCHEMAS)
def test_no_schema_uses_a_format_or_a_keyword_of_another_dialect(path: str) -> None:
    # "format" asserts nothing by default in 2020-12; "discriminator" and "nullable" are OpenAPI's.
    for where, node in _walk(KIT[path]):
        for keyword in ("format", "discriminator", "nullable"):
            assert keyword not in node or where.endswith("/properties"), f"{where}: {keyword}"


CONDITIONAL_DEFAULTS = {
    ("LifecycleAssurances", "release_destroys"),
    ("SandboxProviderCapabilities", "lifecycle_assurances"),
}
"""Optional fields whose default depends on another field (rule 7): stated by the rules, not by ``default``."""


def _objects(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield schema
    yield from schema.get("$defs", {}).values()


@pytest.mark.parametrize("path", SCHEMAS)
def test_every_optional_field_states_its_default(path: str) -> None:
    for obj in _objects(KIT[path]):
        required = set(obj.get("required", []))
        for name, prop in obj.get("properties", {}).items():
            if name in required:
                continue
            if (obj.get("title"), name) in CONDITIONAL_DEFAULTS:
                assert "default" not in prop, name
                assert "ephemeral_zdr" in prop["description"], name
            else:
                assert "default" in prop, f"{obj.get('title')}.{name} is optional and states no default"


def test_rule7s_conditional_default_is_in_the_envelopes_rules() -> None:
    rules = KIT["schemas/SandboxProviderCapabilities.schema.json"]["allOf"]
    (rule7,) = [r for r in rules if r["$comment"].startswith("rule 7")]
    then = rule7["then"]["properties"]["lifecycle_assurances"]
    otherwise = rule7["else"]["properties"]["lifecycle_assurances"]
    assert then["properties"]["release_destroys"] == {"const": True, "default": True}
    assert otherwise["properties"]["release_destroys"] == {"default": False}
    assert otherwise["default"]["release_destroys"] is False


def test_the_envelope_schema_states_its_expressible_rules() -> None:
    comments = [r["$comment"] for r in KIT["schemas/SandboxProviderCapabilities.schema.json"]["allOf"]]
    assert [c.split(":")[0] for c in comments] == ["rule 1", "rule 2", "rule 3", "rule 6", "rule 7", "rule 8"]


# --- vectors through the decoders ----------------------------------------------------------------


@pytest.mark.parametrize("path", VALID)
def test_every_valid_vector_validates_and_decodes(path: str) -> None:
    vector = KIT[path]
    name = vector["message"]
    assert path.startswith(f"vectors/{name}/valid-")
    assert schema_errors(name, vector["document"]) == []
    value = decode_vector(name, json.dumps(vector["document"]))
    if name in FRAME_MESSAGES:
        assert type(value) is FRAME_TYPES[FRAME_MESSAGES[name]][vector["document"]["type"]]
    else:
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
        decode_vector(name, raw_of(vector))
    assert info.value.code == expect["code"], info.value.message
    assert info.value.field == expect["field"], info.value.message


# --- which layer refuses each invalid vector -----------------------------------------------------

BY_SCHEMA = [p for p in INVALID if KIT[p]["refused_by"] == "schema"]
BY_RULE = [p for p in INVALID if KIT[p]["refused_by"] == "rule"]
BY_JSON = [p for p in INVALID if KIT[p]["refused_by"] == "json"]


def test_every_invalid_vector_names_the_layer_that_refuses_it() -> None:
    assert sorted(BY_SCHEMA + BY_RULE + BY_JSON) == INVALID
    for p in BY_SCHEMA:
        assert "document" in KIT[p], p
        assert "beyond_schema" not in KIT[p] and "json_rule" not in KIT[p], p
    for p in BY_RULE:
        assert KIT[p]["beyond_schema"] in BEYOND_SCHEMA, p
        assert "json_rule" not in KIT[p], p
    for p in BY_JSON:
        assert KIT[p]["json_rule"] in JSON_RULES, p
        assert "document_text" in KIT[p], p


def test_the_rules_beyond_the_schema_are_exactly_these() -> None:
    assert set(BEYOND_SCHEMA) == EXPECTED_BEYOND_SCHEMA
    assert {KIT[p]["beyond_schema"] for p in BY_RULE} == EXPECTED_BEYOND_SCHEMA
    assert INDEX["beyond_schema"] == BEYOND_SCHEMA


def test_every_json_text_rule_has_a_vector() -> None:
    assert {KIT[p]["json_rule"] for p in BY_JSON} == set(JSON_RULES)


@pytest.mark.parametrize("path", BY_SCHEMA)
def test_the_schema_refuses_what_it_says_it_refuses(path: str) -> None:
    vector = KIT[path]
    assert schema_errors(vector["message"], vector["document"]), f"the schema accepts {path}"


@pytest.mark.parametrize("path", BY_RULE)
def test_a_rule_beyond_the_schema_is_its_vectors_only_fault(path: str) -> None:
    # The schema accepts the document: only the named rule refuses it.
    vector = KIT[path]
    document = vector["document"] if "document" in vector else _strict_loads(vector["document_text"])
    assert schema_errors(vector["message"], document) == [], path


@pytest.mark.parametrize("path", BY_JSON)
def test_a_json_text_rule_is_its_vectors_only_fault(path: str) -> None:
    vector = KIT[path]
    name, text, rule = vector["message"], vector["document_text"], vector["json_rule"]
    if rule in ("not-json", "nan"):
        with pytest.raises(ValueError):
            _strict_loads(text)
        return
    document = json.loads(text)  # last key wins; an unpaired surrogate passes: most parsers do this
    assert schema_errors(name, document) == [], path
    if rule == "duplicate-key":
        # Written once, the document decodes: the duplicate alone is the fault.
        decode_vector(name, json.dumps(document))
        assert text != json.dumps(document)


def test_each_duplicate_key_vector_is_the_valid_example_with_a_key_written_twice() -> None:
    dups = [p for p in BY_JSON if KIT[p]["json_rule"] == "duplicate-key"]
    assert len(dups) >= len(TYPES) - 1  # every message with a field (DescribeRequest has none)
    for p in dups:
        name = KIT[p]["message"]
        assert json.loads(KIT[p]["document_text"]) == KIT[f"vectors/{name}/valid-0.json"]["document"], p


def test_integer_spellings_are_refused_although_json_schema_takes_them() -> None:
    vectors = [p for p in BY_RULE if KIT[p]["beyond_schema"] == "integers-written-as-integers"]
    assert any("8.0" in KIT[p]["document_text"] for p in vectors)
    assert any("8e0" in KIT[p]["document_text"] for p in vectors)
    # JSON Schema 2020-12: "a number with a zero fractional part" is an integer, so the schema cannot refuse it.
    assert jsonschema.Draft202012Validator({"type": "integer"}).is_valid(8.0)


def test_the_shape_faults_are_refused_by_the_schema() -> None:
    # The common faults are schema faults: a stranger validating with the schema alone refuses them.
    by_schema = {p.rsplit("/", 1)[1] for p in BY_SCHEMA}
    for slug in ("unknown-field", "not-an-object", "duplicate-tier", "empty-network-modes", "rule9-os"):
        assert f"invalid-{slug}.json" in by_schema
    for name in ("rule1", "rule2", "rule3", "rule6", "rule7", "rule8"):
        assert any(s.startswith(f"invalid-{name}-") for s in by_schema), name


# --- the index -----------------------------------------------------------------------------------


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


# --- the openProcess frames ----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "role"), FRAME_MESSAGES.items())
def test_the_frame_union_is_every_frame_the_side_sends(name: str, role: str) -> None:
    entry = INDEX["messages"][name]
    assert entry["sender"] == role
    types = FRAME_TYPES[role]  # type: ignore[index]
    assert entry["frame_types"] == {t: f"schemas/{m.__name__}.schema.json" for t, m in types.items()}
    union = KIT[entry["schema"]]
    assert [ref["$ref"].rsplit("/", 1)[1] for ref in union["oneOf"]] == [m.__name__ for m in types.values()]
    for path in entry["frame_types"].values():
        assert path in KIT
    valid_types = {KIT[v]["document"]["type"] for v in entry["vectors"] if KIT[v]["valid"]}
    assert valid_types == set(types)


def test_each_frame_model_and_resume_point_has_a_schema() -> None:
    assert set(INDEX["frame_schemas"]) == set(frame_models())
    assert "ResumePoint" in INDEX["frame_schemas"]
    for path in INDEX["frame_schemas"].values():
        assert path in KIT


@pytest.mark.parametrize("name", sorted(FRAME_MESSAGES))
def test_frames_a_receiver_refuses_include_unknown_types_and_bad_fields(name: str) -> None:
    slugs = {v.rsplit("/", 1)[1] for v in INDEX["messages"][name]["vectors"] if not KIT[v]["valid"]}
    assert {"invalid-unknown-type.json", "invalid-missing-type.json", "invalid-window-zero.json"} <= slugs
    assert any("only-type" in s for s in slugs)  # a type of the other side


# --- the digest ----------------------------------------------------------------------------------


def test_the_digest_example_is_worked_through() -> None:
    example = KIT["digest-example.json"]
    written, decoded = example["profile_as_written"], example["profile_decoded"]
    # The example shows the defaults being filled in: neither is written, both are in the canonical form.
    assert "packages" not in written
    assert "allowlist" not in written["network_policy"]
    assert decoded["packages"] == {}
    assert decoded["network_policy"]["allowlist"] == []
    assert decode(SandboxProfile, json.dumps(written)).model_dump(mode="json") == decoded
    assert example["canonical"].encode() == rfc8785.dumps(decoded)
    assert example["digest"] == "sha256:" + hashlib.sha256(example["canonical"].encode()).hexdigest()
    assert example["digest"] == decode(SandboxProfile, json.dumps(written)).digest
    assert example["digest"] != "sha256:" + hashlib.sha256(rfc8785.dumps(written)).hexdigest()


def test_every_valid_profile_digest_is_of_the_profile_with_defaults_filled() -> None:
    seen = 0
    for p in VALID:
        doc = KIT[p]["document"]
        if "profile_digest" in doc and "profile" in doc:
            filled = decode(SandboxProfile, json.dumps(doc["profile"])).model_dump(mode="json")
            assert doc["profile_digest"] == "sha256:" + hashlib.sha256(rfc8785.dumps(filled)).hexdigest()
            seen += 1
    assert seen >= 5


# --- the README ----------------------------------------------------------------------------------


def test_the_readme_names_every_rule_beyond_the_schema_and_what_a_decoder_does() -> None:
    section = README.split("## Step 3: the rules beyond the schema", 1)[1].split("\n## ", 1)[0]
    for name in BEYOND_SCHEMA:
        assert f"**`{name}`**" in section
    for words in (
        "SandboxEnvelopeInvalid`, field `minimum_resources.D`",
        "SandboxPathRejected`, field `files.I.path`",
        "SandboxPathRejected`, field `mounts.J.target`",
        "SandboxDigestMismatch`, field `profile_digest`",
        "4096",
        "`8.0`, `8e0`",
    ):
        assert words in section, words
    assert "Exactly these rules cannot be expressed in JSON Schema" in section


def test_the_readme_no_longer_says_an_expressible_rule_is_beyond_json_schema() -> None:
    assert 'durable retention requires snapshots") are beyond JSON Schema' not in README
    assert "some cross-field rules" not in README


def test_the_readme_names_every_json_text_rule() -> None:
    for name in JSON_RULES:
        assert f"**`{name}`**" in README


def test_the_readme_shows_the_digests_canonical_bytes_and_digest() -> None:
    example = KIT["digest-example.json"]
    assert "WITH EVERY DEFAULT FILLED IN".lower() in README.lower().replace("**", "")
    assert f"```\n{example['canonical']}\n```" in README
    assert f"```\n{example['digest']}\n```" in README
    assert "RFC 8785" in README


def _optional_fields() -> Iterator[tuple[str, str]]:
    for path in SCHEMAS:
        for obj in _objects(KIT[path]):
            for name in obj.get("properties", {}):
                if name not in obj.get("required", []):
                    yield obj["title"], name


def test_the_readme_documents_every_optional_field_and_its_default() -> None:
    for title, name in set(_optional_fields()):
        row = re.search(rf"^\| `{title}` \| `{name}` \| (.*) \| (.*) \|$", README, re.M)
        assert row, f"{title}.{name}"
        assert row.group(1) and row.group(2), f"{title}.{name}: no default or no meaning"
    for words in ("`user_namespace`", "so root inside is not root on the host", "release_destroys` is **true** when"):
        assert words in README, words


def test_the_readme_describes_the_wire_form() -> None:
    for words in (
        "POST <base>/v1/<member>",
        "Authorization: Bearer <credential>",
        "`Checkfu-Request` header",
        "application/x-checkfu-files",
        "one line of JSON, a\n  `ReadFilesHead`",
        "| `0x01` | stdin | client |",
        "| `0x02` | out (stdout) | server |",
        "| `0x03` | err (stderr) | server |",
        "### Credit and windows",
        "GET <base>/v1/openProcess",
    ):
        assert words in README, words
    for code, status in STATUS.items():
        assert f"| `{code}` | {status} |" in README


# --- export --------------------------------------------------------------------------------------


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
    text = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert text == README
    assert KIT_VERSION in text
    assert "without Python" in text


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


def test_every_model_in_the_kit_is_a_contract_model() -> None:
    for model in [*TYPES.values(), *frame_models().values()]:
        assert issubclass(model, Model)
