"""Fixtures for the Docker provider's tests against the real engine.

Every object the tests make carries this session's runner tag; at the end the
session asserts that nothing labelled with it is left ("nothing leaks"), after
reclaiming whatever was, so a failure never leaves litter behind.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

docker = pytest.importorskip("docker")

from docker_kit import LEASE, Kit, leftovers  # noqa: E402

from checkfu.contract.members import CompensateRequest  # noqa: E402
from checkfu.providers.docker import DockerProvider  # noqa: E402
from checkfu.testing.served import serve_in_thread  # noqa: E402


@pytest.fixture(scope="session")
def client() -> Iterator[Any]:
    try:
        c = docker.from_env()
        c.ping()
    except Exception as exc:
        if os.environ.get("CHECKFU_REQUIRE_DOCKER") == "1":
            raise
        pytest.skip(f"no Docker Engine: {type(exc).__name__}")
    yield c
    c.close()


@pytest.fixture(scope="session")
def runner_tag() -> str:
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def busybox_id(client: Any) -> str:
    return str(client.images.get("checkfu/busybox:1").id)


@pytest.fixture(scope="session")
def debian_id(client: Any) -> str:
    return str(client.images.get("checkfu/debian:12").id)


@pytest.fixture(scope="session")
def provider(client: Any, runner_tag: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerProvider]:
    p = DockerProvider(state_dir=tmp_path_factory.mktemp("docker-state"), cache_tag=runner_tag, workers=32)
    yield p
    left = leftovers(client, runner_tag)
    for key in sorted({k for _, _, k in left}):
        asyncio.run(
            p.compensate(CompensateRequest(target=p.target, lease=LEASE, allocation_key=key, runner_tag=runner_tag))
        )
    p.close()
    assert not left, f"objects left behind by the tests: {left}"


@pytest.fixture(scope="session", params=["in-process", "wire"])
def kit(
    request: pytest.FixtureRequest, provider: DockerProvider, client: Any, runner_tag: str, busybox_id: str
) -> Iterator[Kit]:
    """The provider in-process, and the same provider served over the wire on loopback: every test runs on both."""
    if request.param == "in-process":
        yield Kit(provider, client, runner_tag, busybox_id, docker=provider)
        return
    with serve_in_thread(provider, attest_enforcement=False) as remote:
        yield Kit(remote, client, runner_tag, busybox_id, docker=provider)


@pytest.fixture(scope="session")
def state_dir(provider: DockerProvider) -> Path:
    return provider.state_dir
