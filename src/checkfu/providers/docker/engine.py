"""The Docker Engine, driven through docker-py off the event loop.

docker-py is blocking, so every call runs in this engine's own thread pool (sized
for many sandboxes at once; the default ``asyncio.to_thread`` pool has only a
handful of threads). Foreign errors are translated here, once, by type and by
the HTTP status the Engine API returned, never by matching the text of a
message; an unknown one becomes ``SandboxProviderFailed``.

A thread cannot be stopped: a call whose caller is cancelled while its blocking
part runs waits for that part to end before the cancellation goes on (except the
calls in ``LEFT_RUNNING``), so whatever it created is on the engine when the
compensation that follows lists the allocation's objects.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import socket
import threading
import time
import urllib.parse
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
from checkfu.providers.docker.transport import EngineUrl, Stream, one_pool

T = TypeVar("T")

DEFAULT_WORKERS = 128
DEFAULT_SOCKET = "/var/run/docker.sock"
PROBE_TIMEOUT = 5.0
"""Seconds to wait for the engine's socket to accept a connection."""
_API_VERSION = re.compile(r"1\.[0-9]{1,3}")

STATUS_ERRORS: dict[int, type[SandboxError]] = {
    404: SandboxNotFound,
    409: SandboxStateConflict,
}
"""Engine API statuses that mean something of their own; every other status is ``SandboxProviderFailed``."""

LEFT_RUNNING = ("exec", "openProcess", "materialize")
"""Calls (by the first word of ``Engine.run``'s ``what``) whose blocking part lasts as long as a process or an
image build may: a cancelled caller does not wait for them (the process is killed, the image is the runner's
cache, not an allocation's). Every other call is a few engine requests that create or remove an allocation's
objects, and a cancelled caller waits for it: a provision abandoned while it created a sandbox went on creating
volumes after the compensation had listed what was there, and they were left behind (issue 29)."""

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


def _address() -> tuple[str, ...]:
    """Where ``docker.from_env`` reaches the engine: ``DOCKER_HOST`` and its TLS settings."""
    return tuple(os.environ.get(k, "") for k in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"))


def local_client(**kwargs: Any) -> Any:
    """``docker.from_env(**kwargs)``, learning the engine's API version once per process and address
    (``DOCKER_HOST`` and its TLS settings), from ``/_ping`` when the engine is a Unix socket, as the docker CLI
    does. docker-py's own question, ``/version``, gathers every component's version: 8 to 20 ms here, against
    under 1 ms for ``/_ping``; and a ``checkfu run`` makes two clients. A Unix socket's client keeps one
    connection pool for all its requests (``transport.one_pool``)."""
    where = _address()
    known = _API_VERSIONS.get(where) or _pinged_version()
    client = docker.from_env(version=known, **kwargs) if known else docker.from_env(**kwargs)
    _API_VERSIONS.setdefault(where, str(client.api.api_version))
    return one_pool(client)


def _pinged_version() -> str | None:
    """The API version a local engine names in ``/_ping``'s ``Api-Version`` header (``/version``'s ``ApiVersion``),
    or None when it cannot be had that way (``DOCKER_HOST`` is not a Unix socket, the engine does not answer, or
    says nothing of the kind): docker-py then asks as it always has, and fails as it would."""
    asked = Early.ask("/_ping")
    if asked is None:
        return None
    try:
        status, headers, _ = asked.answer()
    except OSError:
        return None
    version = headers.get("api-version", "")
    return version if status == 200 and _API_VERSION.fullmatch(version) else None


class Early:
    """One ``GET`` to the local engine's Unix socket, sent when made and read when wanted: the engine works on it
    while the caller does other things (``checkfu run`` opens its journal), with no thread of ours waiting.

    Plain HTTP/1.0, unversioned paths (the engine's own API version), for the few read-only questions of a
    command's start; everything else goes through docker-py."""

    MAX_ANSWER = 1 << 20

    def __init__(self, path: str) -> None:
        self.asked = time.monotonic()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.settimeout(PROBE_TIMEOUT)
            self._conn.connect(socket_path())
            self._conn.sendall(f"GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode("ascii"))
        except BaseException:
            self._conn.close()
            raise

    @classmethod
    def ask(cls, path: str) -> Early | None:
        """The question under way; None when ``DOCKER_HOST`` is not a Unix socket or nothing answers there."""
        host = os.environ.get("DOCKER_HOST", "")
        if host and not host.startswith("unix://"):
            return None
        try:
            return cls(path)
        except (OSError, SandboxError):
            return None

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        """The status, headers (names in lower case) and body; reads until the engine closes the connection.

        Raises:
            OSError: the engine did not answer in full within ``PROBE_TIMEOUT`` seconds, or not in HTTP.
        """
        said = bytearray()
        try:
            while len(said) <= self.MAX_ANSWER:
                chunk = self._conn.recv(65536)
                if not chunk:
                    break
                said += chunk
        finally:
            self._conn.close()
        head, sep, body = bytes(said).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = lines[0].split(" ")
        if not sep or not status[0].startswith("HTTP/1.") or len(status) < 2 or not status[1].isdigit():
            raise OSError("the engine's answer is not HTTP")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(status[1]), headers, body

    def close(self) -> None:
        self._conn.close()


EARLY_INFO_SECONDS = 5.0
"""How old a question sent early (``ask_info_early``, ``ask_image_early``) may be and still be taken instead of
asking again."""
_EARLY_INFO: dict[tuple[tuple[str, ...], str], Early] = {}
"""The questions sent early and not yet taken, by the engine's address and the path asked."""
_EARLY_GUARD = threading.Lock()


def _ask_early(path: str) -> None:
    asked = Early.ask(path)
    if asked is None:
        return
    with _EARLY_GUARD:
        stale = _EARLY_INFO.pop((_address(), path), None)
        _EARLY_INFO[(_address(), path)] = asked
    if stale is not None:
        stale.close()


def _take_early(path: str) -> tuple[int, Any] | None:
    """The status and decoded body of the question about ``path`` sent early to this address; None when there
    is none, it is older than ``EARLY_INFO_SECONDS``, or its answer did not come whole (the caller asks)."""
    with _EARLY_GUARD:
        asked = _EARLY_INFO.pop((_address(), path), None)
    if asked is None:
        return None
    if time.monotonic() - asked.asked > EARLY_INFO_SECONDS:
        asked.close()
        return None
    try:
        status, _, body = asked.answer()
        return status, (json.loads(body) if status == 200 else None)
    except (OSError, ValueError):
        return None


def ask_info_early() -> None:
    """Send the local engine its ``/info`` question now (``Early``). The next ``Engine.info`` of a local engine at
    the same address in this process takes that answer, when the question is at most ``EARLY_INFO_SECONDS`` old,
    instead of asking again: for a command that knows it will describe the Docker tier and has other work to do
    first. Any failure leaves the later call to ask itself."""
    _ask_early("/info")


def _image_path(ref: str) -> str:
    return f"/images/{urllib.parse.quote(ref, safe='/:@')}/json"


def ask_image_early(ref: str) -> None:
    """Send the local engine the question ``Engine.image_id(ref)`` will ask, now, as ``ask_info_early`` does."""
    _ask_early(_image_path(ref))


def _early_info() -> dict[str, Any] | None:
    taken = _take_early("/info")
    if taken is None:
        return None
    info = taken[1]
    return info if isinstance(info, dict) else None


async def to_the_end(pending: asyncio.Future[T]) -> T:
    """``pending``'s result, awaited to its end through any number of cancellations of the caller; a cancellation
    that arrived meanwhile is raised once it has ended (whatever it returned or raised: the caller was cancelled)."""
    cancelled = False
    while not pending.done():
        try:
            await asyncio.shield(pending)
        except asyncio.CancelledError:
            if pending.cancelled():
                raise
            cancelled = True
        except Exception:  # it ended; its exception is read below
            continue
    if cancelled:
        if not pending.cancelled():
            pending.exception()  # read, so that it is never reported as unretrieved
        raise asyncio.CancelledError
    return pending.result()


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
        self._local_default = client is None and where is None
        """Reached as ``local_client`` reaches the engine (``DOCKER_HOST``): the engine ``ask_info_early`` asks."""
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
        """Run blocking ``fn`` in the pool; a foreign error becomes a vocabulary member naming ``what``.

        Cancelled meanwhile, it waits for ``fn`` to return before the cancellation goes on (``to_the_end``),
        unless ``what`` is one of ``LEFT_RUNNING``.
        """
        loop = asyncio.get_running_loop()
        pending = loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))
        try:
            if what.split(" ", 1)[0] in LEFT_RUNNING:
                return await pending
            return await to_the_end(pending)
        except SandboxError:
            raise
        except Exception as exc:
            raise translate(exc, what) from exc

    async def info(self) -> dict[str, Any]:
        """The engine's ``/info``: for the engine ``local_client`` reaches, the answer to the question
        ``ask_info_early`` sent, when that is recent and came whole; otherwise asked now."""
        if self._local_default:
            early = await self.run("info", _early_info)
            if early is not None:
                return early
        found: dict[str, Any] = await self.run("info", self.api.info)
        return found

    def image_id(self, ref: str) -> str | None:
        """The id of the image ``ref`` names on this engine, or None when it has none (blocking: call it through
        ``run``). For the engine ``local_client`` reaches, the answer to the question ``ask_image_early(ref)``
        sent, when that is recent and came whole; otherwise asked now."""
        if self._local_default:
            taken = _take_early(_image_path(ref))
            if taken is not None:
                status, body = taken
                if status == 200 and isinstance(body, dict) and str(body.get("Id", "")).startswith("sha256:"):
                    return str(body["Id"])
                if status == 404:
                    return None
        try:
            return str(self.api.inspect_image(ref)["Id"])
        except Exception as exc:
            if getattr(exc, "status_code", None) in (400, 404):
                return None
            raise

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
