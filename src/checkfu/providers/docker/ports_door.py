"""The published ports of a sandbox: its door inside, its porter outside, and the socket between them.

This file stands alone, like ``egress_door.py``, and imports only the standard
library. The Docker provider runs its source (``python3 -I -S -c <source>
CONFIG``) in two containers, by ``CONFIG["role"]``:

- ``door``: in the sandbox's network namespace (and no other of its namespaces).
  It refuses to open when the namespace has any interface but ``lo``. It listens
  on the Unix socket ``CONFIG["socket"]``, which only the door and the porters
  mount. Each request on it is a port number (one line); the door connects to
  ``127.0.0.1:PORT`` *inside the sandbox* and hands the connected socket back
  through ``SCM_RIGHTS`` (or answers ``no <reason>``). It never relays a byte.
- ``porter``: on the engine host's network namespace. It binds
  ``CONFIG["host"]:CONFIG["host_port"]`` (``0``: a free port), prints the address
  it holds, and for each connection it accepts asks the door for a socket
  connected to ``CONFIG["port"]`` in the sandbox and relays between the two.

Neither opens any way out of the sandbox: the sandbox keeps ``lo`` alone, and
what reaches it comes only through the porter's one listening address.

Exit status: 0 stopped; 3 the door's namespace holds more than ``lo``; 6 the porter
could not bind its address.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import sys
import threading
from typing import Any

READY = "listening"
"""The first word of the porter's line once it listens: ``listening HOST PORT``."""
CHUNK = 65536


def run_door(config: dict[str, Any]) -> int:
    """Serve connect requests on ``config["socket"]`` until stopped."""
    interfaces = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else ["?"]
    if interfaces != ["lo"]:
        print(f"refused: this namespace has {interfaces}, not only lo", flush=True)
        return 3
    path = str(config["socket"])
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(128)
    print(f"{READY} {path}", flush=True)
    while True:
        conn, _ = server.accept()
        try:
            conn.settimeout(5)
            line = conn.recv(16).strip()
            port = int(line) if line.isdigit() else 0
            if not 0 < port < 65536:
                conn.sendall(b"no bad port")
                continue
            try:
                inside = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError as exc:
                conn.sendall(f"no {exc.strerror or exc}".encode()[:200])
                continue
            try:
                socket.send_fds(conn, [b"ok"], [inside.fileno()])
            finally:
                inside.close()
        except OSError:
            pass
        finally:
            conn.close()


def _relay(outside: socket.socket, inside: socket.socket) -> None:
    """Copy bytes both ways until both directions are closed (a half-close passes through)."""
    ends = {outside: inside, inside: outside}
    open_reads = [outside, inside]
    try:
        while open_reads:
            ready, _, _ = select.select(open_reads, [], [])
            for src in ready:
                try:
                    data = src.recv(CHUNK)
                except OSError:
                    data = b""
                if data:
                    ends[src].sendall(data)
                else:
                    open_reads.remove(src)
                    with contextlib.suppress(OSError):
                        ends[src].shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        outside.close()
        inside.close()


def _ask_door(path: str, port: int) -> socket.socket | None:
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        control.settimeout(10)
        control.connect(path)
        control.sendall(f"{port}\n".encode())
        msg, fds, _, _ = socket.recv_fds(control, 256, 1)
        if msg == b"ok" and fds:
            inside = socket.socket(fileno=fds[0])
            inside.settimeout(None)
            return inside
        for fd in fds:
            os.close(fd)
        return None
    except OSError:
        return None
    finally:
        control.close()


def run_porter(config: dict[str, Any]) -> int:
    """Listen on the host address and relay each connection to ``config["port"]`` in the sandbox."""
    host, host_port, port = str(config["host"]), int(config["host_port"]), int(config["port"])
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, host_port))
    except OSError as exc:
        print(f"cannot bind {host}:{host_port}: {exc.strerror or exc}", flush=True)
        return 6
    listener.listen(128)
    print(f"{READY} {host} {listener.getsockname()[1]}", flush=True)
    while True:
        outside, _ = listener.accept()
        inside = _ask_door(str(config["socket"]), port)
        if inside is None:
            outside.close()  # nothing listens on the port in the sandbox (yet): the client sees the close
            continue
        threading.Thread(target=_relay, args=(outside, inside), daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: CONFIG_JSON", file=sys.stderr)
        return 2
    config = json.loads(argv[1])
    return run_door(config) if config.get("role") == "door" else run_porter(config)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
