"""Table tests for the profile, its digest, mount plans and the mount rules of a provision request."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any

import pytest

from checkfu.contract import (
    MountFile,
    MountPlan,
    ProvisionRequest,
    SandboxDigestMismatch,
    SandboxError,
    SandboxPathRejected,
    SandboxProfile,
    SandboxProfileInvalid,
    SandboxProtocolViolation,
    canonical,
    decode,
    digest,
)
from checkfu.contract import examples as ex
from checkfu.contract.profile import PIN_EXAMPLES, PIN_PATTERNS

P = SandboxProfile

EXAMPLE_PROFILE_DIGEST = "sha256:c3bcadf16f134ef83c52b05c3ad73459b4d65138adeedeca5898521f3af16691"
"""The digest of ``examples.profile()``, computed once and pinned: any change to canonicalization shows here."""


def profile(**changes: Any) -> dict[str, Any]:
    doc = ex.profile()
    doc.update(changes)
    return doc


def ok(model: type[Any], doc: Any) -> Any:
    return decode(model, json.dumps(doc))


def refused(model: type[Any], doc: Any, error: type[SandboxError], field: str | None) -> SandboxError:
    with pytest.raises(SandboxError) as info:
        decode(model, json.dumps(doc))
    assert type(info.value) is error, info.value
    assert info.value.field == field, info.value.message
    return info.value


# --- package pins --------------------------------------------------------------------------------


def test_every_manager_has_a_pattern_and_an_example() -> None:
    assert sorted(PIN_PATTERNS) == ["apt", "cargo", "gem", "go", "npm", "pip"]
    assert sorted(PIN_EXAMPLES) == sorted(PIN_PATTERNS)


@pytest.mark.parametrize("manager", sorted(PIN_EXAMPLES))
def test_the_documented_pin_example_is_admitted(manager: Any) -> None:
    prof = ok(P, profile(packages={manager: [PIN_EXAMPLES[manager]]}))
    assert prof.packages == {manager: (PIN_EXAMPLES[manager],)}
    assert prof.package_managers == (manager,)


PINNED = [
    ("apt", "jq=1.6-2.1"),
    ("apt", "curl=1:7.88.1-10+deb12u5"),
    ("apt", "libc6=2.36-9~bpo1"),
    ("pip", "requests==2.31.0"),
    ("pip", "zope.interface==6.0"),
    ("pip", "torch==2.1.0+cpu"),
    ("pip", "foo==1!2.0"),
    ("npm", "left-pad@1.3.0"),
    ("npm", "@types/node@20.10.5"),
    ("npm", "react@18.3.0-canary.1"),
    ("cargo", "serde@1.0.193"),
    ("cargo", "ripgrep@14.0.3"),
    ("gem", "rake:13.0.6"),
    ("gem", "rails:7.1.2"),
    ("go", "golang.org/x/tools@v0.1.0"),
    ("go", "github.com/a/b/v2@v2.3.4"),
    ("go", "golang.org/x/tools@v0.0.0-20200101000000-abcdefabcdef"),
]


@pytest.mark.parametrize(("manager", "name"), PINNED)
def test_pinned_names_are_admitted(manager: str, name: str) -> None:
    assert ok(P, profile(packages={manager: [name]})).packages[manager] == (name,)


UNPINNED = [
    ("apt", "curl"),
    ("apt", "curl=7.88*"),
    ("apt", "curl/bookworm"),
    ("apt", "Curl=1.0"),
    ("apt", "curl="),
    ("pip", "requests"),
    ("pip", "requests>=2"),
    ("pip", "requests~=2.31"),
    ("pip", "requests==2.*"),
    ("pip", "requests===2.0"),
    ("pip", "requests==2.31.0; python_version>'3'"),
    ("pip", "git+https://example.com/r.git"),
    ("npm", "left-pad"),
    ("npm", "left-pad@^1.3.0"),
    ("npm", "left-pad@~1.3.0"),
    ("npm", "left-pad@*"),
    ("npm", "left-pad@>=1"),
    ("npm", "Left-Pad@1.3.0"),
    ("cargo", "serde"),
    ("cargo", "serde@^1.0"),
    ("cargo", "serde@*"),
    ("gem", "rake"),
    ("gem", "rake:>=13"),
    ("gem", "rake:~>13.0"),
    ("go", "golang.org/x/tools"),
    ("go", "golang.org/x/tools@latest"),
    ("go", "golang.org/x/tools@master"),
    ("go", "golang.org/x/tools@0.1.0"),
    ("pip", ""),
    ("apt", " jq=1.6"),
]


@pytest.mark.parametrize(("manager", "name"), UNPINNED)
def test_unpinned_names_are_refused_naming_the_index(manager: Any, name: str) -> None:
    good = PIN_EXAMPLES[manager]
    err = refused(P, profile(packages={manager: [good, name]}), SandboxProfileInvalid, f"packages.{manager}.1")
    assert PIN_EXAMPLES[manager] in err.message


UNPINNED_BY_RESOLUTION = [
    ("npm", "left-pad@latest"),  # a dist-tag: whatever is published today
    ("npm", "left-pad@next"),
    ("npm", "left-pad@1"),  # a range: any 1.x.y
    ("npm", "left-pad@1.x"),
    ("npm", "left-pad@1.3"),  # a range: any 1.3.y
    ("go", "golang.org/x/tools@v0"),  # a version-prefix query: the newest v0.x.y
    ("go", "golang.org/x/tools@v0.1"),
]


@pytest.mark.parametrize(("manager", "name"), UNPINNED_BY_RESOLUTION)
def test_tags_and_version_prefixes_are_not_pins(manager: str, name: str) -> None:
    # A profile's digest must name what gets built; a tag or a prefix resolves to a different
    # version tomorrow, so the same digest would materialize a different image.
    refused(P, profile(packages={manager: [name]}), SandboxProfileInvalid, f"packages.{manager}.0")


def test_unknown_manager_is_refused() -> None:
    refused(P, profile(packages={"brew": ["jq@1.6"]}), SandboxProfileInvalid, "packages.brew")


def test_duplicate_pins_are_refused() -> None:
    refused(P, profile(packages={"apt": ["jq=1.6-2.1", "jq=1.6-2.1"]}), SandboxProfileInvalid, "packages.apt")


def test_packages_default_to_none_and_empty_lists_name_no_manager() -> None:
    prof = ok(P, {k: v for k, v in ex.profile().items() if k != "packages"})
    assert prof.packages == {}
    assert prof.package_managers == ()
    assert ok(P, profile(packages={"apt": [], "pip": ["requests==2.31.0"]})).package_managers == ("pip",)


@pytest.mark.parametrize("value", [["jq=1.6-2.1"], "jq=1.6-2.1", {"apt": "jq=1.6-2.1"}, {"apt": [1]}])
def test_packages_shape(value: Any) -> None:
    with pytest.raises(SandboxProfileInvalid) as info:
        decode(P, json.dumps(profile(packages=value)))
    assert info.value.field is not None
    assert info.value.field.startswith("packages")


# --- network policy and destinations -------------------------------------------------------------


def allowlist(*destinations: str) -> dict[str, Any]:
    return profile(network_policy={"mode": "allowlist", "allowlist": list(destinations)})


@pytest.mark.parametrize("mode", ["none", "unrestricted"])
def test_modes_without_destinations(mode: str) -> None:
    prof = ok(P, profile(network_policy={"mode": mode}))
    assert prof.network_policy.mode == mode
    assert prof.network_policy.allowlist == ()
    refused(
        P,
        profile(network_policy={"mode": mode, "allowlist": ["a.example:443"]}),
        SandboxProfileInvalid,
        "network_policy.allowlist",
    )


def test_allowlist_needs_a_destination() -> None:
    refused(P, profile(network_policy={"mode": "allowlist"}), SandboxProfileInvalid, "network_policy.allowlist")
    refused(P, allowlist(), SandboxProfileInvalid, "network_policy.allowlist")


def test_network_policy_shape() -> None:
    refused(P, profile(network_policy={"mode": "open"}), SandboxProfileInvalid, "network_policy.mode")
    refused(P, profile(network_policy={}), SandboxProfileInvalid, "network_policy.mode")
    refused(P, profile(network_policy={"mode": "none", "x": 1}), SandboxProfileInvalid, "network_policy.x")
    refused(P, profile(network_policy="none"), SandboxProfileInvalid, "network_policy")


GOOD_DESTINATIONS = [
    "a.example:443",
    "api.example.com:1",
    "api.example.com:65535",
    "localhost:8080",
    "10.0.0.1:80",
    "xn--bcher-kva.example:443",
    "a" * 63 + ".example:443",
    "[::1]:443",
    "[2001:db8::1]:8080",
    "[::ffff:1.2.3.4]:443",
    "[fe80::1:2:3:4]:22",
]


@pytest.mark.parametrize("destination", GOOD_DESTINATIONS)
def test_good_destinations(destination: str) -> None:
    assert ok(P, allowlist(destination)).network_policy.allowlist == (destination,)


BAD_DESTINATIONS = [
    "a.example:0",
    "a.example:65536",
    "a.example:99999",
    "[::1]:0",
    "[::1]:65536",
    "a.example",
    "a.example:",
    "a.example:-1",
    "a.example:+80",
    "a.example:443/path",
    "http://a.example:443",
    "A.EXAMPLE:443",
    "*.example:443",
    "-a.example:443",
    "a-.example:443",
    "a..example:443",
    "a.example.:443",
    "a_b.example:443",
    "a" * 64 + ".example:443",
    "::1:443",
    "[::1]",
    "[zz::1]:443",
    "a.example:443 ",
    "",
]


@pytest.mark.parametrize("destination", BAD_DESTINATIONS)
def test_bad_destinations(destination: str) -> None:
    refused(P, allowlist("a.example:443", destination), SandboxProfileInvalid, "network_policy.allowlist.1")


@pytest.mark.parametrize("destination", ["[..]:443", "[1.2]:80", "[:::::]:443", "[1::2::3]:443"])
def test_bracketed_destinations_must_be_ipv6_addresses(destination: str) -> None:
    refused(P, allowlist(destination), SandboxProfileInvalid, "network_policy.allowlist.0")


def test_duplicate_destinations_are_refused() -> None:
    refused(P, allowlist("a.example:443", "a.example:443"), SandboxProfileInvalid, "network_policy.allowlist")


# --- image references, tier, retention, resources ------------------------------------------------

GOOD_IMAGES = [
    "host",
    ex.IMAGE_ID,
    "debian@" + ex.IMAGE_ID,
    "docker.io/library/debian:12@" + ex.IMAGE_ID,
    "localhost:5000/team/x@" + ex.IMAGE_ID,
]
BAD_IMAGES = [
    "debian",
    "debian:12",
    "debian:latest",
    "Debian@" + ex.IMAGE_ID,
    ex.IMAGE_ID.upper(),
    ex.IMAGE_ID[:-1],
    ex.IMAGE_ID + "0",
    "sha256:" + "g" * 64,
    "debian@sha512:" + "0" * 128,
    "HOST",
    "host ",
    "",
    "@" + ex.IMAGE_ID,
]


@pytest.mark.parametrize("image", GOOD_IMAGES)
def test_pinned_images_are_admitted(image: str) -> None:
    assert ok(P, profile(base_image=image)).base_image == image


@pytest.mark.parametrize("image", BAD_IMAGES)
def test_unpinned_images_are_refused(image: str) -> None:
    refused(P, profile(base_image=image), SandboxProfileInvalid, "base_image")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"tier": "vm"}, "tier"),
        ({"retention_mode": "forever"}, "retention_mode"),
        ({"retention_mode": ["durable"]}, "retention_mode"),
        ({"resource_limits": {**ex.resources(1), "memory_mib": 0}}, "resource_limits.memory_mib"),
        ({"resource_limits": {**ex.resources(1), "pids": "64"}}, "resource_limits.pids"),
        ({"resource_limits": {**ex.resources(1), "cpu_millis": True}}, "resource_limits.cpu_millis"),
        ({"extra": 1}, "extra"),
    ],
)
def test_profile_fields(changes: dict[str, Any], field: str) -> None:
    refused(P, profile(**changes), SandboxProfileInvalid, field)


@pytest.mark.parametrize("name", ["tier", "base_image", "network_policy", "resource_limits", "retention_mode"])
def test_required_profile_fields(name: str) -> None:
    refused(P, {k: v for k, v in ex.profile().items() if k != name}, SandboxProfileInvalid, name)


# --- the digest ----------------------------------------------------------------------------------


def test_example_digest_is_pinned() -> None:
    prof = ok(P, ex.profile())
    assert prof.digest == EXAMPLE_PROFILE_DIGEST
    assert digest(prof) == EXAMPLE_PROFILE_DIGEST


def test_digest_is_sha256_of_the_rfc8785_canonical_json() -> None:
    prof = ok(P, ex.profile())
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", prof.digest)
    body = canonical(prof)
    assert prof.digest == "sha256:" + hashlib.sha256(body).hexdigest()
    # RFC 8785: keys sorted, no insignificant whitespace; every default is present.
    parsed = json.loads(body)
    assert body == json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert parsed["network_policy"] == {"allowlist": [], "mode": "none"}


def _reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_keys(v) for v in value]
    return value


def test_digest_does_not_depend_on_key_order() -> None:
    doc = profile(network_policy={"mode": "allowlist", "allowlist": ["a.example:443"]})
    a = ok(P, doc)
    b = ok(P, _reversed_keys(doc))
    assert list(json.loads(json.dumps(_reversed_keys(doc)))) != list(doc)
    assert a.digest == b.digest


def test_digest_is_stable_and_content_sensitive() -> None:
    a = ok(P, ex.profile())
    assert ok(P, ex.profile()).digest == a.digest
    assert ok(P, profile(retention_mode="durable")).digest != a.digest
    assert ok(P, profile(resource_limits=ex.resources(3))).digest != a.digest
    assert ok(P, profile(packages={"apt": ["jq=1.6-2.1"]})).digest != a.digest


def test_omitted_defaults_have_the_digest_of_their_explicit_value() -> None:
    no_packages = {k: v for k, v in ex.profile().items() if k != "packages"}
    assert ok(P, no_packages).digest == ok(P, {**no_packages, "packages": {}}).digest
    assert (
        ok(P, no_packages).digest == ok(P, {**no_packages, "network_policy": {"mode": "none", "allowlist": []}}).digest
    )


# --- mount plans ---------------------------------------------------------------------------------


def mount_file(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"path": "a", "mode": 0o644, "size": 1, "digest": ex.HELLO_SHA256}
    doc.update(changes)
    return doc


def plan(*files: dict[str, Any], target: str = "/workspace") -> dict[str, Any]:
    return {"target": target, "files": list(files)}


def test_example_mount() -> None:
    m = ok(MountPlan, ex.mount())
    assert m.target == "/workspace"
    assert [m.absolute(f) for f in m.files] == ["/workspace/README", "/workspace/src/run.sh"]
    assert m.total_bytes == 2 * len(ex.HELLO)


@pytest.mark.parametrize("path", ["a", "a/b", "a/b/c.txt", ".hidden", "a/...", "x" * 255, "\u00e9t\u00e9/\u4e2d"])
def test_mount_file_relative_paths(path: str) -> None:
    assert ok(MountPlan, plan(mount_file(path=path))).files[0].path == path


@pytest.mark.parametrize(
    "path", ["", "/a", "a/", "a//b", "./a", "a/./b", "..", "a/../b", "a/..", "a\x00b", "x/" * 2048 + "x"]
)
def test_mount_file_bad_paths(path: str) -> None:
    refused(MountPlan, plan(mount_file(path=path)), SandboxPathRejected, "files.0.path")


@pytest.mark.parametrize(
    ("mode", "accepted"),
    [
        (0, True),
        (0o644, True),
        (0o777, True),
        (0o1000, False),
        (0o4755, False),
        (-1, False),
        ("644", False),
        (True, False),
    ],
)
def test_mount_file_modes_are_permission_bits(mode: Any, accepted: bool) -> None:
    doc = plan(mount_file(mode=mode))
    if accepted:
        assert ok(MountPlan, doc).files[0].mode == mode
    else:
        refused(MountPlan, doc, SandboxProfileInvalid, "files.0.mode")


@pytest.mark.parametrize(("size", "accepted"), [(0, True), (1 << 32, True), ((1 << 32) + 1, False), (-1, False)])
def test_mount_file_sizes(size: int, accepted: bool) -> None:
    doc = plan(mount_file(size=size))
    if accepted:
        assert ok(MountPlan, doc).files[0].size == size
    else:
        refused(MountPlan, doc, SandboxProfileInvalid, "files.0.size")


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        (ex.HELLO_SHA256, True),
        (ex.HELLO_GIT, True),
        ("git:" + "a" * 64, True),
        ("sha256:" + "A" * 64, False),
        ("sha256:" + "a" * 63, False),
        ("git:" + "a" * 39, False),
        ("git:" + "a" * 50, False),
        ("md5:" + "a" * 32, False),
        ("a" * 64, False),
    ],
)
def test_mount_file_digests(value: str, accepted: bool) -> None:
    doc = plan(mount_file(digest=value))
    if accepted:
        assert ok(MountPlan, doc).files[0].digest == value
    else:
        refused(MountPlan, doc, SandboxProfileInvalid, "files.0.digest")


def test_mount_file_defaults_mode_644() -> None:
    doc = mount_file()
    del doc["mode"]
    assert ok(MountFile, doc).mode == 0o644


@pytest.mark.parametrize("target", ["/", "workspace", "/workspace/", "/a//b", "/a/../b", "/a/./b", "", "/a\x00"])
def test_mount_targets(target: str) -> None:
    refused(MountPlan, plan(target=target), SandboxPathRejected, "target")


def test_a_file_staged_twice_is_refused() -> None:
    refused(
        MountPlan,
        plan(mount_file(path="a/b"), mount_file(path="c"), mount_file(path="a/b")),
        SandboxPathRejected,
        "files.2.path",
    )


@pytest.mark.parametrize("order", [["a", "a/b"], ["a/b", "a"], ["x/a", "x/a/b/c"], ["x/a/b/c", "x/a"]])
def test_a_path_cannot_be_both_a_file_and_a_directory(order: list[str]) -> None:
    with pytest.raises(SandboxPathRejected) as info:
        decode(MountPlan, json.dumps(plan(*(mount_file(path=p) for p in order))))
    assert info.value.field is not None
    assert info.value.field.startswith("files")
    shorter = min(order, key=len)
    assert repr(shorter) in info.value.message


def test_siblings_with_a_common_prefix_are_not_a_clash() -> None:
    m = ok(MountPlan, plan(mount_file(path="a"), mount_file(path="ab"), mount_file(path="a.d/x")))
    assert len(m.files) == 3


# --- mounts in a provision request ---------------------------------------------------------------


def provision(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(ex.messages()["ProvisionRequest"][0])
    doc.update(changes)
    return doc


def empty_mount(target: str) -> dict[str, Any]:
    return {"target": target, "files": []}


def test_provision_example_and_its_mount_roots() -> None:
    req = ok(ProvisionRequest, provision())
    assert req.mount_roots == ("/workspace",)
    assert req.profile_digest == req.profile.digest == EXAMPLE_PROFILE_DIGEST


@pytest.mark.parametrize(
    ("targets", "index"),
    [
        (["/w", "/w/sub"], 1),
        (["/w/sub", "/w"], 1),
        (["/w", "/w"], 1),
        (["/a", "/b", "/a/b/c"], 2),
        (["/a", "/b", "/b/x"], 2),
    ],
)
def test_overlapping_mount_targets_are_refused(targets: list[str], index: int) -> None:
    err = refused(
        ProvisionRequest,
        provision(mounts=[empty_mount(t) for t in targets]),
        SandboxPathRejected,
        f"mounts.{index}.target",
    )
    assert "overlaps" in err.message


def test_targets_sharing_a_prefix_do_not_overlap() -> None:
    req = ok(ProvisionRequest, provision(mounts=[empty_mount("/w"), empty_mount("/wx"), empty_mount("/w-y")]))
    assert req.mount_roots == ("/w", "/wx", "/w-y")


def test_at_most_64_mounts() -> None:
    ok64 = ok(ProvisionRequest, provision(mounts=[empty_mount(f"/m{i}") for i in range(64)]))
    assert len(ok64.mounts) == 64
    refused(
        ProvisionRequest,
        provision(mounts=[empty_mount(f"/m{i}") for i in range(65)]),
        SandboxProtocolViolation,
        "mounts",
    )


def test_profile_digest_must_match_the_profile() -> None:
    refused(ProvisionRequest, provision(profile_digest="sha256:" + "0" * 64), SandboxDigestMismatch, "profile_digest")
    other = profile(retention_mode="durable")
    refused(ProvisionRequest, provision(profile=other), SandboxDigestMismatch, "profile_digest")
    other_digest = ok(P, other).digest
    assert (
        ok(ProvisionRequest, provision(profile=other, profile_digest=other_digest)).profile.retention_mode == "durable"
    )


def test_errors_inside_a_request_name_the_nested_path_and_the_owner() -> None:
    refused(
        ProvisionRequest,
        provision(profile=profile(base_image="debian:12")),
        SandboxProfileInvalid,
        "profile.base_image",
    )
    doc = provision()
    doc["mounts"][0]["files"][1]["digest"] = "md5:0"
    refused(ProvisionRequest, doc, SandboxProfileInvalid, "mounts.0.files.1.digest")
    doc = provision()
    doc["mounts"][0]["files"][1]["path"] = "../x"
    refused(ProvisionRequest, doc, SandboxPathRejected, "mounts.0.files.1.path")
    refused(
        ProvisionRequest, {k: v for k, v in provision().items() if k != "profile"}, SandboxProtocolViolation, "profile"
    )


def test_a_copy_has_its_own_digest_never_the_originals() -> None:
    """model_copy carries cached attributes over; a profile's digest must not be one of them."""
    from checkfu.testing import memory_profile  # noqa: PLC0415

    original = memory_profile()
    stale = original.digest
    retention = "durable" if original.retention_mode != "durable" else "ephemeral_zdr"
    copy = original.model_copy(update={"retention_mode": retention})
    assert copy.digest != stale
    assert copy.digest == type(copy).model_validate(copy.model_dump()).digest
