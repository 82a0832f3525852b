"""``checkfu server``: the start-up server, a warm process each command runs in (``checkfu.cli.startup``).

It holds no state: no journal, no lease, no sandbox. Stopping it, or never starting it, changes how fast a command
starts and nothing else. These commands always run in their own process, never in a server's child.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape

from checkfu.cli import startup
from checkfu.cli.consoles import console

server_app = typer.Typer(
    help="The start-up server: a warm process each command runs in, so no command pays for importing checkfu.",
    no_args_is_help=True,
)
out = console(highlight=False, soft_wrap=True)
err = console(stderr=True, highlight=False, soft_wrap=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]
START_TIMEOUT = 60.0


def _ask(directory: str, key: str, op: str, timeout: float = 5.0) -> dict[str, Any] | None:
    sock = startup.connect(directory, key, timeout=timeout)
    if sock is None:
        return None
    try:
        startup.send_message(sock, {"op": op})
        answer, _ = startup.recv_message(sock)
    except (OSError, EOFError, ValueError):
        return None
    finally:
        sock.close()
    return answer


def _keys(directory: str) -> list[str]:
    try:
        return sorted(p.name[: -len(".sock")] for p in Path(directory).iterdir() if p.name.endswith(".sock"))
    except OSError:
        return []


def _held(directory: str, key: str, then: Callable[[], None] | None = None) -> bool:
    """Whether a server holds ``key``'s lock (it is starting, or alive but not answering); when none does, ``then``
    runs while this process holds it (so no server starts meanwhile). A lock that is missing, or a link, is held
    by no server of this directory."""
    try:
        fd = os.open(os.path.join(directory, f"{key}.lock"), os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        if then is not None:
            then()
        return False
    with os.fdopen(fd, "r+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        if then is not None:
            then()
        return False


def _servers(directory: str, current: str) -> list[dict[str, Any]]:
    found = []
    for key in _keys(directory):
        answer = _ask(directory, key, "status")
        if answer is None:
            found.append({"key": key, "current": key == current, "answering": False, "alive": _held(directory, key)})
        else:
            found.append({**answer, "current": key == current, "answering": True})
    return found


def _unsafe(directory: str) -> NoReturn:
    """Refuse the server directory: name it, say what is wrong with it and what to do."""
    problem = startup.dir_problem(directory) or f"{directory} is not a directory of this user's alone (mode 0700)"
    err.print(f"[bold red]SandboxPathRejected[/]: {escape(problem)}", highlight=False)
    raise typer.Exit(1)


@server_app.command("start")
def start_command(
    idle: Annotated[
        float | None,
        typer.Option(
            "--idle",
            metavar="SECONDS",
            min=1.0,
            help=f"exit after this long with no command running (default ${startup.IDLE_ENV}, else "
            f"{startup.IDLE_DEFAULT:.0f})",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Start the server for this installation's code (if it is not running) and wait until it answers."""
    directory, key = startup.runtime_dir(), startup.code_key()
    answer = _ask(directory, key, "status")
    if answer is None:
        proc = startup.spawn(directory, idle)
        if proc is None:
            _unsafe(directory)
        if not as_json:
            err.print("server: starting (it imports what commands use, a second or two)")
        deadline = time.monotonic() + START_TIMEOUT
        while answer is None and time.monotonic() < deadline:
            time.sleep(0.05)
            answer = _ask(directory, key, "status")
            if answer is None and proc is not None and proc.poll() not in (None, 0):
                break  # it exited with an error (another server's exit 0 means that one is starting)
        if answer is None:
            err.print(
                f"[bold red]SandboxAdapterUnavailable[/]: the server did not answer within {START_TIMEOUT:.0f} s; "
                f"run `python -m checkfu.cli.startup_server --dir {escape(directory)} --key {escape(key)}` to see why",
                highlight=False,
            )
            raise typer.Exit(1)
        started = True
    else:
        started = False
    if as_json:
        print(json.dumps({**answer, "started_now": started}))
    else:
        said = "started" if started else "already running"
        out.print(f"server {said}: pid {answer['pid']}, {answer['socket']}", markup=False)


@server_app.command("stop")
def stop_command(as_json: JsonOpt = False) -> None:
    """Stop every server of this user (a command still running in one finishes and reports its status)."""
    directory = startup.runtime_dir()
    if os.path.lexists(directory) and not startup.private_dir(directory):
        _unsafe(directory)
    stopped: list[dict[str, Any]] = []
    removed: list[str] = []
    silent: list[str] = []

    def unlink(key: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(startup.socket_path(directory, key))
        removed.append(key)

    for key in _keys(directory):
        answer = _ask(directory, key, "stop")
        if answer is not None:
            stopped.append({"key": key, "pid": answer.get("pid")})
        elif _held(directory, key, then=functools.partial(unlink, key)):
            silent.append(key)  # a server holds it but does not answer: busy, or stopped by a signal
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(
        os.path.exists(startup.socket_path(directory, s["key"])) for s in stopped
    ):
        time.sleep(0.05)
    if as_json:
        print(json.dumps({"stopped": stopped, "stale_sockets_removed": removed, "not_answering": silent}))
        return
    if not stopped and not removed and not silent:
        out.print("server: none running")
    for key in silent:
        out.print(f"server {key}: alive but not answering; left running (see `checkfu server status`)", markup=False)
    for s in stopped:
        out.print(f"server stopped: pid {s['pid']} ({s['key']})", markup=False)
    for key in removed:
        out.print(f"server socket removed: {key} (its server was gone)", markup=False)


@server_app.command("status")
def status_command(as_json: JsonOpt = False) -> None:
    """The servers of this user: which serves this installation's code, what each has served, its memory."""
    directory, key = startup.runtime_dir(), startup.code_key()
    servers = _servers(directory, key) if startup.private_dir(directory) else []
    if as_json:
        print(
            json.dumps(
                {
                    "mode": startup.mode(),
                    "dir": directory,
                    "dir_private": startup.private_dir(directory) or not os.path.exists(directory),
                    "dir_problem": startup.dir_problem(directory) if os.path.lexists(directory) else None,
                    "key": key,
                    "servers": servers,
                }
            )
        )
        return
    if os.path.lexists(directory) and not startup.private_dir(directory):
        _unsafe(directory)
    out.print(f"mode {startup.mode()} (${startup.ENV}); this code's key {key}", markup=False)
    if not servers:
        out.print("server: none running (`checkfu server start` starts one)")
    for s in servers:
        mark = "current" if s["current"] else "other code"
        if not s["answering"]:
            said = "alive but not answering" if s["alive"] else "gone (a socket left behind)"
            out.print(f"server {s['key']}: {said} ({mark}); `checkfu server stop` clears a dead one", markup=False)
            continue
        age = time.time() - float(s["started"])
        out.print(
            f"server {s['key']}: pid {s['pid']} ({mark}), up {age:.0f} s, served {s['served']}, "
            f"running {s['running']}, {int(s['rss_kib']) // 1024} MiB, exits after {s['idle_exit_s']:.0f} s idle",
            markup=False,
        )
        spare = s.get("spare")
        if isinstance(spare, dict):
            state = "ready" if spare.get("ready") else "getting ready"
            out.print(
                f"  spare: pid {spare.get('pid')} ({state}), {int(spare.get('rss_kib') or 0) // 1024} MiB of its own; "
                f"{s.get('served_by_spare', 0)} command(s) served by spares",
                markup=False,
            )
