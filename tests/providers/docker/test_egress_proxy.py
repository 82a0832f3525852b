"""The egress proxy's rules and protocols, in this process, on loopback only: the same file the proxy container runs.

Every origin here is a server this test starts on 127.0.0.1 and stops; a name is resolved by a resolver the test
holds (it records every question), so nothing leaves this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import socket
import ssl
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from checkfu.providers.docker import egress_proxy
from checkfu.providers.docker.egress_door import run_door
from checkfu.providers.docker.egress_proxy import Allowlist, Proxy, Refused, _handed, read_host, serve, split_authority

pytestmark = pytest.mark.anyio


# the rules -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "read"),
    [
        ("10.0.0.1", ("10.0.0.1", True)),
        ("167772161", ("10.0.0.1", True)),  # the C library dials these spellings as 10.0.0.1
        ("0xa.0.0.1", ("10.0.0.1", True)),
        ("012.0.0.1", ("10.0.0.1", True)),
        ("10.1", ("10.0.0.1", True)),
        ("[::ffff:10.0.0.1]", ("10.0.0.1", True)),
        ("[2001:DB8::1]", ("2001:db8::1", True)),
        ("Api.Example.COM.", ("api.example.com", False)),
        ("under_score.example", ("under_score.example", False)),
    ],
)
def test_a_host_is_read_as_what_it_is(host: str, read: tuple[str, bool]) -> None:
    assert read_host(host) == read


@pytest.mark.parametrize("host", ["", "a..b", "exa mple.com", "10.0.0.1 evil", "[10.0.0.1]", "[nope]", "é.com", "a/b"])
def test_what_is_neither_an_address_nor_a_name_is_a_bad_request(host: str) -> None:
    with pytest.raises(Refused) as refused:
        read_host(host)
    assert refused.value.status == 400


@pytest.mark.parametrize("authority", ["h:\u00b2", "h:\u0668\u0660", "h:000080", "h:0", "h:65536", "h:", "h:8o"])
def test_a_port_is_ascii_digits_in_1_to_65535(authority: str) -> None:
    with pytest.raises(Refused) as refused:
        split_authority(authority)
    assert refused.value.status == 400


ALLOW = Allowlist(["api.example.com:443", "10.0.0.7:8080", "[2001:db8::1]:443", "127.0.0.1:9000"])


@pytest.mark.parametrize(
    ("host", "port", "allowed"),
    [
        ("api.example.com", 443, True),
        ("API.example.com.", 443, True),
        ("api.example.com", 80, False),  # an unlisted port of a listed host
        ("www.example.com", 443, False),
        ("10.0.0.7", 8080, True),
        ("167772167", 8080, True),  # 10.0.0.7, spelled as the C library reads it
        ("[::ffff:10.0.0.7]", 8080, True),
        ("10.0.0.7", 8081, False),
        ("10.0.0.8", 8080, False),
        ("[2001:db8::1]", 443, True),
        ("[2001:db8::2]", 443, False),
        ("0.0.0.0", 8080, False),
        ("224.0.0.1", 8080, False),
    ],
)
def test_only_a_listed_host_and_port_pass_the_check(host: str, port: int, allowed: bool) -> None:
    if allowed:
        ALLOW.check(host, port)
    else:
        with pytest.raises(Refused) as refused:
            ALLOW.check(host, port)
        assert refused.value.status == 403


@pytest.mark.parametrize(
    ("address", "port", "admitted"),
    [
        ("93.184.216.34", 443, True),  # public
        ("2606:2800:220:1:248:1893:25c8:1946", 443, True),
        ("10.0.0.7", 8080, True),  # listed itself, with this port
        ("10.0.0.7", 443, False),  # listed, but with another port
        ("10.0.0.9", 443, False),  # private
        ("127.0.0.1", 443, False),
        ("127.0.0.1", 9000, True),
        ("169.254.169.254", 80, False),  # link-local (cloud metadata)
        ("100.64.0.1", 443, False),  # shared address space
        ("::1", 443, False),
        ("fd00::1", 443, False),
        ("::ffff:10.0.0.9", 443, False),
        ("0.0.0.0", 443, False),
        # IPv6 forms that a translator, a tunnel or the stack delivers to an IPv4 address: judged as that address
        ("64:ff9b::a00:5", 443, False),  # NAT64 of 10.0.0.5
        ("64:ff9b::a9fe:a9fe", 80, False),  # NAT64 of 169.254.169.254
        ("64:ff9b:1::a00:5", 443, False),  # NAT64, local-use prefix
        ("2002:a00:5::1", 443, False),  # 6to4 of 10.0.0.5
        ("2001:0:4136:e378:8000:63bf:f5ff:fff6", 443, False),  # Teredo, client 10.0.0.9
        ("::a00:5", 443, False),  # IPv4-compatible
        ("::ffff:0:a00:5", 443, False),  # IPv4-translated
        ("64:ff9b::a00:7", 8080, True),  # 10.0.0.7, listed with this port
        ("64:ff9b::5db8:d822", 443, True),  # NAT64 of a public address
    ],
)
def test_a_listed_name_may_lead_only_to_public_or_listed_addresses(address: str, port: int, admitted: bool) -> None:
    assert ALLOW.admits(address, port) is admitted


# the protocols -------------------------------------------------------------------------------


class Resolver:
    """A name table that records every question; nothing is asked of any DNS server."""

    def __init__(self, names: dict[str, list[str]]) -> None:
        self.names = names
        self.asked: list[str] = []

    async def __call__(self, name: str, port: int) -> list[str]:
        self.asked.append(name)
        if name.rstrip(".") not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, "no such name")
        return self.names[name.rstrip(".")]


@contextlib.asynccontextmanager
async def listening(handler: object) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Says hello, reads to the end, says how many bytes it got, closes."""
    writer.write(b"origin\n")
    await writer.drain()
    got = len(await reader.read())
    writer.write(f"{got} bytes\n".encode())
    await writer.drain()
    writer.close()


async def http_origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers 200 with the request head it received as the body."""
    head = await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(head) + head)
    await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def proxy_at(allowed: list[str], resolver: Resolver | None = None) -> AsyncIterator[tuple[int, list[str]]]:
    """The proxy serving a loopback listener, as it serves the door: its port and its log."""
    log: list[str] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    proxy = Proxy(Allowlist(allowed), resolve=resolver or Resolver({}), log=log.append)
    task = asyncio.create_task(serve(listener, proxy))
    try:
        yield port, log
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def head_of(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)


async def connect_through(port: int, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    return reader, writer, await head_of(reader)


async def test_connect_to_a_listed_address_relays_both_ways_and_carries_a_half_close() -> None:
    async with listening(origin) as dest, proxy_at([f"127.0.0.1:{dest}"]) as (port, log):
        reader, writer, head = await connect_through(port, f"127.0.0.1:{dest}")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert await reader.readline() == b"origin\n"
        writer.write(b"x" * 300_000)
        writer.write_eof()  # the client is done sending; the answer must still come back
        assert await asyncio.wait_for(reader.read(), 5) == b"300000 bytes\n"
        await close(writer)
    assert log == [f"allowed CONNECT 127.0.0.1:{dest} -> 127.0.0.1:{dest}"]


def _tls_contexts(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a fresh self-signed certificate for ``tls.test``, and a client context trusting it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tls.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("tls.test")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (tmp / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
    client = ssl.create_default_context(cafile=str(tmp / "cert.pem"))
    return server, client


async def test_tls_goes_through_connect_end_to_end_and_the_proxy_never_sees_inside(tmp_path: Path) -> None:
    server_ctx, client_ctx = _tls_contexts(tmp_path)

    async def tls_origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello over tls\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(tls_origin, "127.0.0.1", 0, ssl=server_ctx)
    dest = server.sockets[0].getsockname()[1]
    resolver = Resolver({"tls.test": ["127.0.0.1"]})
    try:
        async with proxy_at([f"tls.test:{dest}", f"127.0.0.1:{dest}"], resolver) as (port, log):
            reader, writer, head = await connect_through(port, f"tls.test:{dest}")
            assert head.startswith(b"HTTP/1.1 200 ")
            await writer.start_tls(client_ctx, server_hostname="tls.test")  # verified against tls.test's certificate
            assert await asyncio.wait_for(reader.readline(), 5) == b"hello over tls\n"
            await close(writer)
    finally:
        server.close()
        await server.wait_closed()
    assert log == [f"allowed CONNECT tls.test:{dest} -> 127.0.0.1:{dest}"]


async def test_16_mib_echoed_through_the_proxy_to_a_slow_reader_arrive_whole_and_in_order() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        writer.close()

    payload = bytes(range(256)) * (16 << 12)  # 16 MiB, far past every buffer on the way
    async with listening(echo) as dest, proxy_at([f"127.0.0.1:{dest}"]) as (port, _):
        reader, writer, head = await connect_through(port, f"127.0.0.1:{dest}")
        assert head.startswith(b"HTTP/1.1 200 ")

        async def send() -> None:
            writer.write(payload)
            await writer.drain()
            writer.write_eof()

        sending = asyncio.create_task(send())
        received = bytearray()
        while chunk := await asyncio.wait_for(reader.read(1 << 16), 10):
            received += chunk
            if len(received) % (1 << 20) < (1 << 16):
                await asyncio.sleep(0.001)  # read slowly now and then, so the proxy pauses the other way
        await sending
        await close(writer)
    assert bytes(received) == payload


async def test_unlisted_hosts_ports_and_names_are_refused_and_no_name_is_resolved() -> None:
    seen: list[int] = []

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(1)
        await close(writer)

    resolver = Resolver({"unlisted.test": ["127.0.0.1"]})
    async with listening(counted) as dest, proxy_at([f"127.0.0.1:{dest + 1}"], resolver) as (port, log):
        for target in (
            f"127.0.0.1:{dest}",
            f"2130706433:{dest}",
            f"[::ffff:127.0.0.1]:{dest}",
            f"unlisted.test:{dest}",
        ):
            _, writer, head = await connect_through(port, target)
            assert head.startswith(b"HTTP/1.1 403 "), target
            await close(writer)
    assert not seen, "the origin was contacted"
    assert resolver.asked == [], "an unlisted name was resolved: DNS would have carried it out"
    assert all(line.startswith("refused CONNECT") and "not on the allowlist" in line for line in log)


async def test_a_listed_name_is_resolved_by_the_proxy_and_may_not_lead_to_an_unlisted_address() -> None:
    resolver = Resolver({"good.test": ["127.0.0.1"], "rebound.test": ["127.0.0.2"]})
    async with listening(origin) as dest:
        # 127.0.0.1 is not public: good.test may lead there only because 127.0.0.1:dest is listed itself
        allowed = [f"good.test:{dest}", f"127.0.0.1:{dest}", f"rebound.test:{dest}", f"localhost:{dest + 1}"]
        async with proxy_at(allowed, resolver) as (port, log):
            reader, writer, head = await connect_through(port, f"good.test:{dest}")
            assert head.startswith(b"HTTP/1.1 200 ") and await reader.readline() == b"origin\n"
            await close(writer)
            for target in (f"rebound.test:{dest}", f"localhost:{dest + 1}"):
                _, writer, head = await connect_through(port, target)
                assert head.startswith(b"HTTP/1.1 403 "), target
                await close(writer)
    assert resolver.asked == ["good.test.", "rebound.test."]  # fully qualified; localhost is asked of nobody
    assert "rebound.test resolves to 127.0.0.2: not public" in log[1]
    assert "localhost resolves to 127.0.0.1, ::1: not public" in log[2]
    public = Proxy(Allowlist(["pypi.example:443"]), resolve=Resolver({"pypi.example": ["10.1.1.1", "151.101.0.223"]}))
    assert await public.destinations("pypi.example", 443) == ["151.101.0.223"]  # decided, never dialled


async def test_plain_http_is_forwarded_in_origin_form_with_the_hop_by_hop_headers_dropped() -> None:
    async with listening(http_origin) as dest, proxy_at([f"127.0.0.1:{dest}"]) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"POST http://127.0.0.1:{dest}/p?q=1 HTTP/1.1\r\nHost: elsewhere.test\r\nProxy-Authorization: x\r\n"
            "Connection: keep-alive, X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\nContent-Length: 0\r\n\r\n".encode()
        )
        answer = await asyncio.wait_for(reader.read(), 5)
        await close(writer)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    lines = body.decode().split("\r\n")
    assert lines[0] == "POST /p?q=1 HTTP/1.1" and f"Host: 127.0.0.1:{dest}" in lines
    assert "X-Keep: 2" in lines and "Connection: close" in lines
    assert not [line for line in lines if line.lower().startswith(("proxy-", "x-drop", "host: elsewhere"))]


@pytest.mark.parametrize(
    "request_line",
    [
        "GET / HTTP/1.1",  # origin form: not a proxy request
        "GET https://127.0.0.1:1/ HTTP/1.1",  # TLS goes through CONNECT
        "GET http://user@127.0.0.1:1/ HTTP/1.1",
        "CONNECT 127.0.0.1 HTTP/1.1",  # no port
        "CONNECT ::1:80 HTTP/1.1",  # an IPv6 address must be bracketed
        "NONSENSE",
    ],
)
async def test_what_is_not_a_proxy_request_is_answered_400(request_line: str) -> None:
    async with proxy_at(["127.0.0.1:1"]) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"{request_line}\r\nHost: x\r\n\r\n".encode())
        assert (await head_of(reader)).startswith(b"HTTP/1.1 400 ")
        await close(writer)


async def socks5(port: int, host: bytes, dest: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\x05\x01\x00")
    assert await reader.readexactly(2) == b"\x05\x00"
    writer.write(b"\x05\x01\x00\x03" + bytes([len(host)]) + host + struct.pack(">H", dest))
    return reader, writer, await reader.readexactly(10)


async def test_socks5_connect_is_served_and_refused_by_the_same_rules() -> None:
    async with listening(origin) as dest, proxy_at([f"127.0.0.1:{dest}"]) as (port, log):
        reader, writer, reply = await socks5(port, b"127.0.0.1", dest)
        assert reply[:2] == b"\x05\x00" and await reader.readline() == b"origin\n"
        await close(writer)
        _, writer, reply = await socks5(port, b"127.0.0.1", dest + 1)
        assert reply[:2] == b"\x05\x02"  # connection not allowed by ruleset
        await close(writer)
    assert log[0].startswith("allowed SOCKS5") and log[1].startswith("refused SOCKS5")


async def test_a_stalled_socks5_negotiation_is_closed_after_the_head_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(egress_proxy, "HEAD_TIMEOUT", 0.5)
    async with proxy_at([]) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x05")  # the version, then nothing: a slot held for as long as the peer likes, before
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the proxy, well before 5 s
        await close(writer)


async def test_a_connection_past_the_busy_slots_is_closed_not_queued_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(egress_proxy, "MAX_CONNECTIONS", 1)
    monkeypatch.setattr(egress_proxy, "HEAD_TIMEOUT", 0.5)
    async with listening(origin) as dest, proxy_at([f"127.0.0.1:{dest}"]) as (port, log):
        reader, writer, reply = await connect_through(port, f"127.0.0.1:{dest}")  # holds the one slot
        assert reply.startswith(b"HTTP/1.1 200") and await reader.readline() == b"origin\n"
        late_reader, late_writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(late_reader.read(), 5) == b""
        assert any("connections busy" in line for line in log)
        await close(late_writer)
        await close(writer)


async def test_a_port_in_other_digits_is_answered_400_and_the_proxy_goes_on() -> None:
    async with listening(origin) as dest, proxy_at([f"127.0.0.1:{dest}"]) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write("CONNECT 127.0.0.1:\u0668\u0660 HTTP/1.1\r\n\r\n".encode())
        assert (await head_of(reader)).startswith(b"HTTP/1.1 400")
        await close(writer)
        reader, writer, reply = await connect_through(port, f"127.0.0.1:{dest}")
        assert reply.startswith(b"HTTP/1.1 200")
        await close(writer)


def test_the_proxy_takes_only_a_listening_socket_on_loopback() -> None:
    with socket.socket() as unbound, pytest.raises(ValueError, match="listening"):
        _handed([unbound.detach()])
    with socket.socket() as wide:
        wide.bind(("0.0.0.0", 0))
        wide.listen()
        with pytest.raises(ValueError, match=r"not 127\.0\.0\.1"):
            _handed([wide.detach()])


def test_the_door_refuses_a_namespace_with_more_than_lo() -> None:
    # This test's own namespace has more than lo (the destinations need it): the door must not open here.
    with open("/proc/net/dev") as f:
        if [line.split(":")[0].strip() for line in f.readlines()[2:]] == ["lo"]:
            pytest.skip("this namespace holds only lo")
    assert run_door({"socket": "/nonexistent/door.sock", "port": 0, "wait": 0}) == 3
