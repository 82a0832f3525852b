"""``checkfu submit``, ``checkfu runs wait``, ``checkfu runner serve`` and ``checkfu runner list``: a fleet.

``submit`` takes every option of ``checkfu run`` (the same function's options, checked by the
same code) and queues the Run instead of running it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from checkfu.cli import common
from checkfu.cli import run as run_cli
from checkfu.cli.consoles import console
from checkfu.cli.engines import EngineCertsOpt, EngineOpt, engine_sites
from checkfu.cli.state import client_credential, is_url, open_journal, open_service
from checkfu.contract.errors import SandboxNotFound
from checkfu.core.clock import SystemClock
from checkfu.core.fleet import FleetConfig
from checkfu.core.job import TIMEOUT_EXIT
from checkfu.core.queue import RunQueue, RunRequest
from checkfu.core.registry import (
    adapters_file,
    read_adapters_file,
)
from checkfu.runner.submission import pinned_mounts

err = console(stderr=True, highlight=False, soft_wrap=True)

EXIT_REFUSED = common.EXIT_REFUSED
"""A Run refused, failed or cancelled: ``checkfu run``'s own code for its own failures (125, docker's)."""
EXIT_INTERRUPTED = 130

DbOpt = common.DbOpt
JsonOpt = common.JsonOpt

# checkfu submit -------------------------------------------------------------------------------

SUBMITTED = frozenset(
    {
        "command",
        "profile",
        "mount",
        "no_ignore",
        "workdir",
        "quiet",
        "provider",
        "capture",
        "capture_dir",
        "db",
        "timeout",
        "credential_file",
        "allow",
        "adapters",
        "image",
        "memory",
        "cpus",
        "pids",
        "disk",
        "network",
    }
)
"""The options of ``checkfu run`` a submitted Run carries (``--adapters`` is checked here, not carried: the runner
that serves the Run loads its own, ``runner serve --adapters``); any other one given is refused by name."""

NOT_QUEUED = {
    "env": ("-e/--env", "a queued Run waits in the database, and an environment value never reaches the journal"),
    "env_file": (
        "--env-file",
        "a queued Run waits in the database, and an environment value never reaches the journal",
    ),
    "interactive": ("-i", "a queued Run runs later, on a runner, with no caller's input to stream"),
    "use_tty": ("-t", "a queued Run runs later, on a runner, with no terminal to follow"),
    "json_file": ("--json", "`checkfu runs wait RUN --json` prints a submitted Run's summary"),
    "publish": ("-p", "a queued Run runs later, on whichever runner serves it, whose loopback is not the caller's"),
}
"""``checkfu run``'s options a queued Run cannot carry, and why."""


def _unsupported(options: dict[str, Any]) -> list[str]:
    """Why each option of ``checkfu run`` given here is not carried by a submitted Run."""
    params = inspect.signature(run_cli.run_command).parameters
    return sorted(
        "{}: {}".format(*NOT_QUEUED.get(name, ("--" + name.replace("_", "-"), "not carried by a submitted Run yet")))
        for name, value in options.items()
        if name not in SUBMITTED and name in params and value != params[name].default
    )


@functools.wraps(run_cli.run_command)
def submit_command(**options: Any) -> None:
    given = _unsupported(options)
    if given:
        raise typer.BadParameter("; ".join(given) + " (use checkfu run for these)")
    if options["credential_file"] is not None:
        raise typer.BadParameter(
            "a submitted Run never carries a credential: give it to `checkfu runner serve` instead",
            param_hint="--credential-file",
        )
    name = options["provider"] or "docker"
    remote = is_url(name)
    warnings: list[str] = []
    overrides, allow = common.overrides_of(  # a refusal is reported as check_run_inputs' are
        options["image"],
        options["memory"],
        options["cpus"],
        options["pids"],
        options["disk"],
        options["network"],
        options["allow"] or [],
    )
    checked = run_cli.check_run_inputs(  # checkfu run's own checks, every problem listed
        command=list(options["command"]),
        profile=options["profile"],
        mounts=options["mount"] or [],
        no_ignore=options["no_ignore"],
        env_values=[],
        env_files=[],
        workdir=options["workdir"],
        interactive=False,
        use_tty=False,
        name=name,
        remote=remote,
        captures=options["capture"] or [],
        capture_dir=options["capture_dir"],
        db=options["db"],
        timeout=options["timeout"],
        allow=allow,
        warnings=warnings,
        adapters=adapters_file(options["adapters"]),
        overrides=overrides,
    )
    # a provider service's profile must name its image pinned: only the Docker tier here pins a tag
    profile = run_cli._allowing(common.pin_image(checked.read, name, quiet=True), allow)
    capture_dir: Path | None = options["capture_dir"]
    request = RunRequest(
        provider=name,
        command=tuple(options["command"]),
        profile=json.loads(profile.model_dump_json()),
        mounts=pinned_mounts(checked.specs),
        stage_all=bool(options["no_ignore"]),
        workdir=options["workdir"],
        captures=tuple(options["capture"] or ()),
        capture_dir=str(capture_dir.resolve()) if capture_dir is not None else None,
        timeout=checked.timeout,
        allowed=tuple(dict.fromkeys(allow)),
    )
    service = open_service(options["db"])
    try:
        run_id = service.submit(request)
    finally:
        service.close()
    if not options["quiet"]:
        for line in warnings:
            err.print(f"[bold yellow]warning[/]: {escape(line)}")
    print(run_id)


SUBMIT_HELP = (
    "Queue a Run for the fleet and print its id: any `checkfu runner serve` on the same --db runs it as "
    "`checkfu run` would. Takes the options of `checkfu run`; follow it with `checkfu runs wait RUN`.\n\nWith "
    "--adapters FILE (or CHECKFU_ADAPTERS) a provider of that adapters file is taken by name; the runners that "
    "serve the Run load it themselves (`checkfu runner serve --adapters FILE`)."
)

# checkfu runs wait ----------------------------------------------------------------------------


@run_cli.runs_app.command("wait")
def runs_wait(
    run: Annotated[str, typer.Argument(help="a run id or a unique prefix", metavar="RUN")],
    db: DbOpt = None,
    as_json: JsonOpt = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="stop waiting after this many seconds (exit 124)")
    ] = None,
) -> None:
    """Stream a submitted Run's output once a runner runs it; exit with its status."""
    service = open_service(db)
    journal = service.journal
    try:
        found = journal.find_runs(run)
        if len(found) != 1:
            raise SandboxNotFound(f"{'no' if not found else len(found)} runs match {run!r}", field="run")
        run_id = found[0].run_id

        def attempt(n: int) -> None:
            if n > 1 and not as_json:
                err.print(
                    f"[yellow]checkfu[/]: attempt {n:d} of {escape(run_id)}: the runner of the one before stopped"
                )

        def write(stream: Any) -> Any:
            def out(data: bytes) -> None:
                if not as_json:
                    stream.buffer.write(data)
                    stream.flush()

            return out

        def warned(text: str) -> None:
            if not as_json:
                err.print(f"[bold yellow]warning[/]: {escape(text)}")

        try:
            result = service.wait(
                run_id,
                on_stdout=write(sys.stdout),
                on_stderr=write(sys.stderr),
                on_attempt=attempt,
                on_warning=warned,
                timeout=timeout,
            )
        except TimeoutError as exc:
            err.print(f"checkfu: {escape(str(exc))}; `checkfu runs wait {escape(run_id)}` waits again")
            raise typer.Exit(TIMEOUT_EXIT) from None
    finally:
        service.close()
    code = _exit_code(result.status, result.exit_code)
    if as_json:
        error = result.error
        print(
            json.dumps(
                {
                    "run_id": result.run_id,
                    "status": result.status,
                    "exit_code": result.exit_code,
                    "attempts": result.attempts,
                    "error": None if error is None else {"code": error.code, "message": error.message},
                }
            )
        )
    elif result.error is not None:
        err.print(f"[bold red]{escape(result.error.code)}[/]: {escape(result.error.message)}")
    elif result.status in ("failed", "cancelled"):
        detail = ((result.summary or {}).get("error") or {}).get("message", "")
        err.print(
            f"checkfu: Run {escape(run_id)} {escape(result.status)}" + (f": {escape(str(detail))}" if detail else "")
        )
    raise typer.Exit(code)


def _exit_code(status: str, exit_code: int | None) -> int:
    if status in ("succeeded", "command_failed") and exit_code is not None:
        return exit_code
    if status == "interrupted":
        return EXIT_INTERRUPTED
    return EXIT_REFUSED  # refused, failed or cancelled: as `checkfu run` exits for its own failures


# checkfu runner serve -------------------------------------------------------------------------


def _render(as_json: bool) -> Any:
    def emit(event: dict[str, Any]) -> None:
        stamped = {"at": round(time.time(), 3), **event}
        if as_json:
            print(json.dumps(stamped), flush=True)
            return
        what = event.get("event", "")
        rest = " ".join(f"{k}={v}" for k, v in event.items() if k != "event")
        colour = {"fenced": "bold red", "settled": "green", "claimed": "cyan", "site_down": "yellow"}.get(what, "dim")
        stamp = datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]
        err.print(f"[dim]{escape(stamp)}[/] [{colour}]{escape(what)}[/] {escape(rest)}")

    return emit


@run_cli.runner_app.command("serve")
def runner_serve(
    db: DbOpt = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, max=256, help="Runs carried out at once")] = 4,
    lease_ttl: Annotated[
        float, typer.Option("--lease-ttl", min=1.0, help="seconds a lease holds without a heartbeat")
    ] = 30.0,
    heartbeat: Annotated[
        float | None, typer.Option("--heartbeat", min=0.05, help="seconds between heartbeats (default: TTL/3)")
    ] = None,
    poll: Annotated[float, typer.Option("--poll", min=0.01, help="seconds between claims while idle")] = 0.2,
    reconcile_every: Annotated[
        float, typer.Option("--reconcile-every", min=1.0, help="seconds between reconciliations")
    ] = 60.0,
    engine: EngineOpt = None,
    engine_certs: EngineCertsOpt = None,
    credential_file: common.CredentialOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per event on stdout")] = False,
    adapters: common.AdaptersOpt = None,
) -> None:
    """Serve queued Runs from the database until SIGTERM: claim, heartbeat, take over, reconcile.

    The adapters file (--adapters FILE, else $CHECKFU_ADAPTERS) is read when a Run's provider is first needed: a
    Run whose provider it leaves ambiguous or unavailable is settled as refused, naming the adapters at fault.
    """
    if heartbeat is not None and heartbeat >= lease_ttl:
        raise typer.BadParameter(f"must be shorter than --lease-ttl ({lease_ttl:g} s)", param_hint="--heartbeat")
    config_file = adapters_file(adapters)
    if config_file is not None:
        read_adapters_file(config_file)  # a file that cannot be read is refused now, not at the first Run
    sites = engine_sites(engine, engine_certs)
    service = open_service(db, adapters=config_file)
    config = FleetConfig(
        concurrency=concurrency,
        lease_ttl=lease_ttl,
        heartbeat=heartbeat,
        poll=poll,
        reconcile_every=reconcile_every,
    )
    fleet = service.fleet(config, credential=client_credential(credential_file), sites=sites, emit=_render(as_json))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, fleet.stop)
        try:
            await fleet.serve()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    try:
        asyncio.run(main())
    finally:
        service.close()


# checkfu runner list --------------------------------------------------------------------------


@run_cli.runner_app.command("list")
def runner_list(
    db: DbOpt = None,
    show_all: Annotated[bool, typer.Option("--all", help="also runners that stopped or stopped heartbeating")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The runners serving this database: their heartbeats and the leases they hold."""
    journal = open_journal(db)
    try:
        queue = RunQueue(journal, SystemClock())
        rows = queue.runners()
        held = queue.leases_of(r.owner for r in rows)
        counts = queue.counts()
    finally:
        journal.close()
    now = time.time()
    shown: list[dict[str, Any]] = []
    for r in rows:
        age = now - r.heartbeat_at
        state = r.state
        if state != "stopped" and age > r.lease_ttl:
            state = "stale"  # no heartbeat for a whole TTL: dead or stalled; its leases are being taken over
        if not show_all and state in ("stopped", "stale"):
            continue
        shown.append(
            {
                "runner_id": r.runner_id,
                "host": r.host,
                "pid": r.pid,
                "state": state,
                "runner_tag": r.runner_tag,
                "concurrency": r.concurrency,
                "lease_ttl": r.lease_ttl,
                "started_at": r.started_at,
                "heartbeat_at": r.heartbeat_at,
                "heartbeat_age": round(age, 3),
                "leases": [
                    {
                        "lease_id": h.lease_id,
                        "run_id": h.run_id,
                        "epoch": h.epoch,
                        "expires_in": round(h.expires_at - now, 3),
                    }
                    for h in held
                    if h.owner == r.owner
                ],
            }
        )
    if as_json:
        print(json.dumps({"runners": shown, "runs": counts}))
        return
    table = Table("runner", "host", "pid", "state", "heartbeat", "leases")
    for s in shown:
        leases = ", ".join(f"{x['run_id']}@{x['epoch']} ({x['expires_in']:.0f} s)" for x in s["leases"]) or "-"
        table.add_row(  # everything recorded is data, never markup: each cell is plain Text
            Text(s["runner_id"]),
            Text(s["host"]),
            Text(str(s["pid"])),
            Text(s["state"]),
            Text(f"{s['heartbeat_age']:.1f} s ago"),
            Text(leases),
        )
    Console().print(table)
    err.print("runs: " + escape(", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
