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
    if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5) or not 0 < int(port_text) < 65536:
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
        if (str(ip), port) in self.addresses:
            return True
        inner = embedded_ipv4(ip)
        if inner is not None:  # an IPv6 form that reaches an IPv4 address: judged as that address
            return (str(inner), port) in self.addresses or inner.is_global
        return ip.is_global


_EMBEDDING = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "64:ff9b::/96",  # NAT64, well-known prefix (RFC 6052)
        "64:ff9b:1::/48",  # NAT64, local-use prefix (RFC 8215)
        "::/96",  # IPv4-compatible (deprecated)
        "::ffff:0:0/96",  # IPv4-mapped
        "::ffff:0:0:0/96",  # IPv4-translated (RFC 2765)
    )
)


def embedded_ipv4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries to, where a translator, a tunnel or the stack itself would
    deliver it there: NAT64, IPv4-compatible, -mapped and -translated forms, 6to4 and Teredo's client."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if any(ip in net for net in _EMBEDDING):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


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

    async def dial(self, host: str, port: int) -> tuple[End, str]:
        """A connection to the first address of ``host:port`` that answers, and that address.

        Raises:
            Refused: 403 as ``destinations`` does; 502 (or 504 on a timeout) when no address answers.
        """
        loop = asyncio.get_running_loop()
        errors: list[str] = []
        for address in await self.destinations(host, port):
            end = End()
            try:
                await asyncio.wait_for(
                    loop.create_connection(functools.partial(_same, end), address, port), DIAL_TIMEOUT
                )
            except TIMEOUTS:
                errors.append(f"{address}: timed out")
                continue
            except OSError as exc:
                errors.append(f"{address}: {exc.strerror or type(exc).__name__}")
                continue
            return end, address
        timed_out = bool(errors) and all(e.endswith("timed out") for e in errors)
        raise Refused(f"{_joined(host, port)} did not answer ({'; '.join(errors)})", 504 if timed_out else 502)

    def connection(self) -> End:
        """The protocol of one connection of the sandbox: it reads the request, then relays."""
        end = End(asyncio.StreamReader(limit=HEAD_LIMIT))
        task = asyncio.get_running_loop().create_task(self.handle(end))
        self.connections.add(task)
        task.add_done_callback(self.connections.discard)
        return end

    async def handle(self, end: End) -> None:
        """One connection of the sandbox, start to end; never raises (but is cancelled with ``serve``)."""
        reader = end.reader
        assert reader is not None
        try:
            try:  # a connection waits for a slot no longer than for its request head
                await asyncio.wait_for(self._slots.acquire(), HEAD_TIMEOUT)
            except TIMEOUTS:
                self.log(f"refused a connection: all {MAX_CONNECTIONS} connections busy for {HEAD_TIMEOUT:.0f} s")
                return
            try:
                await end.made
                first = await asyncio.wait_for(reader.readexactly(1), HEAD_TIMEOUT)
                upstream = await (self._socks5(end) if first == b"\x05" else self._http(first, end))
                if upstream is not None:
                    await end.join(upstream)
            finally:
                self._slots.release()
        except (asyncio.IncompleteReadError, ConnectionError, OSError, *TIMEOUTS):
            pass
        except Exception as exc:  # a defect of ours: this connection ends, the proxy and the others go on
            self.log(f"dropped a connection: {type(exc).__name__}: {exc}")
        finally:
            end.close()  # after a relay both ends are closed already; after a refusal, the answer is still sent

    async def _http(self, first: bytes, end: End) -> End | None:
        reader = end.reader
        assert reader is not None
        try:
            head = first + await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, ValueError):
            end.answer(400, "the request head is incomplete or longer than 64 KiB")
            return None
        lines = head[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            end.answer(400, "not an HTTP/1 request line")
            return None
        method, target, version = parts
        try:
            if method == "CONNECT":
                host, port = split_authority(target)
                upstream, address = await self.dial(host, port)
                self.log(f"allowed CONNECT {_joined(host, port)} -> {_joined(address, port)}")
                end.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                host, port, forwarded = _forward_head(method, target, version, lines[1:])
                upstream, address = await self.dial(host, port)
                self.log(f"allowed {method} {_joined(host, port)} -> {_joined(address, port)}")
                upstream.write(forwarded)
        except Refused as refused:
            self.log(f"refused {method} {target[:200]}: {refused.reason}")
            end.answer(refused.status, refused.reason)
            return None
        return upstream

    async def _socks5(self, end: End) -> End | None:
        request = await asyncio.wait_for(self._socks5_request(end), HEAD_TIMEOUT)  # the whole negotiation
        if request is None:
            return None
        host, port = request
        try:
            upstream, address = await self.dial(host, port)
        except Refused as refused:
            self.log(f"refused SOCKS5 {host[:200]}:{port}: {refused.reason}")
            code = 2 if refused.status == 403 else 1 if refused.status == 400 else 4
            end.write(b"\x05" + bytes([code]) + b"\x00\x01" + bytes(6))
            return None
        self.log(f"allowed SOCKS5 {host}:{port} -> {_joined(address, port)}")
        end.write(b"\x05\x00\x00\x01" + bytes(6))
        return upstream

    async def _socks5_request(self, end: End) -> tuple[str, int] | None:
        """The destination of a SOCKS5 CONNECT, after its method negotiation; ``None`` once refused."""
        reader = end.reader
        assert reader is not None
        count = (await reader.readexactly(1))[0]
        methods = await reader.readexactly(count)
        if 0 not in methods:
            end.write(b"\x05\xff")
            return None
        end.write(b"\x05\x00")
        version, command, _, kind = await reader.readexactly(4)
        if kind == 1:
            host = socket.inet_ntop(socket.AF_INET, await reader.readexactly(4))
        elif kind == 4:
            host = "[" + socket.inet_ntop(socket.AF_INET6, await reader.readexactly(16)) + "]"
        elif kind == 3:
            host = (await reader.readexactly((await reader.readexactly(1))[0])).decode("latin-1")
        else:
            end.write(b"\x05\x08\x00\x01" + bytes(6))
            return None
        port = int.from_bytes(await reader.readexactly(2), "big")
        if version != 5 or command != 1:
            end.write(b"\x05\x07\x00\x01" + bytes(6))  # only CONNECT
            return None
        return host, port


def _same(end: End) -> End:
    return end


class End(asyncio.Protocol):
    """One end of a connection through the proxy. The sandbox's end first feeds ``reader`` (the request is read
    from it); once joined to the destination's end, what arrives at either end is written to the other, an end
    whose sending falls behind pauses the other's reading, and an end that stops sending is half-closed on the
    other. Both are closed when both have stopped sending, or when either is lost."""

    def __init__(self, reader: asyncio.StreamReader | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.reader = reader
        self.transport: asyncio.Transport | None = None
        self.peer: End | None = None
        self.early = bytearray()
        """What the destination's end received before it was joined (a greeting sent on connect)."""
        self.ended = False
        self.made: asyncio.Future[None] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=4 * CHUNK)
        if self.reader is not None:
            self.reader.set_transport(transport)
        if not self.made.done():
            self.made.set_result(None)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def answer(self, status: int, reason: str) -> None:
        """An HTTP error answer; the connection closes after it."""
        words = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 504: "Gateway Timeout"}
        body = f"checkfu egress: {reason}\n".encode()
        self.write(
            f"HTTP/1.1 {status} {words.get(status, 'Error')}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )

    async def join(self, peer: End) -> None:
        """Relay between this end and ``peer`` (whatever the request already carried past its head goes first),
        until both are closed."""
        pending = b""
        if self.reader is not None:
            self.reader.feed_eof()  # the reader is ours: what it holds is read at once, without waiting
            pending = await self.reader.read()
            self.reader = None
        self.peer, peer.peer = peer, self
        if pending:
            peer.write(pending)
        for source, target in ((self, peer), (peer, self)):
            if source.early:
                target.write(bytes(source.early))
                source.early.clear()
        for end in (self, peer):
            if end.ended:
                end.eof_received()
            if end.lost.done():
                end.connection_lost(None)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()  # the reader may have paused it
        await asyncio.gather(self.lost, peer.lost)

    def data_received(self, data: bytes) -> None:
        if self.peer is not None:
            self.peer.write(data)
        elif self.reader is not None:
            self.reader.feed_data(data)
        else:
            self.early += data

    def eof_received(self) -> bool:
        self.ended = True
        peer = self.peer
        if peer is None:
            if self.reader is not None:
                self.reader.feed_eof()
            return True
        if peer.ended or peer.transport is None or not peer.transport.can_write_eof():
            self._close_both()
        elif not peer.transport.is_closing():
            peer.transport.write_eof()
        return True  # the other way stays open

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.reader is not None:
            self.reader.feed_eof()
        if not self.lost.done():
            self.lost.set_result(None)
        if self.peer is not None:
            self._close_both()

    def close(self) -> None:
        """Close this end and its peer, if joined; what is buffered is still sent."""
        self._close_both()

    def _close_both(self) -> None:
        for end in (self, self.peer):
            if end is not None and end.transport is not None and not end.transport.is_closing():
                end.transport.close()  # what is buffered is still sent


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


async def serve(listener: socket.socket, proxy: Proxy) -> None:
    """Serve ``listener`` (a listening TCP socket) until cancelled; then close it and end every connection."""
    listener.setblocking(False)
    server = await asyncio.get_running_loop().create_server(proxy.connection, sock=listener)
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
