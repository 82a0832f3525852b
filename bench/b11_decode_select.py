"""B11: the per-attempt cost of envelope decode, selection among 1000 adapters and the profile check.

B11a decodes the Docker-parity example envelope with ``decode`` (strict JSON
pre-pass for duplicate keys and NaN, then the pydantic model and every
cross-field rule) and sets it beside ``json.loads`` of the same bytes, the floor
any decoder pays to read the document at all. Each sample times a batch of
``BATCH`` decodes and reports the time per decode, so the timer and the
harness's own call overhead stay small beside what is measured.

B11b is one whole attempt: decode the envelope, select the one adapter whose
exact target matches among ``ADAPTERS`` registered adapters (``Runner.select``:
the registry lookup, then ``require_capabilities`` of the profile and attempt
against that adapter's envelope; no provider call). The target cycles over the
registered adapters. Beside it, the floor: ``json.loads`` of the same envelope
and a dict lookup of the target tuple.
"""

from __future__ import annotations

import itertools
import json
import statistics

from harness import Figure, interleave, summarize

from checkfu.contract import SandboxProviderCapabilities, decode, encode
from checkfu.contract import examples as ex
from checkfu.contract.vocabulary import Platform
from checkfu.core.journal import Journal
from checkfu.core.registry import Adapter, Registry, target_key
from checkfu.core.runner import Runner
from checkfu.testing import MemoryProvider, memory_envelope, memory_profile

NAMES = ["B11"]

N = 2000
"""Samples per side."""
WARMUP = 200
BATCH = 10
"""Decodes per sample."""
TARGET_SECONDS = 100e-6
ADAPTERS = 1000


async def envelope_decode() -> Figure:
    raw = json.dumps(ex.parity_envelope()).encode()
    expected = decode(SandboxProviderCapabilities, raw)
    if decode(SandboxProviderCapabilities, encode(expected)) != expected:
        raise SystemExit("the parity envelope does not round-trip; refusing to time a broken decoder")

    def ours() -> None:
        for _ in range(BATCH):
            decode(SandboxProviderCapabilities, raw)

    def floor() -> None:
        for _ in range(BATCH):
            json.loads(raw)

    a, b = await interleave(ours, floor, n=N, warmup=WARMUP)
    per_a = [t / BATCH for t in a]
    per_b = [t / BATCH for t in b]
    fig = summarize(
        "B11a envelope decode",
        per_a,
        per_b,
        target="<=100us p50 per attempt",
        met=lambda _ratio, ours_times, _raw: statistics.median(ours_times) <= TARGET_SECONDS,
    )
    fig.extra.update(batch=BATCH, document_bytes=len(raw), warmup=WARMUP)
    return fig


async def attempt_select() -> Figure:
    registry = Registry()
    base = json.loads(memory_envelope().model_dump_json())
    raws: list[bytes] = []
    for i in range(ADAPTERS):
        raw = json.dumps({**base, "provider": f"bench-{i:04d}", "provider_revision": f"bench {i}"}).encode()
        env = decode(SandboxProviderCapabilities, raw)
        registry.add(Adapter(envelope=env, provider=MemoryProvider(env), source=f"bench {i}"))
        raws.append(raw)
    journal = Journal("sqlite://")
    try:
        runner = Runner(registry, journal, runner_tag="bench-b11")
        profile = memory_profile()
        platform = Platform(os="linux", architecture="amd64")
        index = {target_key(a.target): a for a in registry.adapters}
        for i, raw in enumerate(raws):  # selection is right for every adapter before any of it is timed
            env = decode(SandboxProviderCapabilities, raw)
            if runner.select(env.target, profile, platform=platform, mount_count=1) is not registry.adapters[i]:
                raise SystemExit(f"selection picked the wrong adapter for bench-{i:04d}; refusing to time it")
        order = itertools.cycle(range(0, ADAPTERS, 7))

        def ours() -> None:
            for _ in range(BATCH):
                env = decode(SandboxProviderCapabilities, raws[next(order)])
                runner.select(env.target, profile, platform=platform, mount_count=1)

        def floor() -> None:
            for _ in range(BATCH):
                doc = json.loads(raws[next(order)])
                key = (doc["provider"], doc["provider_revision"], doc["materialization_revision"], doc["placement"])
                assert index[key] is not None

        a, b = await interleave(ours, floor, n=N, warmup=WARMUP)
    finally:
        journal.close()
    providers_called = sum(len(a.provider.calls) for a in registry.adapters if isinstance(a.provider, MemoryProvider))
    fig = summarize(
        "B11b attempt: envelope decode + selection among 1000 + profile check",
        [t / BATCH for t in a],
        [t / BATCH for t in b],
        target="<=100us p50 per attempt",
        met=lambda _ratio, ours_times, _raw: statistics.median(ours_times) <= TARGET_SECONDS,
    )
    fig.extra.update(batch=BATCH, adapters=ADAPTERS, warmup=WARMUP, provider_calls=providers_called)
    return fig


async def run() -> list[Figure]:
    return [await envelope_decode(), await attempt_select()]
