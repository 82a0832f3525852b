"""Docker-style flags instead of profile files (issue 32): ``--image``, ``--memory``, ``--cpus``, ``--pids``,
``--disk``, ``--timeout`` and ``--network`` on ``checkfu run``, ``submit`` and ``sandbox create``.

A flag wins over the profile it is given with; a profile may give any subset of the resource limits (the built-in
default gives the rest); the summary and ``--json`` state the resolved profile. What the flags ask is observed
from outside (``docker inspect``) and from inside (the sandbox's own cgroup limits).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from checkfu.contract.errors import SandboxProfileInvalid
from checkfu.core.profiles import Overrides, parse_cpus, parse_seconds, parse_size_mib, read_profile

from .test_run_cli import Cli
from .test_run_docker import containers, dcli, engine, leftovers  # noqa: F401 - fixtures

LIMITS = (
    "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max 2>/dev/null"
    " || cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max"
)
"""The sandbox's own cgroup limits, memory then pids (cgroup v1, else v2)."""


# -- parsing, as docker reads the same words -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mib"), [("512m", 512), ("1g", 1024), ("1.5g", 1536), ("2048k", 2), ("1G", 1024), ("256MiB", 256)]
)
def test_sizes_read_as_docker_reads_them(text: str, mib: int) -> None:
    assert parse_size_mib(text, "--memory") == mib


@pytest.mark.parametrize("text", ["512", "0m", "1.5m", "lots", "-1g", ""])
def test_a_size_that_is_not_whole_mib_is_refused_by_its_flag(text: str) -> None:
    with pytest.raises(SandboxProfileInvalid) as caught:
        parse_size_mib(text, "--memory")
    assert caught.value.field == "--memory"


def test_a_bare_number_is_bytes_as_in_docker_and_the_refusal_says_so() -> None:
    with pytest.raises(SandboxProfileInvalid, match="write 512m"):
        parse_size_mib("512", "--memory")


def test_cpus_and_durations() -> None:
    assert (parse_cpus("1.5"), parse_cpus("0.25"), parse_cpus("2")) == (1500, 250, 2000)
    for bad in ("0", "-1", "x", "0.0001", "nan"):
        with pytest.raises(SandboxProfileInvalid):
            parse_cpus(bad)
    assert (parse_seconds("30s", "--timeout"), parse_seconds("5m", "--timeout"), parse_seconds("90", "--t")) == (
        30,
        300,
        90,
    )
    for bad in ("30x", "0", "-5s", "inf", "nan", "99999999999d"):
        with pytest.raises(SandboxProfileInvalid) as caught:
            parse_seconds(bad, "--timeout")
        assert caught.value.field == "timeout"


def test_a_flag_wins_over_the_profile_and_a_profile_may_give_some_limits(tmp_path: Path) -> None:
    partial = tmp_path / "partial.toml"
    partial.write_text(
        'tier = "container"\nbase_image = "checkfu/busybox:1"\nretention_mode = "ephemeral_zdr"\n'
        '[network_policy]\nmode = "none"\n[resource_limits]\nmemory_mib = 128\n',
        encoding="utf-8",
    )
    read = read_profile(partial, "docker")
    assert read.problems == [], read.problems
    assert read.profile is not None
    limits = read.profile.resource_limits
    assert (limits.memory_mib, limits.cpu_millis, limits.disk_mib, limits.pids) == (128, 1000, 512, 256)
    assert any("resource_limits.pids = 256 from the built-in default" in n for n in read.notes), read.notes
    flagged = read_profile(partial, "docker", Overrides(memory="256m", image="checkfu/debian:12"))
    assert flagged.profile is not None and flagged.profile.resource_limits.memory_mib == 256
    assert flagged.tag == "checkfu/debian:12"


def test_every_bad_flag_is_named_at_once() -> None:
    read = read_profile(None, "docker", Overrides(memory="256", cpus="x", disk="1.5m", pids=0))
    assert sorted(p.error.field or "" for p in read.problems) == ["--cpus", "--disk", "--memory", "--pids"]


# -- the commands ---------------------------------------------------------------------------------------------------


@pytest.mark.docker
def test_run_with_flags_and_no_profile_file(dcli: Cli, tmp_path: Path) -> None:  # noqa: F811
    summary = tmp_path / "run.json"
    done = dcli(
        "run", "--image", "checkfu/debian:12", "--memory", "256m", "--cpus", "1.5", "--pids", "100",
        "--disk", "1g", "--timeout", "30s", "--json", str(summary), "--",
        "python3", "-c", "import subprocess; print(subprocess.run(['sh', '-c', '" + LIMITS + "'], "
        "capture_output=True, text=True).stdout)",
    )  # fmt: skip
    assert done.code == 0, done.err
    memory, pids = done.out.decode().split()[:2]
    assert (int(memory), pids) == (256 << 20, "100")  # from inside: the cgroup's own limits
    resolved = json.loads(summary.read_text())["resolved_profile"]
    assert resolved["image"] == "checkfu/debian:12" and resolved["image_id"].startswith("sha256:")
    assert {k: resolved[k] for k in ("cpus", "memory_mib", "disk_mib", "pids", "network", "timeout_seconds")} == {
        "cpus": 1.5,
        "memory_mib": 256,
        "disk_mib": 1024,
        "pids": 100,
        "network": "none",
        "timeout_seconds": 30.0,
    }
    assert "resolved   checkfu/debian:12, 1.5 cpus, 256 MiB memory, 1024 MiB disk, 100 pids, network none" in done.err


@pytest.mark.docker
def test_the_flag_wins_over_the_profile_file(dcli: Cli, tmp_path: Path) -> None:  # noqa: F811
    summary = tmp_path / "run.json"
    profile = Path(__file__).resolve().parents[2] / "examples" / "profiles" / "busybox-none.toml"
    done = dcli("run", "--profile", str(profile), "--memory", "200m", "--json", str(summary), "--", "sh", "-c", LIMITS)
    assert done.code == 0, done.err
    assert int(done.out.decode().split()[0]) == 200 << 20
    resolved = json.loads(summary.read_text())["resolved_profile"]
    assert (resolved["memory_mib"], resolved["cpus"]) == (200, 0.5)  # the file's cpu_millis = 500 stays


@pytest.mark.docker
def test_network_allow_is_the_allowlist(dcli: Cli, tmp_path: Path) -> None:  # noqa: F811
    summary = tmp_path / "run.json"
    done = dcli(
        "run", "--image", "checkfu/busybox:1", "--network", "allow:pypi.org:443", "--json", str(summary), "--",
        "sh", "-c", "echo $HTTPS_PROXY",
    )  # fmt: skip
    assert done.code == 0, done.err
    assert done.out.decode().strip() == "http://127.0.0.1:3128"
    doc = json.loads(summary.read_text())
    assert doc["allowed"] == ["pypi.org:443"]
    assert (doc["resolved_profile"]["network"], doc["resolved_profile"]["allowlist"]) == ("allowlist", ["pypi.org:443"])


@pytest.mark.docker
def test_bad_flags_are_refused_by_name_before_any_work(dcli: Cli, engine: Any) -> None:  # noqa: F811
    cases = [
        (["--memory", "256"], "--memory"),
        (["--cpus", "lots"], "--cpus"),
        (["--network", "host"], "--network"),
        (["--network", "allow:,"], "--network"),
        (["--network", "none", "--allow", "pypi.org:443"], "--network"),
        (["--timeout", "30x"], "--timeout"),
        (["--image", "NOT A TAG"], "base_image"),
    ]
    for flags, named in cases:
        for command in (["run", *flags, "--", "true"], ["sandbox", "create", *flags]):
            if command[0] == "sandbox" and named in ("--timeout",):
                continue
            if command[0] == "sandbox" and "--allow" in flags:
                continue
            done = dcli(*command)
            assert done.code in (2, 125), (command, done.code, done.err)
            assert named in done.said and "SandboxProfileInvalid" in done.said, (command, done.said)
            assert "Traceback" not in done.err
    assert leftovers(engine, dcli.tag) == []
    assert dcli.json("ps") == {"ok": True, "sandboxes": [], "runs": [], "snapshots": []}


@pytest.mark.docker
def test_sandbox_create_with_flags_seen_by_docker_inspect(dcli: Cli, engine: Any) -> None:  # noqa: F811
    made = dcli.json("sandbox", "create", "--image", "checkfu/busybox:1", "--memory", "256m", "--cpus", "1.5",
                     "--pids", "100", "--disk", "128m", "--json")  # fmt: skip
    sid = made["sandbox_id"]
    try:
        assert {k: made["resolved_profile"][k] for k in ("image", "memory_mib", "cpus", "pids", "disk_mib")} == {
            "image": "checkfu/busybox:1",
            "memory_mib": 256,
            "cpus": 1.5,
            "pids": 100,
            "disk_mib": 128,
        }
        [box] = [c for c in containers(engine, dcli.tag) if c.attrs["Config"]["Cmd"] and not c.name.endswith("-areas")]
        host = box.attrs["HostConfig"]
        assert (host["Memory"], host["NanoCpus"], host["PidsLimit"], host["NetworkMode"]) == (
            256 << 20,
            1_500_000_000,
            100,
            "none",
        )
        inside = dcli("exec", sid, "--", "sh", "-c", LIMITS)
        assert inside.out.decode().split()[:2] == [str(256 << 20), "100"]
    finally:
        dcli("sandbox", "rm", sid)
    assert leftovers(engine, dcli.tag) == []


@pytest.mark.docker
def test_submit_carries_the_resolved_profile(dcli: Cli) -> None:  # noqa: F811
    from checkfu.core.clock import SystemClock  # noqa: PLC0415
    from checkfu.core.journal import Journal, sqlite_url  # noqa: PLC0415
    from checkfu.core.queue import RunQueue  # noqa: PLC0415

    done = dcli("submit", "--memory", "300m", "--pids", "77", "--timeout", "2m", "--", "true")
    assert done.code == 0, done.err
    journal = Journal(sqlite_url(dcli.journal_path))
    try:
        request = RunQueue(journal, SystemClock()).request(done.out.decode().strip())
    finally:
        journal.close()
    assert request is not None
    assert (request.profile["resource_limits"]["memory_mib"], request.profile["resource_limits"]["pids"]) == (300, 77)
    assert request.timeout == 120.0
    refused = dcli("submit", "--memory", "300", "--", "true")
    assert refused.code != 0 and "--memory" in refused.said
