"""Reaching a Docker engine by URL: a docker-py client for the API, and a raw stream for hijacked execs.

An engine is named by a URL, as docker names one:

- ``unix:///path/docker.sock``: the engine of this host;
- ``tcp://HOST:PORT``: always TLS, with a client certificate (``ca.pem``, ``cert.pem``,
  ``key.pem`` in one directory, as docker keeps a context's); plain TCP is refused, since
  the Engine API is root on that host;
- ``ssh://[USER@]HOST[:PORT]``: through the ``ssh`` client, which runs ``docker system
  dial-stdio`` on the far side (the engine's own socket there), as the docker CLI does.

A process's stdin must be half-closable while its output is still read (``close_stdin``),
so a hijacked exec needs more than a byte pipe: a Unix socket and an ``ssh`` child behind a
socket pair shut down their write side; over TLS the client sends ``close_notify`` and keeps
reading (TLS 1.3 allows a half-closed connection; Go's engine reads it as the end of stdin).
Python's ``ssl.SSLSocket`` cannot do that (its ``shutdown`` drops the TLS layer), so
``TlsStream`` drives an ``ssl.SSLObject`` over memory BIOs itself.
"""

from __future__ import annotations

import contextlib
import select
import shutil
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import docker
import docker.tls
import docker.transport.unixconn
import requests.adapters
import urllib3.connection
import urllib3.connectionpool

from checkfu.contract.errors import SandboxAdapterUnavailable

TLS_FILES = ("ca.pem", "cert.pem", "key.pem")


class Stream(Protocol):
    """What a hijacked exec is read and written through: the subset of ``socket.socket`` it uses."""

    def settimeout(self, value: float | None) -> None: ...
    def setblocking(self, flag: bool) -> None: ...
    def fileno(self) -> int: ...
    def recv(self, size: int) -> bytes: ...
    def send(self, data: bytes | memoryview) -> int: ...
    def sendall(self, data: bytes | memoryview) -> None: ...
    def shutdown(self, how: int) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class EngineUrl:
    """Where an engine answers, checked: ``scheme`` is ``unix``, ``tcp`` or ``ssh``."""

    url: str
    scheme: str
    path: str = ""
    host: str = ""
    port: int = 0
    user: str = ""
    tls_dir: Path | None = None

    @property
    def local(self) -> bool:
        """An engine of this host (a Unix socket): its processes are this host's processes."""
        return self.scheme == "unix"

    @classmethod
    def parse(cls, url: str, tls_dir: str | Path | None = None) -> EngineUrl:
        """Raises SandboxAdapterUnavailable: not a URL this tier reaches an engine by (field ``url``)."""
        parts = urlsplit(url)
        if parts.scheme == "unix" and parts.path:
            return cls(url=url, scheme="unix", path=parts.path)
        if parts.scheme == "tcp" and parts.hostname and parts.port:
            if tls_dir is None:
                raise SandboxAdapterUnavailable(
                    f"{url}: an engine over TCP is reached with TLS only; give its client certificates (tls_dir)",
                    field="tls_dir",
                )
            where = Path(tls_dir)
            missing = [f for f in TLS_FILES if not (where / f).is_file()]
            if missing:
                raise SandboxAdapterUnavailable(f"{url}: {where} lacks {', '.join(missing)}", field="tls_dir")
            return cls(url=url, scheme="tcp", host=parts.hostname, port=parts.port, tls_dir=where)
        if parts.scheme == "ssh" and parts.hostname:
            return cls(url=url, scheme="ssh", host=parts.hostname, port=parts.port or 22, user=parts.username or "")
        raise SandboxAdapterUnavailable(
            f"{url[:200]!r} is not unix:///PATH, tcp://HOST:PORT or ssh://[USER@]HOST[:PORT]", field="url"
        )

    # the API client ------------------------------------------------------------------------------

    def client(self, *, workers: int, timeout: int | None = None) -> Any:
        """A docker-py client for this engine (it asks the engine for its API version)."""
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        if self.scheme == "tcp":
            assert self.tls_dir is not None
            tls = docker.tls.TLSConfig(
                client_cert=(str(self.tls_dir / "cert.pem"), str(self.tls_dir / "key.pem")),
                ca_cert=str(self.tls_dir / "ca.pem"),
                verify=True,
            )
            client = docker.DockerClient.__new__(docker.DockerClient)
            client.api = _PinnedTrustClient(
                base_url=f"tcp://{self.host}:{self.port}", tls=tls, max_pool_size=workers, **extra
            )
            return client
        if self.scheme == "ssh":
            client = docker.DockerClient.__new__(docker.DockerClient)
            client.api = _SshClient(self, workers=workers, **extra)
            return client
        return one_pool(docker.DockerClient(base_url=self.url, max_pool_size=workers, **extra))

    def probe(self, timeout: float) -> None:
        """Something accepts a connection where the engine should be (before docker-py builds a client).

        Raises:
            SandboxAdapterUnavailable: nothing does (field ``provider``).
        """
        try:
            if self.scheme == "unix":
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.settimeout(timeout)
                    probe.connect(self.path)
            elif self.scheme == "tcp":
                socket.create_connection((self.host, self.port), timeout=timeout).close()
            elif shutil.which("ssh") is None:
                raise SandboxAdapterUnavailable(f"{self.url}: the ssh client is not installed", field="provider")
        except OSError as exc:
            raise SandboxAdapterUnavailable(
                f"the Docker tier is not available: no engine answers at {self.url} "
                f"({exc.strerror or type(exc).__name__})",
                field="provider",
            ) from None

    # a raw stream for a hijacked exec -----------------------------------------------------------

    def dial(self, timeout: float) -> Stream:
        """A connected stream to the engine's API, for one hijacked request.

        Raises:
            OSError: the engine cannot be reached (the caller translates it).
        """
        if self.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(self.path)
            except BaseException:
                sock.close()
                raise
            return sock
        if self.scheme == "tcp":
            return TlsStream.connect(self, timeout)
        return SshStream.connect(self, timeout)


class _PinnedTrustClient(docker.APIClient):  # type: ignore[misc]
    """An API client that trusts exactly the engine's CA it was given.

    requests lets ``REQUESTS_CA_BUNDLE`` (and proxy variables) from the environment override a
    session's own ``verify``; an engine's API must be verified against its own CA only, and never
    go through a proxy, so this client ignores the environment.
    """

    @property
    def trust_env(self) -> bool:
        return False

    @trust_env.setter
    def trust_env(self, _value: bool) -> None:
        pass


class _SshConnection(urllib3.connection.HTTPConnection):
    """One HTTP connection to the engine through its own ``ssh … docker system dial-stdio`` child, which
    ends with the connection (docker-py's own shell-out leaves its children running and needs paramiko)."""

    def __init__(self, where: EngineUrl, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.where = where
        self._stream: SshStream | None = None

    def connect(self) -> None:
        self._stream = SshStream.connect(self.where, self.timeout if isinstance(self.timeout, int | float) else 60)
        self.sock = self._stream.sock

    def close(self) -> None:
        super().close()
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()


class _SshPool(urllib3.connectionpool.HTTPConnectionPool):
    def __init__(self, where: EngineUrl, timeout: float, maxsize: int) -> None:
        super().__init__("localhost", timeout=timeout, maxsize=maxsize)
        self.where = where
        self._timeout = timeout

    def _new_conn(self) -> _SshConnection:
        return _SshConnection(self.where, self._timeout)


class _SshAdapter(requests.adapters.HTTPAdapter):
    """Requests to ``http+docker://ssh/...`` go through a pool of ``_SshConnection``\\ s."""

    def __init__(self, where: EngineUrl, timeout: float, maxsize: int) -> None:
        self.where = where
        self._pool = _SshPool(where, timeout, maxsize)
        super().__init__()

    def get_connection_with_tls_context(
        self, request: Any, verify: Any, proxies: Any = None, cert: Any = None
    ) -> _SshPool:
        return self._pool

    def get_connection(self, url: Any, proxies: Any = None) -> _SshPool:
        return self._pool

    def request_url(self, request: Any, proxies: Any) -> str:
        return str(request.path_url)

    def close(self) -> None:
        super().close()
        self._pool.close()


class _OnePoolUnixAdapter(docker.transport.unixconn.UnixHTTPAdapter):  # type: ignore[misc]
    """docker-py's Unix socket adapter, with one connection pool for every request.

    docker-py keys a Unix socket's pools by the whole request URL, so nearly every request (each names a
    container, an exec or a query) opens a connection of its own and makes a pool for it, of the client's full
    size: a ``checkfu run`` made ten, each filled with 128 empty slots when made and drained again when closed
    at exit (about 15 ms of its start and end). Over TCP, requests keeps one pool per host; this does the same
    for the one socket, and so reuses connections as a TCP client does."""

    def get_connection(self, url: Any, proxies: Any = None) -> Any:
        return super().get_connection(self.socket_path, proxies)


def one_pool(client: Any) -> Any:
    """``client`` (a ``docker.DockerClient`` made by docker-py for a Unix socket) with one connection pool for all
    its requests (``_OnePoolUnixAdapter``), and without requests' reading of the environment at each request
    (``trust_env``: proxy variables and ``.netrc``, which nothing sent to a Unix socket uses; 0.2 ms of each
    request, measured, most of it scanning the environment for proxies); any other client as it is."""
    api = client.api
    adapter: Any = getattr(api, "_custom_adapter", None)
    if type(adapter) is docker.transport.unixconn.UnixHTTPAdapter:
        api.trust_env = False
        shared = _OnePoolUnixAdapter(
            f"http+unix://{adapter.socket_path}", timeout=adapter.timeout, max_pool_size=adapter.max_pool_size
        )
        api._custom_adapter = shared
        api.mount("http+docker://", shared)
        adapter.close()
    return client


class _SshClient(docker.APIClient):  # type: ignore[misc]
    """An API client whose requests reach the engine through ``ssh``; its version asked of the engine."""

    def __init__(self, where: EngineUrl, *, workers: int, timeout: int | None = None) -> None:
        # a placeholder URL and version, so that constructing asks nothing of any engine
        super().__init__(base_url="tcp://127.0.0.1:9", version="1.24", timeout=timeout or 60)
        self._custom_adapter = _SshAdapter(where, timeout or 60, workers)
        self._unmount("http://", "https://")
        self.mount("http+docker://ssh", self._custom_adapter)
        self.base_url = "http+docker://ssh"
        self._version = self._retrieve_server_version()

    @property
    def trust_env(self) -> bool:
        return False

    @trust_env.setter
    def trust_env(self, _value: bool) -> None:
        pass


class TlsStream:
    """A TLS connection whose write side can be closed (``close_notify``) while its read side stays open.

    Safe for one reader and one writer in two threads at once, as a hijacked exec uses it.
    """

    def __init__(self, raw: socket.socket, context: ssl.SSLContext, server_hostname: str) -> None:
        self.raw = raw
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_hostname=server_hostname)
        self._state = threading.Lock()
        """Guards the TLS object and its BIOs."""
        self._sending = threading.Lock()
        """Keeps what leaves the outgoing BIO in order on the wire."""
        self._closed_write = False

    @classmethod
    def connect(cls, where: EngineUrl, timeout: float) -> TlsStream:
        assert where.tls_dir is not None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(where.tls_dir / "ca.pem"))
        context.load_cert_chain(str(where.tls_dir / "cert.pem"), str(where.tls_dir / "key.pem"))
        raw = socket.create_connection((where.host, where.port), timeout=timeout)
        stream = cls(raw, context, where.host)
        try:
            stream._handshake()
        except BaseException:
            raw.close()
            raise
        return stream

    def _handshake(self) -> None:
        while True:
            with self._state:
                try:
                    self._tls.do_handshake()
                    done = True
                except ssl.SSLWantReadError:
                    done = False
            self._flush()
            if done:
                return
            data = self.raw.recv(1 << 16)
            if not data:
                raise ConnectionResetError("the engine closed the connection during the TLS handshake")
            with self._state:
                self._in.write(data)

    def _flush(self) -> None:
        with self._sending:
            with self._state:
                data = self._out.read()
            view = memoryview(data)
            while view:
                try:
                    sent = self.raw.send(view)
                except BlockingIOError:
                    select.select([], [self.raw], [], 5.0)
                    continue
                view = view[sent:]

    def settimeout(self, value: float | None) -> None:
        self.raw.settimeout(value)

    def setblocking(self, flag: bool) -> None:
        self.raw.setblocking(flag)

    def fileno(self) -> int:
        return self.raw.fileno()

    def recv(self, size: int) -> bytes:
        """What the engine sent, decrypted: everything available (a read never leaves decrypted bytes behind,
        so polling the raw socket stays truthful); ``b""`` at the end."""
        got: list[bytes] = []
        while True:
            with self._state:
                try:
                    while True:
                        chunk = self._tls.read(max(size, 1 << 14))
                        if not chunk:
                            return b"".join(got)
                        got.append(chunk)
                except ssl.SSLWantReadError:
                    pass
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    return b"".join(got)
            self._flush()  # a read may owe the peer a record (a key update)
            if got:
                return b"".join(got)
            data = self.raw.recv(1 << 16)  # blocks, or raises BlockingIOError when non-blocking
            if not data:
                return b""
            with self._state:
                self._in.write(data)

    def send(self, data: bytes | memoryview) -> int:
        if self._closed_write:
            raise BrokenPipeError("the write side was closed")
        with self._state:
            written = self._tls.write(bytes(data[: 1 << 16]))
        self._flush()
        return int(written)

    def sendall(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            view = view[self.send(view) :]

    def shutdown(self, how: int) -> None:
        """``SHUT_WR``: send ``close_notify`` and keep reading. Anything else closes the connection."""
        if how != socket.SHUT_WR:
            self.raw.shutdown(how)
            return
        if self._closed_write:
            return
        self._closed_write = True
        with self._state, contextlib.suppress(ssl.SSLWantReadError):
            self._tls.unwrap()  # queues close_notify; the peer's own close_notify is not waited for
        self._flush()

    def close(self) -> None:
        self.raw.close()


class SshStream:
    """The engine's API through ``ssh HOST docker system dial-stdio``, behind one end of a socket pair."""

    def __init__(self, sock: socket.socket, child: subprocess.Popen[bytes]) -> None:
        self.sock = sock
        self.child = child

    @classmethod
    def connect(cls, where: EngineUrl, timeout: float) -> SshStream:
        ours, theirs = socket.socketpair()
        target = f"{where.user}@{where.host}" if where.user else where.host
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout))}", "-p", str(where.port)]
        try:
            child = subprocess.Popen(
                [*argv, "--", target, "docker", "system", "dial-stdio"],
                stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(timeout)
        return cls(ours, child)

    def settimeout(self, value: float | None) -> None:
        self.sock.settimeout(value)

    def setblocking(self, flag: bool) -> None:
        self.sock.setblocking(flag)

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv(self, size: int) -> bytes:
        return self.sock.recv(size)

    def send(self, data: bytes | memoryview) -> int:
        return self.sock.send(data)

    def sendall(self, data: bytes | memoryview) -> None:
        self.sock.sendall(data)

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()
        if self.child.poll() is None:
            self.child.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.child.wait(timeout=5)
