"""The runner's front door: one object, opened from one ``RunnerConfig``, that owns the journal, assembles the
adapters, builds the session-level ``Runner`` and keeps the house (orphans reaped, sandboxes past their time-to-live
reclaimed, expired snapshots swept) before any use case runs.

Every face stands on it: the ``checkfu`` command, the SDK (``checkfu.Sandbox``), ``checkfu runner serve``, the
warm pool and an embedding platform. None of them builds a ``Runner``, loads a registry or opens the journal on its
own, so they cannot drift apart in how they clean up, which credential they send or which tag they label with.

Heavy modules (SQLAlchemy, pydantic models, the wire client, docker-py) load when a method that needs them runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checkfu.runner.config import RunnerConfig

if TYPE_CHECKING:
    from checkfu.contract.profile import SandboxProfile
    from checkfu.contract.target import ExecutionTarget
    from checkfu.control.enrollment import Enrolled
    from checkfu.control.grading import GradeCard
    from checkfu.core.expiry import ExpiryReport
    from checkfu.core.fleet import FleetConfig, FleetRunner
    from checkfu.core.job import JobResult
    from checkfu.core.journal import Journal
    from checkfu.core.mounts import MountSpec
    from checkfu.core.pool import Drained, Pooled
    from checkfu.core.queue import RunRequest
    from checkfu.core.reconcile import ReapReport, ReconcileReport
    from checkfu.core.registry import Registry
    from checkfu.core.runner import Runner
    from checkfu.core.sandboxes import CutShort, LiveSandbox, Reclaimed, SandboxHost
    from checkfu.runner.submission import RunResult
    from checkfu.wire.credentials import Credential

Notice = Callable[[str], None]
"""Where the front door says what it did on the side (an orphan reaped, a sandbox reclaimed): one line of text."""

Wanted = tuple[str, "str | None"]
"""A provider's name and the site a journal row names (``None``: the one without a site); a provider service's
site is its endpoint."""


def _stderr(text: str) -> None:
    print(text, file=sys.stderr)


@dataclass
class _Shared:
    """A registry this service loaded for the live sandboxes it handed out (one, and its clones), and how many of
    them still use it: its providers hold connections and threads, closed when the last of them is let go."""

    registry: Registry
    users: int = 0


async def _close(registry: Registry | None) -> None:
    """Let ``registry``'s providers go (their engine clients, pools and threads); the sandboxes stay as they are."""
    from checkfu.core.registry import close_adapters  # noqa: PLC0415

    if registry is not None:
        await close_adapters(registry.adapters)


class RunnerService:
    """One runner: its configuration, its journal (open), and the use cases every face offers.

    Make one with ``RunnerService.open(config)`` (or ``await RunnerService.open_async(config)`` from async code),
    which opens the journal and keeps the house; ``close`` it (or use it as a context manager) when done.
    ``RunnerService(config, journal)`` wraps a journal opened elsewhere and does nothing on its own.
    """

    def __init__(self, config: RunnerConfig, journal: Journal, *, notice: Notice | None = None) -> None:
        self.config = config
        self.journal = journal
        self.notice: Notice = notice or _stderr
        self._tag: str | None = None
        self.reclaimed: list[Reclaimed] = []
        """The sandboxes the last ``reclaim_sandboxes`` reclaimed (``checkfu ps`` shows them)."""
        self._live: dict[int, tuple[LiveSandbox, _Shared]] = {}
        """Every live sandbox this service handed out and nobody has let go of yet (``let_go``), by its ``id``, with
        the registry it was reached through (the sandbox object is kept so its ``id`` is not reused meanwhile)."""

    # -- opening and closing ------------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        config: RunnerConfig | None = None,
        *,
        housekeeping: bool = True,
        reap: bool = True,
        notice: Notice | None = None,
    ) -> RunnerService:
        """Open the journal and keep the house (unless ``housekeeping=False``; ``reap=False`` leaves orphans, and
        snapshots cut short, to a caller that settles them itself, as ``reconcile`` does). From inside an event loop
        the house is kept on a thread of its own: call ``open_async`` there instead to keep it on that loop.

        Raises:
            JournalTooNew: the journal was written by a newer checkfu.
            SQLAlchemyError, OSError: the journal cannot be opened.
            StateDirRefused: the state directory belongs to another user.
        """
        config = config or RunnerConfig.from_environment()
        service = cls(config, _open_journal(config), notice=notice)
        if housekeeping:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                asyncio.run(service.keep_house(reap=reap))
            else:
                with concurrent.futures.ThreadPoolExecutor(1) as pool:
                    pool.submit(asyncio.run, service.keep_house(reap=reap)).result()
        return service

    @classmethod
    async def open_async(
        cls,
        config: RunnerConfig | None = None,
        *,
        housekeeping: bool = True,
        reap: bool = True,
        notice: Notice | None = None,
    ) -> RunnerService:
        """``open`` for async code: the journal is opened on a thread, the house kept on the running loop."""
        config = config or RunnerConfig.from_environment()
        journal = await asyncio.to_thread(_open_journal, config)
        service = cls(config, journal, notice=notice)
        if housekeeping:
            try:
                await service.keep_house(reap=reap)
            except BaseException:
                journal.close()
                raise
        return service

    def close(self) -> None:
        """Close what is still open: the providers of every sandbox handed out and not let go of, then the journal.
        From inside an event loop, call ``aclose`` instead: a provider's client is best closed on the loop that
        used it (here it is closed on a loop of its own thread)."""
        if self._live:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                asyncio.run(self._let_go_of_all())
            else:
                with concurrent.futures.ThreadPoolExecutor(1) as pool:
                    pool.submit(asyncio.run, self._let_go_of_all()).result()
        self.journal.close()

    async def aclose(self) -> None:
        """``close`` for async code: the providers are closed on the running loop."""
        try:
            await self._let_go_of_all()
        finally:
            self.journal.close()

    async def let_go(self, live: LiveSandbox) -> None:
        """Say this caller is done with ``live`` (a sandbox ``create_sandbox``, ``attach_sandbox``,
        ``resume_snapshot`` or ``clone_sandbox`` handed out), whether it released it or leaves it live for someone
        else: the providers it was reached through are closed once no other sandbox handed out with them is still
        held. A sandbox this service did not hand out, or one let go of already, is left as it is."""
        held = self._live.pop(id(live), None)  # a held sandbox is kept alive, so no other object has its id
        if held is None:
            return
        shared = held[1]
        shared.users -= 1
        if shared.users == 0:
            await _close(shared.registry)

    async def _let_go_of_all(self) -> None:
        while self._live:  # one at a time: a close cut short leaves the rest held, closed by the next close
            await self.let_go(next(iter(self._live.values()))[0])

    def _hand_out(self, live: LiveSandbox, shared: _Shared) -> LiveSandbox:
        """Hold ``shared`` open for ``live`` until it is let go of (``let_go``, ``close``)."""
        shared.users += 1
        self._live[id(live)] = (live, shared)
        return live

    def __enter__(self) -> RunnerService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def tag(self) -> str:
        """This runner's tag (``RunnerConfig.runner_tag``), worked out once."""
        if self._tag is None:
            self._tag = self.config.runner_tag()
        return self._tag

    # -- adapters and the session-level runner ------------------------------------------------------------------

    async def adapters(
        self,
        wanted: Iterable[Wanted],
        *,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        credentials: Mapping[str, Credential | None] | None = None,
        sites: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        adapters_file: bool = True,
    ) -> Registry:
        """The registry for ``wanted``: installed providers by name (with the configured adapters file unless
        ``adapters_file=False``; ``sites`` places one at several Docker engines), and provider services at their
        endpoints with the credential given for the endpoint, else the one issued when it was enrolled. Every
        ``describe`` is journaled. One that cannot be reached is recorded as unavailable, never taken for empty.

        The caller owns what is returned: its providers hold connections and threads, so it closes them
        (``checkfu.core.registry.close_adapters``) once nothing uses them, as the use cases here do."""
        from checkfu.control.endpoints import reach  # noqa: PLC0415
        from checkfu.core.registry import is_endpoint, load_registry  # noqa: PLC0415

        wanted = list(wanted)
        config = self.config.adapters if adapters_file else None
        options = self._options(options)
        if sites:
            names = sorted({name for name, site in wanted if not is_endpoint(site)})
            registry = await load_registry(
                entry_point_names=names or None, options=options, recorder=self.journal, sites=sites, config=config
            )
            served = [(name, site) for name, site in wanted if is_endpoint(site)]
            if not served:
                return registry
            try:
                more = await reach(self.journal, served, recorder=self.journal, credentials=credentials)
            except BaseException:
                await _close(registry)
                raise
            for adapter in more.adapters:
                registry.add(adapter)  # one checked already when ``reach`` added it
            return registry
        return await reach(
            self.journal, wanted, recorder=self.journal, options=options, credentials=credentials, config=config
        )

    async def remote(self, url: str, credential: Credential | None) -> Registry:
        """A registry of the one provider service at ``url``, reached with ``credential`` (``None``: the one issued
        when it was enrolled). The caller owns it and closes its provider, as with ``adapters``.

        Raises:
            SandboxAdapterUnavailable: ``url`` is not a usable provider URL, or the service cannot be reached.
            SandboxUnauthenticated: the service refuses the credential.
            SandboxError: its envelope does not decode.
        """
        from checkfu.control.endpoints import remote_adapter  # noqa: PLC0415
        from checkfu.core.registry import Registry, add_or_close  # noqa: PLC0415

        registry = Registry()
        adapter = await remote_adapter(url, credential or self.enrolled_credential(url), recorder=self.journal)
        await add_or_close(registry, adapter)  # one refused above its ceiling is closed: nobody will hold it
        return registry

    async def all_adapters(
        self, providers: Sequence[str] | None = None, *, sites: Mapping[str, Sequence[Mapping[str, Any]]] | None = None
    ) -> Registry:
        """Every installed provider (or the named ones) with the adapters file, and every provider service that
        holds something open for this runner: what reconciliation needs to reach every allocation. The caller owns
        it and closes its providers, as with ``adapters``."""
        from checkfu.control.endpoints import add_endpoints, open_endpoints  # noqa: PLC0415
        from checkfu.core.registry import load_registry  # noqa: PLC0415

        loaded = await load_registry(
            entry_point_names=providers,
            recorder=self.journal,
            sites=sites,
            config=self.config.adapters,
            options=self._options(None),
        )
        try:
            return await add_endpoints(
                loaded, self.journal, open_endpoints(self.journal, runner_tag=self.tag), recorder=self.journal
            )
        except BaseException:
            await _close(loaded)
            raise

    async def _at(self, wanted: Wanted, credential: Credential | None) -> Registry:
        """The registry for one journal row's (provider, site): a service's endpoint with ``credential`` (else its
        enrolled one), an installed provider with the adapters file."""
        from checkfu.core.registry import is_endpoint  # noqa: PLC0415

        served = is_endpoint(wanted[1])
        given = {str(wanted[1]): credential} if served and credential is not None else None
        return await self.adapters([wanted], credentials=given, adapters_file=not served)

    def _options(self, given: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
        """``given`` over the configuration's own options for the in-tree providers."""
        merged: dict[str, dict[str, Any]] = {k: dict(v) for k, v in self.config.provider_options().items()}
        for name, values in (given or {}).items():
            merged[name] = {**merged.get(name, {}), **values}
        return merged

    def runner(self, registry: Registry) -> Runner:
        """The session-level runner over ``registry``, labelling with this runner's tag. The one place a face gets
        a ``Runner``."""
        from checkfu.core.runner import Runner  # noqa: PLC0415

        return Runner(registry, self.journal, runner_tag=self.tag)

    def record(self, registry: Registry) -> None:
        """Record ``registry``'s in-tree adapters in the journal with their ceilings, as a runner does before its
        first Run (``provider list`` and ``provider grade`` show them so)."""
        self.runner(registry)

    def sandboxes(self, registry: Registry) -> SandboxHost:
        """Long-lived sandboxes over ``registry``: create, attach, exec, files, snapshot, resume, clone, remove."""
        from checkfu.core.sandboxes import SandboxHost  # noqa: PLC0415

        return SandboxHost(registry, self.journal, runner_tag=self.tag)

    def enrolled_credential(self, url: str) -> Credential | None:
        """The credential issued when the service at ``url`` was enrolled, if it was and its file is readable."""
        from checkfu.control.endpoints import enrolled_credential  # noqa: PLC0415

        return enrolled_credential(self.journal, url)

    @staticmethod
    def choose(registry: Registry, provider: str) -> ExecutionTarget:
        """The one adapter of ``registry`` that serves ``provider`` (an installed provider's name, or a provider
        service's URL), by its advertised target.

        Raises:
            SandboxAdapterAmbiguous: two adapters advertise one target.
            SandboxAdapterUnavailable: none, or several, serve ``provider`` (field ``provider``).
        """
        from checkfu.contract.errors import SandboxAdapterUnavailable  # noqa: PLC0415
        from checkfu.core.registry import is_endpoint  # noqa: PLC0415

        served = is_endpoint(provider)
        found = (
            [a for a in registry.adapters if a.served]
            if served
            else [a for a in registry.by_provider(provider) if not a.served]
        )
        ambiguous = None if served else registry.ambiguity(provider)
        if ambiguous is not None:
            raise ambiguous
        if len(found) == 1:
            return found[0].target
        why = "; ".join(f"{k}: {v}" for k, v in registry.unavailable.items())
        if not found:
            raise SandboxAdapterUnavailable(
                f"provider: no adapter for {provider!r} is available" + (f" ({why})" if why else ""),
                field="provider",
            )
        raise SandboxAdapterUnavailable(f"provider: {len(found)} adapters of {provider!r}; name one", field="provider")

    @staticmethod
    def profile(source: SandboxProfile | Mapping[str, Any] | str | Path | None, provider: str) -> SandboxProfile:
        """The profile as the runner takes it: a ``SandboxProfile`` as given; a mapping or a file (TOML or JSON)
        checked, every problem reported at once; ``None``: the built-in default for ``provider``. A local
        ``base_image`` tag (``checkfu/debian:12``) is pinned to the engine's image id by the Docker tier, the one
        provider that pins tags.

        Raises:
            SandboxProfileInvalid: the profile is not valid (the message lists each problem by field), or names a
                tag for a provider that pins none.
            SandboxAdapterUnavailable: the Docker engine does not answer to pin a tag.
        """
        from checkfu.contract.errors import SandboxProfileInvalid  # noqa: PLC0415
        from checkfu.contract.profile import SandboxProfile  # noqa: PLC0415
        from checkfu.core.admission import raise_problems  # noqa: PLC0415
        from checkfu.core.profiles import check_document, pinned, read_profile  # noqa: PLC0415

        if isinstance(source, SandboxProfile):
            return source
        if isinstance(source, Mapping):
            read = check_document(dict(source), "profile")
        else:
            read = read_profile(None if source is None else Path(source), provider)
        raise_problems(read.problems)
        if read.tag is None:
            assert read.profile is not None
            return read.profile
        if provider != "docker":
            raise SandboxProfileInvalid(
                f"base_image: {read.tag!r} is a tag, and only the Docker tier pins tags; name the image by digest",
                field="base_image",
            )
        from checkfu.providers.docker import pin_base_image  # noqa: PLC0415 - only the Docker tier pins tags

        return pinned(read, pin_base_image(read.tag))

    # -- use cases ----------------------------------------------------------------------------------------------

    async def run_command(
        self,
        provider: str,
        command: Sequence[str],
        *,
        profile: SandboxProfile | Mapping[str, Any] | str | Path | None = None,
        **job: Any,
    ) -> JobResult:
        """One Run of ``command`` on ``provider`` (an installed provider's name, or a provider service's URL reached
        with the credential issued when it was enrolled) in a sandbox of ``profile`` (default: the provider's
        built-in one), released when it ends. ``job``: ``run_job``'s options (``mounts``, ``env``, ``cwd``,
        ``timeout``, ``observer``, ``captures`` ...). The result's ``exit_code`` is the command's, as the engine
        or provider reported it and the runner checked it.

        Raises:
            SandboxError: a refusal (nothing ran, nothing is left allocated) or a sandbox failure.
        """
        from checkfu.core.registry import is_endpoint  # noqa: PLC0415

        site = provider if is_endpoint(provider) else None
        prof = None if site else self.profile(profile, provider)  # before any provider is asked anything
        registry = await self.adapters([(provider, site)], adapters_file=site is None)
        try:
            target = self.choose(registry, provider)
            if prof is None:  # a service: the provider it serves decides whether a tag is pinned
                prof = self.profile(profile, registry.select(target).envelope.provider)
            return await self.run(registry, target, prof, command, **job)
        finally:  # the Run is over, its sandbox released: nothing uses these providers any more
            await _close(registry)

    async def run(
        self,
        registry: Registry,
        target: ExecutionTarget,
        profile: SandboxProfile,
        command: Sequence[str],
        **job: Any,
    ) -> JobResult:
        """One Run of ``command`` in a sandbox of ``profile`` at ``target``, released when it ends
        (``checkfu.core.job.run_job``; ``job`` passes its options on). Captures go under the state directory unless
        a directory is named; the Run records its owner process and, on Docker, its engine."""
        from checkfu.core.job import run_job  # noqa: PLC0415
        from checkfu.core.leases import current_owner  # noqa: PLC0415
        from checkfu.core.output import output_cap  # noqa: PLC0415

        job.setdefault("capture_root", self.config.captures())
        job.setdefault("owner", current_owner())
        job.setdefault("keep_output", output_cap())
        if target.provider == "docker":  # the caller's notes are kept beside it (a profile's source, say)
            job["noted"] = {"engine": self.config.engine_name(), **(job.get("noted") or {})}
        return await run_job(self.runner(registry), target, profile, list(command), **job)

    async def create_sandbox(
        self,
        provider: str,
        *,
        profile: SandboxProfile | Mapping[str, Any] | str | Path | None = None,
        mounts: Sequence[str | MountSpec] = (),
        ttl: float | None = None,
        detached: bool = False,
        credential: Credential | None = None,
    ) -> LiveSandbox:
        """A long-lived sandbox on ``provider``: exec in it, write and read its files, snapshot, clone, ``release``.
        ``mounts`` as ``checkfu run --mount`` takes them (``SRC:TARGET[:ro|rw]``), read, bounded and hashed before
        any provider work. Owned by this process (reclaimed once it is gone) unless ``detached``; either way its
        time-to-live (``ttl`` seconds, default 15 minutes) ends it. A provider service is reached with
        ``credential``, else the one issued when it was enrolled.

        Raises:
            SandboxError: refused (named by field), or a provider fault; nothing is left allocated.
        """
        from checkfu.core.job import QuietObserver, host_platform_value, resolve_mounts  # noqa: PLC0415
        from checkfu.core.mounts import parse_mount  # noqa: PLC0415
        from checkfu.core.registry import check_provider_name, is_endpoint  # noqa: PLC0415
        from checkfu.core.sandboxes import DEFAULT_TTL, check_ttl  # noqa: PLC0415

        check_provider_name(provider, self.config.adapters)
        specs = [parse_mount(m) if isinstance(m, str) else m for m in mounts]
        resolved = await resolve_mounts(specs, QuietObserver())
        site = provider if is_endpoint(provider) else None
        # An installed provider's profile is read before any provider is asked anything (describe included); a
        # service's once its envelope says which provider it serves (and so whether it pins a tag).
        prof = None if site else await asyncio.to_thread(self.profile, profile, provider)
        given = {site: credential} if site and credential is not None else None
        registry = await self.adapters([(provider, site)], credentials=given, adapters_file=site is None)
        try:
            target = self.choose(registry, provider)
            if prof is None:
                prof = await asyncio.to_thread(self.profile, profile, registry.select(target).envelope.provider)
            live = await self.sandboxes(registry).create(
                target,
                prof,
                host_platform_value(),
                mounts=resolved,
                specs=specs,
                ttl=check_ttl(DEFAULT_TTL if ttl is None else ttl),
                detached=detached,
            )
        except BaseException:
            await _close(registry)
            raise
        return self._hand_out(live, _Shared(registry))

    async def attach_sandbox(self, sandbox_id: str, *, credential: Credential | None = None) -> LiveSandbox:
        """A live sandbox of this runner by its id (made by any process, ``checkfu sandbox create`` included).

        Raises:
            SandboxNotFound: no live sandbox of that id in this journal.
        """
        from checkfu.core.sandboxes import SandboxBook  # noqa: PLC0415

        rec = SandboxBook(self.journal).get(sandbox_id)
        wanted = (rec.provider, rec.site or None) if rec is not None else ("docker", None)
        registry = await self._at(wanted, credential)
        try:
            live = self.sandboxes(registry).attach(sandbox_id)
        except BaseException:
            await _close(registry)
            raise
        return self._hand_out(live, _Shared(registry))

    async def resume_snapshot(
        self, ref: str, *, ttl: float | None = None, detached: bool = False, credential: Credential | None = None
    ) -> LiveSandbox:
        """A new sandbox holding snapshot ``ref``'s files, on the provider and site it was taken on.

        Raises:
            SandboxNotFound: no such snapshot, or it was deleted.
        """
        from checkfu.core.sandboxes import DEFAULT_TTL, SandboxBook, check_ttl  # noqa: PLC0415

        rec = SandboxBook(self.journal).snapshot(ref)
        wanted = (rec.target.provider, rec.site or None) if rec is not None else ("docker", None)
        registry = await self._at(wanted, credential)
        try:
            live = await self.sandboxes(registry).resume(
                ref, ttl=check_ttl(DEFAULT_TTL if ttl is None else ttl), detached=detached
            )
        except BaseException:
            await _close(registry)
            raise
        return self._hand_out(live, _Shared(registry))

    async def clone_sandbox(
        self, source: LiveSandbox, *, ttl: float | None = None, detached: bool = False
    ) -> LiveSandbox:
        """A new sandbox holding ``source``'s files as they are now (the source stays as it is). It is reached
        through ``source``'s providers, which stay open until both are let go of (``let_go``); a ``source`` this
        service did not hand out lends its providers, and whoever owns them closes them."""
        from checkfu.core.sandboxes import DEFAULT_TTL, check_ttl  # noqa: PLC0415

        held = self._live.get(id(source))
        if held is None:
            return await source.host.clone(
                source, ttl=check_ttl(DEFAULT_TTL if ttl is None else ttl), detached=detached
            )
        shared = held[1]
        shared.users += 1  # before the clone is awaited: letting go of the source meanwhile must not close them
        try:
            live = await source.host.clone(
                source, ttl=check_ttl(DEFAULT_TTL if ttl is None else ttl), detached=detached
            )
        except BaseException:
            shared.users -= 1
            if shared.users == 0:
                await _close(shared.registry)
            raise
        shared.users -= 1
        return self._hand_out(live, shared)

    async def delete_snapshot(self, ref: str, *, credential: Credential | None = None) -> None:
        """Delete snapshot ``ref`` through the provider and site it was taken on (one already deleted is left as
        it is).

        Raises:
            SandboxNotFound: no such snapshot in this journal.
        """
        from checkfu.core.sandboxes import SandboxBook  # noqa: PLC0415

        rec = SandboxBook(self.journal).snapshot(ref)
        wanted = (rec.target.provider, rec.site or None) if rec is not None else ("docker", None)
        registry = await self._at(wanted, credential)
        try:
            await self.sandboxes(registry).delete_snapshot(ref)
        finally:
            await _close(registry)

    async def pool_fill(
        self,
        registry: Registry,
        target: ExecutionTarget,
        profile: SandboxProfile,
        mount_targets: Sequence[str],
        *,
        n: int,
        ttl: float,
    ) -> list[Pooled]:
        """Provision sandboxes ahead of demand at ``target`` until ``n`` of this shape are ready."""
        from checkfu.core.job import host_platform_value  # noqa: PLC0415
        from checkfu.core.pool import fill  # noqa: PLC0415

        engine = self.config.engine_name() if target.provider == "docker" else None
        return await fill(
            self.runner(registry),
            target,
            profile,
            host_platform_value(),
            list(mount_targets),
            n=n,
            ttl=ttl,
            engine=engine,
        )

    def pool_ready(self) -> list[Pooled]:
        """This runner's ready pooled sandboxes."""
        from checkfu.core.pool import ready  # noqa: PLC0415

        return ready(self.journal, self.tag)

    async def pool_drain(self, registry: Registry) -> list[Drained]:
        """Release every ready pooled sandbox of this runner."""
        from checkfu.core.pool import drain  # noqa: PLC0415

        return await drain(self.journal, registry, self.tag, self.runner(registry))

    async def reconcile(
        self, providers: Sequence[str] | None = None, *, sites: Mapping[str, Sequence[Mapping[str, Any]]] | None = None
    ) -> ReconcileReport:
        """Compensate every unsettled allocation of this runner whose lease expired or whose owner is gone, at its
        provider and site, and settle its Run.

        Raises:
            SandboxAdapterAmbiguous: the adapters file makes two adapters advertise one target (which one reclaims
                an allocation would be a guess), before anything is compensated.
        """
        from checkfu.core.clock import SystemClock  # noqa: PLC0415
        from checkfu.core.reconcile import reconcile  # noqa: PLC0415

        registry = await self.all_adapters(providers, sites=sites)
        try:
            ambiguous = registry.ambiguity()
            if ambiguous is not None:
                raise ambiguous

            async def loaded(_: set[Wanted]) -> Registry:
                return registry

            # A snapshot cut short belongs to a sandbox that lives on, whose lease reconciliation leaves alone: it
            # is undone first (the house keeping of a reconciling opening leaves it here), and counted in the report.
            cut = await self._settle_cut_short(loaded)
            report = await reconcile(self.journal, registry, SystemClock(), runner_tag=self.tag)
        finally:
            await _close(registry)
        await self.reclaim_sandboxes()  # a sandbox whose Run this pass settled (its maker died) is settled with it
        report.compensated[:0] = [c.allocation_key for c in cut if c.error is None]
        report.failed.update({c.allocation_key: c.error for c in cut if c.error is not None})
        return report

    def fleet(
        self,
        settings: FleetConfig,
        *,
        credential: Credential | None = None,
        sites: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        emit: Callable[[dict[str, Any]], None] | None = None,
    ) -> FleetRunner:
        """A fleet member serving queued Runs from this runner's journal (``checkfu runner serve``). A Run's provider
        is loaded when first needed: an installed one by name (placed at ``sites``), with the adapters file, or a
        provider service by URL with ``credential``, else the one issued when it was enrolled. One that cannot be
        loaded is recorded as unavailable, and the Run is settled as refused, naming it."""
        from checkfu.core.fleet import FleetRunner  # noqa: PLC0415
        from checkfu.core.registry import Registry, installed_entry_points, is_endpoint  # noqa: PLC0415

        async def load(spec: str) -> Registry:
            if is_endpoint(spec) or spec.startswith(("http://", "https://")):
                from checkfu.contract.errors import SandboxError  # noqa: PLC0415

                try:
                    return await self.remote(spec, credential)
                except SandboxError as exc:
                    registry = Registry()
                    registry.mark_unavailable(spec, f"{exc.code}: {exc.message}")
                    return registry
            if self.config.adapters is None and spec not in {ep.name for ep in installed_entry_points()}:
                registry = Registry()
                registry.mark_unavailable(spec, f"no provider named {spec!r} is installed on this runner")
                return registry
            return await self.adapters([(spec, None)], sites=sites or None)

        return FleetRunner(self.journal, load, runner_tag=self.tag, config=settings, emit=emit)

    async def enroll(
        self, target: str, evidence: bytes, conformance_key: Any, *, credential: Credential | None = None
    ) -> Enrolled:
        """Admit the provider at ``target`` (a service URL, or an installed provider's name) for selection: verify
        its signed conformance evidence against ``conformance_key``, hold its envelope to the server-owned ceiling
        and, for a service, issue it a credential kept in the state directory's ``credentials``.

        Raises:
            SandboxEnrollmentRefused: naming every reason (evidence, failed cases, egress, each axis above the ceiling).
            SandboxError: the provider cannot be reached or its envelope does not decode.
        """
        from checkfu.control.enrollment import enroll  # noqa: PLC0415

        return await enroll(
            self.journal,
            target,
            evidence,
            conformance_key,
            credential=credential,
            credentials_dir=self.config.state() / "credentials",
        )

    async def grade(
        self, target: str, *, credential: Credential | None = None, conformance: dict[str, Any] | None = None
    ) -> GradeCard:
        """The grade card of ``target`` (an installed provider, or a service URL reached with ``credential``, else
        the one issued when it was enrolled): tier, each axis and who enforces it, egress, ceiling, its enrollment,
        the faults the journal recorded of it, and ``conformance`` (a report's JSON) when given.

        Raises:
            SandboxAdapterUnavailable: nothing by that name is installed, or the service cannot be reached.
        """
        from checkfu.conformance.suite import resolve_target  # noqa: PLC0415
        from checkfu.control.grading import grade  # noqa: PLC0415
        from checkfu.core.registry import Registry, close_provider, enrollment_endpoint  # noqa: PLC0415

        if credential is None and target.startswith(("http://", "https://")):
            credential = self.enrolled_credential(target)
        adapter = await resolve_target(target, credential)
        try:
            registry = Registry()
            registry.add(adapter)
            self.record(registry)
            return grade(
                adapter,
                enrollment=self.journal.enrollment(adapter.target, enrollment_endpoint(adapter)),
                history=self.journal.provider_faults(adapter.target),
                conformance=conformance,
            )
        finally:  # graded from its envelope and the journal: its provider is not asked anything more
            await close_provider(adapter.provider)

    def submit(self, request: RunRequest, *, runner_tag: str | None = None) -> str:
        """Queue a checked Run ``request`` (``checkfu.runner.submission.build_request``) for the fleet on this
        journal, labelled with ``runner_tag`` (default: this runner's); returns its Run id at once."""
        from checkfu.runner.submission import submit_request  # noqa: PLC0415

        return submit_request(self.journal, request, runner_tag=runner_tag or self.tag)

    def wait(
        self,
        run_id: str,
        *,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        on_attempt: Callable[[int], None] | None = None,
        on_warning: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> RunResult:
        """Follow a Run to its one terminal state, streaming each attempt's output as it arrives.

        Raises:
            SandboxNotFound: no Run ``run_id`` in this journal.
            TimeoutError: ``timeout`` seconds passed first (the Run goes on).
        """
        from checkfu.runner.submission import follow  # noqa: PLC0415

        return follow(
            self.journal,
            run_id,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            on_attempt=on_attempt,
            on_warning=on_warning,
            timeout=timeout,
        )

    # -- the house: reaping and expiry --------------------------------------------------------------------------

    async def keep_house(self, *, reap: bool = True) -> None:
        """What every command does when it opens the journal, so no daemon is needed: reclaim this runner's
        sandboxes past their time-to-live or whose owner is gone, sweep its expired snapshots and (with ``reap``)
        reap its orphaned Runs. One read when nothing is due; providers load only for what is. Never raises for
        what it cannot finish: that is said through ``notice`` and left for the next command."""
        from checkfu.core.clock import SystemClock  # noqa: PLC0415
        from checkfu.core.journal import Housekeeping, JournalError  # noqa: PLC0415

        try:
            due = self.journal.housekeeping(runner_tag=self.tag, now=SystemClock().now())
        except JournalError:
            due = Housekeeping(sandboxes=True, snapshots=True, orphans=True)  # each pass reports its own trouble
        if due.sandboxes:
            await self.reclaim_sandboxes(cut_short=reap)
        if due.snapshots:
            await self.sweep_snapshots()
        if reap and due.orphans:
            await self.reap_orphans()

    async def reclaim_sandboxes(self, *, cut_short: bool = True) -> list[Reclaimed]:
        """Reclaim this runner's long-lived sandboxes past their time-to-live or whose owner is gone, and (unless
        ``cut_short=False``: ``reconcile`` does it itself, and counts it) undo the snapshots of them whose command
        died while taking them."""
        from checkfu.core.sandboxes import cut_short as find_cut_short  # noqa: PLC0415
        from checkfu.core.sandboxes import due_for_sweep, sweep  # noqa: PLC0415

        try:
            due = bool(due_for_sweep(self.journal, self.tag))
            cut = cut_short and bool(find_cut_short(self.journal, self.tag))
        except Exception:  # a journal too old to hold sandboxes, or one that cannot be read: nothing to reclaim
            return []

        loaded: list[Registry] = []

        async def registry_for(wanted: set[Wanted]) -> Registry:
            loaded.append(await self.adapters(wanted, adapters_file=False))
            return loaded[-1]

        try:
            if cut:
                await self._settle_cut_short(registry_for)
            if not due:
                return []
            try:
                done = await sweep(self.journal, self.tag, registry_for)
            except Exception as exc:
                self.notice(f"warning: sandboxes due for reclaiming were left for the next command: {exc}")
                return []
        finally:  # what was due is reclaimed (or left for the next command): the providers are not needed
            for registry in loaded:
                await _close(registry)
        for r in done:
            if r.error:
                self.notice(f"warning: sandbox {r.sandbox_id} ({r.reason}) could not be reclaimed: {r.error}")
            else:
                self.notice(f"reclaimed sandbox {r.sandbox_id}: {r.reason}")
        self.reclaimed = done
        return done

    async def _settle_cut_short(self, registry_for: Callable[[set[Wanted]], Awaitable[Registry]]) -> list[CutShort]:
        """Undo this runner's snapshots whose command died while taking them (``checkfu.core.sandboxes``), saying
        what was done through ``notice``."""
        from checkfu.core.sandboxes import settle_cut_short  # noqa: PLC0415

        try:
            done = await settle_cut_short(self.journal, self.tag, registry_for)
        except Exception as exc:
            self.notice(f"warning: snapshots cut short by a command that died were left for the next command: {exc}")
            return []
        for c in done:
            if c.error:
                self.notice(
                    f"warning: snapshot {c.snapshot_ref} of sandbox {c.sandbox_id} was cut short (the command taking "
                    f"it is gone) and could not be undone: {c.error}; the next command, or `checkfu runner "
                    "reconcile`, tries again"
                )
            else:
                self.notice(
                    f"checkfu: snapshot {c.snapshot_ref} of sandbox {c.sandbox_id} was cut short (the command taking "
                    "it is gone): whatever the provider made of it is removed, and the sandbox is thawed if it was "
                    "left paused"
                )
        return done

    async def sweep_snapshots(self) -> ExpiryReport | None:
        """Delete (or, under provider custody, settle) this runner's snapshots whose expiry has passed; ``None``
        when nothing had expired or the journal could not be read."""
        from checkfu.contract.errors import SandboxError  # noqa: PLC0415
        from checkfu.core.clock import SystemClock  # noqa: PLC0415
        from checkfu.core.expiry import sweep_expired_snapshots  # noqa: PLC0415
        from checkfu.core.journal import AllocationRow, JournalError  # noqa: PLC0415

        clock = SystemClock()
        try:
            if not self.journal.expired_snapshots(now=clock.now(), runner_tag=self.tag):
                return None
        except JournalError:
            return None

        loaded: list[Registry] = []

        async def adapters(rows: list[AllocationRow]) -> Registry:
            loaded.append(await self.adapters({(r.target.provider, r.site) for r in rows}, adapters_file=False))
            return loaded[-1]

        try:
            report = await sweep_expired_snapshots(self.journal, adapters, clock, runner_tag=self.tag)
        except (SandboxError, JournalError) as exc:
            self.notice(f"checkfu: expired snapshots were not swept ({exc}); the next command tries again")
            return None
        finally:
            for registry in loaded:
                await _close(registry)
        done = len(report.deleted) + len(report.settled)
        if done:
            self.notice(f"checkfu: deleted {done} expired snapshot(s)")
        for key, why in {**report.failed, **report.skipped}.items():
            self.notice(f"checkfu: expired snapshot {key} is still held ({why}); the next command tries again")
        return report

    async def reap_orphans(self, *, reaper: str | None = None, quiet: bool = False) -> ReapReport | None:
        """Reap this runner's orphaned Runs (their owner process is gone): reclaim what they hold and settle them
        as ``orphaned``. ``None`` when there were none (the common case: one query). A Run on another Docker engine
        is left for a command there."""
        from checkfu.contract.codec import decode  # noqa: PLC0415
        from checkfu.contract.errors import SandboxError  # noqa: PLC0415
        from checkfu.contract.target import ExecutionTarget  # noqa: PLC0415
        from checkfu.core.clock import SystemClock  # noqa: PLC0415
        from checkfu.core.journal import JournalError  # noqa: PLC0415
        from checkfu.core.reconcile import describe_owner, orphans, reap_orphans  # noqa: PLC0415

        say: Notice = (lambda _text: None) if quiet else self.notice
        try:
            gone = orphans(self.journal, runner_tag=self.tag)
        except JournalError:
            return None
        if not gone:
            return None
        here = self.config.engine_name()
        for orphan in list(gone):
            row = self.journal.run(orphan.run_id)
            engine = (row.story or {}).get("engine") if row is not None else None
            if engine is not None and engine != here:
                gone.remove(orphan)
                say(
                    f"checkfu: Run {orphan.run_id} is orphaned, and its sandbox is on another Docker engine "
                    f"({engine}); reap it from there: `{_reach(engine)} checkfu runs list`"
                )
        if not gone:
            return None
        wanted: set[Wanted] = set()
        for orphan in gone:  # each allocation where it was journaled: a provider service's at its endpoint
            wanted |= {(r.target.provider, r.site) for r in self.journal.open_allocations(run_id=orphan.run_id)}
        if not wanted:  # nothing is held: the providers by name, as ever (they settle the Runs)
            for orphan in gone:
                if orphan.target:
                    try:
                        wanted.add((decode(ExecutionTarget, orphan.target).provider, None))
                    except SandboxError:
                        continue
        registry: Registry | None = None
        try:
            registry = await self.adapters(wanted, adapters_file=False)
            report = await reap_orphans(self.journal, registry, SystemClock(), gone, reaper=reaper or _command_name())
        except Exception as exc:  # the command that opened the journal goes on; the orphan waits for the next
            say(f"checkfu: {len(gone):d} orphaned Run(s) could not be reaped now: {exc}")
            return None
        finally:
            await _close(registry)
        owners = {r.run_id: r.owner for r in gone}
        for run_id in report.reaped:
            say(
                f"checkfu: reaped orphaned Run {run_id} (its owner, {describe_owner(owners[run_id])}, is gone): "
                "everything it held is released"
            )
        if report.left:
            say(
                f"checkfu: {len(report.pending):d} orphaned Run(s) still hold {len(report.left):d} allocation(s) "
                "that could not be released now; the next command tries again, or run `checkfu runner reconcile` "
                "once the provider answers:"
            )
            for key, why in report.left.items():
                say(f"  {key}: {why[:300]}")
        return report


def _reach(engine: str) -> str:
    """The environment a command needs to reach the Docker engine recorded as ``engine``: the default one is the
    engine reached with ``DOCKER_HOST`` unset (never ``DOCKER_HOST=default``)."""
    import shlex  # noqa: PLC0415

    from checkfu.runner.config import DEFAULT_ENGINE  # noqa: PLC0415

    return "env -u DOCKER_HOST" if engine == DEFAULT_ENGINE else f"DOCKER_HOST={shlex.quote(engine)}"


def _command_name() -> str:
    return ("checkfu " + " ".join(sys.argv[1:2])).strip()


def _open_journal(config: RunnerConfig) -> Journal:
    from checkfu.core.journal import Journal  # noqa: PLC0415

    return Journal(config.journal(), deadline=config.journal_deadline)


__all__ = ["Notice", "RunnerConfig", "RunnerService", "Wanted"]
