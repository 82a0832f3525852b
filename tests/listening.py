"""Wait until a service process the test started listens on a loopback port."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path


def wait_listening(proc: subprocess.Popen[bytes], port: int, log: Path, within: float = 60.0) -> None:
    """Return once ``127.0.0.1:port`` accepts a connection; fail with ``log`` if ``proc`` ends or time runs out."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {within:g} s: {log.read_text()}")
