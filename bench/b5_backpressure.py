"""B5: backpressure. A reader that sleeps 10 ms per frame, 2 GiB through the wire.

The host-process provider is served by ``checkfu.wire`` in a thread of this process (so the server's own
state can be read while it runs); ``RemoteProvider`` with an 8 MiB window reads ``head -c 2G /dev/zero``
and sleeps 10 ms after every frame. Reported: bytes lost (must be 0), the largest number of bytes the server
held unacknowledged (must stay within the window and one frame), and the process's resident memory at the
start, after the first 256 MiB and at the end (must stay flat). ``CHECKFU_BENCH_BYTES`` changes the size.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harness import Figure

from checkfu.contract.frames import DEFAULT_WINDOW, MAX_DATA
from checkfu.contract.members import ActivateRequest, MaterializeRequest, OpenProcessRequest, ProvisionRequest
from checkfu.contract.process import ProcessOutput
from checkfu.contract.target import Lease

NAMES = ["B5"]
SECRET = "b5-bench-credential"
SLEEP = 0.010


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class _Service(threading.Thread):
    def __init__(self, app: Any) -> None:
        super().__init__(daemon=True)
        self.app = app
        self.url: str | None = None
        self.ready = threading.Event()
        self.stop: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        from checkfu.wire.serving import served  # noqa: PLC0415

        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        async with served(self.app) as url:
            self.url = url
            self.ready.set()
            await self.stop.wait()


async def run() -> list[Figure]:
    from checkfu.providers.host_process import create  # noqa: PLC0415
    from checkfu.wire.client import RemoteProvider  # noqa: PLC0415
    from checkfu.wire.server import create_app  # noqa: PLC0415

    nbytes = int(os.environ.get("CHECKFU_BENCH_BYTES", str(2 << 30)))
    with tempfile.TemporaryDirectory(prefix="checkfu-b5-") as tmp:
        provider = create(state_dir=tmp)
        app = create_app(provider, [SECRET])
        service = _Service(app)
        service.start()
        service.ready.wait(30)
        assert service.url is not None
        remote = RemoteProvider(service.url, SECRET, window=DEFAULT_WINDOW)
        env = (await remote.describe()).envelope
        lease = Lease(lease_id="lease-b5", lease_epoch=1)
        call = {"target": env.target, "lease": lease}
        from checkfu.conformance.suite import host_platform_value  # noqa: PLC0415
        from checkfu.contract.codec import decode_value  # noqa: PLC0415
        from checkfu.contract.profile import SandboxProfile  # noqa: PLC0415

        profile = decode_value(
            SandboxProfile,
            {
                "tier": "container",
                "base_image": "host",
                "network_policy": {"mode": "unrestricted"},
                "resource_limits": {"cpu_millis": 2000, "memory_mib": 1024, "disk_mib": 256, "pids": 64},
                "retention_mode": "durable",
            },
        )
        platform = host_platform_value()
        image = (
            await remote.materialize(
                MaterializeRequest(**call, profile=profile, profile_digest=profile.digest, platform=platform)
            )
        ).image
        inst = await remote.provision(
            ProvisionRequest(
                **call,
                allocation_key="ak-b5",
                runner_tag="bench-b5",
                profile=profile,
                profile_digest=profile.digest,
                platform=platform,
                root_image=image,
            )
        )
        on = {**call, "allocation_key": inst.allocation_key, "instance_id": inst.instance_id}
        await remote.activate(ActivateRequest(**on))
        proc = await remote.open_process(OpenProcessRequest(**on, argv=["head", "-c", str(nbytes), "/dev/zero"]))
        await proc.close_stdin()
        operations = app.state.operations
        start_rss, after_256, peak_unacked, got, frames = rss(), 0, 0, 0, 0
        t0 = time.perf_counter()
        async for event in proc.events():
            if isinstance(event, ProcessOutput):
                got += len(event.data)
                frames += 1
                for op in list(operations.values()):
                    peak_unacked = max(peak_unacked, op.unacked)
                if not after_256 and got >= 256 << 20:
                    after_256 = rss()
                await asyncio.sleep(SLEEP)
        seconds = time.perf_counter() - t0
        end_rss = rss()
        from checkfu.contract.members import ReleaseRequest  # noqa: PLC0415

        await remote.release(ReleaseRequest(**on))
        await remote.aclose()
        assert service.loop is not None and service.stop is not None
        service.loop.call_soon_threadsafe(service.stop.set)
        service.join(15)
    lost = nbytes - got
    bound = DEFAULT_WINDOW + MAX_DATA
    growth = end_rss - (after_256 or start_rss)
    met = lost == 0 and peak_unacked <= bound and growth < 64 << 20
    return [
        Figure(
            name="B5 backpressure: a reader sleeping 10 ms per frame",
            ours_p50=seconds,
            raw_p50=None,
            ratio=None,
            target="0 lost; unacked <= window + one frame; flat memory",
            met=met,
            n=1,
            extra={
                "bytes": nbytes,
                "lost": lost,
                "frames": frames,
                "peak_unacked": peak_unacked,
                "window": DEFAULT_WINDOW,
                "bound": bound,
                "rss_start_mib": start_rss / (1 << 20),
                "rss_after_256mib": (after_256 or 0) / (1 << 20),
                "rss_end_mib": end_rss / (1 << 20),
            },
        )
    ]
