"""B8: provision/release cycles on the Docker tier, beside docker-py ``create`` + ``remove(force=True)``.

The raw side is ``docker rm -f`` through docker-py. Ours: ``provision`` then
``release`` (an ephemeral profile: release destroys the container and its three
writable-area volumes). Raw: ``create`` then ``remove(force=True)`` of a
container with the same flags. Target: ours p99 at most 1.2 times raw p99, and no
object of either left behind. ``CHECKFU_BENCH_B8_N`` sets the cycles (default
1000, the spec's number).
"""

from __future__ import annotations

from b1_docker_first_command import Rig, rounds
from harness import Figure, interleave, summarize

from checkfu.contract.members import ReleaseRequest

NAMES = ["B8"]


async def run() -> list[Figure]:
    rig = Rig("B8")
    cfg = rig.raw_config()

    async def ours() -> None:
        key = rig.key()
        made = await rig.provider.provision(rig.provision_request(key))
        await rig.provider.release(ReleaseRequest(**rig.call(key, made.instance_id)))

    def raw() -> None:
        rig.client.containers.create(**cfg).remove(force=True)

    try:
        a, b = await interleave(ours, raw, n=rounds(1000, "CHECKFU_BENCH_B8_N"), warmup=3)
        left = rig.leftovers()
    finally:
        left_at_close = await rig.close()
    fig = summarize(
        "B8 docker provision/release cycles",
        a,
        b,
        target="<=1.2x raw p99, 0 left behind",
        met=lambda _r, xs, ys: (
            sorted(xs)[round(0.99 * (len(xs) - 1))] <= 1.2 * sorted(ys)[round(0.99 * (len(ys) - 1))] and left == 0
        ),
    )
    fig.extra["p99_ratio"] = fig.extra["ours_p99"] / fig.extra["raw_p99"]
    fig.extra["left_behind"] = left
    fig.extra["left_at_close"] = left_at_close
    return [fig]
