"""B11: the per-attempt cost of envelope decode (and, later, selection among 1000 adapters).

B11a decodes the Docker-parity example envelope with ``decode`` (strict JSON
pre-pass for duplicate keys and NaN, then the pydantic model and every
cross-field rule) and sets it beside ``json.loads`` of the same bytes, the floor
any decoder pays to read the document at all. Each sample times a batch of
``BATCH`` decodes and reports the time per decode, so the timer and the
harness's own call overhead stay small beside what is measured.
"""

from __future__ import annotations

import json
import statistics

from harness import Figure, interleave, summarize

from checkfu.contract import SandboxProviderCapabilities, decode, encode
from checkfu.contract import examples as ex

NAMES = ["B11"]

N = 2000
"""Samples per side."""
WARMUP = 200
BATCH = 10
"""Decodes per sample."""
TARGET_SECONDS = 100e-6


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


async def run() -> list[Figure]:
    return [await envelope_decode()]
