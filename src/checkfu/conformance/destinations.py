"""Network destinations the conformance suite makes itself, and counts every connection to.

Cases 5 and 9 ask whether a sandbox can reach an address. The oracle is not what
the sandbox reports but what the destination saw: a TCP listener that records each
connection it accepts. Traffic goes only to addresses on this machine:

- as root with iproute2, each destination lives in a network namespace the suite
  creates (``ip netns add``), joined to the host by a veth pair with addresses from
  ``10.250.0.0/16``, and is removed afterwards;
- otherwise the listener binds this host's own non-loopback addresses.

Before a case counts on a destination, the suite connects to it from the runner's
side (the positive control), so an unreachable listener can never pass a case.

Case 9 (allowlist egress) also uses a second listener beside a destination (an
unlisted port of a listed host), a listener on the runner's own loopback, and a
name server (UDP DNS) that answers the names it is given, refuses every other,
and records every question it is asked (a query that reached it is DNS that
carried data out).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

LISTENER = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0))
s.listen(64)
print(s.getsockname()[1], flush=True)
while True:
    c, addr = s.accept()
    print("accepted", addr[0], flush=True)
    try:
        c.sendall(b"checkfu-destination\n")
    except OSError:
        pass
    c.close()
"""


HTTP_LISTENER = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0))
s.listen(64)
print(s.getsockname()[1], flush=True)
while True:
    c, addr = s.accept()
    print("accepted", addr[0], flush=True)
    try:
        c.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            more = c.recv(4096)
            if not more:
                break
            head += more
        body = head.split(b"\r\n\r\n")[0] + b"\n"
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    except OSError:
        pass
    c.close()
"""
"""Answers every request ``200`` with the request head it received as the body."""


class DestinationUnavailable(Exception):
    """No destination could be made here; the message says why and what would make one."""


@dataclass
class Destination:
    """A TCP listener at ``host:port`` that counts the connections it accepted."""

    host: str
    port: int
    process: subprocess.Popen[str]
    namespace: str | None = None
    accepted: list[str] = field(default_factory=list)
    http: bool = False
    """An HTTP server (``HTTP_LISTENER``): it answers a request, rather than greeting on connect."""
    _reader: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start_counting(self) -> None:
        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                if line.startswith("accepted"):
                    self.accepted.append(line.split()[1])

        self._reader = threading.Thread(target=read, name="checkfu-destination", daemon=True)
        self._reader.start()

    def count(self, settle: float = 0.2) -> int:
        time.sleep(settle)  # an accept in flight is printed within this
        return len(self.accepted)

    def control(self, timeout: float = 5.0) -> None:
        """Connect from the runner's side: proves the destination is real and reachable from here.

        Raises:
            DestinationUnavailable: the runner itself cannot reach it.
        """
        before = len(self.accepted)
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout) as s:
                if self.http:
                    s.sendall(b"GET /control HTTP/1.0\r\n\r\n")
                s.recv(64)
        except OSError as exc:
            raise DestinationUnavailable(f"the destination {self.address} is not reachable from here: {exc}") from exc
        deadline = time.monotonic() + timeout
        while len(self.accepted) <= before and time.monotonic() < deadline:
            time.sleep(0.01)
        if len(self.accepted) <= before:
            raise DestinationUnavailable(f"the destination {self.address} did not record the control connection")


NAME_SERVER = r"""
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print(s.getsockname()[1], flush=True)
names = dict(a.split("=", 1) for a in sys.argv[3:])
while True:
    data, addr = s.recvfrom(4096)
    try:
        labels, i = [], 12
        while data[i]:
            labels.append(data[i + 1 : i + 1 + data[i]].decode("ascii", "replace").lower())
            i += 1 + data[i]
        qtype = struct.unpack(">H", data[i + 1 : i + 3])[0]
        question = data[12 : i + 5]
    except (IndexError, struct.error):
        print("asked", addr[0], "?", 0, flush=True)
        continue
    name = ".".join(labels)
    print("asked", addr[0], name or ".", qtype, flush=True)
    found = names.get(name)
    flags, answers = (0x8180, b"") if found else (0x8183, b"")
    if found and qtype == 1:
        answers = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton(found)
    head = struct.pack(">HHHHHH", struct.unpack(">H", data[:2])[0], flags, 1, 1 if answers else 0, 0, 0)
    s.sendto(head + question + answers, addr)
"""


@dataclass
class NameServer:
    """A UDP name server at ``host:port`` answering ``names`` (name -> IPv4 address); NXDOMAIN for any other
    name, NOERROR without an answer for another type of a known name. Every question is recorded."""

    host: str
    port: int
    process: subprocess.Popen[str]
    names: dict[str, str]
    namespace: str | None = None
    asked: list[tuple[str, str]] = field(default_factory=list)
    """(source address, name) of every question, in order."""
    _reader: threading.Thread | None = None

    def start_recording(self) -> None:
        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                parts = line.split()
                if len(parts) >= 3 and parts[0] == "asked":
                    self.asked.append((parts[1], parts[2]))

        self._reader = threading.Thread(target=read, name="checkfu-name-server", daemon=True)
        self._reader.start()

    def questions(self, settle: float = 0.2) -> list[tuple[str, str]]:
        time.sleep(settle)  # a question in flight is printed within this
        return list(self.asked)

    def control(self, name: str, timeout: float = 5.0) -> None:
        """Ask for ``name`` from the runner's side: proves the server is real, reachable and records.

        Raises:
            DestinationUnavailable: it did not answer, or did not record the question.
        """
        before = len(self.asked)
        query = struct.pack(">HHHHHH", 0x6366, 0x0100, 1, 0, 0, 0)
        query += b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0\0\1\0\1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(timeout)
            try:
                s.sendto(query, (self.host, self.port))
                s.recv(512)
            except OSError as exc:
                raise DestinationUnavailable(f"the name server {self.host}:{self.port} did not answer: {exc}") from exc
        deadline = time.monotonic() + timeout
        while len(self.asked) <= before and time.monotonic() < deadline:
            time.sleep(0.01)
        if len(self.asked) <= before:
            raise DestinationUnavailable(f"the name server {self.host}:{self.port} did not record the question")


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=20)


def _prefix(namespace: str | None) -> list[str]:
    return ["ip", "netns", "exec", namespace] if namespace else []


def _listener(prefix: list[str], host: str, script: str = LISTENER, *args: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", script, host, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        proc.kill()
        proc.wait()
        raise DestinationUnavailable(f"the listener did not start ({line or 'no output'})")
    return proc, int(line)


def _host_addresses() -> list[str]:
    """This host's own IPv4 addresses other than loopback."""
    found: list[str] = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5, check=False).stdout
        found = [a for a in out.split() if "." in a and not a.startswith("127.")]
    return found


@contextlib.contextmanager
def destination() -> Iterator[Destination]:
    """A counting destination on this machine, removed on the way out.

    Raises:
        DestinationUnavailable: neither a namespace nor a host address could carry one.
    """
    if os.geteuid() == 0 and shutil.which("ip"):
        with _in_namespace() as dest:
            yield dest
        return
    addresses = _host_addresses()
    if not addresses:
        raise DestinationUnavailable(
            "no destination: run as root with iproute2 (the suite makes a network namespace), "
            "or on a host with a non-loopback IPv4 address"
        )
    proc, port = _listener([], addresses[0])
    dest = Destination(addresses[0], port, proc)
    dest.start_counting()
    try:
        yield dest
    finally:
        _stop(proc)


@contextlib.contextmanager
def beside(dest: Destination, *, http: bool = False) -> Iterator[Destination]:
    """Another counting listener on ``dest``'s own address (another port of the same host), removed on the way out;
    with ``http``, an HTTP server answering each request with its own head.

    Raises:
        DestinationUnavailable: the listener did not start.
    """
    proc, port = _listener(_prefix(dest.namespace), dest.host, HTTP_LISTENER if http else LISTENER)
    other = Destination(dest.host, port, proc, namespace=dest.namespace, http=http)
    other.start_counting()
    try:
        yield other
    finally:
        _stop(proc)


@contextlib.contextmanager
def loopback() -> Iterator[Destination]:
    """A counting listener on ``127.0.0.1`` of the runner's own network namespace, removed on the way out.

    Raises:
        DestinationUnavailable: the listener did not start.
    """
    proc, port = _listener([], "127.0.0.1")
    dest = Destination("127.0.0.1", port, proc)
    dest.start_counting()
    try:
        yield dest
    finally:
        _stop(proc)


@contextlib.contextmanager
def name_server(names: dict[str, str] | None = None) -> Iterator[NameServer]:
    """A recording name server answering ``names`` (name -> IPv4 address), removed on the way out: as root with
    iproute2 on port 53 in a network namespace the suite makes, otherwise on an unprivileged port of this host's
    first non-loopback address.

    Raises:
        DestinationUnavailable: neither a namespace nor a host address could carry one.
    """
    table = {k.lower(): v for k, v in (names or {}).items()}
    args = [f"{k}={v}" for k, v in table.items()]
    if os.geteuid() == 0 and shutil.which("ip"):
        with _namespace() as (ns, address):
            proc, port = _listener(_prefix(ns), address, NAME_SERVER, "53", *args)
            server = NameServer(address, port, proc, table, namespace=ns)
            try:
                server.start_recording()
                yield server
            finally:
                _stop(proc)
        return
    addresses = _host_addresses()
    if not addresses:
        raise DestinationUnavailable("no name server: run as root with iproute2, or on a host with an IPv4 address")
    proc, port = _listener([], addresses[0], NAME_SERVER, "0", *args)
    server = NameServer(addresses[0], port, proc, table)
    server.start_recording()
    try:
        yield server
    finally:
        _stop(proc)


@contextlib.contextmanager
def _in_namespace() -> Iterator[Destination]:
    with _namespace() as (ns, address):
        proc, port = _listener(_prefix(ns), address)
        try:
            dest = Destination(address, port, proc, namespace=ns)
            dest.start_counting()
            yield dest
        finally:
            _stop(proc)


@contextlib.contextmanager
def _namespace() -> Iterator[tuple[str, str]]:
    """A network namespace joined to this host by a veth pair: its name and its address; removed on the way out.

    Raises:
        DestinationUnavailable: it could not be made.
    """
    tag = secrets.token_hex(3)
    ns = f"checkfu-{tag}"
    host_if, ns_if = f"cfh{tag}", f"cfn{tag}"
    base = _free_subnet()
    host_ip, ns_ip = f"10.250.{base >> 8}.{(base & 0xFF) + 1}", f"10.250.{base >> 8}.{(base & 0xFF) + 2}"
    try:
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _run("ip", "link", "set", ns_if, "netns", ns)
        _run("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        _run("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        _run("ip", "netns", "exec", ns, "ip", "route", "add", "default", "via", host_ip)
    except subprocess.CalledProcessError as exc:
        _remove_namespace(ns, host_if)
        raise DestinationUnavailable(
            f"cannot make a network namespace: {' '.join(exc.cmd)}: {exc.stderr!s:.200}"
        ) from None
    try:
        yield ns, ns_ip
    finally:
        _remove_namespace(ns, host_if)


def _free_subnet() -> int:
    """A /30 of ``10.250.0.0/16`` (its offset in the /16) that no interface of this host has now: namespaces made
    at once (case 9 makes three) must not share one."""
    taken = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        taken = subprocess.run(
            ["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    for _ in range(64):
        base = (secrets.randbelow(250) + 1) << 8 | secrets.randbelow(64) << 2
        if f" 10.250.{base >> 8}.{(base & 0xFF) + 1}/" not in taken:
            return base
    return base


def _remove_namespace(ns: str, host_if: str) -> None:
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=20, check=False)
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20, check=False)


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()
