"""A Docker Engine of the test's own, to stop and start again: ``dockerd`` on its own socket, data root and
exec root, on a bridge of its own (``engine_bridge``; never ``--bridge none``, which deletes the host's
``docker0``) and with no iptables rules, so starting or stopping it touches nothing of the shared engine.

The base image a test needs is copied in from the shared engine (``docker save`` / ``docker load``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from engine_bridge import make_bridge, remove_bridge


class PrivateEngine:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "d.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.bridge: str | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    def client(self) -> Any:
        return docker.DockerClient(base_url=self.host, timeout=60)

    def start(self, timeout: float = 60.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        if self.bridge is None:
            self.bridge = make_bridge()
        with (self.root / "dockerd.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    "dockerd",
                    "--host", self.host,
                    "--data-root", str(self.root / "data"),
                    "--exec-root", str(self.root / "exec"),
                    "--pidfile", str(self.root / "dockerd.pid"),
                    "--bridge", self.bridge,
                    "--iptables=false",
                    "--ip-masq=false",
                    "--storage-driver", "overlay2",
                    "--shutdown-timeout", "1",
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start: {self.log()[-2000:]}")
            time.sleep(0.2)

    def _answers(self) -> bool:
        """Whether the engine answers ``GET /_ping`` on its socket (a plain socket: nothing left to collect)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            try:
                sock.connect(str(self.socket))
                sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: engine\r\n\r\n")
                return b" 200 " in sock.recv(64)
            except OSError:
                return False

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the engine (its containers stop with it); only the process this fixture started."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def log(self) -> str:
        path = self.root / "dockerd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def load_from(self, shared: Any, image: str) -> None:
        client = self.client()
        try:
            client.images.load(b"".join(shared.images.get(image).save(named=True)))
        finally:
            client.close()


def private_engine(shared: Any) -> Any:
    """Start a private engine holding ``checkfu/busybox:1``; a generator for a pytest fixture."""
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        if os.environ.get("CHECKFU_REQUIRE_DOCKER") == "1":
            pytest.fail("a private engine needs dockerd and root, and CHECKFU_REQUIRE_DOCKER=1")
        pytest.skip("a private engine needs dockerd and root")
    root = Path(tempfile.mkdtemp(prefix="checkfu-pd-", dir="/tmp"))  # short: a socket path is bounded
    engine = PrivateEngine(root)
    try:
        engine.start()
        engine.load_from(shared, "checkfu/busybox:1")
        yield engine
    finally:
        engine.stop()
        if engine.bridge is not None:
            remove_bridge(engine.bridge)
        subprocess.run(["umount", "-R", str(root / "data")], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)
