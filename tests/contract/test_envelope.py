"""Table tests for the capability envelope: every cross-field rule, strict decoding, defaults, tiers.

Each rule of contract.md section 2 is checked both ways: a violating envelope is
refused with ``SandboxEnvelopeInvalid`` naming the exact field, and the nearest
envelope that satisfies the rule decodes. Rules fire on construction (``build``)
as well as on decode.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from checkfu.contract import (
    AUTHORITIES,
    AXES,
    MEMBERS,
    MOUNT_CEILING,
    OPTIONAL_MEMBERS,
    REQUIRED_MEMBERS,
    EnforcementStatement,
    LifecycleAssurances,
    SandboxEnvelopeInvalid,
    SandboxProviderCapabilities,
    assess,
    authority_rank,
    canonical,
    counts_as_enforcement,
    decode,
    decode_value,
    digest,
    encode,
)
from checkfu.contract import examples as ex
from checkfu.contract.codec import build

E = SandboxProviderCapabilities


def day_one(**changes: Any) -> dict[str, Any]:
    doc = ex.day_one_envelope()
    doc.update(changes)
    return doc


def parity(**changes: Any) -> dict[str, Any]:
    doc = ex.parity_envelope()
    doc.update(changes)
    return doc


def without(doc: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in names}


def ok(doc: dict[str, Any]) -> SandboxProviderCapabilities:
    return decode(E, json.dumps(doc))


def refused(doc: dict[str, Any], field: str | None) -> SandboxEnvelopeInvalid:
    with pytest.raises(SandboxEnvelopeInvalid) as info:
        decode(E, json.dumps(doc))
    assert type(info.value) is SandboxEnvelopeInvalid
    assert info.value.field == field, info.value.message
    assert info.value.code == "SandboxEnvelopeInvalid"
    return info.value


# A minimal durable-only envelope: no ephemeral_zdr, so release_destroys defaults to false.
def durable_only(**changes: Any) -> dict[str, Any]:
    doc = without(day_one(), "lifecycle_assurances")
    doc.update(retention_modes=["durable"], snapshots=True)
    doc.update(changes)
    return doc


# --- the nine cross-field rules of contract.md section 2 -------------------------------------

VIOLATIONS: list[tuple[str, dict[str, Any], str]] = [
    # 1. image_mode fixed <=> fixed_base_images non-empty
    ("1 fixed without images", day_one(image_mode="fixed"), "fixed_base_images"),
    ("1 images without fixed", day_one(fixed_base_images=[ex.IMAGE_ID]), "fixed_base_images"),
    ("1 host image without fixed", day_one(fixed_base_images=["host"]), "fixed_base_images"),
    # 2. durable => snapshots
    ("2 durable without snapshots", day_one(retention_modes=["durable", "ephemeral_zdr"]), "retention_modes"),
    ("2 durable only without snapshots", durable_only(snapshots=False), "retention_modes"),
    # 3. provider custody => snapshots
    ("3 provider custody without snapshots", day_one(snapshot_custody="provider"), "snapshot_custody"),
    # 4. minimum <= maximum on every dimension, all positive
    *[
        (
            f"4 minimum above maximum: {dim}",
            day_one(minimum_resources={**ex.resources(1), dim: ex.resources(8)[dim] + 1}),
            f"minimum_resources.{dim}",
        )
        for dim in ("cpu_millis", "memory_mib", "disk_mib", "pids")
    ],
    *[
        (f"4 {side} {dim} zero", day_one(**{side: {**ex.resources(1), dim: 0}}), f"{side}.{dim}")
        for side in ("minimum_resources", "maximum_resources")
        for dim in ("cpu_millis", "memory_mib", "disk_mib", "pids")
    ],
    ("4 negative resource", day_one(maximum_resources={**ex.resources(8), "pids": -1}), "maximum_resources.pids"),
    # 5. max_mounts non-negative
    ("5 negative max_mounts", day_one(max_mounts=-1), "max_mounts"),
    ("5 max_mounts beyond 2^53-1", day_one(max_mounts=2**53), "max_mounts"),
    # 6. egress grade other than unsupported => allowlist (one way only)
    ("6 advisory grade without allowlist", day_one(egress_certification="advisory_filter"), "egress_certification"),
    ("6 boundary grade without allowlist", day_one(egress_certification="security_boundary"), "egress_certification"),
    (
        "6 advisory grade with unrestricted only",
        day_one(network_modes=["unrestricted"], egress_certification="advisory_filter"),
        "egress_certification",
    ),
    # 7. ephemeral_zdr: release_destroys absent is true, explicit false is refused
    (
        "7 zdr with release_destroys false",
        day_one(lifecycle_assurances={"release_destroys": False}),
        "lifecycle_assurances.release_destroys",
    ),
    (
        "7 zdr with release_destroys false beside other assurances",
        day_one(lifecycle_assurances={"cold_compensation": True, "release_destroys": False}),
        "lifecycle_assurances.release_destroys",
    ),
    (
        "7 durable and zdr with release_destroys false",
        day_one(
            retention_modes=["durable", "ephemeral_zdr"],
            snapshots=True,
            lifecycle_assurances={"release_destroys": False},
        ),
        "lifecycle_assurances.release_destroys",
    ),
    # 8. enumerates_allocations => listAllocations in operations
    (
        "8 enumerates without listAllocations",
        day_one(lifecycle_assurances={"release_destroys": True, "enumerates_allocations": True}),
        "lifecycle_assurances.enumerates_allocations",
    ),
    (
        "8 enumerates with other operations only",
        day_one(
            operations=["openProcess", "readFiles"],
            lifecycle_assurances={"release_destroys": True, "enumerates_allocations": True},
        ),
        "lifecycle_assurances.enumerates_allocations",
    ),
    # 9. platforms: os linux, architecture amd64 | arm64
    ("9 os windows", day_one(platforms=[{"os": "windows", "architecture": "amd64"}]), "platforms.0.os"),
    ("9 os capitalized", day_one(platforms=[{"os": "Linux", "architecture": "amd64"}]), "platforms.0.os"),
    ("9 riscv64", day_one(platforms=[{"os": "linux", "architecture": "riscv64"}]), "platforms.0.architecture"),
    ("9 x86_64 spelling", day_one(platforms=[{"os": "linux", "architecture": "x86_64"}]), "platforms.0.architecture"),
    (
        "9 second platform bad",
        day_one(platforms=[{"os": "linux", "architecture": "amd64"}, {"os": "linux", "architecture": "arm"}]),
        "platforms.1.architecture",
    ),
    ("9 platform without os", day_one(platforms=[{"architecture": "amd64"}]), "platforms.0.os"),
]


@pytest.mark.parametrize(("doc", "field"), [(d, f) for _, d, f in VIOLATIONS], ids=[n for n, _, _ in VIOLATIONS])
def test_rule_violation_is_refused_naming_the_field(doc: dict[str, Any], field: str) -> None:
    refused(doc, field)


@pytest.mark.parametrize(("doc", "field"), [(d, f) for _, d, f in VIOLATIONS], ids=[n for n, _, _ in VIOLATIONS])
def test_rule_violation_is_refused_on_construction_too(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(SandboxEnvelopeInvalid) as info:
        build(E, **doc)
    assert info.value.field == field


SATISFIED: list[tuple[str, dict[str, Any]]] = [
    ("1 fixed with host", day_one(image_mode="fixed", fixed_base_images=["host"])),
    ("1 fixed with two images", day_one(image_mode="fixed", fixed_base_images=[ex.IMAGE_ID, "debian@" + ex.IMAGE_ID])),
    ("1 profile with no images", day_one(image_mode="profile", fixed_base_images=[])),
    ("2 durable with snapshots", day_one(retention_modes=["durable", "ephemeral_zdr"], snapshots=True)),
    ("2 durable only with snapshots", durable_only()),
    ("3 provider custody with snapshots", day_one(snapshots=True, snapshot_custody="provider")),
    ("3 runner custody without snapshots", day_one(snapshots=False, snapshot_custody="runner")),
    ("4 minimum equals maximum", day_one(minimum_resources=ex.resources(3), maximum_resources=ex.resources(3))),
    ("4 one of everything", day_one(minimum_resources={"cpu_millis": 1, "memory_mib": 1, "disk_mib": 1, "pids": 1})),
    ("5 zero mounts", day_one(max_mounts=0)),
    ("5 largest safe integer", day_one(max_mounts=2**53 - 1)),
    ("6 allowlist advisory", day_one(network_modes=["allowlist"], egress_certification="advisory_filter")),
    ("6 allowlist boundary", day_one(network_modes=["none", "allowlist"], egress_certification="security_boundary")),
    ("6 none unsupported stated", day_one(egress_certification="unsupported")),
    ("6 unrestricted unsupported", day_one(network_modes=["unrestricted"])),
    ("6 uncertified allowlist, grade omitted", day_one(network_modes=["none", "allowlist"])),
    (
        "6 uncertified allowlist, unsupported stated",
        day_one(network_modes=["allowlist"], egress_certification="unsupported"),
    ),
    ("7 zdr with release_destroys", day_one(lifecycle_assurances={"release_destroys": True})),
    ("7 zdr with assurances omitted", without(day_one(), "lifecycle_assurances")),
    ("7 zdr with release_destroys absent", day_one(lifecycle_assurances={"cold_compensation": True})),
    ("7 zdr with empty assurances", day_one(lifecycle_assurances={})),
    ("7 durable only with no assurances", durable_only()),
    ("7 durable only with release_destroys false", durable_only(lifecycle_assurances={"release_destroys": False})),
    (
        "8 enumerates with listAllocations",
        day_one(
            operations=["listAllocations"],
            lifecycle_assurances={"release_destroys": True, "enumerates_allocations": True},
        ),
    ),
    ("8 listAllocations without enumerates", day_one(operations=["listAllocations"])),
    ("9 arm64", day_one(platforms=[{"os": "linux", "architecture": "arm64"}])),
    (
        "9 both architectures",
        day_one(platforms=[{"os": "linux", "architecture": "amd64"}, {"os": "linux", "architecture": "arm64"}]),
    ),
]


@pytest.mark.parametrize("doc", [d for _, d in SATISFIED], ids=[n for n, _ in SATISFIED])
def test_rule_satisfied_decodes(doc: dict[str, Any]) -> None:
    env = ok(doc)
    assert isinstance(env, E)
    assert build(E, **doc) == env


def test_the_examples_decode() -> None:
    assert ok(ex.day_one_envelope()).provider == "acme-sandbox"
    assert ok(ex.parity_envelope()).provider == "example-parity"
    assert ok(ex.seed_day_one_envelope()).provider == "acme-sandbox"
    assert ok(ex.uncertified_allowlist_envelope()).egress_certification == "unsupported"


# --- rules 6 and 7 as contract.md section 2 now states them -------------------------------------


def test_rule6_allowlist_without_a_grade_is_an_uncertified_allowlist() -> None:
    env = ok(without(day_one(network_modes=["none", "allowlist"]), "egress_certification"))
    assert "allowlist" in env.network_modes
    assert env.egress_certification == "unsupported"
    assert "certified egress" in assess(env).cannot_serve


def test_rule6_a_grade_still_needs_allowlist() -> None:
    err = refused(day_one(egress_certification="advisory_filter"), "egress_certification")
    assert "allowlist" in err.message


def test_rule7_an_envelope_from_the_seed_alone_decodes() -> None:
    # The seed's day-one tier states no optional field at all: no lifecycle_assurances,
    # no list_dir, snapshot_custody, egress_certification, operations or user_namespace.
    doc = ex.seed_day_one_envelope()
    assert not set(doc) & set(OPTIONAL_FIELDS)
    env = ok(doc)
    assert env.retention_modes == ("ephemeral_zdr",)
    assert env.lifecycle_assurances.release_destroys is True
    assert env.lifecycle_assurances.model_dump() == {
        "release_destroys": True,
        "release_idempotent": False,
        "reaps_process_tree": False,
        "cold_compensation": False,
        "enumerates_allocations": False,
    }
    assert (env.list_dir, env.snapshot_custody, env.egress_certification, env.operations, env.user_namespace) == (
        False,
        "runner",
        "unsupported",
        (),
        False,
    )
    assert assess(env).tier == "day_one"


@pytest.mark.parametrize(
    "assurances",
    [None, {}, {"cold_compensation": True}, {"release_idempotent": True, "reaps_process_tree": False}],
    ids=["object omitted", "empty object", "key absent", "key absent among others"],
)
def test_rule7_absent_release_destroys_beside_zdr_is_true(assurances: dict[str, Any] | None) -> None:
    doc = without(day_one(), "lifecycle_assurances")
    if assurances is not None:
        doc["lifecycle_assurances"] = assurances
    env = ok(doc)
    assert env.lifecycle_assurances.release_destroys is True
    for name, value in (assurances or {}).items():
        assert getattr(env.lifecycle_assurances, name) is value
    assert env == ok({**doc, "lifecycle_assurances": {**(assurances or {}), "release_destroys": True}})


@pytest.mark.parametrize("assurances", [None, {}, {"cold_compensation": True}])
def test_rule7_without_zdr_release_destroys_still_defaults_false(assurances: dict[str, Any] | None) -> None:
    doc = durable_only()
    if assurances is not None:
        doc["lifecycle_assurances"] = assurances
    assert ok(doc).lifecycle_assurances.release_destroys is False


def test_rule7_only_an_explicit_false_beside_zdr_is_refused() -> None:
    err = refused(day_one(lifecycle_assurances={"release_destroys": False}), "lifecycle_assurances.release_destroys")
    assert "ephemeral_zdr" in err.message
    assert ok(day_one(lifecycle_assurances={"release_destroys": True})).lifecycle_assurances.release_destroys


def test_rule7_the_default_is_stable_through_encode_canonical_and_digest() -> None:
    seed = ok(ex.seed_day_one_envelope())
    stated = ok({**ex.seed_day_one_envelope(), "lifecycle_assurances": {"release_destroys": True}})
    assert seed == stated
    assert encode(seed) == encode(stated)
    assert digest(seed) == digest(stated)
    wire = encode(seed)
    assert json.loads(wire)["lifecycle_assurances"]["release_destroys"] is True
    again = decode(E, wire)
    assert again == seed
    assert encode(again) == wire
    assert canonical(again) == canonical(seed)


def test_rule7_applies_to_python_construction_too() -> None:
    doc = without(ex.seed_day_one_envelope(), "lifecycle_assurances")
    assert build(E, **doc).lifecycle_assurances.release_destroys is True
    built = build(E, **doc, lifecycle_assurances=LifecycleAssurances(cold_compensation=True))
    assert built.lifecycle_assurances.release_destroys is True
    assert built.lifecycle_assurances.cold_compensation is True
    with pytest.raises(SandboxEnvelopeInvalid) as info:
        build(E, **doc, lifecycle_assurances=LifecycleAssurances(release_destroys=False))
    assert info.value.field == "lifecycle_assurances.release_destroys"
    durable = {**doc, "retention_modes": ("durable",), "snapshots": True}
    assert (
        build(E, **durable, lifecycle_assurances=LifecycleAssurances()).lifecycle_assurances.release_destroys is False
    )


# --- the seed's three rules, in its own words --------------------------------------------------


def test_seed_rule_fixed_image_mode_and_fixed_base_images_must_agree() -> None:
    refused(day_one(image_mode="fixed", fixed_base_images=[]), "fixed_base_images")
    refused(day_one(image_mode="profile", fixed_base_images=["host"]), "fixed_base_images")
    assert ok(day_one(image_mode="fixed", fixed_base_images=["host"])).fixed_base_images == ("host",)


def test_seed_rule_durable_requires_snapshots() -> None:
    err = refused(durable_only(snapshots=False), "retention_modes")
    assert "snapshots" in err.message
    assert ok(durable_only(snapshots=True)).retention_modes == ("durable",)


def test_seed_rule_provider_custody_requires_snapshots() -> None:
    refused(day_one(snapshots=False, snapshot_custody="provider"), "snapshot_custody")
    assert ok(day_one(snapshots=True, snapshot_custody="provider")).snapshot_custody == "provider"


# --- strict decoding ---------------------------------------------------------------------------

REQUIRED_FIELDS = [
    "provider",
    "provider_revision",
    "materialization_revision",
    "placement",
    "tiers",
    "platforms",
    "image_mode",
    "fixed_base_images",
    "package_managers",
    "network_modes",
    "retention_modes",
    "snapshots",
    "enforcement",
    "minimum_resources",
    "maximum_resources",
    "max_mounts",
]
OPTIONAL_FIELDS = [
    "snapshot_custody",
    "egress_certification",
    "list_dir",
    "operations",
    "lifecycle_assurances",
    "user_namespace",
    "terminal",
    "writable_mounts",
    "mount_symlinks",
]


def test_every_field_is_either_required_or_optional() -> None:
    assert sorted(E.model_fields) == sorted(REQUIRED_FIELDS + OPTIONAL_FIELDS)
    assert sorted(n for n, f in E.model_fields.items() if f.is_required()) == sorted(REQUIRED_FIELDS)


@pytest.mark.parametrize("name", REQUIRED_FIELDS)
def test_missing_required_field_is_refused(name: str) -> None:
    refused(without(day_one(), name), name)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (day_one(colour="blue"), "colour"),
        (day_one(enforcement={**ex.day_one_envelope()["enforcement"], "gpu": "not_enforced"}), "enforcement.gpu"),
        (
            day_one(lifecycle_assurances={"release_destroys": True, "teleports": True}),
            "lifecycle_assurances.teleports",
        ),
        (day_one(minimum_resources={**ex.resources(1), "gpus": 1}), "minimum_resources.gpus"),
        (day_one(platforms=[{"os": "linux", "architecture": "amd64", "variant": "v8"}]), "platforms.0.variant"),
    ],
    ids=["top", "enforcement", "assurances", "resources", "platform"],
)
def test_unknown_fields_are_refused(doc: dict[str, Any], field: str) -> None:
    refused(doc, field)


def refused_any(doc: dict[str, Any]) -> SandboxEnvelopeInvalid:
    with pytest.raises(SandboxEnvelopeInvalid) as info:
        decode(E, json.dumps(doc))
    return info.value


WRONG_TYPES: list[tuple[str, Any]] = [
    ("max_mounts", "8"),  # a numeric string for an int
    ("max_mounts", True),  # a bool for an int
    ("max_mounts", 8.0),  # a float for an int
    ("max_mounts", 8.5),
    ("max_mounts", None),
    ("snapshots", 1),  # an int for a bool
    ("snapshots", 0),
    ("snapshots", "false"),
    ("snapshots", None),
    ("list_dir", 1),
    ("list_dir", None),
    ("provider", 7),
    ("provider", ["acme"]),
    ("placement", None),
    ("tiers", "container"),  # a string for a list
    ("tiers", {"0": "container"}),
    ("platforms", {"os": "linux", "architecture": "amd64"}),
    ("enforcement", "runner_enforced"),
    ("enforcement", []),
    ("minimum_resources", [500, 256, 256, 64]),
    ("operations", "readFiles"),
    ("operations", None),
    ("lifecycle_assurances", True),
    ("snapshot_custody", None),
    ("egress_certification", None),
]


@pytest.mark.parametrize(("name", "value"), WRONG_TYPES, ids=[f"{n}={v!r}" for n, v in WRONG_TYPES])
def test_wrong_types_are_refused(name: str, value: Any) -> None:
    err = refused_any(day_one(**{name: value}))
    assert err.field is not None
    assert err.field.split(".")[0] == name


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("minimum_resources", "cpu_millis"), "500"),
        (("minimum_resources", "cpu_millis"), True),
        (("minimum_resources", "pids"), 64.0),
        (("lifecycle_assurances", "release_destroys"), 1),
        (("lifecycle_assurances", "release_destroys"), "true"),
        (("enforcement", "non_root"), True),
    ],
)
def test_wrong_nested_types_are_refused(path: tuple[str, str], value: Any) -> None:
    doc = day_one()
    doc[path[0]] = {**doc[path[0]], path[1]: value}
    refused(doc, ".".join(path))


SET_VALUED: list[tuple[str, list[Any], dict[str, Any]]] = [
    ("tiers", ["container", "microvm", "container"], {}),
    ("platforms", [{"os": "linux", "architecture": "arm64"}, {"os": "linux", "architecture": "arm64"}], {}),
    ("fixed_base_images", ["host", "host"], {"image_mode": "fixed"}),
    ("package_managers", ["apt", "pip", "apt"], {}),
    ("network_modes", ["none", "none"], {}),
    ("retention_modes", ["ephemeral_zdr", "ephemeral_zdr"], {}),
    ("operations", ["readFiles", "openProcess", "readFiles"], {}),
]


@pytest.mark.parametrize(("name", "value", "extra"), SET_VALUED, ids=[s[0] for s in SET_VALUED])
def test_duplicates_in_set_valued_lists_are_refused(name: str, value: list[Any], extra: dict[str, Any]) -> None:
    err = refused(day_one(**extra, **{name: value}), name)
    assert "duplicate" in err.message
    deduplicated = [v for i, v in enumerate(value) if v not in value[:i]]
    assert ok(day_one(**extra, **{name: deduplicated}))


@pytest.mark.parametrize("name", ["tiers", "platforms", "network_modes", "retention_modes"])
def test_empty_required_lists_are_refused(name: str) -> None:
    refused(day_one(**{name: []}), name)


@pytest.mark.parametrize("name", ["package_managers", "operations", "fixed_base_images"])
def test_lists_that_may_be_empty(name: str) -> None:
    assert getattr(ok(day_one(**{name: []})), name) == ()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("tiers", ["vm"]),
        ("tiers", ["host-process"]),
        ("package_managers", ["brew"]),
        ("network_modes", ["open"]),
        ("retention_modes", ["forever"]),
        ("placement", "cloud"),
        ("image_mode", "dynamic"),
        ("snapshot_custody", "nobody"),
        ("egress_certification", "best_effort"),
        ("operations", ["listDir"]),  # governed by list_dir, not operations
        ("operations", ["snapshot"]),  # governed by snapshots
        ("operations", ["exec"]),  # required members are not optional operations
    ],
)
def test_closed_word_lists(name: str, value: Any) -> None:
    err = refused_any(day_one(**{name: value}))
    assert err.field in (name, f"{name}.0")


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("a", True),
        ("0", True),
        ("acme-sandbox", True),
        ("acme.sandbox_v2", True),
        ("a" * 255, True),
        ("a" * 256, False),
        ("", False),
        ("Acme", False),
        ("-acme", False),
        (".acme", False),
        ("acme sandbox", False),
        ("acme/sandbox", False),
        ("acmé", False),
    ],
)
def test_provider_coordinate(value: str, accepted: bool) -> None:
    doc = day_one(provider=value)
    if accepted:
        assert ok(doc).provider == value
    else:
        refused(doc, "provider")


@pytest.mark.parametrize("name", ["provider_revision", "materialization_revision"])
@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("1", True),
        (" ", True),
        ("~!@#$%^&*()_+{}|:<>?", True),
        ("x" * 256, True),
        ("x" * 257, False),
        ("", False),
        ("1.0\n", False),
        ("1.0\t", False),
        ("caf\u00e9", False),
        ("\x7f", False),
    ],
)
def test_revisions_are_1_to_256_printable_ascii(name: str, value: str, accepted: bool) -> None:
    doc = day_one(**{name: value})
    if accepted:
        assert getattr(ok(doc), name) == value
    else:
        refused(doc, name)


@pytest.mark.parametrize("placement", ["test", "local", "hosted", "byoc"])
def test_placements(placement: str) -> None:
    env = ok(day_one(placement=placement))
    assert env.placement == placement
    assert env.target.placement == placement


def test_target_is_the_four_coordinates() -> None:
    env = ok(ex.day_one_envelope())
    t = ex.target()
    assert env.target.model_dump() == t


# --- downward defaults -------------------------------------------------------------------------


def test_omitted_optional_fields_decode_to_the_weakest_value() -> None:
    env = ok(without(durable_only(), *OPTIONAL_FIELDS))
    assert env.list_dir is False
    assert env.snapshot_custody == "runner"
    assert env.egress_certification == "unsupported"
    assert env.operations == ()
    assert env.lifecycle_assurances == LifecycleAssurances()
    assert env.lifecycle_assurances.model_dump() == {
        "release_destroys": False,
        "release_idempotent": False,
        "reaps_process_tree": False,
        "cold_compensation": False,
        "enumerates_allocations": False,
    }


@pytest.mark.parametrize(
    ("name", "weakest"),
    [
        ("list_dir", False),
        ("user_namespace", False),
        ("terminal", False),
        ("writable_mounts", False),
        ("mount_symlinks", False),
        ("snapshot_custody", "runner"),
        ("egress_certification", "unsupported"),
        ("operations", []),
        (
            "lifecycle_assurances",
            {
                "release_destroys": False,
                "release_idempotent": False,
                "reaps_process_tree": False,
                "cold_compensation": False,
                "enumerates_allocations": False,
            },
        ),
    ],
)
def test_silence_means_exactly_the_weakest_value(name: str, weakest: Any) -> None:
    base = durable_only()
    assert ok(without(base, name)) == ok({**base, name: weakest})


def test_omitted_assurance_members_default_false() -> None:
    env = ok(day_one(lifecycle_assurances={"release_destroys": True}))
    a = env.lifecycle_assurances
    assert (a.release_idempotent, a.reaps_process_tree, a.cold_compensation, a.enumerates_allocations) == (
        False,
        False,
        False,
        False,
    )


def test_omitted_list_dir_is_not_a_listdir_claim() -> None:
    env = ok(without(day_one(), "list_dir"))
    assert not env.declares("listDir")


# --- max_mounts and its ceiling ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("declared", "effective"),
    [(0, 0), (1, 1), (63, 63), (64, 64), (65, 64), (1000, 64), (2**53 - 1, 64)],
)
def test_max_mounts_over_64_is_accepted_with_effective_ceiling(declared: int, effective: int) -> None:
    env = ok(day_one(max_mounts=declared))
    assert env.max_mounts == declared
    assert env.effective_max_mounts == effective
    assert MOUNT_CEILING == 64


# --- declares(): one source of truth per optional member ---------------------------------------


def _minimal() -> dict[str, Any]:
    return day_one(list_dir=False, snapshots=False, operations=[])


def test_required_members_are_always_declared_and_optional_ones_not_by_default() -> None:
    env = ok(_minimal())
    assert env.declared_members() == REQUIRED_MEMBERS
    for member in REQUIRED_MEMBERS:
        assert env.declares(member)
    for member in OPTIONAL_MEMBERS:
        assert not env.declares(member)
    assert set(MEMBERS) == set(REQUIRED_MEMBERS) | set(OPTIONAL_MEMBERS)
    assert len(MEMBERS) == 17
    assert len(REQUIRED_MEMBERS) == 9


@pytest.mark.parametrize(
    ("changes", "adds"),
    [
        ({"list_dir": True}, {"listDir"}),
        ({"snapshots": True}, {"snapshot", "deleteSnapshot", "clone", "resume"}),
        ({"operations": ["openProcess"]}, {"openProcess"}),
        ({"operations": ["readFiles"]}, {"readFiles"}),
        ({"operations": ["listAllocations"]}, {"listAllocations"}),
        (
            {"operations": ["openProcess", "readFiles", "listAllocations"]},
            {"openProcess", "readFiles", "listAllocations"},
        ),
    ],
)
def test_each_optional_member_is_declared_by_its_own_field(changes: dict[str, Any], adds: set[str]) -> None:
    env = ok({**_minimal(), **changes})
    declared = set(env.declared_members())
    assert declared == set(REQUIRED_MEMBERS) | adds
    for member in MEMBERS:
        assert env.declares(member) == (member in declared)


def test_parity_declares_all_seventeen() -> None:
    assert ok(ex.parity_envelope()).declared_members() == MEMBERS


# --- the enforcement statement -----------------------------------------------------------------

CONTRACT_AXES = [
    "sandbox_isolation",
    "root_read_only",
    "non_root",
    "no_new_privileges",
    "capabilities_dropped",
    "mounts_sealed",
    "disk_limit",
    "network_policy",
    "resource_limits",
]


def test_nine_axes_and_four_authorities() -> None:
    assert list(AXES) == CONTRACT_AXES
    assert list(AUTHORITIES) == ["runner_enforced", "provider_attested", "guest_observed", "not_enforced"]
    assert sorted(EnforcementStatement.model_fields) == sorted(CONTRACT_AXES)


@pytest.mark.parametrize("axis", CONTRACT_AXES)
def test_every_axis_is_required(axis: str) -> None:
    doc = day_one()
    doc["enforcement"] = without(doc["enforcement"], axis)
    refused(doc, f"enforcement.{axis}")


@pytest.mark.parametrize("axis", CONTRACT_AXES)
def test_unknown_authority_is_refused(axis: str) -> None:
    doc = day_one()
    doc["enforcement"] = {**doc["enforcement"], axis: "trust_me"}
    refused(doc, f"enforcement.{axis}")


@pytest.mark.parametrize(
    ("authority", "counts", "rank"),
    [
        ("runner_enforced", True, 0),
        ("provider_attested", True, 1),
        ("guest_observed", False, 2),
        ("not_enforced", False, 3),
    ],
)
def test_counts_as_enforcement(authority: Any, counts: bool, rank: int) -> None:
    assert counts_as_enforcement(authority) is counts
    assert authority_rank(authority) == rank
    statement = EnforcementStatement.uniform(authority)
    assert statement.items() == [(axis, authority) for axis in CONTRACT_AXES]
    assert statement.not_counting() == ([] if counts else CONTRACT_AXES)
    assert statement.runner_enforced() == (CONTRACT_AXES if authority == "runner_enforced" else [])


def test_e2b_like_statement_is_accurate_not_failing() -> None:
    env = ok(ex.day_one_envelope())
    assert env.enforcement.not_counting() == ["root_read_only", "non_root", "no_new_privileges", "capabilities_dropped"]
    assert env.enforcement.authority("non_root") == "guest_observed"
    assert env.enforcement.runner_enforced() == []


# --- assess(): the tier an envelope amounts to -------------------------------------------------


def _durable_tier(**changes: Any) -> dict[str, Any]:
    doc = day_one(snapshots=True, retention_modes=["durable", "ephemeral_zdr"], list_dir=True)
    doc.update(changes)
    return doc


def _host_process() -> dict[str, Any]:
    return without(
        day_one(
            provider="host-process",
            image_mode="fixed",
            fixed_base_images=["host"],
            package_managers=[],
            network_modes=["unrestricted"],
            retention_modes=["durable"],
            snapshots=True,
            max_mounts=0,
            enforcement={axis: "not_enforced" for axis in CONTRACT_AXES},
        ),
        "lifecycle_assurances",
    )


@pytest.mark.parametrize(
    ("name", "doc", "tier", "label"),
    [
        ("day one example", ex.day_one_envelope(), "day_one", "day one"),
        ("parity example, a third party's", ex.parity_envelope(), "durable", "durable"),
        ("parity example with provider custody", parity(snapshot_custody="provider"), "docker_parity", "Docker parity"),
        ("no network none", day_one(network_modes=["unrestricted"]), "below_day_one", "below the day-one tier"),
        ("no ephemeral", durable_only(), "below_day_one", "below the day-one tier"),
        ("no mounts", day_one(max_mounts=0), "below_day_one", "below the day-one tier"),
        ("host process", _host_process(), "below_day_one", "below the day-one tier"),
        ("one mount is enough", day_one(max_mounts=1), "day_one", "day one"),
        ("snapshots alone", day_one(snapshots=True), "day_one", "day one"),
        ("durable without list_dir", _durable_tier(list_dir=False), "day_one", "day one"),
        ("durable tier", _durable_tier(), "durable", "durable"),
        ("durable with readFiles only", _durable_tier(operations=["readFiles"]), "durable", "durable"),
        (
            "durable with allowlist only",
            _durable_tier(network_modes=["none", "allowlist"], egress_certification="advisory_filter"),
            "durable",
            "durable",
        ),
        ("parity without readFiles", parity(operations=["openProcess", "listAllocations"]), "durable", "durable"),
        (
            "parity without allowlist",
            parity(network_modes=["none"], egress_certification="unsupported"),
            "durable",
            "durable",
        ),
        ("parity without list_dir", parity(list_dir=False), "day_one", "day one"),
        ("parity without none", parity(network_modes=["allowlist"]), "below_day_one", "below the day-one tier"),
        (
            "durable tier from scratch",
            _durable_tier(
                operations=["readFiles"],
                network_modes=["none", "allowlist"],
                egress_certification="advisory_filter",
                snapshot_custody="provider",
            ),
            "docker_parity",
            "Docker parity",
        ),
    ],
)
def test_assess_tiers(name: str, doc: dict[str, Any], tier: str, label: str) -> None:
    a = assess(ok(doc))
    assert a.tier == tier
    assert a.label == label
    assert (a.short_of_next == ()) == (tier == "docker_parity")


def test_assess_day_one_names_what_durable_adds() -> None:
    a = assess(ok(ex.day_one_envelope()))
    assert a.short_of_next == ("snapshots, clone and resume", "retention 'durable'", "enumeration (list_dir)")
    assert a.not_counting == ("root_read_only", "non_root", "no_new_privileges", "capabilities_dropped")


def test_assess_below_day_one_names_every_gap() -> None:
    a = assess(ok(_host_process()))
    assert a.short_of_next == (
        "retention 'ephemeral_zdr'",
        "network mode 'none'",
        "at least one mount (max_mounts >= 1)",
    )
    assert a.not_counting == tuple(CONTRACT_AXES)
    joined = " | ".join(a.cannot_serve)
    for words in ("network modes none, allowlist", "retention ephemeral_zdr", "images built from a profile", "mounts"):
        assert words in joined


def test_assess_durable_names_what_parity_adds() -> None:
    a = assess(ok(_durable_tier()))
    assert a.short_of_next == (
        "physically-contained file reads (readFiles)",
        "'allowlist' egress",
        "provider snapshot custody",
    )
    # The in-tree Docker tier keeps runner custody: measured in-tree, custody is no gap.
    assert assess(ok(_durable_tier()), in_tree=True).short_of_next == a.short_of_next[:2]
    assert assess(ok(ex.parity_envelope()), in_tree=True).tier == "docker_parity"


def test_cannot_serve_lists_every_undeclared_capability() -> None:
    a = assess(ok(ex.day_one_envelope()))
    assert a.cannot_serve == (
        "network modes allowlist, unrestricted",
        "retention durable",
        "package managers cargo, gem, go, npm",
        "snapshot, clone and resume",
        "listDir",
        "openProcess (one-shot harnesses only)",
        "readFiles (no writeback or capture)",
        "listAllocations",
        "certified egress",
        "a user namespace per sandbox (uid 0 inside would be uid 0 on the host)",
        "lifecycle assurances release_idempotent, reaps_process_tree, enumerates_allocations",
    )
    full = assess(ok(ex.parity_envelope()))
    assert full.cannot_serve == ("network modes unrestricted", "package managers cargo, gem, go, npm")
    everything = parity(
        network_modes=["none", "allowlist", "unrestricted"],
        package_managers=list(("apt", "cargo", "gem", "go", "npm", "pip")),
    )
    assert assess(ok(everything)).cannot_serve == ()


def test_decode_value_accepts_a_parsed_document() -> None:
    assert decode_value(E, ex.day_one_envelope()) == ok(ex.day_one_envelope())
