"""B12: reconciliation of 10 000 unsettled allocations on the memory provider.

Set-up (not timed): the memory provider allocates 10 000 instances labelled with
this runner's tag, and the journal holds each as ``pending`` (bulk-inserted), ten
to a Run, under leases that expired long ago. Ours: one ``reconcile`` pass
(takeover, ``compensate(allocation_key)``, settlement, then the enumeration
sweep), timed; then a second pass, which must find nothing to do. Raw, beside it:
the same provider state compensated by calling ``compensate`` for each key
directly, with no journal, no leases and no checks: the provider's own share.

Target: the pass takes at most 10 s, leaves nothing in the provider, and the
second pass finds nothing to do (``second_pass_nothing_to_do``). Set
``CHECKFU_BENCH_ALLOCATIONS`` to change the count.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from harness import Figure

from checkfu.contract.members import CompensateRequest
from checkfu.core.clock import ManualClock, SystemClock
from checkfu.core.journal import Journal, allocations, sqlite_url
from checkfu.core.leases import LeaseStore
from checkfu.core.reconcile import reconcile
from checkfu.core.registry import Adapter, Registry
from checkfu.testing import MemoryProvider, Requests

NAMES = ["B12"]

TAG = "bench-b12"
PER_RUN = 10
TARGET_SECONDS = 10.0


def count() -> int:
    return int(os.environ.get("CHECKFU_BENCH_ALLOCATIONS", "10000"))


async def allocate(memory: MemoryProvider, keys: list[str]) -> None:
    requests = Requests(memory.target, runner_tag=TAG)
    image = (await memory.materialize(requests.materialize())).image
    for key in keys:
        await memory.provision(requests.provision(key, image))


def journal_pending(journal: Journal, memory: MemoryProvider, keys: list[str]) -> None:
    """Ten allocations to a Run, each Run's lease expired long ago; one bulk insert."""
    past = ManualClock(start=time.time() - 86_400)
    store = LeaseStore(journal, past, ttl=60.0)
    target = memory.target.model_dump_json()
    rows = []
    for start in range(0, len(keys), PER_RUN):
        run_id = f"run-b12-{start // PER_RUN:05d}"
        lease = store.acquire(run_id)
        for key in keys[start : start + PER_RUN]:
            rows.append(
                {
                    "allocation_key": key,
                    "run_id": run_id,
                    "kind": "instance",
                    "target": target,
                    "runner_tag": TAG,
                    "lease_id": lease.lease_id,
                    "state": "pending",
                    "object_id": None,
                    "parent_key": None,
                    "created_at": past.now(),
                    "updated_at": past.now(),
                }
            )
    with journal.tx() as c:
        c.execute(allocations.insert(), rows)


async def run() -> list[Figure]:
    n = count()
    keys = [f"ak-b12-{i:06d}" for i in range(n)]

    raw_memory = MemoryProvider()
    await allocate(raw_memory, keys)
    requests = Requests(raw_memory.target, runner_tag=TAG)
    t0 = time.perf_counter()
    for key in keys:
        await raw_memory.compensate(CompensateRequest(**requests.call(), allocation_key=key, runner_tag=TAG))
    raw_seconds = time.perf_counter() - t0
    if raw_memory.live_objects():
        raise SystemExit("the raw compensation left objects behind; refusing to report")

    memory = MemoryProvider()
    await allocate(memory, keys)
    registry = Registry()
    registry.add(Adapter(envelope=memory.envelope, provider=memory, source="bench"))
    with tempfile.TemporaryDirectory(prefix="checkfu-b12-") as tmp:
        journal = Journal(sqlite_url(Path(tmp) / "journal.sqlite"))
        try:
            journal_pending(journal, memory, keys)
            t0 = time.perf_counter()
            first = await reconcile(journal, registry, SystemClock(), runner_tag=TAG)
            ours_seconds = time.perf_counter() - t0
            t0 = time.perf_counter()
            second = await reconcile(journal, registry, SystemClock(), runner_tag=TAG)
            second_seconds = time.perf_counter() - t0
            still_open = len(journal.open_allocations(runner_tag=TAG))
        finally:
            journal.close()
    left = len(memory.live_objects())
    settled = len(first.compensated) + len(first.enumerated)
    met = ours_seconds <= TARGET_SECONDS and second.nothing_to_do and left == 0 and still_open == 0
    return [
        Figure(
            name=f"B12 reconcile {n} unsettled allocations",
            ours_p50=ours_seconds,
            raw_p50=raw_seconds,
            ratio=ours_seconds / raw_seconds if raw_seconds > 0 else None,
            target="<=10s, second pass nothing to do",
            met=met,
            n=1,
            extra={
                "compensated": len(first.compensated),
                "enumerated": len(first.enumerated),
                "failed": len(first.failed),
                "skipped": len(first.skipped),
                "settled_first_pass": settled,
                "second_pass_nothing_to_do": second.nothing_to_do,
                "second_pass_compensated": len(second.compensated) + len(second.enumerated),
                "second_pass_s": second_seconds,
                "open_after": still_open,
                "left_behind": left,
                "runner_share_s": ours_seconds - raw_seconds,
                "journal": "sqlite file",
            },
        )
    ]
