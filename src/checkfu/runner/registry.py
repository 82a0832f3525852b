"""Adapters and exact selection.

Adapters come from entry points in the group ``checkfu.providers`` (each a factory
``create(**options) -> Provider``) and from an adapters file. Selection is exact:
the one adapter whose ``(provider, provider_revision, materialization_revision,
placement)`` equals the attempt's target. None is ``SandboxAdapterUnavailable``,
two are ``SandboxAdapterAmbiguous``; neither falls back.
"""

from __future__ import annotations

import asyncio
import importlib
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from checkfu.contract.codec import revalidate
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import (
    SandboxAdapterAmbiguous,
    SandboxAdapterUnavailable,
    SandboxEnrollmentRefused,
    SandboxEnvelopeInvalid,
    SandboxError,
    SandboxProviderFailed,
    SandboxProviderTimeout,
)
from checkfu.contract.members import DescribeResult
from checkfu.contract.provider import Provider
from checkfu.contract.target import ExecutionTarget
from checkfu.runner.deadlines import DEFAULT_DEADLINES

ENTRY_POINT_GROUP = "checkfu.providers"
IN_TREE_PREFIXES = ("checkfu.providers.", "checkfu.testing.")

TargetKey = tuple[str, str, str, str]


def target_key(t: ExecutionTarget) -> TargetKey:
    return (t.provider, t.provider_revision, t.materialization_revision, t.placement)


@dataclass(frozen=True)
class Adapter:
    envelope: SandboxProviderCapabilities
    provider: Provider
    source: str
    in_tree: bool

    @property
    def target(self) -> ExecutionTarget:
        return self.envelope.target


@dataclass
class Registry:
    """Adapters by exact target, plus why any configured adapter could not be loaded."""

    adapters: list[Adapter] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    _index: dict[TargetKey, list[Adapter]] = field(default_factory=dict)

    def add(self, adapter: Adapter) -> None:
        """Register an adapter. A non-in-tree adapter claiming ``runner_enforced`` is refused.

        Raises:
            SandboxEnrollmentRefused: naming every axis claimed ``runner_enforced`` by a third party.
        """
        if not adapter.in_tree:
            claimed = adapter.envelope.enforcement.runner_enforced()
            if claimed:
                raise SandboxEnrollmentRefused(
                    f"{adapter.source}: a provider that is not in-tree may not claim runner_enforced "
                    f"(claimed on {', '.join(claimed)})",
                    field=f"enforcement.{claimed[0]}",
                )
        self.adapters.append(adapter)
        self._index.setdefault(target_key(adapter.target), []).append(adapter)

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
            known = ", ".join(str(a.target) for a in self.adapters[:10]) or "none"
            why = "".join(f"; {name}: {reason}" for name, reason in self.unavailable.items())
            raise SandboxAdapterUnavailable(f"no adapter advertises {target} (available: {known}{why})", field="target")
        sources = ", ".join(a.source for a in found)
        raise SandboxAdapterAmbiguous(f"{len(found)} adapters advertise {target}: {sources}", field="target")

    def by_provider(self, provider: str) -> list[Adapter]:
        return [a for a in self.adapters if a.envelope.provider == provider]


Factory = Callable[..., Provider]


async def describe(provider: Provider, source: str) -> SandboxProviderCapabilities:
    """The provider's envelope, decoded strictly.

    Raises:
        SandboxEnvelopeInvalid: the envelope does not decode or breaks a rule.
        SandboxProviderTimeout: ``describe`` did not answer within its deadline.
        SandboxProviderFailed: ``describe`` itself failed.
    """
    deadline = DEFAULT_DEADLINES["describe"]
    try:
        result = await asyncio.wait_for(provider.describe(), timeout=deadline)
    except TimeoutError:
        raise SandboxProviderTimeout(f"{source}: describe did not answer within {deadline:g} s") from None
    except SandboxError:
        raise
    except Exception as exc:
        raise SandboxProviderFailed(f"{source}: describe failed: {type(exc).__name__}: {exc}") from None
    try:
        checked = revalidate(DescribeResult, result)
    except SandboxError as exc:
        raise SandboxEnvelopeInvalid(f"{source}: {exc.message}", field=exc.field) from None
    return checked.envelope


async def adapter_from_factory(factory: Factory, source: str, options: Mapping[str, Any]) -> Adapter:
    try:
        provider = factory(**options)
    except SandboxError:
        raise
    except Exception as exc:
        raise SandboxProviderFailed(f"{source}: cannot start: {type(exc).__name__}: {exc}") from None
    envelope = await describe(provider, source)
    module = getattr(factory, "__module__", "") or ""
    return Adapter(envelope=envelope, provider=provider, source=source, in_tree=module.startswith(IN_TREE_PREFIXES))


def entry_point_factories(names: Iterable[str] | None = None) -> dict[str, Factory]:
    wanted = set(names) if names is not None else None
    out: dict[str, Factory] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if wanted is None or ep.name in wanted:
            out[ep.name] = _lazy(ep)
    return out


def _lazy(ep: EntryPoint) -> Factory:
    """A factory that imports its entry point when called, so a broken plugin fails only its own adapter."""

    def create(**options: Any) -> Provider:
        factory: Factory = ep.load()
        return factory(**options)

    create.__module__ = ep.module
    return create


def _resolve_factory(spec: str) -> Factory:
    if ":" in spec:
        module, attr = spec.split(":", 1)
        factory: Factory = getattr(importlib.import_module(module), attr)
        return factory
    found = entry_point_factories([spec])
    if spec not in found:
        raise SandboxAdapterUnavailable(f"no provider entry point named {spec!r}", field="factory")
    return found[spec]


async def load_registry(
    *,
    entry_point_names: Iterable[str] | None = None,
    config: Path | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> Registry:
    """Build a registry from entry points (all, or the named ones) and an adapters file.

    The adapters file is TOML: ``[[adapters]]`` tables with ``factory`` (an entry point
    name or ``module:callable``) and optional ``options``. An adapter that fails to start
    is recorded in ``unavailable`` with its reason rather than failing the whole load.
    """
    registry = Registry()
    specs: list[tuple[str, Factory | str, Mapping[str, Any]]] = []
    for name, factory in entry_point_factories(entry_point_names).items():
        specs.append((f"entry point {name}", factory, (options or {}).get(name, {})))
    if config is not None:
        try:
            doc = tomllib.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise SandboxAdapterUnavailable(f"cannot read adapters file {config}: {exc}", field="config") from None
        for i, table in enumerate(doc.get("adapters", [])):
            specs.append((f"{config}#{i}", str(table.get("factory", "")), dict(table.get("options", {}))))
    for source, spec, opts in specs:
        try:
            resolved = _resolve_factory(spec) if isinstance(spec, str) else spec
            registry.add(await adapter_from_factory(resolved, source, opts))
        except SandboxError as exc:
            registry.unavailable[source] = f"{exc.code}: {exc.message}"
        except (ImportError, AttributeError) as exc:
            registry.unavailable[source] = f"cannot import: {exc}"
    return registry
