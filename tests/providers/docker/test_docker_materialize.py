"""materialize: a profile's image, cached by its materialization digest; a real apt and pip install."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from docker_kit import LEASE, Kit

from checkfu.contract.errors import SandboxCapabilityUnavailable, SandboxIdentityMismatch, SandboxNotFound
from checkfu.contract.members import CompensateRequest, MaterializeRequest
from checkfu.contract.profile import SandboxProfile
from checkfu.providers.docker import create
from checkfu.providers.docker import labels as L
from checkfu.providers.docker.materialize import cache_key, dockerfile, materialization_digest
from checkfu.providers.docker.spec import SandboxUser

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

JQ = "jq=1.6-2.1+deb12u2"
"""In Debian bookworm's main archive (``apt-cache policy jq`` on this host shows the same release)."""
TOML = "toml==0.10.2"


def request(kit: Kit, profile: SandboxProfile) -> MaterializeRequest:
    return MaterializeRequest(
        target=kit.target, lease=LEASE, profile=profile, profile_digest=profile.digest, platform=kit.platform()
    )


def with_packages(kit: Kit, image: str, packages: dict[str, list[str]]) -> SandboxProfile:
    return SandboxProfile(**{**kit.profile(image=image).model_dump(), "packages": packages})


def test_dockerfile_and_digest() -> None:
    user = SandboxUser.parse("1000:1000", "/home/sandbox")
    base = "sha256:" + "a" * 64
    profile = SandboxProfile(
        tier="container",
        base_image=base,
        packages={"pip": ["b==1", "a==2"], "apt": ["jq=1.6"]},
        network_policy={"mode": "none"},
        resource_limits={"cpu_millis": 100, "memory_mib": 16, "disk_mib": 16, "pids": 16},
        retention_mode="durable",
    )
    text = dockerfile(profile, user, with_ca=True)
    lines = text.splitlines()
    assert lines[0] == f"FROM {base}" and lines[-1] == "USER 1000:1000"
    assert "apt-get install -y --no-install-recommends jq=1.6 python3-pip" in text
    assert "python3 -m pip install --no-input b==1 a==2" in text and "PIP_CERT=" in text
    reordered = SandboxProfile(**{**profile.model_dump(), "packages": {"apt": ["jq=1.6"], "pip": ["a==2", "b==1"]}})
    assert materialization_digest(profile, "r1") == materialization_digest(reordered, "r1")
    assert materialization_digest(profile, "r1") != materialization_digest(profile, "r2")
    other = SandboxProfile(**{**profile.model_dump(), "retention_mode": "ephemeral_zdr"})
    assert materialization_digest(profile, "r1") == materialization_digest(other, "r1"), "only what builds counts"


async def test_no_packages_is_the_base_image(kit: Kit, busybox_id: str) -> None:
    result = await kit.provider.materialize(request(kit, kit.profile()))
    assert (result.image, result.built) == (busybox_id, False)
    assert (
        result.materialization_revision == "checkfu-docker-images 1" and result.profile_digest == kit.profile().digest
    )


async def test_refusals(kit: Kit) -> None:
    with pytest.raises(SandboxCapabilityUnavailable):
        await kit.provider.materialize(request(kit, with_packages(kit, kit.image, {"npm": ["left-pad@1.3.0"]})))
    with pytest.raises(SandboxNotFound):
        await kit.provider.materialize(request(kit, kit.profile(image="sha256:" + "0" * 64)))
    other = kit.target.model_copy(update={"placement": "hosted"})
    with pytest.raises(SandboxIdentityMismatch):
        await kit.provider.materialize(request(kit, kit.profile()).model_copy(update={"target": other}))


async def test_real_apt_and_pip_install_then_cache_hit(kit: Kit, debian_id: str, client: Any) -> None:
    seen: list[str] = []

    def progress(line: str) -> None:
        seen.append(line.rstrip())  # one str per line, as a console prints it

    provider = create(progress=progress, state_dir=str(kit.docker.state_dir), cache_tag=kit.runner_tag, workers="4")
    profile = with_packages(kit, debian_id, {"apt": [JQ], "pip": [TOML]})
    digest = materialization_digest(profile, provider.envelope.materialization_revision)
    try:
        first = await provider.materialize(request(kit, profile))
        assert first.built is True and first.image != debian_id
        # the build says first that it reaches the network, for which packages, and how an operator forbids it
        assert seen[0].startswith(f"building the image for packages.apt: {JQ}; packages.pip: {TOML}: "), seen[:2]
        assert "reach the package registries" in seen[0] and "CHECKFU_BUILD_NETWORK=none" in seen[0]
        assert any(line.startswith("Step 1/") for line in seen), seen[:5]
        assert all(line and "\n" not in line for line in seen)
        labels = client.images.get(first.image).labels
        assert labels[L.MATERIALIZATION] == digest and labels[L.RUNNER_TAG] == kit.runner_tag
        assert labels[L.ALLOCATION_KEY] == cache_key(digest)
        again, concurrent = await asyncio.gather(
            provider.materialize(request(kit, profile)), provider.materialize(request(kit, profile))
        )
        assert (again.image, again.built, concurrent.built) == (first.image, False, False)
        box = await kit.up("built", profile=profile, root_image=first.image)
        try:
            r = await box.sh(
                "jq --version; dpkg-query -W -f '${Version}' jq; echo;"
                " python3 -c 'import toml; print(toml.__version__)'; id -u"
            )
            assert r.stdout.split() == [b"jq-1.6", b"1.6-2.1+deb12u2", b"0.10.2", b"1000"], r.stderr
        finally:
            await box.release()
    finally:
        reclaimed = await provider.compensate(
            CompensateRequest(
                target=provider.target, lease=LEASE, allocation_key=cache_key(digest), runner_tag=kit.runner_tag
            )
        )
        provider.close()
    assert reclaimed.reclaimed == 1
