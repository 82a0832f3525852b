"""The engine's questions at a command's start (``providers/docker/engine.py``): the API version from ``/_ping``
rather than docker-py's ``/version``, and ``/info`` sent ahead (``ask_info_early``) and taken once, fresh, by the
local engine it was asked of; anything else is asked again as before. And a Unix socket's client asks everything
through one pool of connections (``transport.one_pool``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import docker
import pytest
import requests

from checkfu.providers.docker import engine as E
from checkfu.providers.docker.transport import EngineUrl

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


def _pools(made: Any) -> list[Any]:
    adapter = made.api.get_adapter("http+docker://localhost")
    return [adapter.pools[key] for key in adapter.pools.keys()]  # noqa: SIM118 - it cannot be iterated


@pytest.mark.docker
@pytest.mark.parametrize("how", ["local_client", "engine_url"])
def test_a_unix_sockets_client_asks_everything_through_one_connection(client: Any, how: str) -> None:
    url = EngineUrl.parse(f"unix://{E.socket_path()}")
    made = E.local_client(max_pool_size=8) if how == "local_client" else url.client(workers=8)
    try:
        made.api.ping()
        (pool,) = _pools(made)
        opened: list[Any] = []
        real = pool._new_conn

        def counted() -> Any:
            opened.append(real())
            return opened[-1]

        pool._new_conn = counted
        # docker-py's own adapter made a pool, and opened a connection, for each of these URLs
        made.api.version()
        made.api.containers(all=True, filters={"label": "checkfu.test=one-pool"})
        made.api.images(filters={"label": "checkfu.test=one-pool"})
        assert _pools(made) == [pool]
        assert opened == [], "one after another, the requests share the first one's connection"
        assert pool.pool.maxsize == 8, "of the size asked for"
    finally:
        made.close()


@pytest.mark.docker
@pytest.mark.parametrize("how", ["local_client", "engine_url"])
def test_a_unix_sockets_client_reads_no_environment_per_request(
    client: Any, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """requests looks for proxies (and ``.netrc``) in the environment at every request unless told not to; nothing
    of either applies to a Unix socket, so its client does not look."""
    url = EngineUrl.parse(f"unix://{E.socket_path()}")
    made = E.local_client(max_pool_size=2) if how == "local_client" else url.client(workers=2)
    looked: list[str] = []
    monkeypatch.setattr(requests.sessions, "get_environ_proxies", lambda url, **_: looked.append(url) or {})
    monkeypatch.setattr(requests.sessions, "get_netrc_auth", lambda url, **_: looked.append(url))
    try:
        made.api.ping()
        made.api.containers(all=True, filters={"label": "checkfu.test=no-environment"})
        assert looked == []
    finally:
        made.close()


@pytest.mark.docker
def test_an_image_asked_early_is_the_engines_and_taken_once(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = E.Engine()
    asked: list[str] = []
    real = engine.api.inspect_image

    def counted(ref: str) -> Any:
        asked.append(ref)
        return real(ref)

    monkeypatch.setattr(engine.api, "inspect_image", counted)
    present, missing = "checkfu/busybox:1", "checkfu/no-such-image:0"
    try:
        E.ask_image_early(present)
        E.ask_image_early(missing)
        assert engine.image_id(present) == client.images.get(present).id
        assert engine.image_id(missing) is None, "the engine's 404, taken as it came"
        assert asked == [], "both answers were taken, nothing asked again"
        assert engine.image_id(present) == client.images.get(present).id
        assert engine.image_id("checkfu/debian:12") is not None
        assert asked == [present, "checkfu/debian:12"], "an answer is taken once, and only for what it asked"
    finally:
        engine.close()
