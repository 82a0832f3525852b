"""``CHECKFU_BUILD_NETWORK=none``: an operator forbids image builds that reach the network, so a profile naming
packages is refused by field, with a code of the vocabulary, before any provider work and with nothing left
allocated. Unset (or ``host``), such a profile runs as before. On the memory provider, which materializes packages
without a network; the Docker tier's build says that it reaches the network (tests/providers/docker/
test_docker_materialize.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkfu.contract.errors import SandboxCapabilityUnavailable, SandboxProfileInvalid
from checkfu.core.admission import build_network_problems
from checkfu.testing.memory import BASE_IMAGE as MEMORY_IMAGE

from .test_run_cli import Cli, isolated_cli, profile_file

PIP = "toml==0.10.2"
APT = "jq=1.6-2.1+deb12u2"


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with isolated_cli(tmp_path) as c:
        yield c


@pytest.fixture
def with_packages(tmp_path: Path) -> Path:
    return profile_file(
        tmp_path, base_image=MEMORY_IMAGE, name="packages.toml", extra=f'packages = {{ pip = ["{PIP}"] }}'
    )


def test_build_network_none_refuses_a_profile_with_packages_by_field(cli: Cli, with_packages: Path) -> None:
    done = cli(
        "run", "--provider", "memory", "--profile", str(with_packages), "--json", "-", "--", "true",
        CHECKFU_BUILD_NETWORK="none",
    )  # fmt: skip
    assert done.code == 125, str(done)
    error = json.loads(done.out)["error"]
    assert (error["code"], error["field"]) == ("SandboxCapabilityUnavailable", "profile.packages.pip")
    assert PIP in error["message"] and "CHECKFU_BUILD_NETWORK=none" in error["message"]
    assert "SandboxCapabilityUnavailable" in done.err and "Traceback" not in done.err
    assert cli.open_allocations() == []
    assert cli.json("runs", "list") == []  # refused at selection, before any provider work: no Run was started


def test_unset_or_host_the_same_profile_runs(cli: Cli, with_packages: Path) -> None:
    for env in ({}, {"CHECKFU_BUILD_NETWORK": "host"}):
        done = cli("run", "-q", "--provider", "memory", "--profile", str(with_packages), "--", "echo", "ok", **env)
        assert done.code == 0 and done.out == b"ok\n", str(done)


def test_build_network_none_lets_a_profile_without_packages_run(cli: Cli) -> None:
    prof = profile_file(cli.home, base_image=MEMORY_IMAGE, name="plain.toml")
    done = cli("run", "-q", "--provider", "memory", "--profile", str(prof), "--", "true", CHECKFU_BUILD_NETWORK="none")
    assert done.code == 0, str(done)


def test_an_unknown_value_is_refused_by_name_not_guessed(cli: Cli, with_packages: Path) -> None:
    done = cli(
        "run", "--provider", "memory", "--profile", str(with_packages), "--json", "-", "--", "true",
        CHECKFU_BUILD_NETWORK="off",
    )  # fmt: skip
    assert done.code == 125, str(done)
    error = json.loads(done.out)["error"]
    assert (error["code"], error["field"]) == ("SandboxProfileInvalid", "CHECKFU_BUILD_NETWORK")


@pytest.mark.parametrize(
    ("packages", "value", "found"),
    [
        ({}, "none", []),
        ({"pip": ()}, "none", []),
        ({"pip": (PIP,)}, None, []),
        ({"pip": (PIP,)}, "", []),
        ({"pip": (PIP,)}, "host", []),
        ({"pip": (PIP,)}, "none", [(SandboxCapabilityUnavailable, "profile.packages.pip")]),
        (
            {"pip": (PIP,), "apt": (APT,)},
            "none",
            [
                (SandboxCapabilityUnavailable, "profile.packages.apt"),
                (SandboxCapabilityUnavailable, "profile.packages.pip"),
            ],
        ),
        ({"apt": (APT,)}, "bridge", [(SandboxProfileInvalid, "CHECKFU_BUILD_NETWORK")]),
    ],
)
def test_build_network_problems(
    packages: dict[str, tuple[str, ...]], value: str | None, found: list[tuple[type, str]]
) -> None:
    problems = build_network_problems(packages.items(), value)
    assert [(type(p.error), p.field) for p in problems] == found
