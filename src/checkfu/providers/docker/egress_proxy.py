"""The egress proxy of an ``allowlist`` sandbox.

This file stands alone: it imports only the standard library (never ``checkfu``),
because the Docker provider runs its source in a container of the egress image
(``python3 -I -S -c <source> CONFIG``, Python 3.9 or later). The provider and the
tests import the same file, so what is tested is what runs.

The proxy runs on a Docker bridge, outside every namespace of the sandbox. It
waits for the one handoff from the door (``egress_door.py``), removes its Unix
socket (nobody can hand it another listener), then serves the sandbox's
connections on the handed listener: HTTP ``CONNECT`` (TLS or any TCP), plain
HTTP in absolute form, and SOCKS5 ``CONNECT``, told apart by their first byte.

Every request names a host and a port, and the proxy decides (``Allowlist``):

1. The host is read as what it is. An IPv6 or IPv4 address in any spelling the
   C library would dial (``10.0.0.1``, ``167772161``, ``0xa.0.0.1``,
   ``[::ffff:10.0.0.1]``) is that address; anything else must be a host name
   (letters, digits, ``-``, ``_``, dots).
2. An address is allowed only when that address and port are listed (as an
   address); a name only when that name and port are listed. Nothing is
   resolved before this check, so an unlisted name never reaches a resolver.
3. A listed name is resolved by the proxy itself, as a fully qualified name (no
   search domains; ``localhost`` and names under it are loopback and asked of
   nobody), and the proxy dials what it resolved: never an address the sandbox
   supplied. A resolved address that is not public (loopback, private,
   link-local, shared, reserved, ...) is refused unless it is itself listed, as
   an address, with that port, so a listed name cannot be turned into a way to
   an unlisted address. An unspecified or multicast address is never dialled.

A refusal answers ``403`` (HTTP) or ``0x02`` (SOCKS5) and logs one line on
standard output; so does every allowed connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import os
import socket
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

HEAD_LIMIT = 64 * 1024
"""The longest request head (HTTP) the proxy reads."""
HEAD_TIMEOUT = 30.0
DIAL_TIMEOUT = 10.0
CHUNK = 256 * 1024
MAX_CONNECTIONS = 512
HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "upgrade",
        "host",
    }
)
"""Headers of a plain HTTP request that are not forwarded (``Host`` is set from the request target)."""
LOOPBACK = ("127.0.0.1", "::1")
"""What ``localhost`` and every name under it resolve to, without asking anyone (RFC 6761)."""
TIMEOUTS = (asyncio.TimeoutError, TimeoutError)
"""What a timed-out wait raises: one class from Python 3.11 on, two before (the image may hold 3.9 or 3.10)."""
NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")

Resolve = Callable[[str, int], Awaitable[list[str]]]
"""A name (fully qualified, with its final dot) and a port to the addresses the name resolves to."""


class Refused(Exception):
    """The proxy does not make this connection; ``status`` is the HTTP status that says why."""

    def __init__(self, reason: str, status: int = 403) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def read_host(host: str) -> tuple[str, bool]:
    """``host`` as what it is: ``(canonical address, True)`` or ``(lowercase name, False)``.

    Raises:
        Refused: 400, the host is neither an address nor a host name.
    """
    text = host.strip().lower()
    if text.startswith("[") and text.endswith("]"):
        ip = _address(text[1:-1])
        if ip is None or ":" not in text:
            raise Refused(f"{host[:80]!r} is not a bracketed IPv6 address", 400)
        return str(ip), True
    ip = _address(text)
    if ip is not None:
        return str(ip), True
    if text.endswith("."):
        text = text[:-1]
    if not text or len(text) > 253 or not set(text) <= NAME_CHARACTERS:
        raise Refused(f"{host[:80]!r} is not a host name or an address", 400)
    try:
        packed = socket.inet_aton(text)  # the C library's other spellings of an IPv4 address
    except OSError:
        packed = None
    if packed is not None:
        return str(ipaddress.IPv4Address(packed)), True
    if any(not 0 < len(label) < 64 for label in text.split(".")):
        raise Refused(f"{host[:80]!r} is not a host name", 400)
    return text, False


def split_authority(authority: str, default_port: int | None = None) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) into its host and port; ``default_port`` when the port is absent.

    Raises:
        Refused: 400, no port where one is needed, or a port outside 1..65535.
    """
    host, sep, port_text = authority.rpartition(":")
    if not sep or (host.count(":") and not (host.startswith("[") and host.endswith("]"))):
        if default_port is None:
            raise Refused(f"{authority[:80]!r} names no port", 400)
        return authority, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise Refused(f"{authority[:80]!r} has no port in 1..65535", 400)
    return host, int(port_text)


class Allowlist:
    """The listed destinations, each read as what it is; ``check`` and ``admits`` decide.

    Raises (on construction):
        Refused: an entry is not ``host:port``.
    """

    def __init__(self, entries: Iterable[str]) -> None:
        self.entries = tuple(entries)
        self.names: set[tuple[str, int]] = set()
        self.addresses: set[tuple[str, int]] = set()
        for entry in self.entries:
            host, port = split_authority(entry)
            canonical, is_address = read_host(host)
            (self.addresses if is_address else self.names).add((canonical, port))

    def check(self, host: str, port: int) -> tuple[str, bool]:
        """The host to dial, read as what it is, when ``host:port`` is listed.

        Raises:
            Refused: 403, it is not listed (or is an address that is never dialled); 400, it is not a host.
        """
        canonical, is_address = read_host(host)
        if is_address:
            ip = ipaddress.ip_address(canonical)
            if ip.is_unspecified or ip.is_multicast:
                raise Refused(f"{canonical} is not an address to dial")
            if (canonical, port) not in self.addresses:
                raise Refused(f"{_joined(canonical, port)} is not on the allowlist")
        elif (canonical, port) not in self.names:
            raise Refused(f"{canonical}:{port} is not on the allowlist")
        return canonical, is_address

    def admits(self, address: str, port: int) -> bool:
        """Whether a listed name may lead to ``address``: a public address, or one listed itself with ``port``."""
        ip = _address(address.split("%", 1)[0])
        if ip is None or ip.is_unspecified or ip.is_multicast:
            return False
        return (str(ip), port) in self.addresses or ip.is_global


def _joined(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def system_resolve(name: str, port: int) -> list[str]:
    """The addresses the C library resolves ``name`` to (the container's own resolver configuration)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    found: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in found:
            found.append(address)
    return found


class Proxy:
    """Serves a sandbox's connections; ``log`` receives one line per decision."""

    def __init__(
        self, allowlist: Allowlist, resolve: Resolve = system_resolve, log: Callable[[str], None] = print
    ) -> None:
        self.allowlist = allowlist
        self.resolve = resolve
        self.log = log
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self.connections: set[asyncio.Task[None]] = set()

    async def destinations(self, host: str, port: int) -> list[str]:
        """The addresses to try for ``host:port``, in order.

        Raises:
            Refused: not listed; or a listed name that resolves to nothing it may lead to.
        """
        canonical, is_address = self.allowlist.check(host, port)
        if is_address:
            return [canonical]
        if canonical == "localhost" or canonical.endswith(".localhost"):
            return self._admitted(canonical, port, list(LOOPBACK))  # RFC 6761: never asked of a DNS server
        try:
            resolved = await asyncio.wait_for(self.resolve(canonical + ".", port), DIAL_TIMEOUT)
        except (OSError, *TIMEOUTS) as exc:
            raise Refused(f"{canonical} does not resolve ({type(exc).__name__}: {exc})", 502) from None
        return self._admitted(canonical, port, resolved)

    def _admitted(self, canonical: str, port: int, resolved: list[str]) -> list[str]:
        allowed = [a for a in resolved if self.allowlist.admits(a, port)]
        if not allowed:
            shown = ", ".join(resolved) or "nothing"
            raise Refused(f"{canonical} resolves to {shown}: not public, and not listed as an address with port {port}")
        return allowed

    async def dial(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str]:
        """A connection to the first address of ``host:port`` that answers.

        Raises:
            Refused: 403 as ``destinations`` does; 502 (or 504 on a timeout) when no address answers.
        """
        errors: list[str] = []
        for address in await self.destinations(host, port):
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(address, port, limit=CHUNK), DIAL_TIMEOUT
                )
            except TIMEOUTS:
                errors.append(f"{address}: timed out")
                continue
            except OSError as exc:
                errors.append(f"{address}: {exc.strerror or type(exc).__name__}")
                continue
            _tune(writer)
            return reader, writer, address
        timed_out = bool(errors) and all(e.endswith("timed out") for e in errors)
        raise Refused(f"{_joined(host, port)} did not answer ({'; '.join(errors)})", 504 if timed_out else 502)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection of the sandbox, start to end; never raises (but is cancelled with ``serve``)."""
        task = asyncio.current_task()
        if task is not None:
            self.connections.add(task)
            task.add_done_callback(self.connections.discard)
        async with self._slots:
            _tune(writer)
            try:
                first = await asyncio.wait_for(reader.readexactly(1), HEAD_TIMEOUT)
                if first == b"\x05":
                    await self._socks5(reader, writer)
                else:
                    await self._http(first, reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError, OSError, *TIMEOUTS):
                pass
            finally:
                await _close(writer)

    async def _http(self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = first + await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, ValueError):
            await _answer(writer, 400, "the request head is incomplete or longer than 64 KiB")
            return
        lines = head[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await _answer(writer, 400, "not an HTTP/1 request line")
            return
        method, target, version = parts
        try:
            if method == "CONNECT":
                host, port = split_authority(target)
                upstream, upwriter, address = await self.dial(host, port)
                self.log(f"allowed CONNECT {_joined(host, port)} -> {_joined(address, port)}")
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                host, port, forwarded = _forward_head(method, target, version, lines[1:])
                upstream, upwriter, address = await self.dial(host, port)
                self.log(f"allowed {method} {_joined(host, port)} -> {_joined(address, port)}")
                upwriter.write(forwarded)
        except Refused as refused:
            self.log(f"refused {method} {target[:200]}: {refused.reason}")
            await _answer(writer, refused.status, refused.reason)
            return
        await relay(reader, writer, upstream, upwriter)

    async def _socks5(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count = (await reader.readexactly(1))[0]
        methods = await reader.readexactly(count)
        if 0 not in methods:
            writer.write(b"\x05\xff")
            return
        writer.write(b"\x05\x00")
        version, command, _, kind = await reader.readexactly(4)
        if kind == 1:
            host = socket.inet_ntop(socket.AF_INET, await reader.readexactly(4))
        elif kind == 4:
            host = "[" + socket.inet_ntop(socket.AF_INET6, await reader.readexactly(16)) + "]"
        elif kind == 3:
            host = (await reader.readexactly((await reader.readexactly(1))[0])).decode("latin-1")
        else:
            writer.write(b"\x05\x08\x00\x01" + bytes(6))
            return
        port = int.from_bytes(await reader.readexactly(2), "big")
        if version != 5 or command != 1:
            writer.write(b"\x05\x07\x00\x01" + bytes(6))  # only CONNECT
            return
        try:
            upstream, upwriter, address = await self.dial(host, port)
        except Refused as refused:
            self.log(f"refused SOCKS5 {host[:200]}:{port}: {refused.reason}")
            code = 2 if refused.status == 403 else 1 if refused.status == 400 else 4
            writer.write(b"\x05" + bytes([code]) + b"\x00\x01" + bytes(6))
            return
        self.log(f"allowed SOCKS5 {host}:{port} -> {_joined(address, port)}")
        writer.write(b"\x05\x00\x00\x01" + bytes(6))
        await relay(reader, writer, upstream, upwriter)


def _forward_head(method: str, target: str, version: str, headers: list[str]) -> tuple[str, int, bytes]:
    """The host, port and request head a plain HTTP request in absolute form is forwarded with.

    Raises:
        Refused: 400, not absolute ``http://`` form, or it carries user information.
    """
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() != "http":
        raise Refused("a plain request must name an http:// URL; use CONNECT for anything else", 400)
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:].split("#", 1)[0]
    if not authority or "@" in authority:
        raise Refused("the URL must name a host and no user information", 400)
    host, port = split_authority(authority, 80)
    if not path.startswith("/"):
        path = "/" + path
    named = set()
    for line in headers:
        name = line.split(":", 1)[0].strip().lower()
        if name == "connection":
            named |= {t.strip().lower() for t in line.split(":", 1)[-1].split(",")}
    kept = [h for h in headers if h and h.split(":", 1)[0].strip().lower() not in HOP_BY_HOP | named]
    head = [f"{method} {path} {version}", f"Host: {authority}", *kept, "Connection: close", "", ""]
    return host, port, "\r\n".join(head).encode("latin-1")


def _tune(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    writer.transport.set_write_buffer_limits(high=4 * CHUNK)


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    words = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 504: "Gateway Timeout"}
    body = f"checkfu egress: {reason}\n".encode()
    writer.write(
        f"HTTP/1.1 {status} {words.get(status, 'Error')}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.transport.abort()


async def relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    upstream: asyncio.StreamReader,
    upwriter: asyncio.StreamWriter,
) -> None:
    """Copy both ways until both ends are done (an end that stops sending is half-closed on the other)."""
    try:
        await asyncio.gather(_pipe(reader, upwriter), _pipe(upstream, writer))
    finally:
        await _close(upwriter)


async def serve(listener: socket.socket, proxy: Proxy) -> None:
    """Serve ``listener`` (a listening TCP socket) until cancelled; then close it and end every connection."""
    listener.setblocking(False)
    server = await asyncio.start_server(proxy.handle, sock=listener, limit=HEAD_LIMIT)
    try:
        async with server:
            await server.serve_forever()
    finally:
        for task in list(proxy.connections):
            task.cancel()
        await asyncio.gather(*proxy.connections, return_exceptions=True)


# As the container runs it ----------------------------------------------------------------------


def run_proxy(config: dict[str, Any]) -> int:
    """Wait for the door's one handoff on ``config["socket"]``, then serve it with ``config["allow"]``."""
    allowlist = Allowlist(config["allow"])
    path = str(config["socket"])
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(path):
        os.unlink(path)
    control.bind(path)
    control.listen(1)
    print(f"waiting for the door at {path}; allowlist: {', '.join(allowlist.entries)}", flush=True)
    while True:
        conn, _ = control.accept()
        try:
            conn.settimeout(10)
            _, fds, _, _ = socket.recv_fds(conn, 16, 1)
            listener = _handed(fds)
        except (OSError, ValueError) as exc:
            print(f"handoff refused: {exc}", flush=True)
            conn.close()
            continue
        conn.sendall(b"ok")
        conn.close()
        break
    control.close()
    os.unlink(path)
    print(f"serving {listener.getsockname()[0]}:{listener.getsockname()[1]} of the sandbox", flush=True)

    async def main() -> None:  # the proxy is made inside the loop it serves in (Python 3.9 binds it at creation)
        await serve(listener, Proxy(allowlist, log=functools.partial(print, flush=True)))

    asyncio.run(main())
    return 0


def _handed(fds: list[int]) -> socket.socket:
    """The one socket handed over: a listening TCP socket on loopback, or ValueError."""
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"{len(fds)} descriptors, not 1")
    sock = socket.socket(fileno=fds[0])
    host = sock.getsockname()[0] if sock.family == socket.AF_INET else ""
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.close()
        raise ValueError("not a listening stream socket")
    if host != "127.0.0.1":
        sock.close()
        raise ValueError(f"bound to {host!r}, not 127.0.0.1")
    return sock


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: CONFIG_JSON", file=sys.stderr)
        return 2
    return run_proxy(json.loads(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
