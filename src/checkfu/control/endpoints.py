"""Reaching again the providers that journal rows name: installed providers by name, services by endpoint.

Every allocation, sandbox and snapshot is journaled with its target and its site. A provider
service's site is its endpoint (``checkfu.core.registry.endpoint``), so whoever must reach
it later (reconciliation, orphan reaping, a sandbox's time-to-live, a snapshot's expiry, the
next ``checkfu exec``) builds its adapter from the row, with the credential issued when that
endpoint was enrolled. An installed provider's adapter is loaded by its name as before; a
served one never stands in for it, nor it for a served one: the adapter that answers a row
is the one at the row's site.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from checkfu.contract.errors import SandboxError
from checkfu.core.door import Recorder
from checkfu.core.journal import Journal
from checkfu.core.registry import (
    Adapter,
    Registry,
    adapter_from_factory,
    add_or_close,
    endpoint,
    is_endpoint,
    load_registry,
)
from checkfu.wire.credentials import ENROLLED, Credential, CredentialError, read_credential

Wanted = tuple[str, str | None]
"""A provider's name and the site a row names (``None`` or ``''``: the one without a site)."""


def enrolled_credential(journal: Journal, url: str) -> Credential | None:
    """The credential issued when the service at ``url`` was enrolled, if it was and its file is readable."""
    try:
        where = endpoint(url)
    except SandboxError:
        return None
    row = journal.enrollment_at(where)
    if row is None or not row.credential_path:
        return None
    try:
        read = read_credential(Path(row.credential_path))
    except CredentialError:
        return None
    return None if read is None else Credential(read.secret, source=f"{ENROLLED} ({row.credential_path})")


async def remote_adapter(url: str, credential: Credential | None, *, recorder: Recorder | None = None) -> Adapter:
    """The adapter of the provider service at ``url``, placed at its endpoint.

    Raises:
        SandboxAdapterUnavailable: ``url`` is not a usable provider URL (field ``provider``).
        SandboxError: the service cannot be reached, refuses the credential, or its envelope does not decode.
    """
    from checkfu.wire.client import RemoteProvider  # noqa: PLC0415 - the wire client only when a URL is named

    where = endpoint(url)
    return await adapter_from_factory(lambda: RemoteProvider(where, credential), where, {}, recorder=recorder)


async def reach(
    journal: Journal,
    wanted: Iterable[Wanted],
    *,
    recorder: Recorder | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    credentials: Mapping[str, Credential | None] | None = None,
    config: Path | None = None,
) -> Registry:
    """A registry holding an adapter for each wanted (provider, site): the installed providers by name (loaded as
    ``load_registry`` loads them), and each service endpoint with its enrolled credential (or the one given in
    ``credentials`` for that endpoint). One that cannot be reached is recorded as unavailable at its site, never
    taken for empty. ``config``: an adapters file loaded with the installed providers."""
    wanted = list(wanted)
    names = sorted({name for name, site in wanted if not is_endpoint(site)})
    registry = (
        await load_registry(entry_point_names=names, options=options, recorder=recorder, config=config)
        if names or config is not None
        else Registry()
    )
    given = {endpoint(k): v for k, v in (credentials or {}).items()}
    for site in sorted({endpoint(str(site)) for _, site in wanted if is_endpoint(site)}):
        credential = given[site] if site in given else enrolled_credential(journal, site)
        try:
            await add_or_close(registry, await remote_adapter(site, credential, recorder=recorder))
        except SandboxError as exc:
            registry.mark_unavailable(site, f"{exc.code}: {exc.message}", site=site)
    return registry


def open_endpoints(journal: Journal, *, runner_tag: str | None = None) -> set[str]:
    """The endpoints of provider services that hold something open for ``runner_tag`` (every tag: ``None``)."""
    return {str(r.site) for r in journal.open_allocations(runner_tag=runner_tag) if is_endpoint(r.site)}


async def add_endpoints(
    registry: Registry, journal: Journal, sites: Iterable[str], *, recorder: Recorder | None = None
) -> Registry:
    """``registry`` with an adapter added for each endpoint in ``sites`` it lacks (with its enrolled credential);
    one that cannot be reached is recorded as unavailable at its site."""
    have = {a.site for a in registry.adapters}
    for site in sorted(set(sites) - have):
        try:
            await add_or_close(
                registry, await remote_adapter(site, enrolled_credential(journal, site), recorder=recorder)
            )
        except SandboxError as exc:
            registry.mark_unavailable(site, f"{exc.code}: {exc.message}", site=site)
    return registry
