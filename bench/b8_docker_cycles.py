"""B8: provision/release cycles on the Docker tier, beside the raw engine making the same shape.

Ours: ``provision`` then ``release`` (an ephemeral profile: release destroys the container and its
three writable-area volumes). Raw (the figure's ratio): docker-py ``create`` then
``remove(force=True, v=True)`` of a container of the same shape: the same flags and the same three
size-limited tmpfs volumes (``Rig.raw_shaped_config``; why volumes and not HostConfig tmpfs: see
there). Beside them, the *bare* container the earlier figure compared with: the same flags with
HostConfig tmpfs mounts, one engine object instead of four; its ratio is stated too.
All three interleaved in one process, their order rotated each round. Target: ours p99 at most
1.2 times the same-shape raw p99, and no object left behind. ``CHECKFU_BENCH_B8_N`` sets the cycles
(default 1000, the spec's number).
"""

from __future__ import annotations

import statistics

from b1_docker_first_command import Rig, rounds
from harness import Figure, interleave_many, percentile, summarize

from checkfu.contract.members import ReleaseRequest

NAMES = ["B8"]


async def run() -> list[Figure]:
    rig = Rig("B8")
    shaped, bare_cfg = rig.raw_shaped_config(), rig.raw_config()

    async def ours() -> None:
        key = rig.key()
        made = await rig.provider.provision(rig.provision_request(key))
        await rig.provider.release(ReleaseRequest(**rig.call(key, made.instance_id)))

    def raw() -> None:
        rig.client.containers.create(**shaped).remove(force=True, v=True)

    def bare() -> None:
        rig.client.containers.create(**bare_cfg).remove(force=True)

    try:
        a, b, c = await interleave_many([ours, raw, bare], n=rounds(1000, "CHECKFU_BENCH_B8_N"), warmup=3)
        left = rig.leftovers()
    finally:
        left_at_close = await rig.close()
    fig = summarize(
        "B8 docker provision/release cycles",
        a,
        b,
        target="<=1.2x same-shape raw p99, 0 left behind",
        met=lambda _r, xs, ys: percentile(xs, 0.99) <= 1.2 * percentile(ys, 0.99) and left == 0,
    )
    fig.extra["p99_ratio"] = fig.extra["ours_p99"] / fig.extra["raw_p99"]
    fig.extra["raw"] = "docker-py create + remove(v=True), the same flags and three tmpfs volumes"
    fig.extra["bare_p50"] = statistics.median(c)
    fig.extra["bare_p99"] = percentile(c, 0.99)
    fig.extra["bare_ratio"] = fig.ours_p50 / fig.extra["bare_p50"]
    fig.extra["bare_p99_ratio"] = fig.extra["ours_p99"] / fig.extra["bare_p99"]
    fig.extra["shape_over_bare_p50"] = fig.raw_p50 / fig.extra["bare_p50"] if fig.raw_p50 else None
    fig.extra["left_behind"] = left
    fig.extra["left_at_close"] = left_at_close
    return [fig]
