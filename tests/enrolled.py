"""Enrolling a provider service for a test, as ``checkfu provider enroll`` leaves it after checking its evidence.

A provider service is never a test double, whatever placement it advertises: it is selected only once enrolled at
its endpoint. Tests about what comes after enrollment record the enrollment directly; enrollment itself (evidence,
ceilings, the credential it issues) is tested in ``tests/control``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from checkfu.contract.codec import digest
from checkfu.contract.target import ExecutionTarget
from checkfu.control.endpoints import remote_adapter
from checkfu.core.journal import Journal
from checkfu.core.registry import Adapter, Registry, enrollment_endpoint
from checkfu.wire.credentials import Credential


def enroll_adapter(journal: Journal, adapter: Adapter) -> None:
    """Record ``adapter`` (a provider service's, already described) as enrolled at its endpoint in ``journal``."""
    journal.record_enrollment(
        adapter.target,
        endpoint=enrollment_endpoint(adapter),
        source=adapter.source,
        kind="evidence",
        envelope_digest=digest(adapter.envelope),
        envelope=adapter.envelope.model_dump_json(),
        ceiling=adapter.ceiling.model_dump_json(),
        now=0.0,
    )


def enroll_service(db: str, url: str, credential_file: Path | None = None) -> ExecutionTarget:
    """Record the service at ``url`` as enrolled in the journal at ``db`` (its credential the one in
    ``credential_file``, which the runner then uses by itself); returns the target it advertises."""
    secret = credential_file.read_text().splitlines()[0].strip() if credential_file is not None else None

    async def describe() -> tuple[ExecutionTarget, str, str, str, str]:
        adapter = await remote_adapter(url, Credential(secret) if secret else None)
        try:
            env = adapter.envelope
            return env.target, adapter.site, digest(env), env.model_dump_json(), adapter.ceiling.model_dump_json()
        finally:
            close = getattr(adapter.provider, "close", None)
            if callable(close):
                close()

    target, endpoint, envelope_digest, envelope, ceiling = asyncio.run(describe())
    journal = Journal(db)
    try:
        journal.record_enrollment(
            target,
            endpoint=endpoint,
            source=url,
            kind="evidence",
            envelope_digest=envelope_digest,
            envelope=envelope,
            ceiling=ceiling,
            now=0.0,
            credential_path=str(credential_file) if credential_file is not None else None,
        )
    finally:
        journal.close()
    return target


def enroll_adapters(journal: Journal, registry: Registry) -> None:
    """Record every adapter of ``registry`` that is served as enrolled at its endpoint: the tests that call this are
    about what comes after enrollment."""
    for adapter in registry.adapters:
        if adapter.served:
            env = adapter.envelope
            journal.record_enrollment(
                env.target,
                endpoint=adapter.site,
                source=adapter.source,
                kind="evidence",
                envelope_digest=digest(env),
                envelope=env.model_dump_json(),
                ceiling=adapter.ceiling.model_dump_json(),
                now=0.0,
            )
