"""Docker engines of a test's own: ``dockerd`` processes on their own sockets and data roots.

The shared engine at ``/var/run/docker.sock`` is never stopped or reconfigured: a private engine
has its own socket, data root (``overlay2`` on the host's ext4, as the shared engine uses), exec
root (and with it its own managed containerd), pid file, cgroup parent and configuration file
(an empty one, so a host ``daemon.json`` cannot interfere), and touches nothing of the host's
network: a bridge of its own (``engine_bridge``; never ``--bridge none``, which deletes the host's
``docker0`` as the engine starts), no iptables rules, no IP forwarding change. Its sandboxes
need no network (profiles with ``network_policy = none``).

An engine may also listen on ``tcp://127.0.0.1:PORT`` with TLS (``--tlsverify``): a CA, a
server certificate for 127.0.0.1 and a client certificate made here with ``cryptography``, in
``tls_dir`` (``ca.pem``, ``cert.pem``, ``key.pem``: what ``--engine-certs`` reads).

Base images are copied in from the shared engine (``docker save`` / ``load``), which keeps their
ids, so one pinned profile serves every engine. Starting one takes a second or two.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from engine_bridge import make_bridge, remove_bridge

ROOT = Path("/var/lib/checkfu-test-engines")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_tls(server_dir: Path, client_dir: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, in docker's file names."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "checkfu test engines CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign, crl_sign
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(name: str, server: bool) -> tuple[bytes, bytes]:
        key = _key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(
                x509.ExtendedKeyUsage(
                    [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            import ipaddress  # noqa: PLC0415

            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)

    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    for where, (cert, key) in ((server_dir, leaf("127.0.0.1", True)), (client_dir, leaf("checkfu-tests", False))):
        where.mkdir(parents=True, exist_ok=True)
        (where / "ca.pem").write_bytes(ca_pem)
        (where / "cert.pem").write_bytes(cert)
        (where / "key.pem").write_bytes(key)
        os.chmod(where / "key.pem", 0o600)


@dataclass
class PrivateEngine:
    name: str
    root: Path
    tls: bool = False
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    bridge: str | None = None
    client_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.client_dir = self.root / "client" / self.name

    @property
    def sock(self) -> Path:
        return self.root / "docker.sock"

    @property
    def socket_url(self) -> str:
        return f"unix://{self.sock}"

    @property
    def url(self) -> str:
        """How the runner reaches it: TCP with TLS when it has that, else its socket."""
        return f"tcp://127.0.0.1:{self.port}" if self.tls else self.socket_url

    @property
    def exec_root(self) -> Path:
        return Path("/run") / f"cf-{self.root.name[-12:]}"  # short: containerd's socket path lives below it

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "daemon.json"
        config.write_text("{}")
        if self.bridge is None:
            self.bridge = make_bridge()
        argv = [
            "dockerd",
            "--config-file", str(config),
            "--host", self.socket_url,
            "--data-root", str(self.root / "data"),
            "--exec-root", str(self.exec_root),
            "--pidfile", str(self.root / "dockerd.pid"),
            "--storage-driver", "overlay2",
            "--bridge", self.bridge,
            "--iptables=false",
            "--ip6tables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            "--cgroup-parent", f"/checkfu-engine-{self.root.name}",
            "--shutdown-timeout", "2",
        ]  # fmt: skip
        if self.tls:
            server = self.root / "server"
            if not (server / "cert.pem").exists():
                make_tls(server, self.client_dir)
            self.port = self.port or _free_port()
            argv += [
                "--host", f"tcp://127.0.0.1:{self.port}",
                "--tlsverify",
                "--tlscacert", str(server / "ca.pem"),
                "--tlscert", str(server / "cert.pem"),
                "--tlskey", str(server / "key.pem"),
            ]  # fmt: skip
        with (self.root / "dockerd.log").open("ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd {self.name} exited: {(self.root / 'dockerd.log').read_text()[-3000:]}")
            if self._accepts():
                c = self.client()
                try:
                    if c.ping():
                        return
                finally:
                    c.close()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"dockerd {self.name} did not answer: {(self.root / 'dockerd.log').read_text()[-3000:]}"
                )
            time.sleep(0.2)

    def _accepts(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.sock))
            except OSError:
                return False
        return True

    def client(self) -> Any:
        return docker.DockerClient(base_url=self.socket_url, timeout=60)

    def stop(self) -> None:
        """SIGTERM this engine (its containers get 2 s), and wait for it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def crash(self) -> None:
        """SIGKILL this engine: its API is gone at once, and what it held stays (its containerd and sandboxes
        too, until it is started again and finds them)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def _containerd_pid(self) -> int | None:
        try:
            return int((self.exec_root / "containerd" / "containerd.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def load(self, shared: Any, tag: str) -> str:
        """Copy ``tag`` from the shared engine (its id is kept); returns the id."""
        image = shared.images.get(tag)
        c = self.client()
        try:
            c.images.load(b"".join(image.save(named=True)))
            return str(c.images.get(tag).id)
        finally:
            c.close()

    def labelled(self, tag: str) -> list[str]:
        """Every container, volume and image on this engine labelled with runner tag ``tag``."""
        c = self.client()
        try:
            selector = {"label": [f"checkfu.runner_tag={tag}"]}
            out = [f"container {x.name}" for x in c.containers.list(all=True, filters=selector, ignore_removed=True)]
            out += [f"volume {v.name}" for v in c.volumes.list(filters=selector)]
            out += [f"image {i.id}" for i in c.images.list(filters=selector)]
            return out
        finally:
            c.close()

    def destroy(self) -> None:
        """Stop it and remove its data root (unmounting anything left mounted below it first)."""
        self.stop()
        if self.proc is not None and self.running:
            return
        pid = self._containerd_pid()  # the containerd this engine started, if a crash left it behind
        if pid is not None and Path(f"/proc/{pid}/cmdline").exists():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if str(self.exec_root).encode() in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                for _ in range(100):
                    if not Path(f"/proc/{pid}").exists():
                        break
                    time.sleep(0.1)
        for base in (self.root, self.exec_root):
            mounts = [
                line.split()[4]
                for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if line.split()[4].startswith(str(base) + "/")
            ]
            for mount in sorted(mounts, key=len, reverse=True):
                subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
            shutil.rmtree(base, ignore_errors=True)
        if self.bridge is not None:
            remove_bridge(self.bridge)
            self.bridge = None


def new_engine(name: str, *, tls: bool = False) -> PrivateEngine:
    return PrivateEngine(name=name, root=ROOT / f"{name}-{uuid.uuid4().hex[:10]}", tls=tls)


def can_run_dockerd() -> str | None:
    """Why private engines cannot run here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return "starting dockerd needs root"
    if shutil.which("dockerd") is None:
        return "dockerd is not installed (scripts/engine-up installs it)"
    return None


def engines_json(engines: list[PrivateEngine]) -> str:
    return json.dumps([{"name": e.name, "url": e.url} for e in engines])
