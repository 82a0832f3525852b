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
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
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
                s.recv(64)
        except OSError as exc:
            raise DestinationUnavailable(f"the destination {self.address} is not reachable from here: {exc}") from exc
        deadline = time.monotonic() + timeout
        while len(self.accepted) <= before and time.monotonic() < deadline:
            time.sleep(0.01)
        if len(self.accepted) <= before:
            raise DestinationUnavailable(f"the destination {self.address} did not record the control connection")


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=20)


def _listener(prefix: list[str], host: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", LISTENER, host],
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
def _in_namespace() -> Iterator[Destination]:
    tag = secrets.token_hex(3)
    ns = f"checkfu-{tag}"
    host_if, ns_if = f"cfh{tag}", f"cfn{tag}"
    octet = int(tag[:2], 16) % 250 + 1
    host_ip, ns_ip = f"10.250.{octet}.1", f"10.250.{octet}.2"
    proc: subprocess.Popen[str] | None = None
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
        proc, port = _listener(["ip", "netns", "exec", ns], ns_ip)
        dest = Destination(ns_ip, port, proc, namespace=ns)
        dest.start_counting()
        yield dest
    except subprocess.CalledProcessError as exc:
        raise DestinationUnavailable(
            f"cannot make a network namespace: {' '.join(exc.cmd)}: {exc.stderr!s:.200}"
        ) from None
    finally:
        if proc is not None:
            _stop(proc)
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
