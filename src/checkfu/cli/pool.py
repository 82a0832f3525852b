"""``checkfu pool``: a warm pool of sandboxes provisioned ahead of demand, which ``checkfu run --pool`` adopts.

There is no daemon. ``checkfu pool fill`` tops the pool of one shape (provider, profile, sealed mount
targets) up to ``-n`` and remembers that size in the state directory; ``checkfu run --pool`` that
adopted one starts ``checkfu pool refill`` in the background as it exits, which tops every remembered
shape up again. ``checkfu pool drain`` releases every ready sandbox and forgets the sizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from checkfu.cli.common import (
    EXIT_REFUSED,
    ConsoleObserver,
    DbOpt,
    JsonOpt,
    choose,
    err,
    load_adapters,
    pin_image,
    refused,
)
from checkfu.cli.interrupts import Interrupted, run_interruptible, sigterm_interrupts
from checkfu.cli.state import current_engine, open_journal, runner_tag, service_of, state_dir
from checkfu.contract.errors import SandboxError
from checkfu.contract.profile import SandboxProfile
from checkfu.core import owner_only
from checkfu.core.admission import raise_problems, target_problems
from checkfu.core.journal import Journal
from checkfu.core.pool import DEFAULT_POOL_TTL, Pooled, ready
from checkfu.core.profiles import read_profile

pool_app = typer.Typer(
    help="A warm pool: sandboxes provisioned ahead of demand, each adopted by one `checkfu run --pool`.",
    no_args_is_help=True,
)


def _sizes_file(tag: str) -> Path:
    return state_dir() / f"pool-{tag}.json"


def _sizes(tag: str) -> dict[str, Any]:
    try:
        loaded = json.loads(_sizes_file(tag).read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _remember(tag: str, key: str, entry: dict[str, Any] | None) -> None:
    sizes = _sizes(tag)
    if entry is None:
        sizes.pop(key, None)
    else:
        sizes[key] = entry
    owner_only.replace_file(_sizes_file(tag), (json.dumps(sizes, indent=2) + "\n").encode())


def _say_ready(entries: list[Pooled], as_json: bool, **more: Any) -> None:
    if as_json:
        print(json.dumps({"ready": [e.as_json() for e in entries], **more}))
        return
    if not entries:
        err.print("pool: no ready sandboxes (`checkfu pool fill --profile FILE -n N` makes some)")
    for e in entries:
        mounts = ",".join(e.mounts) or "-"
        print(f"{e.instance_id}  {e.profile_digest[:19]}  {e.target.provider}  mounts={mounts}  run={e.run_id}")


async def _fill(
    name: str,
    prof: SandboxProfile,
    targets: list[str],
    n: int,
    ttl: float,
    journal: Journal,
    db: str | None,
    quiet: bool,
) -> list[Pooled]:
    service = service_of(journal, db)
    registry = await load_adapters(service, name, None, ConsoleObserver(quiet=quiet), hold=True)
    target = choose(registry, name, True)
    return await service.pool_fill(registry, target, prof, targets, n=n, ttl=ttl)


@pool_app.command("fill")
def pool_fill(
    profile: Annotated[
        Path | None,
        typer.Option("--profile", help="a SandboxProfile, TOML or JSON (default: the built-in one)", metavar="FILE"),
    ] = None,
    n: Annotated[int, typer.Option("-n", min=0, max=64, help="how many ready sandboxes to keep")] = 1,
    mount_target: Annotated[
        list[str] | None,
        typer.Option(
            "--mount-target",
            help="an absolute sandbox path a Run will mount (sealed) there; a Run adopts only its own mount targets",
            show_default=False,
            metavar="PATH",
        ),
    ] = None,
    ttl: Annotated[
        float, typer.Option("--ttl", min=1.0, help="seconds a ready sandbox waits for a Run", metavar="SECONDS")
    ] = DEFAULT_POOL_TTL,
    provider: Annotated[str, typer.Option("--provider", help="provider name", metavar="NAME")] = "docker",
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Provision sandboxes ahead of demand until -n are ready (provisioned, not activated; nothing runs in them)."""
    targets = list(mount_target or [])
    summary: dict[str, Any] = {"ok": False}
    journal: Journal | None = None
    try:
        raise_problems(target_problems(targets))
        read = read_profile(profile, provider)
        raise_problems(read.problems)
        journal = open_journal(db)
        prof = pin_image(read, provider, as_json)
        with sigterm_interrupts():  # SIGINT and SIGTERM stop the fill; the sandbox being made is released
            made = run_interruptible(_fill(provider, prof, targets, n, ttl, journal, db, as_json))
        tag = runner_tag(db)
        shape = json.dumps([provider, prof.digest, targets])
        _remember(
            tag,
            shape,
            {"provider": provider, "profile": prof.model_dump_json(), "mounts": targets, "n": n, "ttl": ttl},
        )
        engine = current_engine() if provider == "docker" else None  # as ``_fill`` records it
        have = [
            e
            for e in ready(journal, tag)
            if e.profile_digest == prof.digest and list(e.mounts) == targets and e.engine == engine
        ]
    except SandboxError as exc:
        refused(exc, None, summary)
        raise typer.Exit(EXIT_REFUSED) from None
    except Interrupted as exc:
        kept = ready(journal, runner_tag(db)) if journal is not None else []
        said = f"[bold red]interrupted[/] by {escape(exc.name)}"
        if kept:  # made before the signal: ready for Runs to adopt, as a fill means them to be
            said += f"; {len(kept):d} ready pooled sandbox(es) are kept (`checkfu pool drain` releases them)"
        err.print(said)
        raise typer.Exit(exc.exit_code) from None
    finally:
        if journal is not None:
            journal.close()
    if not as_json:
        err.print(f"pool: made {len(made):d}, {len(have):d} ready for profile {escape(prof.digest[:19])}")
    _say_ready(have, as_json, made=[e.allocation_key for e in made])


def _refill(tag: str, journal: Journal, db: str | None, made: list[Pooled], errors: list[dict[str, Any]]) -> None:
    """Top every remembered shape of ``tag`` up to its size; what was made and what failed, shape by shape."""
    for spec in _sizes(tag).values():
        try:
            prof = SandboxProfile.model_validate_json(spec["profile"])
            shape = (str(spec["provider"]), list(spec["mounts"]), int(spec["n"]), float(spec["ttl"]))
        except (KeyError, TypeError, ValueError) as exc:
            errors.append(
                {
                    "code": "SandboxProfileInvalid",
                    "message": f"{_sizes_file(tag)}: a saved pool does not read ({type(exc).__name__}); "
                    "fill it again with checkfu pool fill",
                }
            )
            continue
        try:
            made += asyncio.run(_fill(shape[0], prof, shape[1], shape[2], shape[3], journal, db, True))
        except SandboxError as exc:
            errors.append({"code": exc.code, "message": exc.message})


@pool_app.command("refill")
def pool_refill(db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Top every pool `checkfu pool fill` made up to its size again (started by a `checkfu run --pool` that adopted)."""
    tag = runner_tag(db)
    journal = open_journal(db)
    made: list[Pooled] = []
    errors: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        stack.callback(journal.close)
        # One refill at a time per runner tag: two Runs that each adopted start one each, and the second must
        # see what the first made (else the pool grows to twice its size until --ttl reclaims the extra).
        lock = stack.enter_context(owner_only.open_append(_sizes_file(tag).with_suffix(".lock")))
        fcntl.flock(lock, fcntl.LOCK_EX)
        _refill(tag, journal, db, made, errors)
    if as_json:
        print(json.dumps({"made": [e.allocation_key for e in made], "errors": errors}))
    else:
        err.print(f"pool: made {len(made):d}")
        for e in errors:
            err.print(f"[bold red]{escape(e['code'])}[/]: {escape(e['message'])}")
    if errors:
        raise typer.Exit(1)


@pool_app.command("ls")
def pool_ls(db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """List the ready pooled sandboxes of this runner."""
    journal = open_journal(db)
    try:
        entries = ready(journal, runner_tag(db))
    finally:
        journal.close()
    _say_ready(entries, as_json, sizes=list(_sizes(runner_tag(db)).values()) if as_json else None)


@pool_app.command("drain")
def pool_drain(
    provider: Annotated[str, typer.Option("--provider", help="provider name", metavar="NAME")] = "docker",
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Release every ready pooled sandbox and forget the pool sizes (no refill follows). Exits 1 if any is left."""
    tag = runner_tag(db)
    for key in list(_sizes(tag)):
        _remember(tag, key, None)
    journal = open_journal(db)
    try:

        async def go() -> Any:
            service = service_of(journal, db)
            registry = await load_adapters(service, provider, None, ConsoleObserver(quiet=True))
            return await service.pool_drain(registry)

        drained = asyncio.run(go())
    finally:
        journal.close()
    left = [d for d in drained if d.error is not None]
    if as_json:
        print(
            json.dumps(
                {
                    "drained": [d.allocation_key for d in drained if d.error is None],
                    "left": {d.allocation_key: d.error for d in left},
                }
            )
        )
    else:
        err.print(f"pool: drained {len(drained) - len(left):d}")
        for d in left:
            err.print(f"  left {escape(d.allocation_key)}: {escape(d.error or '')}")
    if left:
        raise typer.Exit(1)
