"""The engine's questions at a command's start (``providers/docker/engine.py``): the API version from ``/_ping``
rather than docker-py's ``/version``, and ``/info`` sent ahead (``ask_info_early``) and taken once, fresh, by the
local engine it was asked of; anything else is asked again as before."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import docker
import pytest

from checkfu.providers.docker import engine as E

NO_ENGINE = "unix:///nonexistent/checkfu-no-engine.sock"


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    """No question or version left by another test of this process."""
    E._API_VERSIONS.clear()
    E._EARLY_INFO.clear()
    yield
    E._API_VERSIONS.clear()
    for left in E._EARLY_INFO.values():
        left.close()
    E._EARLY_INFO.clear()


@pytest.mark.docker
def test_the_pinged_version_is_the_one_docker_py_negotiates(client: Any) -> None:
    negotiated = docker.from_env(version="auto")  # asks /version
    try:
        assert E._pinged_version() == negotiated.api.api_version
        made = E.local_client()
        assert made.api.api_version == negotiated.api.api_version
        made.close()
    finally:
        negotiated.close()


def test_no_ping_where_the_engine_is_not_a_local_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    assert E._pinged_version() is None
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    assert E._pinged_version() is None  # docker-py then asks, and fails, its own way


@pytest.mark.docker
def test_info_asked_early_is_the_engines_and_taken_once(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = E.Engine()
    asked: list[str] = []
    real = engine.api.info

    def counted() -> Any:
        asked.append("info")
        return real()

    monkeypatch.setattr(engine.api, "info", counted)
    try:
        E.ask_info_early()
        early = asyncio.run(engine.info())
        assert asked == [], "the early answer was taken, nothing asked again"
        assert early["ID"] == client.info()["ID"]
        assert "SecurityOptions" in early
        again = asyncio.run(engine.info())
        assert asked == ["info"], "an early answer is taken once"
        assert again["ID"] == early["ID"]
    finally:
        engine.close()


@pytest.mark.docker
def test_a_stale_early_question_is_not_taken(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = E.Engine()
    monkeypatch.setattr(engine.api, "info", lambda: {"asked": "now"})
    monkeypatch.setattr(E, "EARLY_INFO_SECONDS", 0.0)
    try:
        E.ask_info_early()
        assert asyncio.run(engine.info()) == {"asked": "now"}
        assert E._EARLY_INFO == {}, "the stale question is dropped"
    finally:
        engine.close()


@pytest.mark.docker
def test_an_engine_reached_otherwise_never_takes_the_early_answer(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = E.Engine(client=docker.from_env())
    monkeypatch.setattr(engine.api, "info", lambda: {"asked": "this engine"})
    try:
        E.ask_info_early()
        assert asyncio.run(engine.info()) == {"asked": "this engine"}
        assert len(E._EARLY_INFO) == 1, "left for the engine it was asked of"
    finally:
        engine.close()


def test_no_early_question_without_a_local_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    E.ask_info_early()
    assert E._EARLY_INFO == {}
