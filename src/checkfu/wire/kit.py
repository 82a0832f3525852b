"""The provider author kit: JSON Schemas and golden vectors, from the models the code uses.

``build_kit()`` returns every file as ``{relative path: JSON value}``;
``checkfu.conformance.author_kit.export_kit`` writes them with the README (which states
the conformance cases too, so it is written by the layer that sees both). Nothing here is
hand-maintained beside the models: the schemas are generated from them (cross-field rules
included, as ``if``/``then`` clauses the models carry) and the valid vectors are
``checkfu.contract.examples``.
The invalid vectors state, independently of the decoder, the error code and field
path a conforming decoder must report, and which layer refuses them:

- ``"refused_by": "schema"``: the JSON Schema alone refuses the document;
- ``"refused_by": "rule"``: the schema accepts it and a rule beyond JSON Schema,
  named in ``beyond_schema`` (one of ``BEYOND_SCHEMA``), refuses it;
- ``"refused_by": "json"``: the JSON text itself breaks a rule of the kit's JSON
  (named in ``json_rule``, one of ``JSON_RULES``) before any schema applies.

The project's tests run every vector through the decoders and through a JSON Schema
validator of another language, so the kit cannot drift from the code.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import rfc8785
from pydantic.json_schema import models_json_schema

from checkfu.contract import examples as ex
from checkfu.contract.codec import build, canonical, decode_value, digest
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import (
    SandboxDigestMismatch,
    SandboxEnvelopeInvalid,
    SandboxPathRejected,
    SandboxProfileInvalid,
    SandboxProtocolViolation,
    SandboxResultInvalid,
)
from checkfu.contract.frames import FRAME_TYPES, ResumePoint, Role
from checkfu.contract.members import MESSAGES, WriteFileRequest
from checkfu.contract.model import MAX_SAFE_INT, Model
from checkfu.contract.mounts import MountPlan
from checkfu.contract.paths import MAX_PATH_BYTES
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.vocabulary import PLACEMENTS
from checkfu.wire.errors import WireError
from checkfu.wire.files import ReadFilesHead
from checkfu.wire.openapi import openapi_document

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
KIT_VERSION = "v1"

BEYOND_SCHEMA: dict[str, str] = {
    "minimum-not-above-maximum": "an envelope's minimum_resources is at most its maximum_resources, per dimension",
    "path-staged-once": "a mount stages each path once, and never a file where another file needs a directory",
    "mount-targets-apart": "no mount target is another's or below it",
    "profile-digest": "profile_digest is the digest of the profile beside it",
    "path-utf8-bytes": "a sandbox path is at most 4096 bytes of UTF-8 (maxLength counts characters)",
    "integers-written-as-integers": "an integer is written without a fraction or exponent (8, not 8.0 or 8e0)",
    "timestamp-real-date": "a timestamp names a real date (the pattern admits 2027-02-30 and 2027-02-29)",
}
"""Every rule a conforming decoder applies that the schemas cannot express, by the name vectors use."""

JSON_RULES: dict[str, str] = {
    "not-json": "the document is one JSON value",
    "nan": "NaN and Infinity are not JSON",
    "duplicate-key": "object keys are unique, at every depth",
    "lone-surrogate": "strings hold no unpaired UTF-16 surrogate escape",
}
"""Rules of the JSON text every message is written in (I-JSON, RFC 7493), by the name vectors use."""

FRAME_MESSAGES: dict[str, Role] = {"ClientFrame": "client", "ServerFrame": "server"}
"""The ``openProcess`` text frames, as two messages: what a client sends and what a server sends."""


def message_types() -> dict[str, type[Model]]:
    """Every message of the wire form decoded by ``checkfu.contract.codec.decode``, by name."""
    out: dict[str, type[Model]] = {
        "SandboxProviderCapabilities": SandboxProviderCapabilities,
        "SandboxProfile": SandboxProfile,
        "MountPlan": MountPlan,
        "WireError": WireError,
        "ReadFilesHead": ReadFilesHead,
    }
    for request, result in MESSAGES.values():
        out[request.__name__] = request
        out[result.__name__] = result
    return out


def frame_models() -> dict[str, type[Model]]:
    """Each text frame's model and ``ResumePoint``, by name: each gets a schema of its own."""
    out: dict[str, type[Model]] = {}
    for frames in FRAME_TYPES.values():
        for model in frames.values():
            out[model.__name__] = model
    out[ResumePoint.__name__] = ResumePoint
    return out


CLAUSE_FIELD = "; field: "
"""How a cross-field clause's ``$comment`` ends: the field a refusal names, relative to the object the clause
is on (several, comma-separated, in the order a decoder checks them: the first one broken is named)."""


def clause_fields(clause: dict[str, Any]) -> tuple[str, ...]:
    """The fields a refusal by an ``allOf`` clause of a schema names, from its ``$comment``."""
    comment: str = clause["$comment"]
    assert CLAUSE_FIELD in comment, comment
    return tuple(f.strip() for f in comment.rsplit(CLAUSE_FIELD, 1)[1].split(","))


def message_code(name: str) -> str:
    """The code a decode failure of message ``name`` reports when no object inside it owns one (frames: always)."""
    if name in FRAME_MESSAGES:
        return SandboxProtocolViolation.code
    return message_types()[name].decode_error.code


def _inner_models(annotation: Any) -> list[type[Model]]:
    if isinstance(annotation, type) and issubclass(annotation, Model):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _inner_models(arg)]


def object_codes() -> dict[str, str]:
    """Each object (by its schema title) that, inside another message, owns a code of its own.

    A field at fault inside such an object is refused with its code (the innermost one that contains
    the field), not the message's. Never inside an ``openProcess`` frame: every frame fault is the frame's.
    """
    default = Model.decode_error
    found: dict[str, str] = {}
    seen: set[type[Model]] = set()

    def walk(model: type[Model], nested: bool) -> None:
        if nested and model.decode_error is not default:
            found[model.__name__] = model.decode_error.code
        if model in seen:
            return
        seen.add(model)
        for info in model.model_fields.values():
            for inner in _inner_models(info.annotation):
                walk(inner, True)

    for model in message_types().values():
        walk(model, False)
    return dict(sorted(found.items()))


def request_header(request: WriteFileRequest) -> str:
    """The ``Checkfu-Request`` header as the runner's client writes it: one line of ASCII JSON."""
    return json.dumps(request.model_dump(mode="json"), ensure_ascii=True, separators=(",", ":"))


def largest_request_header() -> int:
    """The longest ``Checkfu-Request`` header the runner can send, in bytes.

    Every field at its longest, in the characters that escape longest: a revision of ``"`` (two bytes each),
    a path of control characters (``\\u0001``: six bytes for each byte of the path's 4096).
    """
    widest = "\x01" * (MAX_PATH_BYTES - 1)
    request = build(
        WriteFileRequest,
        target={
            "provider": "a" * 255,
            "provider_revision": '"' * 256,
            "materialization_revision": '"' * 256,
            "placement": max(PLACEMENTS, key=len),
        },
        lease={"lease_id": "l" * 128, "lease_epoch": MAX_SAFE_INT},
        allocation_key="k" * 128,
        instance_id="i" * 128,
        path="/" + widest,
        mode=0o777,
        size=MAX_SAFE_INT,
        digest="sha256:" + "0" * 64,
    )
    return len(request_header(request))


def member_of(name: str) -> dict[str, str]:
    for member, (request, result) in MESSAGES.items():
        if request.__name__ == name:
            return {"member": member, "role": "request"}
        if result.__name__ == name:
            return {"member": member, "role": "result"}
    if name == "ReadFilesHead":
        return {"member": "readFiles", "role": "result head (application/x-checkfu-files)"}
    if name == "WireError":
        return {"role": "error body of every member"}
    if name in FRAME_MESSAGES:
        return {"member": "openProcess", "role": f"text frame sent by the {FRAME_MESSAGES[name]}"}
    return {}


def _document(name: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"$schema": SCHEMA_DIALECT, "$id": f"urn:checkfu:{KIT_VERSION}:{name}", **body}


def schema(model: type[Model]) -> dict[str, Any]:
    return _document(model.__name__, model.model_json_schema(mode="validation"))


def frame_schema(name: str) -> dict[str, Any]:
    """The union of the text frames one side sends: exactly one frame schema matches, chosen by ``type``."""
    role = FRAME_MESSAGES[name]
    models = list(FRAME_TYPES[role].values())
    refs, defs = models_json_schema([(m, "validation") for m in models], ref_template="#/$defs/{model}")
    return _document(
        name,
        {
            "description": f"An openProcess text frame the {role} sends; binary frames carry the bytes "
            "(see the README). A frame of any other type is refused.",
            "oneOf": [{"$ref": refs[(m, "validation")]["$ref"]} for m in models],
            "$defs": defs["$defs"],
        },
    )


# --- invalid vectors -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Invalid:
    slug: str
    description: str
    code: str
    field: str | None
    mutate: Callable[[dict[str, Any]], Any] | None = None
    text: Callable[[dict[str, Any]], str] | str | None = None
    """A raw document (or how to write one from the example), for what a JSON value cannot express."""
    beyond: str | None = None
    """The rule beyond JSON Schema that refuses it (a key of ``BEYOND_SCHEMA``), if the schema accepts it."""
    json_rule: str | None = None
    """The JSON text rule it breaks (a key of ``JSON_RULES``), if it is refused before any schema."""

    def __post_init__(self) -> None:
        assert self.beyond is None or self.beyond in BEYOND_SCHEMA, self.beyond
        assert self.json_rule is None or self.json_rule in JSON_RULES, self.json_rule
        assert (self.mutate is None) != (self.text is None), self.slug

    @property
    def refused_by(self) -> Literal["schema", "rule", "json"]:
        if self.json_rule is not None:
            return "json"
        if self.beyond is not None:
            return "rule"
        return "schema"


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


def _node(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = _node(doc, parents)
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return apply


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        del _node(doc, parents)[last]

    return apply


def _changes(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        for key, value in changes.items():
            _set(key, value)(doc)

    return apply


def _duplicated(path: str = "") -> Callable[[dict[str, Any]], str]:
    """The example's JSON with the first key of the object at ``path`` written twice, same value both times.

    Parsed with last-wins (as most parsers do) it is the valid example: the duplicate is its only fault.
    """

    def write(doc: dict[str, Any]) -> str:
        target = _node(doc, path.split(".")) if path else doc
        key, value = next(iter(target.items()))
        marker = "\x00duplicate\x00"
        target[marker] = None
        text = json.dumps(doc)
        pair = f"{json.dumps(key)}: {json.dumps(value)}"
        return text.replace(f"{json.dumps(marker)}: null", pair)

    return write


def _spelled(path: str, spelling: str) -> Callable[[dict[str, Any]], str]:
    """The example's JSON with the number at ``path`` spelled ``spelling`` (say ``8.0``) instead."""

    def write(doc: dict[str, Any]) -> str:
        marker = "\x00number\x00"
        _set(path, marker)(doc)
        return json.dumps(doc).replace(json.dumps(marker), spelling)

    return write


def _with_nan(doc: dict[str, Any]) -> str:
    key = next(iter(doc))
    rest = json.dumps({k: v for k, v in doc.items() if k != key})[1:]
    return "{" + json.dumps(key) + ": NaN" + (", " + rest if rest != "}" else "}")


def generic_invalid(model: type[Model], example: dict[str, Any], code: str | None = None) -> Iterator[Invalid]:
    """Unknown field, each required field missing, each field of the wrong JSON type, and the JSON text rules."""
    own = code or model.decode_error.code
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
    if example:
        yield Invalid(
            "duplicate-key",
            "a key written twice (with the same value) is refused; the document is otherwise valid",
            own,
            None,
            text=_duplicated(),
            json_rule="duplicate-key",
        )
        yield Invalid("nan", "NaN is not JSON", own, None, text=_with_nan, json_rule="nan")
    yield Invalid(
        "not-json", "a document that is not JSON is refused", own, None, text="{not json", json_rule="not-json"
    )
    yield Invalid("not-an-object", "a message is a JSON object", own, None, mutate=lambda doc: [doc])


ENV = SandboxEnvelopeInvalid.code
PROF = SandboxProfileInvalid.code
PATH = SandboxPathRejected.code
PROTO = SandboxProtocolViolation.code
RESULT = SandboxResultInvalid.code

RULES: dict[str, list[Invalid]] = {
    "SandboxProviderCapabilities": [
        Invalid(
            "rule1-fixed-without-images",
            "image_mode fixed needs fixed_base_images",
            ENV,
            "fixed_base_images",
            _changes(image_mode="fixed"),
        ),
        Invalid(
            "rule1-images-without-fixed",
            "fixed_base_images only with image_mode fixed",
            ENV,
            "fixed_base_images",
            _changes(fixed_base_images=[ex.IMAGE_ID]),
        ),
        Invalid(
            "rule2-durable-without-snapshots",
            "durable retention needs snapshots",
            ENV,
            "retention_modes",
            _changes(retention_modes=["durable", "ephemeral_zdr"]),
        ),
        Invalid(
            "rule3-provider-custody-without-snapshots",
            "provider custody needs snapshots",
            ENV,
            "snapshot_custody",
            _changes(snapshot_custody="provider"),
        ),
        Invalid(
            "rule4-minimum-above-maximum",
            "minimum_resources above maximum_resources",
            ENV,
            "minimum_resources.memory_mib",
            _changes(**{"minimum_resources.memory_mib": 1 << 20}),
            beyond="minimum-not-above-maximum",
        ),
        Invalid(
            "rule4-resource-zero",
            "resources are positive",
            ENV,
            "maximum_resources.pids",
            _changes(**{"maximum_resources.pids": 0}),
        ),
        Invalid("rule5-negative-mounts", "max_mounts is non-negative", ENV, "max_mounts", _changes(max_mounts=-1)),
        Invalid(
            "rule5-mounts-unsafe-integer",
            "integers stay within +/-(2^53 - 1)",
            ENV,
            "max_mounts",
            _changes(max_mounts=2**53),
        ),
        Invalid(
            "rule6-grade-without-allowlist",
            "an egress grade needs allowlist in network_modes",
            ENV,
            "egress_certification",
            _changes(egress_certification="advisory_filter"),
        ),
        Invalid(
            "rule6-boundary-grade-unrestricted-only",
            "a grade certifies an allowlist, and unrestricted is none",
            ENV,
            "egress_certification",
            _changes(egress_certification="security_boundary", network_modes=["unrestricted"]),
        ),
        Invalid(
            "rule7-zdr-release-destroys-false",
            "an explicit release_destroys false contradicts ephemeral_zdr (an absent one is true)",
            ENV,
            "lifecycle_assurances.release_destroys",
            _changes(lifecycle_assurances={"release_destroys": False, "cold_compensation": True}),
        ),
        Invalid(
            "rule8-enumerates-without-operation",
            "enumerates_allocations needs listAllocations in operations",
            ENV,
            "lifecycle_assurances.enumerates_allocations",
            _changes(lifecycle_assurances={"enumerates_allocations": True}, operations=["readFiles"]),
        ),
        Invalid(
            "rule9-os",
            "os is always linux",
            ENV,
            "platforms.0.os",
            _changes(platforms=[{"os": "windows", "architecture": "amd64"}]),
        ),
        Invalid(
            "rule9-architecture",
            "architecture is amd64 or arm64",
            ENV,
            "platforms.0.architecture",
            _changes(platforms=[{"os": "linux", "architecture": "riscv64"}]),
        ),
        Invalid(
            "duplicate-tier",
            "set-valued lists refuse duplicates",
            ENV,
            "tiers",
            _changes(tiers=["container", "container"]),
        ),
        Invalid(
            "duplicate-platform",
            "set-valued lists of objects refuse duplicates too",
            ENV,
            "platforms",
            _changes(platforms=[ex.platform(), ex.platform()]),
        ),
        Invalid(
            "empty-network-modes", "required lists are non-empty", ENV, "network_modes", _changes(network_modes=[])
        ),
        Invalid(
            "provider-coordinate",
            "provider matches ^[a-z0-9][a-z0-9._-]{0,254}$",
            ENV,
            "provider",
            _changes(provider="Acme Sandbox"),
        ),
        Invalid(
            "provider-trailing-newline",
            "a pattern's $ is the end of the string: a final newline does not match",
            ENV,
            "provider",
            _changes(provider="acme\n"),
        ),
        Invalid(
            "revision-not-printable",
            "revisions are printable ASCII",
            ENV,
            "provider_revision",
            _changes(provider_revision="1.0\n"),
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
            _changes(**{"enforcement.non_root": "trust_me"}),
        ),
        Invalid(
            "unknown-operation",
            "three optional operations only",
            ENV,
            "operations.0",
            _changes(operations=["teleport"]),
        ),
        Invalid(
            "unknown-assurance",
            "five lifecycle assurances only",
            ENV,
            "lifecycle_assurances.teleports",
            _changes(lifecycle_assurances={"release_destroys": True, "teleports": True}),
        ),
        Invalid("bool-as-string", "booleans are JSON booleans", ENV, "snapshots", _changes(snapshots="false")),
        Invalid(
            "integer-with-a-fraction",
            "8.0 is not an integer, though JSON Schema counts it as one",
            ENV,
            "max_mounts",
            text=_spelled("max_mounts", "8.0"),
            beyond="integers-written-as-integers",
        ),
        Invalid(
            "integer-with-an-exponent",
            "8e0 is not an integer either",
            ENV,
            "max_mounts",
            text=_spelled("max_mounts", "8e0"),
            beyond="integers-written-as-integers",
        ),
        Invalid(
            "duplicate-nested-key",
            "a key written twice inside a nested object is refused too",
            ENV,
            None,
            text=_duplicated("enforcement"),
            json_rule="duplicate-key",
        ),
    ],
    "SandboxProfile": [
        Invalid("unpinned-package", "packages are pinned", PROF, "packages.apt.0", _set("packages.apt", ["jq"])),
        Invalid(
            "pin-of-another-manager",
            "each manager has its own pin form (npm@version is not a pip pin)",
            PROF,
            "packages.pip.0",
            _set("packages.pip", ["left-pad@1.3.0"]),
        ),
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
            "port-above-65535",
            "ports are 1..65535",
            PROF,
            "network_policy.allowlist.0",
            _set("network_policy", {"mode": "allowlist", "allowlist": ["a.example:65536"]}),
        ),
        Invalid(
            "bad-ipv6",
            "a bracketed destination is a valid IPv6 address",
            PROF,
            "network_policy.allowlist.1",
            _set("network_policy", {"mode": "allowlist", "allowlist": ["[::1]:443", "[1::2::3]:443"]}),
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
        Invalid(
            "integer-with-a-fraction",
            "256.0 is not an integer",
            PROF,
            "resource_limits.memory_mib",
            text=_spelled("resource_limits.memory_mib", "512.0"),
            beyond="integers-written-as-integers",
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
        Invalid(
            "staged-twice",
            "a path is staged once",
            PATH,
            "files.1.path",
            _set("files.1.path", "README"),
            beyond="path-staged-once",
        ),
        Invalid(
            "file-and-directory",
            "a path is not both a file and a directory of another file",
            PATH,
            "files",
            _set("files.0.path", "src"),
            beyond="path-staged-once",
        ),
        Invalid(
            "path-over-4096-characters",
            "4097 characters: over the schema's maxLength, and refused as the path rule (SandboxPathRejected)",
            PATH,
            "files.0.path",
            _set("files.0.path", "a" * (MAX_PATH_BYTES + 1)),
        ),
        Invalid("setuid-mode", "modes are permission bits only", PROF, "files.0.mode", _set("files.0.mode", 0o4755)),
        Invalid("bad-digest", "digests are sha256: or git:", PROF, "files.0.digest", _set("files.0.digest", "md5:0")),
    ],
    "ProvisionRequest": [
        Invalid(
            "too-many-mounts",
            "at most 64 mounts",
            PROTO,
            "mounts",
            lambda doc: doc.__setitem__("mounts", [{"target": f"/m{i}", "files": []} for i in range(65)]),
        ),
        Invalid(
            "overlapping-mounts",
            "mount targets do not overlap",
            PATH,
            "mounts.1.target",
            lambda doc: doc.__setitem__("mounts", [{"target": "/w", "files": []}, {"target": "/w/sub", "files": []}]),
            beyond="mount-targets-apart",
        ),
        Invalid(
            "same-mount-target",
            "two mounts on one target overlap",
            PATH,
            "mounts.1.target",
            lambda doc: doc.__setitem__("mounts", [{"target": "/w", "files": []}, {"target": "/w", "files": []}]),
            beyond="mount-targets-apart",
        ),
        Invalid(
            "profile-digest-mismatch",
            "profile_digest is the profile's digest",
            SandboxDigestMismatch.code,
            "profile_digest",
            _set("profile_digest", "sha256:" + "0" * 64),
            beyond="profile-digest",
        ),
        Invalid(
            "profile-digest-of-the-profile-as-written",
            "the digest is of the profile with its defaults filled in, not of the text as written",
            SandboxDigestMismatch.code,
            "profile_digest",
            lambda doc: doc.update(profile=ex.minimal_profile(), profile_digest=_as_written(ex.minimal_profile())),
            beyond="profile-digest",
        ),
        Invalid("nul-in-path", "no NUL in a path", PATH, "mounts.0.target", _set("mounts.0.target", "/work\x00")),
        Invalid(
            "staged-twice-in-a-mount",
            "a path is staged once (the field is named from the request down)",
            PATH,
            "mounts.0.files.1.path",
            _set("mounts.0.files.1.path", "README"),
            beyond="path-staged-once",
        ),
    ],
    "MaterializeRequest": [
        Invalid(
            "profile-digest-mismatch",
            "profile_digest is the profile's digest",
            SandboxDigestMismatch.code,
            "profile_digest",
            _set("profile_digest", "sha256:" + "f" * 64),
            beyond="profile-digest",
        ),
        Invalid(
            "bad-profile",
            "a fault inside the profile is the profile's (SandboxProfileInvalid)",
            PROF,
            "profile.tier",
            _set("profile.tier", "vm"),
        ),
    ],
    "ExecRequest": [
        Invalid("empty-argv", "argv is non-empty", PROTO, "argv", _set("argv", [])),
        Invalid("bad-env-name", "env names are identifiers", PROTO, "env.NOT-A-NAME", _set("env", {"NOT-A-NAME": "x"})),
        Invalid("relative-cwd", "cwd is absolute", PATH, "cwd", _set("cwd", "tmp")),
        Invalid("stdin-not-base64", "bytes are standard base64", PROTO, "stdin", _set("stdin", "***")),
        Invalid("stdin-unpadded", "base64 is padded", PROTO, "stdin", _set("stdin", "aW5wdXQ")),
        Invalid(
            "lone-surrogate",
            "an unpaired surrogate escape is not a string",
            PROTO,
            None,
            text=lambda doc: json.dumps({**doc, "argv": ["sh", "\ud800"]}),
            json_rule="lone-surrogate",
        ),
    ],
    "InstanceResult": [
        Invalid("unknown-state", "three instance states", RESULT, "state", _set("state", "running")),
        Invalid(
            "foreign-lease-shape",
            "lease epochs are integers",
            RESULT,
            "lease.lease_epoch",
            _set("lease.lease_epoch", 1.5),
        ),
        Invalid(
            "lease-epoch-with-a-fraction",
            "3.0 is not an integer",
            RESULT,
            "lease.lease_epoch",
            text=_spelled("lease.lease_epoch", "3.0"),
            beyond="integers-written-as-integers",
        ),
    ],
    "ListDirResult": [
        Invalid("entries-of-a-file", "only a directory has entries", RESULT, "entries", _set("kind", "file")),
        Invalid(
            "truncated-missing",
            "only a directory listing can be truncated",
            RESULT,
            "truncated",
            lambda doc: doc.update(kind="missing", entries=[], truncated=True),
        ),
        Invalid("unknown-path-kind", "five path kinds only", RESULT, "kind", _set("kind", "fifo")),
    ],
    "SnapshotRequest": [
        Invalid("keep-zero", "a lifetime is at least one second", PROTO, "keep_seconds", _set("keep_seconds", 0)),
        Invalid(
            "keep-over-a-century",
            "a lifetime is at most a century",
            PROTO,
            "keep_seconds",
            _set("keep_seconds", 100 * 366 * 86400 + 1),
        ),
    ],
    "SnapshotResult": [
        Invalid(
            "expiry-with-an-offset",
            "an expiry is in UTC, written with Z",
            RESULT,
            "expires_at",
            _set("expires_at", "2026-12-08T23:05:42+01:00"),
        ),
        Invalid(
            "expiry-as-a-number",
            "an expiry is an RFC 3339 string, not seconds",
            RESULT,
            "expires_at",
            _set("expires_at", 1796767542),
        ),
        Invalid(
            "expiry-month-13", "months run 01 to 12", RESULT, "expires_at", _set("expires_at", "2026-13-08T22:05:42Z")
        ),
        Invalid(
            "expiry-february-30",
            "February has no 30th: the pattern admits it, the decoder does not",
            RESULT,
            "expires_at",
            _set("expires_at", "2027-02-30T00:00:00Z"),
            beyond="timestamp-real-date",
        ),
    ],
    "ReadFilesRequest": [
        Invalid("dotdot-path", "paths are normalized", PATH, "paths.0", _set("paths.0", "/workspace/../etc")),
        Invalid("duplicate-path", "paths are unique", PROTO, "paths", _set("paths", ["/a", "/a"])),
    ],
    "WriteFileRequest": [
        Invalid("trailing-slash", "no empty segment", PATH, "path", _set("path", "/workspace/")),
        Invalid(
            "path-over-4096-bytes",
            "2048 two-byte characters and a slash: 2049 characters, 4097 bytes",
            PATH,
            "path",
            _set("path", "/" + "\u00e9" * 2048),
            beyond="path-utf8-bytes",
        ),
        Invalid(
            "path-over-4096-characters",
            "a slash and 4096 letters: over the schema's maxLength, refused as the path rule (SandboxPathRejected), "
            "not as the message's SandboxProtocolViolation",
            PATH,
            "path",
            _set("path", "/" + "a" * MAX_PATH_BYTES),
        ),
    ],
    "ReadFilesHead": [
        Invalid("negative-size", "sizes are non-negative", RESULT, "files.0.size", _set("files.0.size", -1)),
    ],
    "WireError": [
        Invalid("unknown-code", "the closed vocabulary only", PROTO, "error.code", _set("error.code", "SandboxOops")),
        Invalid("retryable-missing", "retryable is required", PROTO, "error.retryable", _delete("error.retryable")),
    ],
}


def _as_written(profile: dict[str, Any]) -> str:
    """The digest of ``profile`` as written, without its defaults: what a decoder must NOT compute."""
    return "sha256:" + hashlib.sha256(rfc8785.dumps(profile)).hexdigest()


def _frame_vectors(role: Role) -> list[Invalid]:
    """Frames a conforming receiver refuses, each as ``SandboxProtocolViolation`` naming the field at fault."""
    bad = [
        Invalid("unknown-type", "a frame of an unknown type", PROTO, "type", lambda d: {"type": "teleport"}),
        Invalid("missing-type", "a frame without a type", PROTO, "type", lambda d: {"bytes": 5}),
        Invalid("not-an-object", "a text frame is a JSON object", PROTO, "type", lambda d: [d]),
        Invalid(
            "window-zero", "a grant is at least one byte", PROTO, "bytes", lambda d: {"type": "window", "bytes": 0}
        ),
        Invalid(
            "window-as-string", "a grant is a JSON integer", PROTO, "bytes", lambda d: {"type": "window", "bytes": "5"}
        ),
        Invalid(
            "window-with-a-fraction",
            "1.5 bytes is no grant",
            PROTO,
            "bytes",
            lambda d: {"type": "window", "bytes": 1.5},
        ),
        Invalid(
            "window-unknown-field",
            "frames refuse unknown fields",
            PROTO,
            "x",
            lambda d: {"type": "window", "bytes": 1, "x": 1},
        ),
        Invalid(
            "window-integer-spelled-with-a-fraction",
            "8.0 is not an integer",
            PROTO,
            "bytes",
            text='{"type": "window", "bytes": 8.0}',
            beyond="integers-written-as-integers",
        ),
        Invalid("not-json", "a text frame is JSON", PROTO, "frame", text="{not json", json_rule="not-json"),
        Invalid("nan", "NaN is not JSON", PROTO, "frame", text='{"type": "window", "bytes": NaN}', json_rule="nan"),
        Invalid(
            "duplicate-key",
            "a key written twice (with the same value) is refused; the frame is otherwise valid",
            PROTO,
            "frame",
            text=_duplicated(),
            json_rule="duplicate-key",
        ),
    ]
    if role == "client":
        return [
            *bad,
            Invalid(
                "server-only-type",
                "exit is the server's to send",
                PROTO,
                "type",
                lambda d: {"type": "exit", "exit_code": 0},
            ),
            Invalid(
                "stdin-as-text",
                "stdin bytes travel only as binary frames (tag 0x01)",
                PROTO,
                "type",
                lambda d: {"type": "stdin", "data": "aGk="},
            ),
            Invalid("start-without-request", "start carries the request", PROTO, "request", _delete("request")),
            Invalid("start-empty-argv", "the request is checked too", PROTO, "request.argv", _set("request.argv", [])),
            Invalid(
                "start-bad-operation-id",
                "operation ids are identifiers",
                PROTO,
                "operation_id",
                _set("operation_id", "op 1"),
            ),
            Invalid(
                "start-resume-ended-twice",
                "resume.ended is a set",
                PROTO,
                "resume.ended",
                _set("resume", {"out": 0, "err": 0, "ended": ["out", "out"]}),
            ),
            Invalid("kill-with-a-field", "kill carries nothing", PROTO, "now", lambda d: {"type": "kill", "now": True}),
        ]
    return [
        *bad,
        Invalid("client-only-type", "kill is the client's to send", PROTO, "type", lambda d: {"type": "kill"}),
        Invalid(
            "out-as-text",
            "output bytes travel only as binary frames (tags 0x02, 0x03)",
            PROTO,
            "type",
            lambda d: {"type": "out", "data": "aGk="},
        ),
        Invalid(
            "started-window-zero", "the first stdin grant is at least one byte", PROTO, "window", _set("window", 0)
        ),
        Invalid("started-negative-stdin", "stdin received is non-negative", PROTO, "stdin", _set("stdin", -1)),
        Invalid(
            "started-without-process-id",
            "the started result is checked too",
            PROTO,
            "started.process_id",
            _delete("started.process_id"),
        ),
        Invalid(
            "exit-code-fraction",
            "exit codes are integers",
            PROTO,
            "exit_code",
            lambda d: {"type": "exit", "exit_code": 1.5},
        ),
        Invalid("exit-without-code", "exit carries its code", PROTO, "exit_code", lambda d: {"type": "exit"}),
        Invalid(
            "error-unknown-code",
            "error codes are the closed vocabulary",
            PROTO,
            "error.code",
            lambda d: {"type": "error", "error": {"code": "SandboxOops", "message": "x", "retryable": False}},
        ),
        Invalid(
            "error-without-retryable",
            "an error says whether it is retryable",
            PROTO,
            "error.retryable",
            lambda d: {"type": "error", "error": {"code": "SandboxNotFound", "message": "x"}},
        ),
    ]


def invalid_vectors(name: str, model: type[Model], example: dict[str, Any]) -> Iterator[Invalid]:
    yield from generic_invalid(model, example)
    yield from RULES.get(name, [])


def _invalid_vector(name: str, inv: Invalid, example: dict[str, Any]) -> dict[str, Any]:
    vector: dict[str, Any] = {
        "message": name,
        "valid": False,
        "description": inv.description,
        "expect": {"code": inv.code, "field": inv.field},
        "refused_by": inv.refused_by,
    }
    if inv.beyond is not None:
        vector["beyond_schema"] = inv.beyond
    if inv.json_rule is not None:
        vector["json_rule"] = inv.json_rule
    doc = copy.deepcopy(example)
    if inv.text is not None:
        vector["document_text"] = inv.text if isinstance(inv.text, str) else inv.text(doc)
    else:
        assert inv.mutate is not None
        replaced = inv.mutate(doc)
        vector["document"] = doc if replaced is None else replaced
    return vector


# --- the digest's worked example ---------------------------------------------------------------


def digest_example() -> dict[str, Any]:
    """One profile as written, as decoded (every default filled in), its canonical bytes and its digest."""
    written = ex.minimal_profile()
    profile = decode_value(SandboxProfile, written)
    text = canonical(profile).decode("utf-8")
    return {
        "description": "the profile digest worked through: decode, fill every default, RFC 8785, SHA-256",
        "profile_as_written": written,
        "profile_decoded": profile.model_dump(mode="json"),
        "canonical": text,
        "digest": profile.digest,
    }


def envelope_digest_example() -> dict[str, Any]:
    """One envelope as written (every optional field left out), as decoded, its canonical bytes and its digest:
    the digest conformance evidence and enrollment bind to."""
    written = ex.seed_day_one_envelope()
    envelope = decode_value(SandboxProviderCapabilities, written)
    return {
        "description": "the envelope digest worked through: decode, fill every default (release_destroys by rule 7), "
        "RFC 8785, SHA-256",
        "envelope_as_written": written,
        "envelope_decoded": envelope.model_dump(mode="json"),
        "canonical": canonical(envelope).decode("utf-8"),
        "digest": digest(envelope),
    }


# --- the kit -------------------------------------------------------------------------------------


def build_kit() -> dict[str, Any]:
    """Every file of the kit, by relative path (the README aside)."""
    files: dict[str, Any] = {}
    index: dict[str, Any] = {
        "version": KIT_VERSION,
        "dialect": SCHEMA_DIALECT,
        "members": {m: {"request": req.__name__, "result": res.__name__} for m, (req, res) in MESSAGES.items()},
        "messages": {},
        "frame_schemas": {},
        "beyond_schema": BEYOND_SCHEMA,
        "json_rules": JSON_RULES,
        "digest_example": "digest-example.json",
        "envelope_digest_example": "envelope-digest-example.json",
        "object_codes": object_codes(),
        "openapi": "openapi.json",
    }
    examples = ex.described()
    examples["WireError"] = [("an error body: a vocabulary code, a message, retryable, the field", ex.wire_error())]
    examples["ReadFilesHead"] = [("the head line of a readFiles body, before the bytes", ex.read_files_head())]
    for name, model in message_types().items():
        files[f"schemas/{name}.schema.json"] = schema(model)
        entry: dict[str, Any] = {
            "schema": f"schemas/{name}.schema.json",
            **member_of(name),
            "code": message_code(name),
            "vectors": [],
        }
        _vectors(files, entry, name, examples[name], invalid_vectors(name, model, examples[name][0][1]))
        index["messages"][name] = entry
    frames = {"ClientFrame": ex.client_frames(), "ServerFrame": ex.server_frames()}
    for name, role in FRAME_MESSAGES.items():
        files[f"schemas/{name}.schema.json"] = frame_schema(name)
        entry = {
            "schema": f"schemas/{name}.schema.json",
            **member_of(name),
            "sender": role,
            "code": message_code(name),
            "frame_types": {t: f"schemas/{m.__name__}.schema.json" for t, m in FRAME_TYPES[role].items()},
            "vectors": [],
        }
        _vectors(files, entry, name, frames[name], iter(_frame_vectors(role)))
        index["messages"][name] = entry
    for name, model in frame_models().items():
        files[f"schemas/{name}.schema.json"] = schema(model)
        index["frame_schemas"][name] = f"schemas/{name}.schema.json"
    files["digest-example.json"] = digest_example()
    files["envelope-digest-example.json"] = envelope_digest_example()
    files["openapi.json"] = copy.deepcopy(openapi_document())
    files["index.json"] = index
    return files


def _vectors(
    files: dict[str, Any],
    entry: dict[str, Any],
    name: str,
    valid: list[tuple[str, dict[str, Any]]],
    invalid: Iterator[Invalid],
) -> None:
    for i, (what, doc) in enumerate(valid):
        path = f"vectors/{name}/valid-{i}.json"
        files[path] = {"message": name, "valid": True, "description": what, "document": doc}
        entry["vectors"].append(path)
    for inv in invalid:
        path = f"vectors/{name}/invalid-{inv.slug}.json"
        assert path not in files, path
        files[path] = _invalid_vector(name, inv, valid[0][1])
        entry["vectors"].append(path)
