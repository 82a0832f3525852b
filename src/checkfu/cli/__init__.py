"""The ``checkfu`` command. Thin: it calls only the public API and renders what comes back.

``main`` answers ``checkfu --version`` before importing anything else (not even ``typing`` or
``importlib.metadata``), so it costs Python's own start-up and no more, and ``checkfu ps`` on a journal with nothing
to list or reclaim from the standard library alone (``checkfu.cli.quick``); the command tree lives in
``checkfu.cli.commands``, which loads a subcommand's module only when that subcommand runs.
"""

from __future__ import annotations

import gc
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

EXIT_REFUSED = 1
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_RUN_REFUSED = 125
"""``checkfu run``'s own failures (a refusal, a usage error, a sandbox failure or an internal error), as docker
reserves 125 for its own; other commands keep 1 for a refusal and 2 for a usage error."""
EXIT_USAGE = 2


def version_text() -> str:
    """``checkfu X.Y.Z``: ``checkfu.__version__``, which a test holds equal to the installed distribution's version
    (reading that through ``importlib.metadata`` would cost more than all of Python's start-up)."""
    from checkfu import __version__  # noqa: PLC0415

    return f"checkfu {__version__}"


def __getattr__(name: str) -> Any:
    if name == "app":
        from checkfu.cli.commands import app  # noqa: PLC0415

        return app
    raise AttributeError(name)


def main() -> None:
    """Entry point: ``--version`` at once; otherwise the command runs in a warm start-up server's child when one
    is serving this code (``checkfu.cli.startup``), or here."""
    if sys.argv[1:] == ["--version"]:
        print(version_text())
        return
    if sys.argv[1:2] == ["ps"]:
        from checkfu.cli import quick  # noqa: PLC0415 - stdlib only: `ps` with nothing to list or reclaim

        quick.main(sys.argv[1:])
    # `checkfu mcp` lives long and ends on a signal with its own cleanup: it gains nothing from a warm start
    serving = sys.argv[1:2] not in (["server"], ["mcp"]) and _server_mode() != "off"
    if serving:
        from checkfu.cli import startup  # noqa: PLC0415 - stdlib only

        try:
            code = startup.attach(sys.argv[1:])
        except KeyboardInterrupt:  # Ctrl-C before any server took the command: nothing ran
            sys.exit(EXIT_INTERRUPTED)
        if isinstance(code, int):
            _relayed(code)
        # A server of this code refused this process's context: another started for it would find this one
        # holding the code's lock, and end.
        serving = code is None
    try:
        run_here()
    finally:
        if serving and _should_start_server():
            _start_server()


def _relayed(code: int) -> NoReturn:
    """Exit with the status a server's child reported, at once: this process only relayed the command, and
    Python's own finalization would add milliseconds to every one (4 ms measured, of a `checkfu run` of 490)."""
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - contextlib is not loaded here
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _server_mode() -> str:
    from checkfu.cli import startup  # noqa: PLC0415

    return startup.mode()


def _should_start_server() -> bool:
    """``on``; or ``auto`` with a person at a terminal (standard input and standard error both one)."""
    mode = _server_mode()
    return mode == "on" or (mode == "auto" and os.isatty(0) and os.isatty(2))


def _start_server() -> None:
    from checkfu.cli import startup  # noqa: PLC0415

    try:  # noqa: SIM105 - contextlib is not loaded by then, and this is every command's way out
        startup.spawn()
    except OSError:
        pass  # the next command tries again; this one's outcome stands


def run_here(*, warm: bool = False) -> None:
    """Run the command ``sys.argv`` names in this process: no traceback reaches a user unless
    ``CHECKFU_DEBUG=1``. ``warm``: a start-up server's child, whose modules are loaded and objects frozen."""
    from checkfu.cli import commands  # noqa: PLC0415 - the tree; each command's module loads when it runs

    if not warm:
        # Start-up makes only objects that live as long as the process (modules, classes, models): collecting
        # garbage while they are made, and again at exit, walks them all for nothing (about a quarter of `checkfu
        # run`'s start). So the collector waits until the command's module is loaded, then leaves those out.
        gc.disable()
        commands.ON_LOAD.append(_settle_gc)
    app = commands.app

    running = len(sys.argv) > 1 and sys.argv[1] in ("run", "exec")  # docker's 125 for its own failures
    try:
        app()
    except SystemExit as exc:
        # A usage error of `checkfu run` (click's 2) is checkfu's own failure: 125, as docker's is;
        # the command's own status 2 (it ran: run.FINISHED says so) passes through.
        if running and exc.code == EXIT_USAGE and not _finished():
            sys.exit(EXIT_RUN_REFUSED)
        raise
    except KeyboardInterrupt as exc:
        # Ctrl-C, or a command's own ``checkfu.cli.interrupts.Interrupted`` (SIGINT or SIGTERM, after it wound up
        # what it held): 128 + the signal, 130 or 143.
        code = getattr(exc, "exit_code", EXIT_INTERRUPTED)
        from rich.markup import escape  # noqa: PLC0415

        _err().print(
            "interrupted" + (f" by {escape(str(exc.args[0]))}" if code != EXIT_INTERRUPTED and exc.args else "")
        )
        sys.exit(code)
    except Exception as exc:
        # The contract's errors and the journal's are told by their classes, looked up only where their modules
        # were loaded (an exception of a module that was never imported cannot be one of its classes).
        from rich.markup import escape  # noqa: PLC0415

        errors, journal = sys.modules.get("checkfu.contract.errors"), sys.modules.get("checkfu.core.journal")
        if errors is not None and isinstance(exc, errors.SandboxError):
            _err().print(f"[bold red]{escape(exc.code)}[/]: {escape(exc.message)}", highlight=False, markup=True)
            sys.exit(EXIT_RUN_REFUSED if running else EXIT_REFUSED)
        if journal is not None and isinstance(exc, journal.JournalError):
            _err().print(
                f"[bold red]journal unavailable[/]: {escape(str(exc))}. Nothing was asked of a provider without its "
                "record; run `checkfu runner reconcile` once the journal answers to settle what it could not record",
                highlight=False,
            )
            sys.exit(EXIT_RUN_REFUSED if running else EXIT_REFUSED)
        owner_only = sys.modules.get("checkfu.core.owner_only")
        if owner_only is not None and isinstance(exc, owner_only.StateDirRefused):
            _err().print(f"checkfu: {exc}", highlight=False, markup=False)
            sys.exit(EXIT_RUN_REFUSED if running else EXIT_REFUSED)
        if os.environ.get("CHECKFU_DEBUG") == "1":
            raise
        _err().print(
            f"checkfu: internal error: {type(exc).__name__}: {exc} (set CHECKFU_DEBUG=1 for a traceback)",
            highlight=False,
            markup=False,
        )
        sys.exit(EXIT_RUN_REFUSED if running else EXIT_INTERNAL)


def _settle_gc() -> None:
    """Move every object made so far out of the collector's sight (``gc.freeze``) and collect again from here."""
    gc.freeze()
    gc.enable()


def _err() -> Any:
    from rich.console import Console  # noqa: PLC0415

    return Console(stderr=True, soft_wrap=True)


def _finished() -> bool:
    """Whether the command ran (``checkfu run``/``exec`` record its status in ``checkfu.cli.run.FINISHED``)."""
    run = sys.modules.get("checkfu.cli.run")
    return run is not None and bool(run.FINISHED)
