"""The figures of docs/egress.md, measured again (not a test: pytest does not collect it).

    .venv/bin/python tests/providers/docker/measure_egress.py first-command [N]   # none vs allowlist, N rounds each
    .venv/bin/python tests/providers/docker/measure_egress.py loopback [N]        # 256 MiB: proxy vs direct
    .venv/bin/python tests/providers/docker/measure_egress.py sandbox [N]         # 256 MiB from inside, via the proxy

Everything goes to loopback or to a network namespace made here (as root with iproute2); every server is
stopped and every sandbox released at the end.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import docker
from docker_kit import LEASE, Kit

from checkfu.conformance import destinations as D
from checkfu.contract.members import ActivateRequest, ExecRequest, ProvisionRequest, ReleaseRequest
from checkfu.contract.profile import SandboxProfile
from checkfu.providers.docker import DockerProvider

SIZE = 256 << 20
SINK = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
buf = bytearray(1 << 20)
while True:
    c, _ = s.accept()
    n = 0
    while k := c.recv_into(buf):
        n += k
    c.sendall(str(n).encode())
    c.close()
"""
PROXY = r"""
import asyncio, socket, sys
sys.path.insert(0, sys.argv[2])
from egress_proxy import Allowlist, Proxy, serve
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(64)
print(listener.getsockname()[1], flush=True)
async def main():
    await serve(listener, Proxy(Allowlist([sys.argv[1]]), log=lambda line: None))
asyncio.run(main())
"""
INSIDE = r"""
import socket, sys, time
host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t0 = time.perf_counter()
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT %s:%d HTTP/1.1\r\n\r\n" % (host.encode(), port))
head = b""
while b"\r\n\r\n" not in head:
    head += s.recv(100)
chunk = bytes(1 << 20)
for _ in range(size >> 20):
    s.sendall(chunk)
s.shutdown(socket.SHUT_WR)
assert int(s.recv(64)) == size
print(size / (time.perf_counter() - t0) / (1 << 20))
"""
SOURCE_DIR = Path(__file__).resolve().parents[3] / "src" / "checkfu" / "providers" / "docker"


def _summary(name: str, values: list[float], unit: str) -> str:
    return (
        f"{name:22s} n={len(values)} median {statistics.median(values):7.0f} {unit}"
        f"  (min {min(values):.0f}, max {max(values):.0f})"
    )


def send(host: str, port: int, proxy: int | None = None) -> float:
    """MiB/s of 256 MiB sent to the sink at ``host:port``, directly or through ``CONNECT`` at ``127.0.0.1:proxy``."""
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", proxy) if proxy else (host, port)) as s:
        if proxy:
            s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(100)
            assert b" 200 " in head, head
        chunk = bytes(1 << 20)
        for _ in range(SIZE >> 20):
            s.sendall(chunk)
        s.shutdown(socket.SHUT_WR)
        assert int(s.recv(64)) == SIZE
    return SIZE / (time.perf_counter() - t0) / (1 << 20)


def _start(argv: list[str]) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def loopback(n: int) -> None:
    sink, sink_port = _start([sys.executable, "-c", SINK, "127.0.0.1"])
    proxy, proxy_port = _start([sys.executable, "-c", PROXY, f"127.0.0.1:{sink_port}", str(SOURCE_DIR)])
    try:
        results: dict[str, list[float]] = {"loopback, direct": [], "loopback, via proxy": []}
        send("127.0.0.1", sink_port)
        send("127.0.0.1", sink_port, proxy_port)
        for i in range(n):
            for via in (False, True) if i % 2 == 0 else (True, False):
                key = "loopback, via proxy" if via else "loopback, direct"
                results[key].append(send("127.0.0.1", sink_port, proxy_port if via else None))
        for name, values in results.items():
            print(_summary(name, values, "MiB/s"))
    finally:
        for proc in (proxy, sink):
            proc.kill()
            proc.wait()


def _profile(image: str, network: dict[str, Any]) -> SandboxProfile:
    return SandboxProfile(
        tier="container",
        base_image=image,
        network_policy=network,  # type: ignore[arg-type]
        resource_limits={"cpu_millis": 2000, "memory_mib": 256, "disk_mib": 64, "pids": 128},  # type: ignore[arg-type]
        retention_mode="ephemeral_zdr",
    )


async def sandbox(n: int) -> None:
    client = docker.from_env()
    tag = "measure-" + uuid.uuid4().hex[:8]
    provider = DockerProvider(state_dir=tempfile.mkdtemp(prefix="checkfu-measure-"), cache_tag=tag)
    debian = str(client.images.get("checkfu/debian:12").id)
    try:
        with D._namespace() as (ns, address):
            sink, port = D._listener(D._prefix(ns), address, SINK)
            try:
                kit = Kit(provider, client, tag, debian, docker=provider)
                box = await kit.up(
                    "throughput", profile=_profile(debian, {"mode": "allowlist", "allowlist": [f"{address}:{port}"]})
                )
                results: dict[str, list[float]] = {"runner, direct": [], "sandbox, via proxy": []}
                for i in range(n + 1):
                    direct = send(address, port)
                    ran = await box.exec("python3", "-c", INSIDE, address, str(port), str(SIZE), timeout_ms=120_000)
                    if i:  # the first round warms up
                        results["runner, direct"].append(direct)
                        results["sandbox, via proxy"].append(float(ran.stdout))
                await box.release()
                for name, values in results.items():
                    print(_summary(name, values, "MiB/s"))
            finally:
                D._stop(sink)
    finally:
        provider.close()


async def first_command(n: int) -> None:
    client = docker.from_env()
    image = str(client.images.get("checkfu/busybox:1").id)
    tag = "measure-" + uuid.uuid4().hex[:8]
    provider = DockerProvider(state_dir=tempfile.mkdtemp(prefix="checkfu-measure-"), cache_tag=tag, workers=32)
    await provider.describe()
    profiles = {
        "none": _profile(image, {"mode": "none"}),
        "allowlist": _profile(image, {"mode": "allowlist", "allowlist": ["10.250.0.2:80", "pypi.org:443"]}),
    }
    totals: dict[str, list[float]] = {k: [] for k in profiles}
    try:
        for i in range(n + 2):
            for name in ("none", "allowlist") if i % 2 == 0 else ("allowlist", "none"):
                key, profile = f"{tag}-{name}-{i}", profiles[name]
                t0 = time.perf_counter()
                made = await provider.provision(
                    ProvisionRequest(
                        target=provider.target,
                        lease=LEASE,
                        profile=profile,
                        profile_digest=profile.digest,
                        platform=provider.envelope.platforms[0],
                        allocation_key=key,
                        runner_tag=tag,
                        mounts=(),
                        root_image=image,
                    )
                )
                call = {
                    "target": provider.target,
                    "lease": LEASE,
                    "allocation_key": key,
                    "instance_id": made.instance_id,
                }
                await provider.activate(ActivateRequest(**call))
                ran = await provider.exec(ExecRequest(**call, argv=("true",), timeout_ms=10_000, max_output_bytes=1024))
                elapsed = time.perf_counter() - t0
                assert ran.exit_code == 0
                await provider.release(ReleaseRequest(**call))
                if i >= 2:  # two rounds warm up
                    totals[name].append(elapsed * 1000)
        for name, values in totals.items():
            print(_summary(f"first command, {name}", values, "ms"))
        added = [a - b for a, b in zip(totals["allowlist"], totals["none"], strict=True)]
        print(f"added by allowlist, per round: median {statistics.median(added):.0f} ms (n={len(added)})")
    finally:
        provider.close()


if __name__ == "__main__":
    what, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 9
    if what == "loopback":
        loopback(rounds)
    elif what == "sandbox":
        asyncio.run(sandbox(rounds))
    elif what == "first-command":
        asyncio.run(first_command(rounds))
    else:
        raise SystemExit(__doc__)
