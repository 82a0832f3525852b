"""Running a provider service: on a port of its own, or beside the caller in its event loop (for tests).

Given ``tls`` (a certificate and its key) the service speaks only TLS: ``https://`` and ``wss://``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

from checkfu.wire.credentials import SERVER_LOGGERS, redact_logs
from checkfu.wire.limits import RequestLimits, bounded_http
from checkfu.wire.tls import ServerTls


def _config(
    app: Any, host: str, port: int, *, limits: RequestLimits | None = None, tls: ServerTls | None = None
) -> uvicorn.Config:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=bounded_http(limits or RequestLimits()),  # heads bounded in size, lines and time: see limits
        log_level="warning",
        access_log=False,
        lifespan="on",
        ws_max_size=96 << 20,
        ws_ping_interval=None,
        ws_per_message_deflate=False,  # see RemoteProcess._connect: compression costs more than it saves
        timeout_graceful_shutdown=5,
        ssl_certfile=tls.cert if tls is not None else None,
        ssl_keyfile=tls.key if tls is not None else None,
    )
    redact_logs(*SERVER_LOGGERS)  # after uvicorn configured its loggers
    return config


class _BesideCaller(uvicorn.Server):
    """A server that leaves the process's signals to the caller, whose event loop it shares."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()


async def serve(app: Any, host: str, port: int, *, tls: ServerTls | None = None) -> None:
    """Serve ``app`` until cancelled (or until SIGINT/SIGTERM, which uvicorn handles); over TLS with ``tls``."""
    await uvicorn.Server(_config(app, host, port, tls=tls)).serve()


@contextlib.asynccontextmanager
async def served(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    limits: RequestLimits | None = None,
    tls: ServerTls | None = None,
) -> AsyncIterator[str]:
    """Serve ``app`` in this event loop on a free loopback port; yields its base URL, stops on the way out."""
    server = _BesideCaller(_config(app, host, port, limits=limits, tls=tls))
    task = asyncio.ensure_future(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the provider service stopped before it started")
            await asyncio.sleep(0.005)
        sock = server.servers[0].sockets[0]
        bound_host, bound_port = sock.getsockname()[:2]
        yield f"{'https' if tls is not None else 'http'}://{bound_host}:{bound_port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, timeout=10)
