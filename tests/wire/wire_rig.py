"""The wire tests' rig: a provider service in a thread of its own that a test can crash and
restart on the same port, loopback peers written in the test, and a few requests.

Everything listens on 127.0.0.1 only. A ``Service`` runs uvicorn in a background thread (its
own event loop), as a real service runs apart from the runner; ``crash`` drops every
connection at once, as a killed process would, and can bring a new service (a new app over
the same provider, so every in-flight operation is forgotten) up on the same port first.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from checkfu.contract.members import ActivateRequest, InstanceResult, OpenProcessRequest, ReleaseRequest
from checkfu.contract.profile import SandboxProfile
from checkfu.contract.provider import Provider
from checkfu.testing import Requests
from checkfu.wire.client import RemoteProvider
from checkfu.wire.server import create_app
from checkfu.wire.serving import _BesideCaller, _config
from checkfu.wire.tls import ServerTls

T = TypeVar("T")

GRACE = 0.3
"""How long a stopping test service waits for in-flight calls before it cancels them."""


def new_secret() -> str:
    return "wire-secret-" + secrets.token_urlsafe(18)


class Service:
    """``create_app(provider)`` served on loopback from a thread of its own."""

    def __init__(
        self,
        provider: Provider,
        secret: str | None = None,
        *,
        app_options: dict[str, Any] | None = None,
        tls: ServerTls | None = None,
    ):
        self.provider = provider
        self.secret = secret or new_secret()
        self.app_options = app_options or {}
        self.tls = tls
        self.app: Any = None
        self.port = 0
        self._server: _BesideCaller | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="wire-test-service", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def remote(self, **options: Any) -> RemoteProvider:
        return RemoteProvider(self.url, self.secret, **options)

    # running coroutines in the service's loop -----------------------------------------------

    def submit(self, coro: Awaitable[T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]

    def run(self, coro: Awaitable[T], timeout: float = 30) -> T:
        return self.submit(coro).result(timeout)

    async def arun(self, coro: Awaitable[T]) -> T:
        """Run ``coro`` in the service's loop without blocking the caller's."""
        return await asyncio.wrap_future(self.submit(coro))

    # starting and stopping -------------------------------------------------------------------

    async def _start(self) -> None:
        self.app = create_app(self.provider, [self.secret], **self.app_options)
        config = _config(self.app, "127.0.0.1", self.port, tls=self.tls)
        config.timeout_graceful_shutdown = GRACE
        server = _BesideCaller(config)
        task = asyncio.ensure_future(server.serve())
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the test service stopped before it started")
            await asyncio.sleep(0.005)
        self.port = server.servers[0].sockets[0].getsockname()[1]
        self._server, self._task = server, task

    async def _stop(self, *, abort: bool) -> None:
        server, task = self._server, self._task
        if server is None or task is None:
            return
        self._server = self._task = None
        for listening in server.servers:
            listening.close()
        if abort:
            for conn in list(server.server_state.connections):
                transport = getattr(conn, "transport", None)
                if transport is not None:
                    transport.abort()
        server.should_exit = True
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, timeout=10)

    async def _crash(self, restart: bool) -> None:
        old_server, old_task = self._server, self._task
        assert old_server is not None and old_task is not None
        for listening in old_server.servers:
            listening.close()  # the port is free: a new service may bind it before the old connections drop
        if restart:
            await self._start()
        else:
            self._server = self._task = None
        for conn in list(old_server.server_state.connections):
            transport = getattr(conn, "transport", None)
            if transport is not None:
                transport.abort()
        old_server.should_exit = True
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(old_task, timeout=10)

    def start(self) -> str:
        self.run(self._start())
        return self.url

    def stop(self) -> None:
        self.run(self._stop(abort=False))

    async def crash(self, *, restart: bool = False) -> None:
        """Drop every connection at once; with ``restart``, a new service is listening on the same port first."""
        await self.arun(self._crash(restart))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.run(self._stop(abort=True))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def operations(self) -> dict[str, Any]:
        """The service's open ``openProcess`` operations, by id."""
        ops: dict[str, Any] = self.app.state.operations
        return ops


# The memory provider, driven by hand over the wire ---------------------------------------------


@dataclass
class Driven:
    """A provider behind a service, a client for it, and requests that fit it."""

    service: Service
    remote: RemoteProvider
    requests: Requests
    image: str = ""
    instances: list[InstanceResult] = field(default_factory=list)

    async def active(self, key: str | None = None) -> InstanceResult:
        r = self.requests
        if not self.image:
            self.image = (await self.remote.materialize(r.materialize())).image
        inst = await self.remote.provision(r.provision(key or f"ak-{secrets.token_hex(6)}", self.image))
        inst = await self.remote.activate(ActivateRequest(**r.on(inst)))
        self.instances.append(inst)
        return inst

    def process_request(self, inst: InstanceResult, *argv: str) -> OpenProcessRequest:
        return OpenProcessRequest(**self.requests.on(inst), argv=list(argv))

    async def release_all(self) -> None:
        for inst in self.instances:
            with contextlib.suppress(Exception):
                await self.remote.release(ReleaseRequest(**self.requests.on(inst)))
        await self.remote.aclose()


def host_profile() -> SandboxProfile:
    return SandboxProfile(
        tier="container",
        base_image="host",
        network_policy={"mode": "unrestricted"},
        resource_limits={"cpu_millis": 1000, "memory_mib": 512, "disk_mib": 256, "pids": 256},
        retention_mode="durable",
    )


# Loopback peers written in the test ----------------------------------------------------------


@dataclass
class Peer:
    """A TCP server on loopback whose every connection ``handle`` answers as it likes."""

    server: asyncio.Server
    connections: int = 0

    @property
    def url(self) -> str:
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def peer(handle: Handler) -> AsyncIterator[Peer]:
    """Serve ``handle`` on a free loopback port; every connection is closed on the way out."""
    writers: set[asyncio.StreamWriter] = set()
    tasks: set[asyncio.Task[None]] = set()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        made.connections += 1
        writers.add(writer)
        task = asyncio.ensure_future(handle(reader, writer))
        tasks.add(task)
        await asyncio.wait({task})  # a handler cancelled on the way out ends this callback quietly
        tasks.discard(task)
        if not task.cancelled():
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                task.result()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    made = Peer(server)
    try:
        yield made
    finally:
        server.close()
        for writer in writers:
            writer.transport.abort()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One HTTP/1.1 request from a client: its head and its Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return head, await reader.readexactly(length)
