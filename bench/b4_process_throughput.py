"""B4: ``openProcess`` stdout throughput, in-process, over the loopback wire, and on the Docker tier.

Each figure streams ``head -c BYTES /dev/zero`` (1 GiB unless ``CHECKFU_BENCH_BYTES`` says otherwise) from a
process and reads every byte, beside a raw baseline in the same run, interleaved:

- ``B4a`` in-process: the host-process provider's stream, read through the runner's checked session
  (``RunSession.open_process``: every event ordered and bounded), against a raw pipe from a subprocess;
  target at least 1 GiB/s.
- ``B4b`` over the loopback wire: the host-process provider served by ``checkfu.wire`` in a process of its own,
  read through ``RemoteProvider`` (WebSocket frames within the credit window), against the same raw pipe;
  target at least 500 MiB/s.
- ``B4c`` the Docker tier: ``DockerProvider.open_process`` against docker-py's attach socket on the same
  container (an exec started with ``socket=True``, read raw); target at least 0.8x docker-py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from harness import Figure, interleave, summarize

from checkfu.contract.codec import decode_value
from checkfu.contract.process import ProcessOutput
from checkfu.contract.profile import SandboxProfile
from checkfu.core.clock import SystemClock
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Adapter, Registry, adapter_from_factory, enrollment_endpoint
from checkfu.core.runner import Runner
from checkfu.core.session import Limits

NAMES = ["B4"]
MIB = 1 << 20
SECRET = "b4-bench-credential"
SERVE = r"""
import asyncio, sys
from checkfu.providers.host_process import create
from checkfu.wire.server import create_app
from checkfu.wire.serving import served

async def main():
    async with served(create_app(create(state_dir=sys.argv[2]), [sys.argv[1]])) as url:
        print(url, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


def size() -> int:
    return int(os.environ.get("CHECKFU_BENCH_BYTES", str(1 << 30)))


def runs() -> int:
    return int(os.environ.get("CHECKFU_BENCH_N", "5"))


def raw_pipe(nbytes: int) -> Callable[[], Awaitable[int]]:
    async def go() -> int:
        def read() -> int:
            proc = subprocess.Popen(["head", "-c", str(nbytes), "/dev/zero"], stdout=subprocess.PIPE)
            assert proc.stdout is not None
            got = 0
            while chunk := proc.stdout.read(1 << 18):
                got += len(chunk)
            proc.wait()
            proc.stdout.close()
            return got

        got = await asyncio.to_thread(read)
        assert got == nbytes, got
        return got

    return go


def host_profile() -> SandboxProfile:
    return decode_value(
        SandboxProfile,
        {
            "tier": "container",
            "base_image": "host",
            "network_policy": {"mode": "unrestricted"},
            "resource_limits": {"cpu_millis": 2000, "memory_mib": 1024, "disk_mib": 256, "pids": 64},
            "retention_mode": "durable",
        },
    )


async def _streamer(adapter: Adapter, journal: Journal, nbytes: int, profile: SandboxProfile) -> tuple[Any, Any]:
    """A live instance on ``adapter`` and a step that streams ``nbytes`` out of it."""
    from checkfu.core.job import host_platform_value  # noqa: PLC0415

    registry = Registry()
    registry.add(adapter)
    if not adapter.in_tree and adapter.target.placement != "test":
        journal.record_enrollment(
            adapter.target,
            endpoint=enrollment_endpoint(adapter),
            source="bench",
            kind="evidence",
            envelope_digest=_digest(adapter),
            envelope=adapter.envelope.model_dump_json(),
            ceiling=adapter.ceiling.model_dump_json(),
            now=0.0,
        )
    runner = Runner(
        registry, journal, runner_tag="bench-b4", clock=SystemClock(), limits=Limits(max_output_bytes=1 << 22)
    )
    platform = host_platform_value()
    session = runner.start(adapter.target, profile, platform=platform).session
    image = (await session.materialize(profile, platform)).image
    inst = await session.provision(profile, platform, image)
    await session.activate(inst)
    session.leases.renew(session.lease, ttl=3600)

    async def go() -> int:
        proc = await session.open_process(inst, ["head", "-c", str(nbytes), "/dev/zero"])
        await proc.close_stdin()
        got = 0
        async for event in proc.events():
            if isinstance(event, ProcessOutput):
                got += len(event.data)
        assert got == nbytes, got
        return got

    return session, go


def _digest(adapter: Adapter) -> str:
    from checkfu.contract.codec import digest  # noqa: PLC0415

    return digest(adapter.envelope)


def throughput(
    name: str, a: list[float], b: list[float], nbytes: int, *, target: str, ok: Callable[..., bool]
) -> Figure:
    fig = summarize(name, a, b, target=target, met=ok)
    fig.extra.update(
        bytes=nbytes,
        ours_mib_s=nbytes / MIB / fig.ours_p50,
        raw_mib_s=nbytes / MIB / fig.raw_p50 if fig.raw_p50 else None,
    )
    return fig


async def run() -> list[Figure]:
    nbytes, n = size(), runs()
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="checkfu-b4-") as tmp:
        journal = Journal(sqlite_url(Path(tmp) / "journal.sqlite"))
        try:
            figures.append(await _in_process(journal, Path(tmp), nbytes, n))
            figures.append(await _over_the_wire(journal, Path(tmp), nbytes, n))
            docker = await _docker(journal, nbytes, n)
            if docker is not None:
                figures.append(docker)
        finally:
            journal.close()
    return figures


async def _in_process(journal: Journal, tmp: Path, nbytes: int, n: int) -> Figure:
    from checkfu.providers.host_process import create  # noqa: PLC0415

    provider = create(state_dir=str(tmp / "host"))
    adapter = await adapter_from_factory(lambda: provider, "bench host-process", {}, in_tree=True)
    session, ours = await _streamer(adapter, journal, nbytes, host_profile())
    try:
        a, b = await interleave(ours, raw_pipe(nbytes), n=n, warmup=1)
    finally:
        await session.release_all()
    return throughput(
        "B4a openProcess stdout in-process (host-process)",
        a,
        b,
        nbytes,
        target=">=1GiB/s",
        ok=lambda _r, a, _b: nbytes / sorted(a)[len(a) // 2] >= 1 << 30,
    )


async def _over_the_wire(journal: Journal, tmp: Path, nbytes: int, n: int) -> Figure:
    from checkfu.wire.client import RemoteProvider  # noqa: PLC0415

    server = subprocess.Popen(
        [sys.executable, "-c", SERVE, SECRET, str(tmp / "served")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        remote = RemoteProvider(url, SECRET)
        adapter = await adapter_from_factory(lambda: remote, url, {})
        session, ours = await _streamer(adapter, journal, nbytes, host_profile())
        try:
            a, b = await interleave(ours, raw_pipe(nbytes), n=n, warmup=1)
        finally:
            await session.release_all()
            await remote.aclose()
    finally:
        server.terminate()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
    return throughput(
        "B4b openProcess stdout over the loopback wire (host-process served)",
        a,
        b,
        nbytes,
        target=">=500MiB/s",
        ok=lambda _r, a, _b: nbytes / sorted(a)[len(a) // 2] >= 500 * MIB,
    )


async def _docker(journal: Journal, nbytes: int, n: int) -> Figure | None:
    try:
        import docker  # noqa: PLC0415

        client = docker.from_env()
        client.ping()
    except Exception as exc:
        print(f"B4c: no Docker Engine ({type(exc).__name__}); skipped", file=sys.stderr)
        return None
    from checkfu.providers.docker import create, pin_base_image  # noqa: PLC0415

    provider = create(cache_tag="bench-b4")
    adapter = await adapter_from_factory(lambda: provider, "bench docker", {}, in_tree=True)
    profile = decode_value(
        SandboxProfile,
        {
            "tier": "container",
            "base_image": pin_base_image("checkfu/busybox:1"),
            "network_policy": {"mode": "none"},
            "resource_limits": {"cpu_millis": 2000, "memory_mib": 512, "disk_mib": 64, "pids": 64},
            "retention_mode": "ephemeral_zdr",
        },
    )
    session, ours = await _streamer(adapter, journal, nbytes, profile)
    (inst,) = session.instances.values()
    container = client.containers.get(inst.instance_id)

    async def raw() -> int:
        def read() -> int:
            exec_id = client.api.exec_create(container.id, ["head", "-c", str(nbytes), "/dev/zero"], user="1000:1000")
            sock = client.api.exec_start(exec_id, socket=True)
            raw_sock = sock._sock
            got = 0
            while True:
                header = _read_exactly(raw_sock, 8)
                if not header:
                    break
                length = int.from_bytes(header[4:8], "big")
                got += len(_read_exactly(raw_sock, length))
            sock.close()
            return got

        got = await asyncio.to_thread(read)
        assert got == nbytes, got
        return got

    try:
        a, b = await interleave(ours, raw, n=n, warmup=1)
    finally:
        await session.release_all()
        provider.close()
        client.close()
    return throughput(
        "B4c openProcess stdout on the Docker tier",
        a,
        b,
        nbytes,
        target=">=0.8x docker-py attach",
        ok=lambda r, _a, _b: r <= 1 / 0.8,
    )


def _read_exactly(sock: Any, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(min(n - len(buf), 1 << 18))
        if not part:
            return bytes(buf)
        buf += part
    return bytes(buf)
