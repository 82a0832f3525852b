"""``pin_base_image``: a tag becomes the engine's image id; an unknown tag or a missing engine is refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from checkfu.contract.errors import SandboxAdapterUnavailable, SandboxProfileInvalid
from checkfu.providers.docker import ask_pin_early, create, pin_base_image

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


# the question sent ahead (checkfu run sends it before it opens its journal) ---------------------------------


@pytest.mark.docker
def test_a_question_sent_ahead_pins_as_asking_then_would(client: Any, busybox_id: str) -> None:
    early = ask_pin_early("checkfu/busybox:1")
    assert early is not None
    assert pin_base_image("checkfu/busybox:1", early) == busybox_id
    assert ask_pin_early(busybox_id) is None, "an id needs no question"


@pytest.mark.docker
@pytest.mark.parametrize("ref", ["checkfu/no-such-image:0", "Not A Reference"])
def test_a_question_sent_ahead_refuses_a_missing_image_by_name(client: Any, ref: str) -> None:
    early = ask_pin_early(ref)
    assert early is not None
    with pytest.raises(SandboxProfileInvalid) as refused:
        pin_base_image(ref, early)
    assert refused.value.field == "base_image" and repr(ref) in refused.value.message


@pytest.mark.docker
def test_an_answer_that_is_not_the_engines_is_asked_again(client: Any, busybox_id: str) -> None:
    early = ask_pin_early("checkfu/busybox:1")
    assert early is not None
    early.close()  # the answer cannot be read: docker-py asks, as without the early question
    assert pin_base_image("checkfu/busybox:1", early) == busybox_id


def test_no_engine_sends_no_question_and_the_tier_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    assert ask_pin_early("checkfu/busybox:1") is None
    with pytest.raises(SandboxAdapterUnavailable):
        pin_base_image("checkfu/busybox:1", None)
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    assert ask_pin_early("checkfu/busybox:1") is None, "only a Unix socket is asked ahead"
