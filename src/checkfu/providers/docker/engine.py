"""The Docker Engine, driven through docker-py off the event loop.

docker-py is blocking, so every call runs in this engine's own thread pool (sized
for many sandboxes at once; the default ``asyncio.to_thread`` pool has only a
handful of threads). Foreign errors are translated here, once, by type and by
the HTTP status the Engine API returned, never by matching the text of a
message; an unknown one becomes ``SandboxProviderFailed``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions

from checkfu.contract.errors import (
    SandboxAdapterUnavailable,
    SandboxError,
    SandboxNotFound,
    SandboxProviderFailed,
    SandboxProviderTimeout,
    SandboxStateConflict,
)
from checkfu.providers.docker.transport import EngineUrl, Stream

T = TypeVar("T")

DEFAULT_WORKERS = 128
DEFAULT_SOCKET = "/var/run/docker.sock"
PROBE_TIMEOUT = 5.0
"""Seconds to wait for the engine's socket to accept a connection."""

STATUS_ERRORS: dict[int, type[SandboxError]] = {
    404: SandboxNotFound,
    409: SandboxStateConflict,
}
"""Engine API statuses that mean something of their own; every other status is ``SandboxProviderFailed``."""

TYPE_ERRORS: tuple[tuple[type[BaseException], type[SandboxError], bool], ...] = (
    (requests.exceptions.Timeout, SandboxProviderTimeout, True),
    (socket.timeout, SandboxProviderTimeout, True),
    (requests.exceptions.ConnectionError, SandboxProviderFailed, True),
    (ConnectionError, SandboxProviderFailed, True),
    (docker.errors.DockerException, SandboxProviderFailed, False),
    (OSError, SandboxProviderFailed, True),
)
"""Foreign exception types, most specific first: (type, vocabulary member, retryable)."""


def translate(exc: BaseException, what: str) -> SandboxError:
    """The vocabulary member a foreign exception raised while doing ``what`` amounts to."""
    if isinstance(exc, SandboxError):
        return exc
    if isinstance(exc, docker.errors.APIError):
        status = exc.status_code
        explanation = exc.explanation if isinstance(exc.explanation, str) else ""
        detail = f"{what}: engine answered {status}" + (f" ({explanation[:300]})" if explanation else "")
        cls = STATUS_ERRORS.get(status) if isinstance(status, int) else None
        if cls is not None:
            return cls(detail)
        return SandboxProviderFailed(detail, retryable=isinstance(status, int) and status >= 500)
    for kind, cls, retryable in TYPE_ERRORS:
        if isinstance(exc, kind):
            return cls(f"{what}: {type(exc).__name__}: {str(exc)[:300]}", retryable=retryable)
    return SandboxProviderFailed(f"{what}: {type(exc).__name__}: {str(exc)[:300]}")


def socket_path(environ: dict[str, str] | None = None) -> str:
    """The Unix socket of the local engine, from ``DOCKER_HOST`` as docker-py reads it.

    Raises:
        SandboxProviderFailed: ``DOCKER_HOST`` names something other than a Unix socket.
    """
    env = os.environ if environ is None else environ
    host = env.get("DOCKER_HOST", "")
    if not host:
        return DEFAULT_SOCKET
    if host.startswith("unix://"):
        return host[len("unix://") :]
    raise SandboxProviderFailed(
        f"DOCKER_HOST {host[:80]!r} is not a Unix socket; the local Docker provider needs the engine's socket",
        field="DOCKER_HOST",
    )


def require_engine(environ: dict[str, str] | None = None) -> str:
    """The local engine's Unix socket, once something accepts a connection on it.

    Asked before docker-py builds a client, which leaves a failed connection's socket to
    the garbage collector.

    Raises:
        SandboxAdapterUnavailable: ``DOCKER_HOST`` names no Unix socket, or nothing listens on it
            (field ``provider``).
    """
    try:
        path = socket_path(environ)
    except SandboxProviderFailed as exc:
        raise SandboxAdapterUnavailable(f"the Docker tier is not available: {exc.message}", field="provider") from None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(PROBE_TIMEOUT)
            probe.connect(path)
    except OSError as exc:
        raise SandboxAdapterUnavailable(
            f"the Docker tier is not available: no engine answers at {path} ({exc.strerror or type(exc).__name__})",
            field="provider",
        ) from None
    return path


_API_VERSIONS: dict[tuple[str, ...], str] = {}


def local_client(**kwargs: Any) -> Any:
    """``docker.from_env(**kwargs)``, asking the engine for its API version once per process and address
    (``DOCKER_HOST`` and its TLS settings): a ``checkfu run`` makes two clients, and each question is a round trip."""
    where = tuple(os.environ.get(k, "") for k in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"))
    known = _API_VERSIONS.get(where)
    client = docker.from_env(version=known, **kwargs) if known else docker.from_env(**kwargs)
    _API_VERSIONS.setdefault(where, str(client.api.api_version))
    return client


class Engine:
    """One docker-py client and the thread pool its blocking calls run in.

    The engine holds no event-loop state: one object may serve calls from any
    number of event loops, one after another or at once. ``where`` says how it is
    reached (``transport.EngineUrl``): the local socket from ``DOCKER_HOST`` by
    default, or any engine by URL.
    """

    def __init__(
        self,
        client: Any = None,
        *,
        workers: int = DEFAULT_WORKERS,
        build_timeout: int = 3600,
        where: EngineUrl | None = None,
    ) -> None:
        self.where = where if where is not None else EngineUrl.parse(f"unix://{socket_path()}")
        self._workers = workers
        if client is not None:
            self.client = client
        elif where is None:
            self.client = local_client(max_pool_size=workers)
        else:
            self.client = where.client(workers=workers)
        self.api: Any = self.client.api
        self.build_timeout = build_timeout
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="checkfu-docker")

    @property
    def local(self) -> bool:
        """An engine of this host: its containers' processes are this host's, seen in its ``/proc``."""
        return self.where.local

    def dial(self, timeout: float) -> Stream:
        """A raw connection to the engine's API, for one hijacked exec (``process.hijack``)."""
        return self.where.dial(timeout)

    async def run(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking ``fn`` in the pool; a foreign error becomes a vocabulary member naming ``what``."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))
        except SandboxError:
            raise
        except Exception as exc:
            raise translate(exc, what) from exc

    def build_client(self) -> Any:
        """A separate client whose reads may wait as long as an image build may take."""
        return self.where.client(workers=4, timeout=self.build_timeout)

    @property
    def api_version(self) -> str:
        return str(self.api.api_version)

    def close(self) -> None:
        """Stop the pool and close the client's connections; idempotent."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.client.close()
