"""A Run frozen at one point of its lifecycle, for the test to SIGKILL: a fault-injection point owned by the
tests. The shipped CLI has no such hook: this wraps the provider door's one ``_invoke``, which every provider
call of a Run goes through, before it asks the provider and after the provider answered.

Usage::

    python killpoint.py POINT cli ARGS...          # checkfu ARGS..., frozen at POINT
    python killpoint.py POINT session PROVIDER     # a Session on PROVIDER that snapshots and clones

POINT is ``before:MEMBER#N`` (the N-th call of MEMBER is journaled, with its allocation row written first
where it allocates, and the provider not yet asked) or ``answered:MEMBER#N`` (the provider has answered; the
runner has not yet checked the answer nor settled its row). At POINT the process says ``killpoint POINT`` on
stderr and freezes its event loop (no further step of the Run can happen) until it is killed, or, with
``KILLPOINT_RESUME_FILE`` set, until that file exists (the test changes the world meanwhile, then lets it go on).

The session mode needs a Session's members that ``checkfu run`` never calls: provision, activate, exec,
clone (activated and released: ``release#1``), snapshot, deleteSnapshot, release (``release#2``), through
the public runner API, with the same state directory, journal and runner tag a ``checkfu run`` of this
environment would use.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from checkfu.core.door import ProviderDoor

REPO = Path(__file__).resolve().parents[2]
PROFILES = {
    "docker": REPO / "examples" / "profiles" / "busybox-none.toml",
    "host-process": REPO / "examples" / "profiles" / "host.toml",
}


def freeze_at(point: str) -> None:
    original = ProviderDoor._invoke
    seen: Counter[str] = Counter()

    resume = os.environ.get("KILLPOINT_RESUME_FILE")

    def stop(where: str) -> None:
        if where == point:
            print(f"killpoint {point}", file=sys.stderr, flush=True)
            deadline = time.monotonic() + 3600
            while time.monotonic() < deadline:  # the event loop itself stands still: nothing of the Run moves on
                if resume and os.path.exists(resume):
                    return  # KILLPOINT_RESUME_FILE: held only until the test makes that file
                time.sleep(0.02)

    async def _invoke(self: ProviderDoor, plan: Any) -> object:
        seen[plan.member] += 1
        step = f"{plan.member}#{seen[plan.member]}"
        stop(f"before:{step}")
        raw = await original(self, plan)
        stop(f"answered:{step}")
        return raw

    ProviderDoor._invoke = _invoke  # type: ignore[method-assign]


async def session(provider: str) -> None:
    """Provision, activate, exec, clone, snapshot; wind each up as a Session would."""
    from checkfu.cli.common import pin_image  # noqa: PLC0415
    from checkfu.cli.state import open_journal, runner_tag  # noqa: PLC0415
    from checkfu.core.job import host_platform_value  # noqa: PLC0415
    from checkfu.core.profiles import read_profile  # noqa: PLC0415
    from checkfu.core.registry import load_registry  # noqa: PLC0415
    from checkfu.core.runner import Runner  # noqa: PLC0415

    read = read_profile(PROFILES[provider], provider)
    assert not read.problems, read.problems
    profile = pin_image(read, provider, True)
    platform = host_platform_value()
    journal = open_journal(None)
    registry = await load_registry(entry_point_names=[provider], recorder=journal)
    (adapter,) = registry.adapters
    runner = Runner(registry, journal, runner_tag=runner_tag())
    attempt = runner.start(adapter.target, profile, platform=platform, command=["session"])
    s = attempt.session
    image = (await s.materialize(profile, platform)).image
    inst = await s.provision(profile, platform, image)
    await s.activate(inst)
    await s.exec(inst, ["sh", "-c", "echo kept > f"], timeout=30)
    twin = await s.clone(inst, profile, platform, image)
    await s.activate(twin)
    await s.release(twin)  # release#1
    snap = await s.snapshot(inst)
    await s.delete_snapshot(snap)
    await s.release(inst)  # release#2
    runner.finish(attempt, status="succeeded", exit_code=0)
    print("session done", file=sys.stderr, flush=True)


if __name__ == "__main__":
    point, mode, *rest = sys.argv[1:]
    freeze_at(point)
    if mode == "cli":
        from checkfu.cli import main

        sys.argv = ["checkfu", *rest]
        main()
    else:
        asyncio.run(session(rest[0]))
