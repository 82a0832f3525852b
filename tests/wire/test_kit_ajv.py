"""The exported kit, checked by a JSON Schema validator of another language: Ajv, under Node.js.

``tests/wire/ajv/check-kit.mjs`` reads nothing but the exported folder. Ajv (draft
2020-12, strict mode: no unknown keyword, no keyword on a type it cannot apply to)
must compile every schema, accept every valid vector, refuse every ``schema``
vector, and accept every ``rule`` vector (only a rule beyond JSON Schema refuses
it); a ``json`` vector must break its JSON text rule alone. From Ajv's own errors it checks
what the README says a decoder reports: a ``SandboxPathRejected`` schema vector fails a
pattern or ``maxLength`` marked as the path rule at exactly its field (and only those do), and
a vector only an ``if``/``then`` clause refuses names a field the clause's ``$comment`` lists.
Every message names its code in ``index.json``. It also recomputes every
``profile_digest`` from scratch: the schema's defaults filled in by Ajv, RFC 8785
written by hand in JavaScript, SHA-256. A broken kit makes it fail; the last tests
prove that on purpose.

Node.js and Ajv come from ``scripts/setup``; without them these tests skip, unless
``CHECKFU_REQUIRE_NODE=1`` (as ``scripts/check`` sets) makes that a failure (the
``node_ajv`` fixture of ``tests/conftest.py``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_kit import EXPECTED_BEYOND_SCHEMA, KIT, VALID, VECTORS
from test_kit_claims import CLAUSE_VECTORS

from checkfu.conformance.author_kit import export_kit
from checkfu.wire.kit import FRAME_MESSAGES, JSON_RULES


def run_ajv(node_ajv: Any, kit: Path) -> tuple[int, dict[str, Any]]:
    out = subprocess.run(
        [node_ajv.node, str(node_ajv.directory / "check-kit.mjs"), str(kit)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.stdout, out.stderr
    return out.returncode, json.loads(out.stdout)


@pytest.fixture(scope="module")
def checked(node_ajv: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any]]:
    """Ajv's report on the kit as exported."""
    directory = tmp_path_factory.mktemp("kit")
    export_kit(directory)
    return run_ajv(node_ajv, directory)


def test_ajv_accepts_and_refuses_every_vector_as_the_kit_says(node_ajv: Any, checked: tuple[int, Any]) -> None:
    code, report = checked
    assert report["failures"] == [], json.dumps(report["failures"], indent=2)
    assert code == 0
    assert report["warnings"] == []
    assert report["ajv"] == json.loads((node_ajv.directory / "package.json").read_text())["dependencies"]["ajv"]
    assert report["vectors"] == len(VECTORS)
    assert report["valid"] == len(VALID)
    assert report["schemas"] == len([p for p in KIT if p.startswith("schemas/")])
    counts = {
        layer: len([p for p in VECTORS if not KIT[p]["valid"] and KIT[p]["refused_by"] == layer])
        for layer in ("schema", "rule", "json")
    }
    assert report["refused_by"] == counts


def test_ajv_finds_the_path_rule_and_each_clauses_field_where_the_readme_says(checked: tuple[int, Any]) -> None:
    _, report = checked
    path_faults = [
        p
        for p in VECTORS
        if not KIT[p]["valid"]
        and KIT[p]["refused_by"] == "schema"
        and KIT[p]["message"] not in FRAME_MESSAGES
        and KIT[p]["expect"]["code"] == "SandboxPathRejected"
    ]
    assert report["path_rule"] == len(path_faults) >= 10
    assert report["clause_fields"] == len(CLAUSE_VECTORS) >= 12
    assert report["openapi"] == KIT["openapi.json"]["openapi"]


def test_what_ajv_cannot_refuse_is_exactly_the_rules_beyond_the_schema(checked: tuple[int, Any]) -> None:
    _, report = checked
    assert set(report["beyond_schema"]) == EXPECTED_BEYOND_SCHEMA
    assert set(report["json_rules"]) == set(JSON_RULES)


def test_javascript_computes_every_profile_digest_from_the_readmes_recipe(checked: tuple[int, Any]) -> None:
    _, report = checked
    with_digest = [p for p in VALID if {"profile", "profile_digest"} <= set(KIT[p]["document"])]
    assert report["digests"] == len(with_digest) + 2  # and the two worked examples, the profile's and the envelope's
    assert report["failures"] == []


# --- the check fails when the kit is wrong -------------------------------------------------------


def _edit(kit: Path, rel: str, change: Any) -> None:
    path = kit / rel
    doc = json.loads(path.read_text(encoding="utf-8"))
    change(doc)
    path.write_text(json.dumps(doc), encoding="utf-8")


def _failed(report: dict[str, Any]) -> set[str]:
    return {f["vector"] for f in report["failures"]}


def test_a_rule_dropped_from_a_schema_fails(node_ajv: Any, tmp_path: Path) -> None:
    export_kit(tmp_path)
    _edit(
        tmp_path,
        "schemas/SandboxProviderCapabilities.schema.json",
        lambda s: s.__setitem__("allOf", [r for r in s["allOf"] if not r["$comment"].startswith("rule 2")]),
    )
    code, report = run_ajv(node_ajv, tmp_path)
    assert code == 1
    assert "vectors/SandboxProviderCapabilities/invalid-rule2-durable-without-snapshots.json" in _failed(report)


def test_a_rule_claimed_beyond_the_schema_that_the_schema_refuses_fails(node_ajv: Any, tmp_path: Path) -> None:
    export_kit(tmp_path)
    rel = "vectors/SandboxProviderCapabilities/invalid-rule1-fixed-without-images.json"

    def claim(v: dict[str, Any]) -> None:
        v.update(refused_by="rule", beyond_schema="minimum-not-above-maximum")

    _edit(tmp_path, rel, claim)
    code, report = run_ajv(node_ajv, tmp_path)
    assert code == 1
    assert rel in _failed(report)


def test_a_wrong_digest_fails(node_ajv: Any, tmp_path: Path) -> None:
    export_kit(tmp_path)
    _edit(tmp_path, "digest-example.json", lambda d: d["profile_as_written"].__setitem__("tier", "container"))
    rel = "vectors/MaterializeRequest/valid-1.json"
    _edit(tmp_path, rel, lambda v: v["document"]["profile"]["resource_limits"].__setitem__("pids", 65))
    code, report = run_ajv(node_ajv, tmp_path)
    assert code == 1
    assert {"digest-example.json", rel} <= _failed(report)


def test_a_schema_default_removed_changes_the_digest(node_ajv: Any, tmp_path: Path) -> None:
    # The digest needs every default filled in: without the schema's default for packages,
    # JavaScript computes the digest of the profile as written, and it does not match.
    export_kit(tmp_path)
    _edit(tmp_path, "schemas/SandboxProfile.schema.json", lambda s: s["properties"]["packages"].pop("default"))
    code, report = run_ajv(node_ajv, tmp_path)
    assert code == 1
    assert "digest-example.json" in _failed(report)


def test_a_wrong_envelope_digest_or_a_lost_rule_7_default_fails(node_ajv: Any, tmp_path: Path) -> None:
    # Rule 7: beside ephemeral_zdr an omitted release_destroys is true, stated as the default of an if/then
    # clause. Without it JavaScript fills false and computes another digest.
    export_kit(tmp_path)
    _edit(tmp_path, "envelope-digest-example.json", lambda d: d.__setitem__("digest", "sha256:" + "0" * 64))
    code, report = run_ajv(node_ajv, tmp_path)
    assert code == 1 and "envelope-digest-example.json" in _failed(report)
    export_kit(tmp_path)

    def lose_rule_7_default(schema: dict[str, Any]) -> None:
        (clause,) = [c for c in schema["allOf"] if c["$comment"].startswith("rule 7")]
        clause["then"]["properties"]["lifecycle_assurances"]["properties"]["release_destroys"].pop("default")
        clause["then"]["properties"]["lifecycle_assurances"]["default"] = {}

    _edit(tmp_path, "schemas/SandboxProviderCapabilities.schema.json", lose_rule_7_default)
    code, report = run_ajv(node_ajv, tmp_path)
    assert code == 1 and "envelope-digest-example.json" in _failed(report)


def test_a_clause_naming_another_field_fails(node_ajv: Any, tmp_path: Path) -> None:
    # The field a rule-2 refusal names is the if side's (retention_modes): a $comment naming the
    # then side's field (snapshots), as a validator would report it, disagrees with the vector.
    export_kit(tmp_path)

    def then_side(s: dict[str, Any]) -> None:
        (rule2,) = [r for r in s["allOf"] if r["$comment"].startswith("rule 2")]
        rule2["$comment"] = rule2["$comment"].replace("field: retention_modes", "field: snapshots")

    _edit(tmp_path, "schemas/SandboxProviderCapabilities.schema.json", then_side)
    code, report = run_ajv(node_ajv, tmp_path)
    assert code == 1
    assert _failed(report) == {"vectors/SandboxProviderCapabilities/invalid-rule2-durable-without-snapshots.json"}


def test_an_unmarked_path_pattern_fails(node_ajv: Any, tmp_path: Path) -> None:
    export_kit(tmp_path)
    _edit(tmp_path, "schemas/WriteFileRequest.schema.json", lambda s: s["properties"]["path"].pop("$comment"))
    code, report = run_ajv(node_ajv, tmp_path)
    assert code == 1
    assert {
        "vectors/WriteFileRequest/invalid-trailing-slash.json",
        "vectors/WriteFileRequest/invalid-path-over-4096-characters.json",
    } <= _failed(report)


def test_a_message_without_its_code_fails(node_ajv: Any, tmp_path: Path) -> None:
    export_kit(tmp_path)
    _edit(tmp_path, "index.json", lambda i: i["messages"]["ExecRequest"].pop("code"))
    code, report = run_ajv(node_ajv, tmp_path)
    assert code == 1
    assert "schemas/ExecRequest.schema.json" in _failed(report)
