"""B3: one member call through the wire server, beside the same call in-process.

Ours: ``RemoteProvider.inspect`` against the memory provider served by
``checkfu.wire.create_app`` in a process of its own on loopback (a keep-alive
connection, as the runner holds one). Raw: ``MemoryProvider.inspect`` called in
this process on an instance of its own. Interleaved A B / B A. The targets are
absolute additions: at most 0.5 ms at p50 and 2 ms at p99.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

from harness import Figure, interleave, percentile, summarize

from checkfu.contract.members import ActivateRequest, InspectRequest
from checkfu.testing import MemoryProvider, Requests
from checkfu.wire.client import RemoteProvider

NAMES = ["B3"]
SECRET = "b3-bench-credential"
SERVE = r"""
import asyncio, sys
from checkfu.testing import MemoryProvider
from checkfu.wire.server import create_app
from checkfu.wire.serving import served

async def main():
    async with served(create_app(MemoryProvider(), [sys.argv[1]])) as url:
        print(url, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())  # as `checkfu provider serve` runs it
"""


async def _instance(provider: object, r: Requests) -> InspectRequest:
    image = (await provider.materialize(r.materialize())).image  # type: ignore[attr-defined]
    inst = await provider.provision(r.provision("ak-b3", image))  # type: ignore[attr-defined]
    await provider.activate(ActivateRequest(**r.on(inst)))  # type: ignore[attr-defined]
    return InspectRequest(**r.on(inst))


async def run() -> list[Figure]:
    n = int(os.environ.get("CHECKFU_BENCH_N", "2000"))
    server = subprocess.Popen([sys.executable, "-c", SERVE, SECRET], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        if not url.startswith("http://"):
            raise SystemExit("the provider service did not start")
        memory = MemoryProvider()
        remote = RemoteProvider(url, SECRET)
        r = Requests(memory.target)
        local_req = await _instance(memory, r)
        remote_req = await _instance(remote, r)
        a, b = await interleave(lambda: remote.inspect(remote_req), lambda: memory.inspect(local_req), n=n, warmup=200)
        await remote.aclose()
    finally:
        server.terminate()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
    added50 = statistics.median(a) - statistics.median(b)
    added99 = percentile(a, 0.99) - percentile(b, 0.99)
    fig = summarize(
        "B3 one member call over the wire (memory provider)",
        a,
        b,
        target="<=+0.5ms p50, <=+2ms p99",
        met=lambda _r, _a, _b: added50 <= 0.5e-3 and added99 <= 2e-3,
    )
    fig.extra.update(added_p50=added50, added_p99=added99, warmup=200, transport="HTTP/1.1 keep-alive, loopback")
    return [fig]
