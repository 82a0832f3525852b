"""Fixtures for the wire's own tests; the rig they build on is ``wire_rig``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from wire_rig import Driven, Service, host_profile

from checkfu.contract.provider import Provider
from checkfu.contract.vocabulary import Platform
from checkfu.providers.host_process import HostProcessProvider
from checkfu.testing import MemoryProvider, Requests


@pytest.fixture
def serve() -> Iterator[Callable[..., Service]]:
    """``serve(provider)`` starts a service; every one is stopped at the end of the test."""
    services: list[Service] = []

    def make(provider: Provider, secret: str | None = None, **app_options: Any) -> Service:
        service = Service(provider, secret, app_options=app_options)
        services.append(service)
        service.start()
        return service

    yield make
    for service in services:
        service.close()


@pytest.fixture
async def memory_wire(serve: Callable[..., Service]) -> AsyncIterator[tuple[MemoryProvider, Driven]]:
    memory = MemoryProvider()
    service = serve(memory)
    driven = Driven(service, service.remote(), Requests(memory.target))
    yield memory, driven
    await driven.release_all()


@pytest.fixture
async def host_wire(serve: Callable[..., Service], tmp_path: Path) -> AsyncIterator[tuple[HostProcessProvider, Driven]]:
    provider = HostProcessProvider(state_dir=tmp_path / "state", kill_grace=0.2, drain_grace=0.05)
    envelope = (await provider.describe()).envelope
    service = serve(provider)
    platform: Platform = envelope.platforms[0]
    driven = Driven(service, service.remote(), Requests(envelope.target, profile=host_profile(), platform=platform))
    driven.image = "host"
    yield provider, driven
    await driven.release_all()
