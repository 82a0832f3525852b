"""``pin_base_image``: a tag becomes the engine's image id; an unknown tag or a missing engine is refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from checkfu.contract.errors import SandboxAdapterUnavailable, SandboxProfileInvalid
from checkfu.providers.docker import create, pin_base_image

NO_ENGINE = "unix:///nonexistent/checkfu-no-engine.sock"


@pytest.mark.docker
def test_a_tag_is_pinned_to_the_engine_image_id(client: Any, busybox_id: str) -> None:
    pinned = pin_base_image("checkfu/busybox:1")
    assert pinned == busybox_id == client.images.get("checkfu/busybox:1").id
    assert pinned.startswith("sha256:")
    assert pin_base_image(pinned) == pinned, "an id is pinned already"


@pytest.mark.docker
@pytest.mark.parametrize("ref", ["checkfu/no-such-image:0", "Not A Reference"])
def test_an_image_the_engine_does_not_have_is_a_profile_fault(client: Any, ref: str) -> None:
    with pytest.raises(SandboxProfileInvalid) as refused:
        pin_base_image(ref)
    assert refused.value.field == "base_image"
    assert "scripts/base-images" in refused.value.message and repr(ref) in refused.value.message


def test_a_pinned_reference_is_returned_without_asking_an_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    pinned = "debian@sha256:" + "a" * 64
    assert pin_base_image(pinned) == pinned


def test_no_engine_makes_the_tier_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    with pytest.raises(SandboxAdapterUnavailable) as refused:
        pin_base_image("checkfu/busybox:1")
    assert refused.value.field == "provider"
    with pytest.raises(SandboxAdapterUnavailable) as refused:
        create()
    assert refused.value.field == "provider"
