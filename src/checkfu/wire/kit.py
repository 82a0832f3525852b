"""The provider author kit: JSON Schemas and golden vectors, from the models the code uses.

``build_kit()`` returns every file as ``{relative path: JSON value}``; ``export_kit``
writes them. Nothing here is hand-maintained beside the models: the schemas are
generated from them and the valid vectors are ``checkfu.contract.examples``. The
invalid vectors state, independently of the decoder, the error code and field
path a conforming decoder must report; the project's tests run every vector
through the decoders, so the kit cannot drift from the code.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkfu.contract import examples as ex
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import (
    SandboxDigestMismatch,
    SandboxEnvelopeInvalid,
    SandboxPathRejected,
    SandboxProfileInvalid,
)
from checkfu.contract.members import MESSAGES
from checkfu.contract.model import Model
from checkfu.contract.mounts import MountPlan
from checkfu.contract.profile import SandboxProfile
from checkfu.wire.errors import WireError

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
KIT_VERSION = "v1"


def message_types() -> dict[str, type[Model]]:
    """Every message of the wire form, by name."""
    out: dict[str, type[Model]] = {
        "SandboxProviderCapabilities": SandboxProviderCapabilities,
        "SandboxProfile": SandboxProfile,
        "MountPlan": MountPlan,
        "WireError": WireError,
    }
    for request, result in MESSAGES.values():
        out[request.__name__] = request
        out[result.__name__] = result
    return out


def member_of(name: str) -> dict[str, str]:
    for member, (request, result) in MESSAGES.items():
        if request.__name__ == name:
            return {"member": member, "role": "request"}
        if result.__name__ == name:
            return {"member": member, "role": "result"}
    return {}


def schema(model: type[Model]) -> dict[str, Any]:
    body = model.model_json_schema(mode="validation")
    return {"$schema": SCHEMA_DIALECT, "$id": f"urn:checkfu:{KIT_VERSION}:{model.__name__}", **body}


@dataclass(frozen=True)
class Invalid:
    slug: str
    description: str
    code: str
    field: str | None
    mutate: Callable[[dict[str, Any]], Any] | None = None
    text: str | None = None
    """A raw document, for what JSON values cannot express (duplicate keys, NaN)."""


def _wrong_type(value: Any) -> Any:
    if isinstance(value, bool):
        return "true"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return 12345
    if isinstance(value, list):
        return {"0": value}
    if isinstance(value, dict):
        return [value]
    return {"unexpected": True}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return apply


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        del node[last]

    return apply


def generic_invalid(model: type[Model], example: dict[str, Any]) -> Iterator[Invalid]:
    """Unknown field, each required field missing, each field of the wrong JSON type."""
    own = model.decode_error.code
    yield Invalid("unknown-field", "an unknown top-level field is refused", own, "x_unknown", _set("x_unknown", 1))
    for name, info in model.model_fields.items():
        if info.is_required():
            yield Invalid(f"missing-{name}", f"required field {name} is missing", own, name, _delete(name))
        if name in example:
            yield Invalid(
                f"wrong-type-{name}",
                f"{name} has the wrong JSON type",
                own,
                name,
                _set(name, _wrong_type(example[name])),
            )
    yield Invalid("duplicate-key", "a duplicate object key is refused", own, None, text='{"a": 1, "a": 2}')
    yield Invalid("not-json", "a document that is not JSON is refused", own, None, text="{not json")
    yield Invalid("nan", "NaN is not JSON", own, None, text='{"x": NaN}')
    yield Invalid("not-an-object", "a message is a JSON object", own, None, mutate=lambda doc: [doc])


def _envelope(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        for key, value in changes.items():
            _set(key, value)(doc)

    return apply


ENV = SandboxEnvelopeInvalid.code
PROF = SandboxProfileInvalid.code
PATH = SandboxPathRejected.code

RULES: dict[str, list[Invalid]] = {
    "SandboxProviderCapabilities": [
        Invalid(
            "rule1-fixed-without-images",
            "image_mode fixed needs fixed_base_images",
            ENV,
            "fixed_base_images",
            _envelope(image_mode="fixed"),
        ),
        Invalid(
            "rule1-images-without-fixed",
            "fixed_base_images only with image_mode fixed",
            ENV,
            "fixed_base_images",
            _envelope(fixed_base_images=[ex.IMAGE_ID]),
        ),
        Invalid(
            "rule2-durable-without-snapshots",
            "durable retention needs snapshots",
            ENV,
            "retention_modes",
            _envelope(retention_modes=["durable", "ephemeral_zdr"]),
        ),
        Invalid(
            "rule3-provider-custody-without-snapshots",
            "provider custody needs snapshots",
            ENV,
            "snapshot_custody",
            _envelope(snapshot_custody="provider"),
        ),
        Invalid(
            "rule4-minimum-above-maximum",
            "minimum_resources above maximum_resources",
            ENV,
            "minimum_resources.memory_mib",
            _envelope(**{"minimum_resources.memory_mib": 1 << 20}),
        ),
        Invalid(
            "rule4-resource-zero",
            "resources are positive",
            ENV,
            "maximum_resources.pids",
            _envelope(**{"maximum_resources.pids": 0}),
        ),
        Invalid("rule5-negative-mounts", "max_mounts is non-negative", ENV, "max_mounts", _envelope(max_mounts=-1)),
        Invalid(
            "rule6-grade-without-allowlist",
            "an egress grade needs allowlist",
            ENV,
            "egress_certification",
            _envelope(egress_certification="advisory_filter"),
        ),
        Invalid(
            "rule7-zdr-release-destroys-false",
            "an explicit release_destroys false contradicts ephemeral_zdr (an absent one is true)",
            ENV,
            "lifecycle_assurances.release_destroys",
            _envelope(lifecycle_assurances={"release_destroys": False, "cold_compensation": True}),
        ),
        Invalid(
            "rule8-enumerates-without-operation",
            "enumerates_allocations needs listAllocations",
            ENV,
            "lifecycle_assurances.enumerates_allocations",
            _envelope(lifecycle_assurances={"release_destroys": True, "enumerates_allocations": True}),
        ),
        Invalid(
            "rule9-os",
            "os is always linux",
            ENV,
            "platforms.0.os",
            _envelope(platforms=[{"os": "windows", "architecture": "amd64"}]),
        ),
        Invalid(
            "rule9-architecture",
            "architecture is amd64 or arm64",
            ENV,
            "platforms.0.architecture",
            _envelope(platforms=[{"os": "linux", "architecture": "riscv64"}]),
        ),
        Invalid(
            "duplicate-tier",
            "set-valued lists refuse duplicates",
            ENV,
            "tiers",
            _envelope(tiers=["container", "container"]),
        ),
        Invalid(
            "empty-network-modes", "required lists are non-empty", ENV, "network_modes", _envelope(network_modes=[])
        ),
        Invalid(
            "provider-coordinate",
            "provider matches ^[a-z0-9][a-z0-9._-]{0,254}$",
            ENV,
            "provider",
            _envelope(provider="Acme Sandbox"),
        ),
        Invalid(
            "revision-not-printable",
            "revisions are printable ASCII",
            ENV,
            "provider_revision",
            _envelope(provider_revision="1.0\n"),
        ),
        Invalid(
            "missing-axis",
            "all nine axes are required",
            ENV,
            "enforcement.disk_limit",
            _delete("enforcement.disk_limit"),
        ),
        Invalid(
            "unknown-authority",
            "four authorities only",
            ENV,
            "enforcement.non_root",
            _envelope(**{"enforcement.non_root": "trust_me"}),
        ),
        Invalid(
            "unknown-operation",
            "three optional operations only",
            ENV,
            "operations.0",
            _envelope(operations=["teleport"]),
        ),
        Invalid("bool-as-string", "booleans are JSON booleans", ENV, "snapshots", _envelope(snapshots="false")),
    ],
    "SandboxProfile": [
        Invalid("unpinned-package", "packages are pinned", PROF, "packages.apt.0", _set("packages.apt", ["jq"])),
        Invalid("unknown-manager", "six package managers only", PROF, "packages.brew", _set("packages.brew", [])),
        Invalid(
            "allowlist-empty",
            "allowlist mode names destinations",
            PROF,
            "network_policy.allowlist",
            _set("network_policy", {"mode": "allowlist"}),
        ),
        Invalid(
            "destinations-without-allowlist",
            "destinations only with allowlist",
            PROF,
            "network_policy.allowlist",
            _set("network_policy", {"mode": "none", "allowlist": ["a.example:443"]}),
        ),
        Invalid(
            "port-zero",
            "ports are 1..65535",
            PROF,
            "network_policy.allowlist.0",
            _set("network_policy", {"mode": "allowlist", "allowlist": ["a.example:0"]}),
        ),
        Invalid(
            "unpinned-image",
            "base_image is pinned by digest or image id",
            PROF,
            "base_image",
            _set("base_image", "debian:12"),
        ),
        Invalid(
            "zero-memory",
            "resources are positive",
            PROF,
            "resource_limits.memory_mib",
            _set("resource_limits.memory_mib", 0),
        ),
    ],
    "MountPlan": [
        Invalid("dotdot", "mount paths are normalized", PATH, "files.0.path", _set("files.0.path", "../etc/passwd")),
        Invalid(
            "absolute-file",
            "file paths are relative to the target",
            PATH,
            "files.0.path",
            _set("files.0.path", "/etc/passwd"),
        ),
        Invalid("relative-target", "targets are absolute", PATH, "target", _set("target", "workspace")),
        Invalid("root-target", "a mount may not cover /", PATH, "target", _set("target", "/")),
        Invalid("staged-twice", "a path is staged once", PATH, "files.1.path", _set("files.1.path", "README")),
        Invalid("setuid-mode", "modes are permission bits only", PROF, "files.0.mode", _set("files.0.mode", 0o4755)),
        Invalid("bad-digest", "digests are sha256: or git:", PROF, "files.0.digest", _set("files.0.digest", "md5:0")),
    ],
    "ProvisionRequest": [
        Invalid(
            "too-many-mounts",
            "at most 64 mounts",
            "SandboxProtocolViolation",
            "mounts",
            lambda doc: doc.__setitem__("mounts", [{"target": f"/m{i}", "files": []} for i in range(65)]),
        ),
        Invalid(
            "overlapping-mounts",
            "mount targets do not overlap",
            PATH,
            "mounts.1.target",
            lambda doc: doc.__setitem__("mounts", [{"target": "/w", "files": []}, {"target": "/w/sub", "files": []}]),
        ),
        Invalid(
            "profile-digest-mismatch",
            "profile_digest is the profile's digest",
            SandboxDigestMismatch.code,
            "profile_digest",
            _set("profile_digest", "sha256:" + "0" * 64),
        ),
        Invalid("nul-in-path", "no NUL in a path", PATH, "mounts.0.target", _set("mounts.0.target", "/work\x00")),
    ],
    "ExecRequest": [
        Invalid("empty-argv", "argv is non-empty", "SandboxProtocolViolation", "argv", _set("argv", [])),
        Invalid(
            "bad-env-name",
            "env names are identifiers",
            "SandboxProtocolViolation",
            "env.NOT-A-NAME",
            _set("env", {"NOT-A-NAME": "x"}),
        ),
        Invalid("relative-cwd", "cwd is absolute", PATH, "cwd", _set("cwd", "tmp")),
        Invalid(
            "stdin-not-base64", "bytes are standard base64", "SandboxProtocolViolation", "stdin", _set("stdin", "***")
        ),
    ],
    "InstanceResult": [
        Invalid("unknown-state", "three instance states", "SandboxResultInvalid", "state", _set("state", "running")),
        Invalid(
            "foreign-lease-shape",
            "lease epochs are integers",
            "SandboxResultInvalid",
            "lease.lease_epoch",
            _set("lease.lease_epoch", 1.5),
        ),
    ],
    "ListDirResult": [
        Invalid(
            "entries-of-a-file",
            "only a directory has entries",
            "SandboxResultInvalid",
            "entries",
            _set("kind", "file"),
        ),
        Invalid(
            "truncated-missing",
            "only a directory listing can be truncated",
            "SandboxResultInvalid",
            "truncated",
            lambda doc: doc.update(kind="missing", entries=[], truncated=True),
        ),
        Invalid("unknown-path-kind", "five path kinds only", "SandboxResultInvalid", "kind", _set("kind", "fifo")),
    ],
    "ReadFilesRequest": [
        Invalid("dotdot-path", "paths are normalized", PATH, "paths.0", _set("paths.0", "/workspace/../etc")),
        Invalid("duplicate-path", "paths are unique", "SandboxProtocolViolation", "paths", _set("paths", ["/a", "/a"])),
    ],
    "WriteFileRequest": [
        Invalid("trailing-slash", "no empty segment", PATH, "path", _set("path", "/workspace/")),
    ],
}


def invalid_vectors(name: str, model: type[Model], example: dict[str, Any]) -> Iterator[Invalid]:
    yield from generic_invalid(model, example)
    yield from RULES.get(name, [])


def build_kit() -> dict[str, Any]:
    """Every file of the kit, by relative path."""
    files: dict[str, Any] = {}
    index: dict[str, Any] = {
        "version": KIT_VERSION,
        "dialect": SCHEMA_DIALECT,
        "members": {m: {"request": req.__name__, "result": res.__name__} for m, (req, res) in MESSAGES.items()},
        "messages": {},
    }
    examples = ex.described()
    for name, model in message_types().items():
        files[f"schemas/{name}.schema.json"] = schema(model)
        entry: dict[str, Any] = {"schema": f"schemas/{name}.schema.json", **member_of(name), "vectors": []}
        described = examples.get(name) or ([("valid example 0", ex.wire_error())] if name == "WireError" else [])
        docs = [doc for _, doc in described]
        for i, (what, doc) in enumerate(described):
            path = f"vectors/{name}/valid-{i}.json"
            files[path] = {"message": name, "valid": True, "description": what, "document": doc}
            entry["vectors"].append(path)
        if docs:
            for inv in invalid_vectors(name, model, docs[0]):
                vector: dict[str, Any] = {
                    "message": name,
                    "valid": False,
                    "description": inv.description,
                    "expect": {"code": inv.code, "field": inv.field},
                }
                if inv.text is not None:
                    vector["document_text"] = inv.text
                else:
                    doc = copy.deepcopy(docs[0])
                    assert inv.mutate is not None
                    replaced = inv.mutate(doc)
                    vector["document"] = doc if replaced is None else replaced
                path = f"vectors/{name}/invalid-{inv.slug}.json"
                files[path] = vector
                entry["vectors"].append(path)
        index["messages"][name] = entry
    files["index.json"] = index
    return files


README = """# checkfu provider author kit ({version})

A provider written in any language can use this folder without Python.

- `index.json` maps every lifecycle member to its request and result message
  (`members`), and lists every wire message: its JSON Schema, the first member and role
  (request or result) it belongs to, and its vectors.
- `schemas/NAME.schema.json` are JSON Schemas (draft 2020-12) generated from the models
  the runner decodes with. They check shape; some cross-field rules (for example
  "durable retention requires snapshots") are beyond JSON Schema and are covered by
  the vectors.
- `vectors/NAME/valid-N.json` hold a `document` your decoder must accept.
- `vectors/NAME/invalid-SLUG.json` hold a `document` (or, where JSON cannot express
  the fault, a raw `document_text`) that a conforming decoder must refuse, with
  `expect.code` (the closed error vocabulary) and `expect.field` (the dotted path at
  fault, array indexes as numbers; `null` when the document as a whole is at fault).

Encoding rules the schemas cannot say: bytes are standard padded base64; object keys
are unique; `NaN` and `Infinity` are not JSON; integers stay within +/-(2^53 - 1);
digests and signatures use RFC 8785 canonical JSON.
"""


def export_kit(directory: Path) -> int:
    """Write the kit under ``directory``; returns the number of files written."""
    files = build_kit()
    for rel, value in files.items():
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False) + "\n", encoding="utf-8")
    (directory / "README.md").write_text(README.format(version=KIT_VERSION), encoding="utf-8")
    return len(files) + 1
