"""B2: one ``exec`` in a live Docker sandbox, beside docker-py's ``exec_run`` in a live container.

Ours: ``exec(["true"])`` through the provider (Engine API exec create, hijacked
start, exit code), in one activated sandbox. Raw: ``container.exec_run(["true"])``
in a live container with the same flags. Never the docker CLI. Target: ours p50
at most 1.15 times raw. Set ``CHECKFU_BENCH_N`` (default 30).
"""

from __future__ import annotations

from b1_docker_first_command import Rig, exec_request, rounds
from harness import Figure, interleave, summarize

NAMES = ["B2"]


async def run() -> list[Figure]:
    rig = Rig("B2")
    try:
        call = await rig.up()
        container = rig.client.containers.run(detach=True, **rig.raw_config())

        async def ours() -> None:
            result = await rig.provider.exec(exec_request(call, "true"))
            assert result.exit_code == 0

        def raw() -> None:
            code, _ = container.exec_run(["true"], user="1000:1000")
            assert code == 0

        try:
            a, b = await interleave(ours, raw, n=rounds(30), warmup=3)
        finally:
            container.remove(force=True)
            await rig.down(call)
    finally:
        left = await rig.close()
    fig = summarize("B2 docker exec", a, b, target="<=1.15x docker-py exec_run", met=lambda r, _a, _b: r <= 1.15)
    fig.extra["left_behind"] = left
    return [fig]
