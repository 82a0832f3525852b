"""Adapters, the trust each one is given, and exact selection.

Adapters come from entry points in the group ``checkfu.providers`` (each a factory
``create(**options) -> Provider``) and from an adapters file. Selection is exact:
the one adapter whose ``(provider, provider_revision, materialization_revision,
placement)`` equals the attempt's target. None is ``SandboxAdapterUnavailable``,
two are ``SandboxAdapterAmbiguous``; neither falls back.

Trust is declared, never guessed. ``IN_TREE_PROVIDERS`` lists this package's own
providers. An adapter is in-tree when it came from this distribution's own entry
point of that name and its provider is exactly the declared class; test doubles
(``memory``, the misbehaving providers) never are, and anything from an adapters
file, another distribution or a URL is a third party, whatever module its
factory lives in. Each adapter is held to a server-owned ceiling
(``checkfu.contract.ceiling``): the in-tree one admits ``runner_enforced``; the
third-party one does not, nor an egress grade above ``advisory_filter``. A
``Registry`` only grows through its checked ``add``, which refuses, by name, every
claim above the adapter's ceiling.

A provider service reached by URL is placed at its *endpoint*: the adapter's site is
the URL in one canonical spelling (``endpoint``), so every allocation it makes is
journaled with where it lives, and reconciliation, reaping and expiry can reach it
again (``checkfu.control.endpoints``). Any provider object that says it is served
(``service_url``) is given that site, whoever built it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import os
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import MappingProxyType
from typing import Any

from checkfu.contract.ceiling import IN_TREE, THIRD_PARTY, RunnerProviderCapability, overreach
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import (
    SandboxAdapterAmbiguous,
    SandboxAdapterUnavailable,
    SandboxEnrollmentRefused,
    SandboxError,
    SandboxProviderFailed,
)
from checkfu.contract.provider import Provider
from checkfu.contract.target import ExecutionTarget
from checkfu.core.documents import DocumentError, parse_toml, read_bounded
from checkfu.core.door import ProviderDoor, ProviderFault, Recorder
from checkfu.core.session import describe_plan

ENTRY_POINT_GROUP = "checkfu.providers"
DISTRIBUTION = "checkfu"
ADAPTERS_ENV = "CHECKFU_ADAPTERS"
"""Names an adapters file the commands that build a registry load when given no ``--adapters FILE``."""


@dataclass(frozen=True)
class InTree:
    """One of this package's own providers: its entry point's factory and the exact class it builds."""

    factory: str
    provider_class: str


IN_TREE_PROVIDERS: Mapping[str, InTree] = MappingProxyType(
    {
        "docker": InTree("checkfu.providers.docker:create", "checkfu.providers.docker.provider:DockerProvider"),
        "host-process": InTree(
            "checkfu.providers.host_process:create", "checkfu.providers.host_process.provider:HostProcessProvider"
        ),
    }
)
"""The in-tree adapters, by provider name. Nothing else may claim ``runner_enforced``."""

TargetKey = tuple[str, str, str, str]

ENDPOINT_MAX = 256
"""The longest endpoint the journal keeps (its ``site`` columns): a longer provider URL is refused by name."""


def is_endpoint(site: str | None) -> bool:
    """Whether ``site`` is a provider service's endpoint (an ``http(s)://`` URL) rather than a Docker engine's
    name (which never holds a ``:``)."""
    return bool(site) and str(site).startswith(("http://", "https://"))


def endpoint(url: str) -> str:
    """The one spelling of a provider service's URL in the journal: scheme and host lowercased, no default port,
    no trailing ``/``, no query or fragment.

    Raises:
        SandboxAdapterUnavailable: not an ``http(s)://HOST`` URL, or longer than ``ENDPOINT_MAX`` (field
            ``provider``).
    """
    text = url.strip()
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise SandboxAdapterUnavailable(f"{text[:120]!r} is not a provider URL: {exc}", field="provider") from None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if scheme not in ("http", "https") or not host:
        raise SandboxAdapterUnavailable(
            f"{text[:120]!r} is not a provider URL (http://HOST[:PORT] or https://HOST[:PORT])", field="provider"
        )
    if ":" in host:
        host = f"[{host}]"
    default = 443 if scheme == "https" else 80
    netloc = host if port in (None, default) else f"{host}:{port}"
    if parts.username or parts.password:
        raise SandboxAdapterUnavailable(
            "a provider URL may not carry a user or password: give the credential with --credential-file",
            field="provider",
        )
    canonical = f"{scheme}://{netloc}{parts.path.rstrip('/')}"
    if len(canonical) > ENDPOINT_MAX:
        raise SandboxAdapterUnavailable(
            f"the provider URL is {len(canonical)} characters; the journal keeps at most {ENDPOINT_MAX}",
            field="provider",
        )
    return canonical


def enrollment_endpoint(adapter: Adapter) -> str:
    """What an enrollment of ``adapter`` is keyed by besides its target: its endpoint, or ``""`` for a provider
    loaded in this process."""
    return adapter.site if is_endpoint(adapter.site) else ""


def target_key(t: ExecutionTarget) -> TargetKey:
    return (t.provider, t.provider_revision, t.materialization_revision, t.placement)


@dataclass(frozen=True)
class Adapter:
    """A provider with its decoded envelope. ``in_tree`` is a claim that ``Registry.add`` verifies."""

    envelope: SandboxProviderCapabilities
    provider: Provider
    source: str
    in_tree: bool = False
    site: str = ""
    """Which of several placements of the same target this is (a Docker engine's name); empty when there is one.
    Every allocation is journaled with its site, and compensated and enumerated there. For a provider service,
    its endpoint (``endpoint``)."""
    door: ProviderDoor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        served = getattr(self.provider, "service_url", None)
        if isinstance(served, str) and not is_endpoint(self.site):  # a service is placed at its endpoint, always
            object.__setattr__(self, "site", endpoint(served))
        object.__setattr__(self, "door", ProviderDoor(self.provider, source=self.source))

    @property
    def target(self) -> ExecutionTarget:
        return self.envelope.target

    @property
    def served(self) -> bool:
        """Whether this is a provider service reached over the wire (its site is its endpoint)."""
        return is_endpoint(self.site)

    @property
    def ceiling(self) -> RunnerProviderCapability:
        """The ceiling this adapter is held to (a claim of in-tree trust is checked by ``Registry.add``)."""
        return IN_TREE if self.in_tree else THIRD_PARTY


def _declared_class(name: str) -> type | None:
    entry = IN_TREE_PROVIDERS.get(name)
    if entry is None:
        return None
    module, _, attr = entry.provider_class.partition(":")
    found = getattr(importlib.import_module(module), attr, None)
    return found if isinstance(found, type) else None


def in_tree_refusal(adapter: Adapter) -> str | None:
    """Why ``adapter`` may not be trusted as in-tree, or ``None`` when it is one of this package's own."""
    name = adapter.envelope.provider
    if name not in IN_TREE_PROVIDERS:
        return f"{name!r} is not one of this package's providers ({', '.join(IN_TREE_PROVIDERS)})"
    cls = _declared_class(name)
    if cls is None or type(adapter.provider) is not cls:
        return f"its provider is a {type(adapter.provider).__name__}, not this package's own {name} provider"
    return None


class Registry:
    """Adapters by exact target, plus why any configured adapter could not be loaded."""

    def __init__(self) -> None:
        self._adapters: list[Adapter] = []
        self._unavailable: dict[str, str] = {}
        self._index: dict[TargetKey, list[Adapter]] = {}
        self._down_sites: dict[str, str] = {}

    @property
    def adapters(self) -> tuple[Adapter, ...]:
        return tuple(self._adapters)

    @property
    def unavailable(self) -> Mapping[str, str]:
        """Why each configured adapter that is not here could not be added, by source."""
        return MappingProxyType(self._unavailable)

    def add(self, adapter: Adapter) -> None:
        """Register an adapter, after checking the trust it claims and every claim against its ceiling.

        Raises:
            SandboxEnrollmentRefused: it claims to be in-tree and is not; or its envelope claims more than its
                ceiling allows (a third party claiming ``runner_enforced``, say), naming every axis and field.
        """
        if adapter.in_tree:
            why = in_tree_refusal(adapter)
            if why is not None:
                raise SandboxEnrollmentRefused(f"{adapter.source}: claims to be in-tree, but {why}", field="provider")
        over = overreach(adapter.envelope, adapter.ceiling)
        if over:
            who = "an in-tree provider" if adapter.in_tree else "a provider that is not in-tree"
            lead = (
                f"{who} may not claim runner_enforced (claimed on "
                f"{', '.join(o.field.removeprefix('enforcement.') for o in over if o.claimed == 'runner_enforced')}); "
                if any(o.claimed == "runner_enforced" for o in over)
                else ""
            )
            raise SandboxEnrollmentRefused(
                f"{adapter.source}: {lead}claims more than its ceiling allows: {'; '.join(map(str, over))}",
                field=over[0].field,
            )
        self._adapters.append(adapter)
        self._index.setdefault(target_key(adapter.target), []).append(adapter)

    @property
    def down_sites(self) -> Mapping[str, str]:
        """Sites that were configured but could not be reached, with why: never to be taken for empty."""
        return MappingProxyType(self._down_sites)

    def mark_unavailable(self, source: str, reason: str, *, site: str = "") -> None:
        self._unavailable[source] = reason
        if site:
            self._down_sites[site] = reason

    def sites(self, target: ExecutionTarget) -> list[Adapter]:
        """Every adapter advertising exactly ``target``: one, or one per site when it has several placements."""
        return list(self._index.get(target_key(target), []))

    def at(self, target: ExecutionTarget, site: str | None) -> Adapter | None:
        """The adapter of ``target`` at ``site`` (``None`` or empty: the one without a site), if loaded."""
        for adapter in self._index.get(target_key(target), []):
            if adapter.site == (site or ""):
                return adapter
        return None

    def select(self, target: ExecutionTarget) -> Adapter:
        """The one adapter advertising exactly ``target``.

        Raises:
            SandboxAdapterUnavailable: no adapter advertises it.
            SandboxAdapterAmbiguous: more than one does.
        """
        found = self._index.get(target_key(target), [])
        if len(found) == 1:
            return found[0]
        if not found:
            known = ", ".join(str(a.target) for a in self._adapters[:10]) or "none"
            why = "".join(f"; {name}: {reason}" for name, reason in self._unavailable.items())
            raise SandboxAdapterUnavailable(f"no adapter advertises {target} (available: {known}{why})", field="target")
        sources = ", ".join(a.source for a in found)
        raise SandboxAdapterAmbiguous(f"{len(found)} adapters advertise {target}: {sources}", field="target")

    def by_provider(self, provider: str) -> list[Adapter]:
        return [a for a in self._adapters if a.envelope.provider == provider]

    def ambiguity(self, provider: str | None = None) -> SandboxAdapterAmbiguous | None:
        """Why the adapters (of ``provider``, or all) cannot be told apart, or ``None`` when they can: two adapters
        advertising one target at one site (an adapters file loading an installed provider again, say), or, for
        ``provider``, several targets under that one name (selection by name would have to guess)."""
        found = self._adapters if provider is None else self.by_provider(provider)
        if provider is not None and len({target_key(a.target) for a in found}) > 1:
            listing = "; ".join(f"{a.target} from {a.source}" for a in found)
            return SandboxAdapterAmbiguous(
                f"{len({target_key(a.target) for a in found})} different targets of provider {provider!r}: "
                f"{listing}; keep one (remove the others from the adapters file)",
                field="provider",
            )
        placed: dict[tuple[TargetKey, str], list[Adapter]] = {}
        for a in found:
            placed.setdefault((target_key(a.target), a.site), []).append(a)
        for same in placed.values():
            if len(same) > 1:
                sources = ", ".join(a.source for a in same)
                return SandboxAdapterAmbiguous(
                    f"{len(same)} adapters advertise {same[0].target}: {sources}; remove the duplicate from the "
                    "adapters file (it may load an installed provider again)",
                    field="target",
                )
        return None


Factory = Callable[..., Provider]


async def describe(door: ProviderDoor, *, recorder: Recorder | None = None) -> SandboxProviderCapabilities:
    """The provider's envelope, decoded strictly, through the door.

    Raises:
        SandboxEnvelopeInvalid: the envelope does not decode or breaks a rule.
        SandboxProviderTimeout: ``describe`` did not answer within its deadline.
        SandboxProviderFailed: ``describe`` itself failed (naming the code the provider raised).
    """
    try:
        return (await door.call(describe_plan(door.source), recorder=recorder)).value
    except ProviderFault as fault:
        raise fault.error from None


async def adapter_from_factory(
    factory: Factory,
    source: str,
    options: Mapping[str, Any],
    *,
    in_tree: bool = False,
    recorder: Recorder | None = None,
    site: str = "",
) -> Adapter:
    """Build a provider and ask it for its envelope. ``in_tree`` is a claim ``Registry.add`` checks."""
    try:
        provider = factory(**options)
    except SandboxError:
        raise
    except Exception as exc:
        raise SandboxProviderFailed(f"{source}: cannot start: {type(exc).__name__}: {exc}") from None
    try:
        served = getattr(provider, "service_url", None)
        if isinstance(served, str):
            site = endpoint(served)
        envelope = await describe(ProviderDoor(provider, source=source), recorder=recorder)
    except BaseException:
        await close_provider(provider)
        raise
    return Adapter(envelope=envelope, provider=provider, source=source, in_tree=in_tree, site=site)


async def close_provider(provider: object) -> None:
    """Let a provider go: its ``aclose()`` (a wire client's pool) or ``close()`` (the Docker tier's client and
    threads), whichever it has. Sandboxes are left as they are; a provider that fails to close is let go anyway
    (its connections close when it is collected), so one bad close never stops the others."""
    aclose = getattr(provider, "aclose", None)
    close = getattr(provider, "close", None)
    with contextlib.suppress(Exception):
        if callable(aclose):
            await aclose()
        elif callable(close):
            await asyncio.to_thread(close)  # it may wait for locks (the Docker tier's spools): not on the loop


async def add_or_close(registry: Registry, adapter: Adapter) -> None:
    """``registry.add(adapter)``; an adapter it refuses is closed at once, since nothing will ever hold it.

    Raises:
        SandboxEnrollmentRefused: as ``Registry.add``.
    """
    try:
        registry.add(adapter)
    except BaseException:
        await close_provider(adapter.provider)
        raise


async def close_adapters(adapters: Iterable[Adapter]) -> None:
    """``close_provider`` for each distinct provider of ``adapters``."""
    seen: set[int] = set()
    for adapter in adapters:
        if id(adapter.provider) not in seen:
            seen.add(id(adapter.provider))
            await close_provider(adapter.provider)


def _ours(ep: EntryPoint) -> bool:
    """Whether ``ep`` is this distribution's own entry point for one of its in-tree providers."""
    entry = IN_TREE_PROVIDERS.get(ep.name)
    dist = getattr(ep, "dist", None)
    return entry is not None and ep.value == entry.factory and dist is not None and dist.name == DISTRIBUTION


@functools.cache
def installed_entry_points() -> tuple[EntryPoint, ...]:
    """The entry points of ``ENTRY_POINT_GROUP``, read from the installed distributions' metadata once per process
    (a scan of every distribution: a start-up server reads them once for all its commands, and a new installation
    gives a new server, ``checkfu.cli.startup.code_key``)."""
    return tuple(entry_points(group=ENTRY_POINT_GROUP))


def check_provider_name(provider: str, adapters: Path | None) -> None:
    """Refuse, before anything else is read or asked, a provider name nothing here can serve: not a provider
    service's URL, not installed, and no adapters file (``adapters``) that might name it.

    Raises:
        SandboxAdapterUnavailable: no provider of that name is installed (field ``provider``; the message names the
            installed ones).
    """
    if is_endpoint(provider) or adapters is not None:
        return
    installed = sorted({ep.name for ep in installed_entry_points()})
    if provider not in installed:
        raise SandboxAdapterUnavailable(
            f"provider: no provider named {provider!r} (installed: {', '.join(installed) or 'none'})", field="provider"
        )


def entry_point_factories(names: Iterable[str] | None = None) -> dict[str, tuple[Factory, bool]]:
    """Factories by entry point name, each with whether it is one of this package's in-tree providers."""
    wanted = set(names) if names is not None else None
    out: dict[str, tuple[Factory, bool]] = {}
    for ep in installed_entry_points():
        if wanted is None or ep.name in wanted:
            out[ep.name] = (_lazy(ep), _ours(ep))
    return out


def _lazy(ep: EntryPoint) -> Factory:
    """A factory that imports its entry point when called, so a broken plugin fails only its own adapter."""

    def create(**options: Any) -> Provider:
        factory: Factory = ep.load()
        return factory(**options)

    return create


def _resolve_factory(spec: str) -> Factory:
    """An adapters-file factory: ``module:callable`` or an entry point name. Never in-tree."""
    if ":" in spec:
        module, attr = spec.split(":", 1)
        factory: Factory = getattr(importlib.import_module(module), attr)
        return factory
    found = entry_point_factories([spec])
    if spec not in found:
        raise SandboxAdapterUnavailable(f"no provider entry point named {spec!r}", field="factory")
    return found[spec][0]


def adapters_file(given: Path | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The adapters file a command loads: ``given`` (``--adapters FILE``), else the one ``CHECKFU_ADAPTERS`` names,
    else none."""
    if given is not None:
        return given
    value = (os.environ if environ is None else environ).get(ADAPTERS_ENV, "").strip()
    return Path(value) if value else None


def read_adapters_file(config: Path) -> list[tuple[str, dict[str, Any]]]:
    """The ``(factory, options)`` of each ``[[adapters]]`` table of an adapters file, read bounded.

    Raises:
        SandboxAdapterUnavailable: the file cannot be read, is not TOML, or is not shaped as adapters
            tables (naming the file and the table at fault).
    """
    try:
        raw = read_bounded(config)
    except DocumentError as exc:
        raise SandboxAdapterUnavailable(f"cannot read adapters file: {exc}", field="config") from None
    return decode_adapters(raw, config)


def decode_adapters(raw: bytes, config: Path | str) -> list[tuple[str, dict[str, Any]]]:
    """The ``(factory, options)`` of each ``[[adapters]]`` table of the adapters file ``config`` holding ``raw``.

    Raises:
        SandboxAdapterUnavailable: not TOML, or not shaped as adapters tables (naming the file and the table).
    """
    try:
        doc = parse_toml(raw, config)
    except DocumentError as exc:
        raise SandboxAdapterUnavailable(f"cannot read adapters file: {exc}", field="config") from None
    return parse_adapters(doc, config)


def parse_adapters(doc: Mapping[str, Any], config: Path | str) -> list[tuple[str, dict[str, Any]]]:
    """The adapters tables of a parsed adapters file.

    Raises:
        SandboxAdapterUnavailable: ``adapters`` is not an array of tables, a table has no string ``factory``,
            its ``options`` is not a table, or the file has a key besides ``adapters``.
    """
    unknown = sorted(set(doc) - {"adapters"})
    if unknown:
        raise SandboxAdapterUnavailable(
            f"adapters file {config}: unknown key {unknown[0][:80]!r} (only [[adapters]] tables)", field="config"
        )
    tables = doc.get("adapters", [])
    if not isinstance(tables, list):
        raise SandboxAdapterUnavailable(f"adapters file {config}: adapters must be [[adapters]] tables", field="config")
    out: list[tuple[str, dict[str, Any]]] = []
    for i, table in enumerate(tables):
        where = f"adapters file {config}: adapters.{i}"
        if not isinstance(table, dict):
            raise SandboxAdapterUnavailable(f"{where} is not a table", field=f"adapters.{i}")
        factory, opts = table.get("factory"), table.get("options", {})
        if not isinstance(factory, str) or not factory:
            raise SandboxAdapterUnavailable(
                f"{where}.factory must be a non-empty string", field=f"adapters.{i}.factory"
            )
        if not isinstance(opts, dict):
            raise SandboxAdapterUnavailable(f"{where}.options must be a table", field=f"adapters.{i}.options")
        extra = sorted(set(table) - {"factory", "options"})
        if extra:
            raise SandboxAdapterUnavailable(f"{where}: unknown key {extra[0][:80]!r}", field=f"adapters.{i}")
        out.append((factory, opts))
    return out


async def load_registry(
    *,
    entry_point_names: Iterable[str] | None = None,
    config: Path | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    recorder: Recorder | None = None,
    sites: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> Registry:
    """Build a registry from entry points (all, or the named ones) and an adapters file.

    The adapters file is TOML: ``[[adapters]]`` tables with ``factory`` (an entry point
    name or ``module:callable``) and optional ``options``. An adapter that fails to start
    is recorded in ``unavailable`` with its reason rather than failing the whole load.
    Every ``describe`` is recorded through ``recorder`` when one is given.

    ``sites`` places one entry point at several sites (a Docker engine each): for every
    mapping in ``sites[name]``, one adapter from that entry point, built with ``options[name]``
    plus that mapping, whose ``"site"`` names the site. A site that cannot be reached is in
    ``unavailable`` and ``down_sites``.
    """
    registry = Registry()
    specs: list[tuple[str, Factory | str, Mapping[str, Any], bool, str]] = []
    for name, (factory, ours) in entry_point_factories(entry_point_names).items():
        common = (options or {}).get(name, {})
        placed = (sites or {}).get(name)
        if not placed:
            specs.append((f"entry point {name}", factory, common, ours, ""))
            continue
        for place in placed:
            site = str(place["site"])
            specs.append((f"entry point {name} at {site}", factory, {**common, **place}, ours, site))
    if config is not None:
        for i, (named, given) in enumerate(read_adapters_file(config)):
            specs.append((f"{config}#{i}", named, given, False, ""))
    for source, spec, opts, ours, site in specs:
        try:
            resolved = _resolve_factory(spec) if isinstance(spec, str) else spec
            adapter = await adapter_from_factory(resolved, source, opts, in_tree=ours, recorder=recorder, site=site)
            await add_or_close(registry, adapter)
        except SandboxError as exc:
            registry.mark_unavailable(source, f"{exc.code}: {exc.message}", site=site)
        except (ImportError, AttributeError) as exc:
            named = f" {spec}" if isinstance(spec, str) else ""
            registry.mark_unavailable(source, f"cannot import{named}: {exc}", site=site)
    return registry
