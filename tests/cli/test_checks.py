"""``checkfu envelope check``, ``checkfu profile check`` and ``checkfu kit export``.

The bulk runs in-process through typer's ``CliRunner``; a few cases run the
installed console script, which is what a user runs, to prove the exit codes and
that no traceback ever reaches the terminal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from checkfu.cli import app
from checkfu.contract import SandboxProfile, SandboxProviderCapabilities, decode
from checkfu.contract import examples as ex

CHECKFU = Path(sys.executable).parent / "checkfu"
EXAMPLE_PROFILE_DIGEST = "sha256:c3bcadf16f134ef83c52b05c3ad73459b4d65138adeedeca5898521f3af16691"
AXES_NOT_COUNTING_DAY_ONE = ["root_read_only", "non_root", "no_new_privileges", "capabilities_dropped"]


def invoke(*args: str) -> Result:
    # wide enough that no line wraps, wherever the checkout lies (paths in the output vary in length)
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})
    assert "Traceback" not in result.stdout
    assert "Traceback" not in result.stderr
    return result


def write(tmp_path: Path, name: str, content: str | bytes | dict[str, Any]) -> Path:
    path = tmp_path / name
    if isinstance(content, dict):
        path.write_text(json.dumps(content), encoding="utf-8")
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string of ASCII text is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def to_toml(doc: dict[str, Any]) -> str:
    return "".join(f"{k} = {toml_value(v)}\n" for k, v in doc.items())


def refusal(result: Result) -> dict[str, Any]:
    """The one JSON object of a ``--json`` refusal; exit 1, nothing else on stdout."""
    assert result.exit_code == 1, (result.stdout, result.stderr, result.exception)
    body: dict[str, Any] = json.loads(result.stdout)
    assert body["ok"] is False
    assert set(body) - {"problems"} == {"error", "ok"}  # a profile refusal also lists every problem
    assert sorted(body["error"]) == ["code", "field", "message"]
    assert body["error"]["message"]
    return body


def flat(text: str) -> str:
    return " ".join(text.split())


def squash(text: str) -> str:
    """``text`` without any whitespace, for paths a narrow terminal may have folded."""
    return "".join(text.split())


def without(doc: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in names}


# --- envelope check --json: success --------------------------------------------------------------


def test_valid_envelope_prints_ok_with_every_default_filled(tmp_path: Path) -> None:
    doc = without(ex.day_one_envelope(), "list_dir", "snapshot_custody", "egress_certification", "operations")
    doc["lifecycle_assurances"] = {"release_destroys": True}
    result = invoke("envelope", "check", str(write(tmp_path, "env.json", doc)), "--json")
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    assert sorted(body) == ["assessment", "envelope", "ok"]
    assert body["ok"] is True
    assert body["assessment"]["tier"] == "day_one" and body["assessment"]["over_ceiling"] == []
    env = body["envelope"]
    assert env["list_dir"] is False
    assert env["snapshot_custody"] == "runner"
    assert env["egress_certification"] == "unsupported"
    assert env["operations"] == []
    assert env["lifecycle_assurances"] == {
        "release_destroys": True,
        "release_idempotent": False,
        "reaps_process_tree": False,
        "cold_compensation": False,
        "enumerates_allocations": False,
    }
    assert sorted(env) == sorted(SandboxProviderCapabilities.model_fields)
    # what it prints is itself a valid envelope, equal to the one it read
    assert decode(SandboxProviderCapabilities, json.dumps(env)) == decode(SandboxProviderCapabilities, json.dumps(doc))


def test_valid_toml_envelope_is_the_same_envelope(tmp_path: Path) -> None:
    doc = ex.day_one_envelope()
    from_json = invoke("envelope", "check", str(write(tmp_path, "env.json", doc)), "--json")
    from_toml = invoke("envelope", "check", str(write(tmp_path, "env.toml", to_toml(doc))), "--json")
    assert from_toml.exit_code == 0, from_toml.stdout
    assert json.loads(from_toml.stdout) == json.loads(from_json.stdout)


def test_a_toml_suffix_is_read_case_insensitively(tmp_path: Path) -> None:
    result = invoke("envelope", "check", str(write(tmp_path, "ENV.TOML", to_toml(ex.parity_envelope()))), "--json")
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout)["envelope"]["provider"] == "example-parity"


# --- envelope check --json: every rule is refused with its field ---------------------------------


def day_one(**changes: Any) -> dict[str, Any]:
    doc = ex.day_one_envelope()
    doc.update(changes)
    return doc


RULE_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("rule1", day_one(image_mode="fixed"), "fixed_base_images"),
    ("rule2", day_one(retention_modes=["durable", "ephemeral_zdr"]), "retention_modes"),
    ("rule3", day_one(snapshot_custody="provider"), "snapshot_custody"),
    ("rule4", day_one(minimum_resources=ex.resources(9)), "minimum_resources.cpu_millis"),
    ("rule5", day_one(max_mounts=-1), "max_mounts"),
    ("rule6", day_one(egress_certification="advisory_filter"), "egress_certification"),
    ("rule7", day_one(lifecycle_assurances={"release_destroys": False}), "lifecycle_assurances.release_destroys"),
    (
        "rule8",
        day_one(lifecycle_assurances={"release_destroys": True, "enumerates_allocations": True}),
        "lifecycle_assurances.enumerates_allocations",
    ),
    ("rule9", day_one(platforms=[{"os": "darwin", "architecture": "arm64"}]), "platforms.0.os"),
    ("unknown field", day_one(gpus=2), "gpus"),
    ("string for int", day_one(max_mounts="8"), "max_mounts"),
    ("int for bool", day_one(snapshots=0), "snapshots"),
    ("duplicate", day_one(tiers=["container", "container"]), "tiers"),
    ("empty list", day_one(retention_modes=[]), "retention_modes"),
    ("missing axis", day_one(enforcement={"sandbox_isolation": "provider_attested"}), "enforcement.root_read_only"),
]


@pytest.mark.parametrize(("doc", "field"), [(d, f) for _, d, f in RULE_CASES], ids=[n for n, _, _ in RULE_CASES])
def test_each_violation_is_refused_with_its_field(tmp_path: Path, doc: dict[str, Any], field: str) -> None:
    body = refusal(invoke("envelope", "check", str(write(tmp_path, "env.json", doc)), "--json"))
    assert body["error"]["code"] == "SandboxEnvelopeInvalid"
    assert body["error"]["field"] == field


def test_a_violation_in_toml_is_refused_with_its_field(tmp_path: Path) -> None:
    doc = day_one(image_mode="fixed")
    body = refusal(invoke("envelope", "check", str(write(tmp_path, "env.toml", to_toml(doc))), "--json"))
    assert body["error"]["field"] == "fixed_base_images"


# --- files that are not envelopes at all ---------------------------------------------------------

BAD_FILES: list[tuple[str, str, str | bytes]] = [
    ("garbage", "env.json", "{not json"),
    ("empty", "env.json", ""),
    ("whitespace", "env.json", " \n\t\n"),
    ("binary junk", "env.json", bytes(range(256)) * 4),
    ("not utf-8", "env.json", b'{"provider": "\xff"}'),
    ("utf-16", "env.json", json.dumps(ex.day_one_envelope()).encode("utf-16")),
    ("byte order mark", "env.json", b"\xef\xbb\xbf" + json.dumps(ex.day_one_envelope()).encode()),
    ("deep nesting", "env.json", "[" * 200_000 + "]" * 200_000),
    ("deep objects", "env.json", '{"a":' * 100_000 + "1" + "}" * 100_000),
    ("huge number", "env.json", "1" + "0" * 10_000),
    ("duplicate keys", "env.json", '{"provider": "a", "provider": "b"}'),
    ("nan", "env.json", '{"max_mounts": NaN}'),
    ("lone surrogate", "env.json", '{"provider": "\\ud800"}'),
    ("array", "env.json", "[]"),
    ("null", "env.json", "null"),
    ("bad toml", "env.toml", "provider = \n"),
    ("empty toml", "env.toml", ""),
    ("toml datetime", "env.toml", "provider = 1979-05-27T07:32:00Z\n"),
    ("toml not utf-8", "env.toml", b"provider = '\xff'\n"),
    ("toml deep nesting", "env.toml", "a = " + "[" * 100_000 + "]" * 100_000 + "\n"),
]


@pytest.mark.parametrize(("name", "content"), [(n, c) for _, n, c in BAD_FILES], ids=[i for i, _, _ in BAD_FILES])
def test_bad_files_get_a_clean_json_refusal(tmp_path: Path, name: str, content: str | bytes) -> None:
    path = write(tmp_path, name, content)
    body = refusal(invoke("envelope", "check", str(path), "--json"))
    assert body["error"]["code"] == "SandboxEnvelopeInvalid"


@pytest.mark.parametrize(("name", "content"), [(n, c) for _, n, c in BAD_FILES], ids=[i for i, _, _ in BAD_FILES])
def test_bad_files_get_a_clean_human_refusal(tmp_path: Path, name: str, content: str | bytes) -> None:
    result = invoke("envelope", "check", str(write(tmp_path, name, content)))
    assert result.exit_code == 1, result.exception
    assert "refused" in result.stderr
    assert "SandboxEnvelopeInvalid" in result.stderr


def test_unreadable_paths_are_refused(tmp_path: Path) -> None:
    missing = refusal(invoke("envelope", "check", str(tmp_path / "nope.json"), "--json"))
    assert "cannot read" in missing["error"]["message"]
    directory = refusal(invoke("envelope", "check", str(tmp_path), "--json"))
    assert "cannot read" in directory["error"]["message"]
    missing_toml = refusal(invoke("profile", "check", str(tmp_path / "nope.toml"), "--json"))
    assert missing_toml["error"]["code"] == "SandboxProfileInvalid"


def test_an_oversized_file_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with path.open("wb") as fh:
        fh.truncate(16 * 1024 * 1024 + 1)  # sparse: costs no disk
    body = refusal(invoke("envelope", "check", str(path), "--json"))
    assert "larger than" in body["error"]["message"]


# --- envelope check: the human summary -----------------------------------------------------------


def test_human_summary_of_the_day_one_tier(tmp_path: Path) -> None:
    result = invoke("envelope", "check", str(write(tmp_path, "env.json", ex.day_one_envelope())))
    assert result.exit_code == 0
    out = flat(result.stdout)
    assert "ok" in out
    assert "tier day one" in out
    assert "acme-sandbox@acme-sandbox 1.4.2/acme-images 7[hosted]" in out
    for axis in AXES_NOT_COUNTING_DAY_ONE:
        assert axis in out
    assert "non_root (guest_observed)" in out
    assert "root_read_only (not_enforced)" in out
    for axis in ("sandbox_isolation", "mounts_sealed", "disk_limit", "network_policy", "resource_limits"):
        assert axis not in out
    assert "cannot serve:" in out
    for item in (
        "network modes allowlist, unrestricted",
        "retention durable",
        "snapshot, clone and resume",
        "listDir",
        "openProcess (one-shot harnesses only)",
        "certified egress",
    ):
        assert item in out
    assert "short of the next tier: snapshots, clone and resume" in out


def test_an_envelope_claiming_what_only_in_tree_may_is_not_blessed(tmp_path: Path) -> None:
    """The kit's parity example claims runner_enforced on all nine axes and keeps snapshots in the runner's
    custody: as a third party's it is durable, not Docker parity, and every claim a ceiling would refuse is named."""
    result = invoke("envelope", "check", str(write(tmp_path, "env.json", ex.parity_envelope())))
    assert result.exit_code == 0
    out = flat(result.stdout)
    assert "tier durable (as a third party's)" in out
    assert "short of the next tier: provider snapshot custody" in out
    for axis in ex.parity_envelope()["enforcement"]:
        assert f"a third party's ceiling would refuse enforcement.{axis}: claims runner_enforced" in out
    assert "cannot serve: - network modes unrestricted - package managers cargo, gem, go, npm" in out
    result = invoke("envelope", "check", str(write(tmp_path, "env.json", ex.parity_envelope())), "--json")
    assessment = json.loads(result.stdout)["assessment"]
    assert assessment["tier"] == "durable"
    assert len(assessment["over_ceiling"]) == 9


def test_a_third_party_at_docker_parity(tmp_path: Path) -> None:
    doc = {
        **ex.parity_envelope(),
        "snapshot_custody": "provider",
        "enforcement": dict.fromkeys(ex.parity_envelope()["enforcement"], "provider_attested"),
    }
    result = invoke("envelope", "check", str(write(tmp_path, "env.json", doc)))
    assert result.exit_code == 0
    out = flat(result.stdout)
    assert "tier Docker parity (as a third party's)" in out
    assert "all nine axes count as enforcement" in out
    assert "short of the next tier" not in out and "warning" not in out


def test_security_boundary_from_a_provider_is_named(tmp_path: Path) -> None:
    doc = {
        **ex.parity_envelope(),
        "enforcement": dict.fromkeys(ex.parity_envelope()["enforcement"], "provider_attested"),
        "egress_certification": "security_boundary",
    }
    out = flat(invoke("envelope", "check", str(write(tmp_path, "env.json", doc))).stdout)
    assert "would refuse egress_certification: claims security_boundary" in out
    assert "security_boundary egress is not admissible for a provider that is not in-tree" in out


def test_human_summary_below_day_one(tmp_path: Path) -> None:
    doc = without(
        day_one(
            image_mode="fixed",
            fixed_base_images=["host"],
            network_modes=["unrestricted"],
            retention_modes=["durable"],
            snapshots=True,
            max_mounts=0,
            enforcement=dict.fromkeys(ex.day_one_envelope()["enforcement"], "not_enforced"),
        ),
        "lifecycle_assurances",
    )
    result = invoke("envelope", "check", str(write(tmp_path, "env.json", doc)))
    assert result.exit_code == 0, result.stderr
    out = flat(result.stdout)
    assert "tier below the day-one tier" in out
    assert "network mode 'none'" in out
    assert "retention 'ephemeral_zdr'" in out
    for axis in ex.day_one_envelope()["enforcement"]:
        assert f"{axis} (not_enforced)" in out
    assert "images built from a profile (fixed base images only: host)" in out


def test_human_refusal_names_the_field(tmp_path: Path) -> None:
    result = invoke("envelope", "check", str(write(tmp_path, "env.json", day_one(max_mounts=-1))))
    assert result.exit_code == 1
    err = flat(result.stderr)
    assert "refused SandboxEnvelopeInvalid (field max_mounts)" in err
    assert result.stdout == ""


# --- text from the file or the command line is shown literally, never read as markup ------------


@pytest.mark.parametrize("revision", ["rev [/] 1", "[bold]rev[/bold]", "rev [hosted]", "[/red]", "[link=x]y"])
def test_envelope_text_is_not_markup(tmp_path: Path, revision: str) -> None:
    result = invoke("envelope", "check", str(write(tmp_path, "env.json", day_one(provider_revision=revision))))
    assert result.exit_code == 0, result.exception
    assert f"acme-sandbox@{revision}/acme-images 7[hosted]" in flat(result.stdout)


def test_file_names_are_not_markup(tmp_path: Path) -> None:
    (tmp_path / "a[").mkdir()
    path = write(tmp_path / "a[", "]b.json", ex.day_one_envelope())
    assert "[/]" in str(path)
    result = invoke("envelope", "check", str(path))
    assert result.exit_code == 0, result.exception
    assert squash(str(path)) in squash(result.stdout)
    missing = invoke("envelope", "check", str(tmp_path / "a[" / "]missing.json"))
    assert missing.exit_code == 1, missing.exception
    assert "cannot read" in missing.stderr
    refused = invoke("envelope", "check", str(tmp_path / "a[" / "]missing.json"), "--json")
    assert "a[/]missing.json" in json.loads(refused.stdout)["error"]["message"]


def test_kit_export_names_a_bracketed_directory_literally(tmp_path: Path) -> None:
    result = invoke("kit", "export", str(tmp_path / "k[" / "]it"))
    assert result.exit_code == 0, result.exception
    assert squash(str(tmp_path / "k[" / "]it")) in squash(result.stdout)


# --- profile check -------------------------------------------------------------------------------


def test_profile_check_json_fills_defaults(tmp_path: Path) -> None:
    doc = without(ex.profile(), "packages")
    result = invoke("profile", "check", str(write(tmp_path, "p.json", doc)), "--json")
    assert result.exit_code == 0, result.stdout
    body = json.loads(result.stdout)
    assert body["ok"] is True
    assert body["profile"]["packages"] == {}
    assert body["profile"]["network_policy"] == {"mode": "none", "allowlist": []}
    assert decode(SandboxProfile, json.dumps(body["profile"])) == decode(SandboxProfile, json.dumps(doc))


def test_profile_check_prints_the_digest(tmp_path: Path) -> None:
    result = invoke("profile", "check", str(write(tmp_path, "p.json", ex.profile())))
    assert result.exit_code == 0
    assert EXAMPLE_PROFILE_DIGEST in result.stdout
    from_toml = invoke("profile", "check", str(write(tmp_path, "p.toml", to_toml(ex.profile()))))
    assert EXAMPLE_PROFILE_DIGEST in from_toml.stdout


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"base_image": "Debian 12"}, "base_image"),  # not a reference (a tag is pinned at admission)
        ({"packages": {"apt": ["jq"]}}, "packages.apt.0"),
        ({"network_policy": {"mode": "allowlist"}}, "network_policy.allowlist"),
        ({"resource_limits": {**ex.resources(1), "pids": 0}}, "resource_limits.pids"),
    ],
)
def test_profile_refusals(tmp_path: Path, changes: dict[str, Any], field: str) -> None:
    body = refusal(invoke("profile", "check", str(write(tmp_path, "p.json", {**ex.profile(), **changes})), "--json"))
    assert body["error"]["code"] == "SandboxProfileInvalid"
    assert body["error"]["field"] == field


def test_an_envelope_is_not_a_profile(tmp_path: Path) -> None:
    body = refusal(invoke("profile", "check", str(write(tmp_path, "p.json", ex.day_one_envelope())), "--json"))
    assert body["error"]["code"] == "SandboxProfileInvalid"


# --- kit export ----------------------------------------------------------------------------------


def test_kit_export_writes_the_kit(tmp_path: Path) -> None:
    result = invoke("kit", "export", str(tmp_path / "kit"))
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "kit" / "index.json").is_file()
    assert (tmp_path / "kit" / "README.md").is_file()
    count = sum(1 for p in (tmp_path / "kit").rglob("*") if p.is_file())
    assert f"wrote {count} files" in flat(result.stdout)


def test_kit_export_into_an_impossible_place_is_a_clean_refusal(tmp_path: Path) -> None:
    blocker = write(tmp_path, "file", "x")
    result = invoke("kit", "export", str(blocker / "kit"))
    assert result.exit_code == 1
    assert "cannot write the kit" in flat(result.stderr)


# --- the installed console script ----------------------------------------------------------------


def run(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(CHECKFU), *args], capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" not in done.stderr
    assert "Traceback" not in done.stdout
    return done


def test_the_console_script_is_installed() -> None:
    assert CHECKFU.is_file()


def test_script_accepts_a_valid_envelope(tmp_path: Path) -> None:
    done = run("envelope", "check", str(write(tmp_path, "env.json", ex.day_one_envelope())), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["envelope"]["list_dir"] is False


def test_script_refuses_a_violation_and_garbage(tmp_path: Path) -> None:
    done = run("envelope", "check", str(write(tmp_path, "env.json", day_one(snapshot_custody="provider"))), "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["error"]["field"] == "snapshot_custody"
    done = run("envelope", "check", str(write(tmp_path, "junk.json", bytes(range(256)))), "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["ok"] is False


def test_script_refuses_huge_nesting_cleanly(tmp_path: Path) -> None:
    done = run("envelope", "check", str(write(tmp_path, "deep.json", "[" * 500_000 + "]" * 500_000)), "--json")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["error"]["code"] == "SandboxEnvelopeInvalid"


def test_script_refuses_deep_toml_cleanly(tmp_path: Path) -> None:
    deep = write(tmp_path, "deep.toml", "a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    done = run("envelope", "check", str(deep), "--json")
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert json.loads(done.stdout)["error"]["code"] == "SandboxEnvelopeInvalid"


def test_script_refuses_unreadable_paths(tmp_path: Path) -> None:
    done = run("envelope", "check", str(tmp_path / "missing.json"), "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["ok"] is False
    done = run("envelope", "check", str(tmp_path))
    assert done.returncode == 1
    assert "refused" in done.stderr


def test_script_profile_digest_and_kit_export(tmp_path: Path) -> None:
    done = run("profile", "check", str(write(tmp_path, "p.json", ex.profile())))
    assert done.returncode == 0
    assert EXAMPLE_PROFILE_DIGEST in done.stdout
    done = run("kit", "export", str(tmp_path / "kit"))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "kit" / "index.json").read_text(encoding="utf-8"))["version"] == "v1"


# `checkfu profile check` as `checkfu run` reads a profile (issue 10) --------------------------------


EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "profiles").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_shipped_example_profile_checks_and_a_tag_is_pinned_at_admission(path: Path) -> None:
    result = invoke("profile", "check", str(path), "--json")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    body = json.loads(result.stdout)
    assert body["ok"] is True
    image = body["profile"]["base_image"]
    if image == "host":
        assert body["notes"] == [] and body["digest"].startswith("sha256:")
    else:
        assert "sha256:" not in image  # reported as written
        assert body["digest"] is None  # the digest is the pinned profile's, known at admission
        assert any("pinned to the engine's image id at admission" in note for note in body["notes"])
    human = invoke("profile", "check", str(path))
    assert human.exit_code == 0 and "valid SandboxProfile" in human.stdout


def test_a_profile_refusal_lists_every_problem_and_names_unknown_keys(tmp_path: Path) -> None:
    doc = {**ex.profile(), "bogus": 1, "network_policy": {"mode": "none", "extra": 2}}
    doc["resource_limits"] = {**ex.resources(1), "pids": 0}
    del doc["retention_mode"]
    body = refusal(invoke("profile", "check", str(write(tmp_path, "p.json", doc)), "--json"))
    fields = [p["field"] for p in body["problems"]]
    assert sorted(fields) == sorted(["bogus", "network_policy.extra", "resource_limits.pids", "retention_mode"])
    messages = " ".join(p["message"] for p in body["problems"])
    assert "unknown key 'bogus'" in messages and "unknown key 'extra'" in messages
    assert "the keys here are: tier, base_image" in messages  # what is allowed where the unknown key stands
    assert "retention_mode: missing" in messages


def test_profile_init_writes_the_built_in_default_which_checks(tmp_path: Path) -> None:
    target = tmp_path / "mine.toml"
    result = invoke("profile", "init", str(target))
    assert result.exit_code == 0, result.stdout
    assert "checkfu run --profile" in " ".join(result.stdout.split())
    checked = json.loads(invoke("profile", "check", str(target), "--json").stdout)
    assert checked["ok"] and checked["profile"]["base_image"] == "checkfu/debian:12"
    assert checked["profile"]["network_policy"]["mode"] == "none"
    again = invoke("profile", "init", str(target))
    assert again.exit_code == 2 and "--force" in again.stderr  # never overwritten by accident
    host = tmp_path / "host.toml"
    assert invoke("profile", "init", str(host), "--provider", "host-process").exit_code == 0
    assert json.loads(invoke("profile", "check", str(host), "--json").stdout)["profile"]["base_image"] == "host"


def test_help_has_no_type_clutter_and_version_and_completion_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    # The shell is the one named below, not one looked for among this process's ancestors (there may be none: a
    # detached pytest has no shell above it). Read when the command is built, so set here rather than in invoke.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    for args in (["run", "--help"], ["--help"], ["profile", "init", "--help"]):
        text = invoke(*args).stdout
        for clutter in ("<bool>", "<str>", "<path>", "<float>", "<int>", "list[str]", "TEXT", "BOOLEAN"):
            assert clutter not in text, (args, clutter)
    lines = invoke("run", "--help").stdout.splitlines()
    for option, metavar in (("--db ", "URL"), ("--credential-file ", "FILE"), ("--profile ", "FILE")):
        line = next(x for x in lines if option in x)
        assert metavar in line, (option, line)  # every option that takes a value says what kind
    version = invoke("--version")
    assert version.exit_code == 0 and version.stdout.startswith("checkfu ")
    completion = invoke("--show-completion", "bash")
    assert completion.exit_code == 0 and "complete" in completion.stdout and "checkfu" in completion.stdout
