"""``checkfu logs RUN [-f]``: the output kept with a Run, as ``docker logs`` prints a container's."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Annotated, Any

import typer
from rich.markup import escape

from checkfu.cli.common import DbOpt, JsonOpt, human_bytes
from checkfu.cli.consoles import console
from checkfu.cli.state import open_journal, service_of
from checkfu.core.journal import Journal, OutputRow, RunRow
from checkfu.core.leases import owner_gone
from checkfu.core.output import CAP_ENV, OUTPUT_CAP
from checkfu.core.queue import is_terminal
from checkfu.core.reconcile import run_status

err = console(stderr=True, highlight=False, soft_wrap=True)

POLL = 0.1
"""Seconds between looks at the journal while following (growing to ``POLL_MAX`` while nothing comes)."""
POLL_MAX = 0.5
STREAMS = {"out": "stdout", "err": "stderr", "warn": "warning"}

LOGS_HELP = (
    "The output kept with a Run: its stdout to stdout, its stderr to stderr, in the order they came.\n\n"
    f"Each Run keeps the first {human_bytes(OUTPUT_CAP)} of its output (stdout and stderr together; "
    f"{CAP_ENV}=BYTES when the Run was started sets another cap); beyond the cap output is counted, not kept, and "
    "this command says how much was dropped. With -f, follows a Run still running until it ends, as "
    "`docker logs -f` does."
)


def find_run(journal: Journal, run: str, *, as_json: bool = False) -> RunRow:
    """The one Run whose id starts with ``run``; or, when no Run's does, the Run of the one sandbox whose id starts
    with it (a long-lived sandbox is one Run: its calls, its profile, how it ended).

    Raises:
        typer.Exit: none or several match (said on stderr, or as JSON on stdout with ``as_json``; exit 1).
    """
    found = journal.find_runs(run)
    boxes = ""
    if not found and run and not "run-".startswith(run[:4]):  # a Run's id starts run-; a sandbox's, sb-
        from checkfu.core.sandboxes import SandboxBook  # noqa: PLC0415 - only for a sandbox id

        rows = [journal.run(b.run_id) for b in SandboxBook(journal).find(run)]
        found = [r for r in rows if r is not None]
        boxes = " and no sandbox id does" if not found else " (by sandbox id)"
    if len(found) != 1:
        where = ", `checkfu ps` the live sandboxes" if boxes else ""
        message = (
            f"{'no' if not found else len(found)} runs match {run!r}{boxes} (`checkfu runs list` lists them{where})"
        )
        if as_json:
            error = {"code": "SandboxNotFound", "message": message, "field": "run"}
            print(json.dumps({"ok": False, "error": error}))
        else:
            err.print(f"[bold red]SandboxNotFound[/]: {escape(message)} (field: run)")
        raise typer.Exit(1)
    return found[0]


def sandbox_of(journal: Journal, row: RunRow) -> dict[str, Any] | None:
    """The long-lived sandbox whose Run ``row`` is (its id, state, why it ended, its time-to-live's deadline and
    what it was made from), else ``None``."""
    if row.command is not None:  # a Run of a command: no sandbox outlives it
        return None
    from checkfu.core.sandboxes import SandboxBook  # noqa: PLC0415 - only for a sandbox's Run

    for box in SandboxBook(journal).find(row.run_id):
        if box.run_id == row.run_id:
            return {
                "sandbox_id": box.sandbox_id,
                "state": box.state,
                "reason": box.reason,
                "expires_at": box.expires_at,
                "origin": box.origin,
            }
    return None


def history_of(row: RunRow, sandbox: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the journal keeps of how a Run was asked for and how it ended, besides its calls: its ``timeout`` in
    seconds, whether it ``timed_out``, its network ``allowlist``, its ``profile`` (where it was read from, its
    digest, the document as admitted) and, for a long-lived sandbox's Run, the ``sandbox`` (``sandbox_of``). A value
    the journal does
    not hold is ``None`` (a Run recorded before it was kept; ``timed_out`` of a Run not yet ended, or of a
    sandbox, which has a time-to-live instead)."""
    story, summary = row.story or {}, row.summary or {}
    document = story.get("profile")
    network = document.get("network_policy") if isinstance(document, dict) else None
    timed_out = summary.get("timed_out")
    return {
        "timeout": story.get("timeout"),
        "timed_out": timed_out if isinstance(timed_out, bool) else None,
        "allowlist": story.get("allowlist"),
        "profile": {
            "source": story.get("profile_source"),
            "digest": row.profile_digest,
            "network": network.get("mode") if isinstance(network, dict) else None,
            "document": document,
        },
        "sandbox": sandbox,
    }


def history_lines(row: RunRow, sandbox: dict[str, Any] | None = None) -> list[str]:
    """``history_of`` as plain lines for a terminal (data, never markup: the caller prints them as Text)."""
    h = history_of(row, sandbox)
    lines = []
    box = h["sandbox"]
    if box:
        why = f" ({box['reason']})" if box["reason"] else ""
        lines.append(f"sandbox   {box['sandbox_id']} {box['state']}{why}")
    p = h["profile"]
    source = p["source"] or ("not recorded" if p["document"] is None else "as admitted")
    lines.append(f"profile   {source} ({p['digest'] or 'no digest recorded'})")
    if p["document"] is not None:
        allow = ", ".join(h["allowlist"] or []) or "none"
        lines.append(f"network   {p['network']}; allowlist: {allow}")
    if h["timeout"] is not None:
        said = {True: "timed out: killed at the timeout", False: "did not time out", None: "not ended"}
        lines.append(f"timeout   {h['timeout']:g} s; {said[h['timed_out']]}")
    elif not box:
        lines.append("timeout   not recorded")
    return lines


def truncation(row: RunRow) -> dict[str, Any]:
    """What the Run's summary says of its kept output: bytes kept, dropped and the cap (empty when unknown yet)."""
    summary = row.summary or {}
    out: dict[str, Any] = {}
    for key in ("output_kept_bytes", "output_dropped_bytes", "output_cap_bytes", "output_lost_bytes"):
        if isinstance(summary.get(key), int):
            out[key.removeprefix("output_")] = summary[key]
    return out


def truncation_note(row: RunRow) -> str | None:
    """A sentence for a Run whose output was cut at the cap (or partly lost), else ``None``."""
    t = truncation(row)
    dropped, lost = t.get("dropped_bytes", 0), t.get("lost_bytes", 0)
    notes = []
    if dropped:
        cap = t.get("cap_bytes", OUTPUT_CAP)
        notes.append(
            f"output truncated: the first {human_bytes(cap)} of this Run's output are kept (the cap, stdout and "
            f"stderr together); {dropped:d} more bytes were dropped"
        )
    if lost:
        notes.append(f"{lost:d} bytes of output within the cap were lost (the journal could not take them)")
    return "; ".join(notes) or None


def _write(chunk: OutputRow) -> None:
    if chunk.stream == "out":
        sys.stdout.buffer.write(chunk.data)
        sys.stdout.flush()
    elif chunk.stream == "err":
        sys.stderr.buffer.write(chunk.data)
        sys.stderr.flush()
    else:
        err.print(f"[bold yellow]warning[/]: {escape(chunk.data.decode('utf-8', 'replace'))}")


def _chunk_json(chunk: OutputRow) -> dict[str, Any]:
    return {
        "stream": STREAMS.get(chunk.stream, chunk.stream),
        "data": chunk.data.decode("utf-8", "replace"),
        "at": chunk.at,
        "attempt": chunk.attempt,
    }


def _end_json(row: RunRow, shown: str, sandbox: dict[str, Any] | None = None) -> dict[str, Any]:
    t = truncation(row)
    return {
        "run_id": row.run_id,
        "status": shown,
        "exit_code": row.exit_code,
        **history_of(row, sandbox),
        "truncated": bool(t.get("dropped_bytes")),
        "kept_bytes": t.get("kept_bytes"),
        "dropped_bytes": t.get("dropped_bytes", 0),
        "cap_bytes": t.get("cap_bytes", OUTPUT_CAP),
    }


def logs_command(
    run: Annotated[str, typer.Argument(help="a run id or a unique prefix (or a sandbox id: its Run)", metavar="RUN")],
    follow: Annotated[bool, typer.Option("-f", "--follow", help="follow a running Run's output until it ends")] = False,
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    journal = open_journal(db)
    try:
        row = find_run(journal, run, as_json=as_json)
        run_id = row.run_id
        chunks: list[dict[str, Any]] = []
        last = 0
        pause = POLL
        while True:
            row = journal.run(run_id) or row  # read before the output: all written before it settled is then there
            got = journal.output_since(run_id, last)
            for chunk in got:
                last = chunk.id
                if as_json:
                    if follow:
                        print(json.dumps(_chunk_json(chunk)), flush=True)
                    else:
                        chunks.append(_chunk_json(chunk))
                else:
                    _write(chunk)
            if got:
                pause = POLL
                continue
            if not follow or is_terminal(row.status):
                break
            if row.status == "running" and row.owner is not None and owner_gone(row.owner, row.owner_boot):
                # its owner died while followed: this command reaps it, as any other would
                asyncio.run(service_of(journal, db).reap_orphans())
                row = journal.run(run_id) or row
                if not as_json:
                    err.print(f"[yellow]checkfu[/]: Run {escape(run_id)} is orphaned: its owner process is gone")
                if run_status(row) != "running" and not journal.output_since(run_id, last, limit=1):
                    break
                continue
            time.sleep(pause)
            pause = min(pause * 1.5, POLL_MAX)
        sandbox = sandbox_of(journal, row)
    finally:
        journal.close()
    shown = run_status(row)
    if as_json:
        end = _end_json(row, shown, sandbox)
        if follow:
            print(json.dumps({"end": end}))
        else:
            t = {"stdout": "", "stderr": ""}
            for c in chunks:
                if c["stream"] in t:
                    t[c["stream"]] += c["data"]
            print(json.dumps({**end, "output": chunks, **t}))
        return
    note = truncation_note(row)
    if note:
        err.print(f"[yellow]checkfu[/]: {escape(note)}")
    history = history_of(row)
    if history["timed_out"]:
        err.print(
            f"[yellow]checkfu[/]: Run {escape(row.run_id)} timed out: the command ran past its timeout of "
            f"{escape(format(history['timeout'], 'g'))} s and was killed (exit {escape(str(row.exit_code))})"
        )
    if sandbox is not None and not last:
        err.print(
            f"[dim]checkfu: Run {escape(row.run_id)} is a long-lived sandbox's: what `checkfu exec` printed went to "
            f"its caller, not to the journal (`checkfu runs show {escape(row.run_id)}` lists each call)[/]"
        )
    elif not last and not (row.summary or {}).get("output_cap_bytes") and is_terminal(row.status):
        err.print("[dim]checkfu: no output was kept for this Run[/]")
