"""A provider served over the wire on loopback, in a thread of its own: for differential tests.

``with serve_in_thread(provider) as remote:`` starts ``checkfu.wire.create_app(provider)``
on a free loopback port in a background thread (its own event loop) and yields a
``RemoteProvider`` for it, so the same test can drive a provider in-process and
behind the wire. The service is stopped on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections.abc import Callable, Iterator
from typing import Any

from checkfu.contract.provider import Provider
from checkfu.wire.client import RemoteProvider
from checkfu.wire.server import create_app
from checkfu.wire.serving import served


class _Service(threading.Thread):
    def __init__(self, app: Any) -> None:
        super().__init__(name="checkfu-served", daemon=True)
        self.app = app
        self.url: str | None = None
        self.failed: BaseException | None = None
        self.ready = threading.Event()
        self._halt: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._halt = asyncio.Event()
        try:
            async with served(self.app) as url:
                self.url = url
                self.ready.set()
                await self._halt.wait()
        except BaseException as exc:
            self.failed = exc
            self.ready.set()

    def stop(self) -> None:
        if self._loop is not None and self._halt is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._halt.set)
        self.join(timeout=15)


@contextlib.contextmanager
def serve_in_thread(
    provider: Provider,
    *,
    credential: str | None = None,
    attest_enforcement: bool = True,
    front: Callable[[Any], Any] | None = None,
) -> Iterator[RemoteProvider]:
    """Serve ``provider`` on loopback in a background thread; yields a client for it. ``front`` wraps the service's
    ASGI application in one of the caller's (a gateway that answers some requests itself, say).

    Raises:
        RuntimeError: the service did not start.
    """
    secret = credential or secrets.token_urlsafe(24)
    app = create_app(provider, [secret], attest_enforcement=attest_enforcement)
    service = _Service(front(app) if front is not None else app)
    service.start()
    if not service.ready.wait(timeout=30) or service.url is None:
        service.stop()
        raise RuntimeError(f"the provider service did not start: {service.failed!r}")
    try:
        yield RemoteProvider(service.url, secret)
    finally:
        service.stop()
