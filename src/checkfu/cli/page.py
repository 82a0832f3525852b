"""A Run's story as one self-contained HTML page (``checkfu runs show RUN --html FILE``).

The page loads nothing: its style is inline, it has no script, and a Content-Security-Policy of
``default-src 'none'`` forbids anything else a browser might fetch. Everything recorded (argv,
output, adapter names, file paths, details) is data: every piece is escaped before it is written.
"""

from __future__ import annotations

import datetime
import shlex
from collections.abc import Sequence
from html import escape
from typing import Any

from checkfu.cli.common import human_bytes
from checkfu.cli.logs import history_of
from checkfu.core.journal import AllocationRow, EventRow, OutputRow, RunRow
from checkfu.core.output import OUTPUT_CAP
from checkfu.core.reconcile import describe_owner, run_status

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
main{max-width:1100px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d5d9de;padding-bottom:4px}
code,pre,.mono{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,monospace;font-size:12.5px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #e4e7eb;vertical-align:top}
th{background:#eef0f3;font-weight:600}
.kv td:first-child{width:170px;color:#57606a}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;background:#e4e7eb}
.ok,.succeeded,.runner_enforced,.provider_attested{background:#d8f3dc;color:#1b5e20}
.error,.failed,.orphaned,.abandoned,.not_enforced,.command_failed{background:#fde2e1;color:#8a1c1c}
.warning,.guest_observed,.running,.interrupted{background:#fff4d6;color:#7a4d00}
.bar{position:relative;height:12px;background:#eef0f3;min-width:160px}
.bar span{position:absolute;top:0;bottom:0;background:#4f7cac;min-width:2px}
.bar span.error{background:#c0392b}
pre{background:#0f1419;color:#e6e1cf;padding:12px;overflow:auto;white-space:pre-wrap;word-break:break-all;margin:0}
pre .stderr{color:#ff8f80}
.note{color:#57606a;margin:6px 0}
.num{white-space:nowrap;text-align:right}
"""


def _when(t: float | None) -> str:
    if t is None:
        return ""
    return datetime.datetime.fromtimestamp(t, tz=datetime.UTC).isoformat(timespec="milliseconds")


def _e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def _badge(text: str) -> str:
    cls = "".join(ch for ch in text.split(":", 1)[0] if ch.isalnum() or ch == "_")
    return f'<span class="badge {_e(cls)}">{_e(text)}</span>'


def _kv(rows: Sequence[tuple[str, str]]) -> str:
    """A two-column table; the values are HTML already escaped by the caller."""
    body = "".join(f"<tr><td>{_e(k)}</td><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _word(value: object) -> str:
    """A recorded value as the page says it: ``yes``/``no`` for a flag, never a Python repr (``True``, ``None``)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ", ".join(_word(v) for v in value)
    return str(value)


def _mode(f: dict[str, Any]) -> str:
    """A staged file's mode as ``ls`` and ``chmod`` write it (``0755``), not Python's ``0o755``."""
    return "symlink" if f.get("symlink") else f"{int(f.get('mode', 0)):04o}"


def _profile(row: RunRow, story: dict[str, Any]) -> str:
    """The resolved profile the Run got (image, limits, network, allowlist, timeout), at the top of the page."""
    prof = story.get("resolved_profile")
    if not isinstance(prof, dict):
        return (
            '<h2>Profile</h2><p class="note" id="profile">the resolved profile is not recorded for this Run '
            f"(its digest: <code>{_e(row.profile_digest)}</code>)</p>"
        )
    allow = prof.get("allowlist") or []
    timeout = prof.get("timeout_seconds")
    rows = [
        ("image", f"<code>{_e(prof.get('image'))}</code>"),
        (
            "limits",
            _e(
                f"{float(prof.get('cpus', 0)):g} cpus, {_word(prof.get('memory_mib'))} MiB memory, "
                f"{_word(prof.get('disk_mib'))} MiB disk, {_word(prof.get('pids'))} pids"
            ),
        ),
        ("network", _e(_word(prof.get("network")))),
        ("allowlist", _e(", ".join(map(str, allow))) if allow else "nothing"),
        ("timeout", _e(f"{float(timeout):g} s") if timeout is not None else "none"),
    ]
    return '<h2>Profile</h2><section id="profile">' + _kv(rows) + "</section>"


def _header(row: RunRow, status: str) -> str:
    rows = [
        ("status", _badge(status) + (" (its owner process is gone)" if status != row.status else "")),
        ("exit code", _e(row.exit_code)),
        ("command", f'<code id="command">{_e(shlex.join(row.command or []))}</code>'),
        ("started", _e(_when(row.created_at))),
        ("finished", _e(_when(row.finished_at))),
        ("took", _e(f"{(row.finished_at - row.created_at):.3f} s") if row.finished_at else ""),
        ("owner", _e(describe_owner(row.owner)) if row.owner else "(a Run of the fleet, or recorded before owners)"),
        ("runner tag", f"<code>{_e(row.runner_tag)}</code>"),
        ("profile digest", f"<code>{_e(row.profile_digest)}</code>"),
    ]
    h = history_of(row)
    said = {True: "timed out: killed at the timeout", False: "did not time out", None: "not ended"}
    timeout = "not recorded" if h["timeout"] is None else f"{h['timeout']:g} s"
    rows += [
        ("profile", _e(h["profile"]["source"] or ("not recorded" if h["profile"]["document"] is None else ""))),
        ("network", _e(h["profile"]["network"] or "not recorded")),
        ("allowlist", f'<span id="allowlist">{_e(", ".join(h["allowlist"] or []) or "none")}</span>'),
        (
            "timeout",
            f'<span id="timeout">{_e(timeout)}</span>'
            + (f' <span id="timed-out">{_e(said[h["timed_out"]])}</span>' if h["timeout"] is not None else ""),
        ),
    ]
    summary = row.summary or {}
    if summary.get("reason"):
        rows.append(("settled", _e(f"{summary.get('settled_by', '')}: {summary['reason']}")))
    if summary.get("reaped_by"):
        rows.append(("reaped by", _e(summary["reaped_by"])))
    return f"<h1>Run <code>{_e(row.run_id)}</code></h1>" + _kv(rows)


def _adapter(row: RunRow, story: dict[str, Any]) -> str:
    grade = story.get("grade") or {}
    short = grade.get("short_of_next") or []
    rows = [
        ("adapter", f'<code id="adapter">{_e(story.get("adapter") or row.target)}</code>'),
        ("grade", f'<span id="grade">{_badge(str(grade.get("label", "not recorded")))}</span>'),
        ("short of next tier", _e("; ".join(map(str, short))) if short else "nothing (the top tier)"),
        ("in tree", _e(_word(story.get("in_tree")))),
        ("source", _e(story.get("source"))),
    ]
    if story.get("site"):
        rows.append(("site", _e(story["site"])))
    return '<h2>Adapter and grade</h2><section id="adapter-section">' + _kv(rows) + "</section>"


def _axes(story: dict[str, Any]) -> str:
    axes = story.get("axes") or []
    if not axes:
        return '<h2>The nine axes</h2><p class="note" id="axes">not recorded for this Run</p>'
    body = "".join(
        f"<tr><td><code>{_e(a.get('axis'))}</code></td><td>{_badge(str(a.get('authority')))}</td>"
        f"<td>{'counts as enforcement' if a.get('counts') else 'does not count as enforcement'}</td></tr>"
        for a in axes
    )
    return (
        '<h2>The nine axes</h2><table id="axes"><tr><th>axis</th><th>who enforces it</th><th></th></tr>'
        + body
        + "</table>"
    )


def _staged(story: dict[str, Any]) -> str:
    mounts = story.get("mounts")
    if mounts is None:
        return '<h2>Staged files</h2><p class="note" id="staged">not recorded for this Run</p>'
    if not mounts:
        return '<h2>Staged files</h2><p class="note" id="staged">no mounts: nothing was staged</p>'
    parts = ['<h2>Staged files</h2><section id="staged">']  # below the output; each mount's list folded
    for m in mounts:
        files = m.get("files") or []
        count = int(m.get("file_count", len(files)))
        parts.append(
            f"<p><code>{_e(m.get('source'))}</code> → <code>{_e(m.get('target'))}</code> "
            f"{'(writable, not sealed)' if m.get('writable') else '(sealed read-only)'}: "
            f"{count:d} files, {_e(human_bytes(int(m.get('bytes', 0))))}</p>"
        )
        parts.append(
            f"<details><summary>{count:d} files</summary>"
            "<table><tr><th>path</th><th>size</th><th>mode</th><th>digest</th></tr>"
        )
        for f in files:
            kind = " (symlink)" if f.get("symlink") else ""
            parts.append(
                f'<tr class="file"><td><code>{_e(f.get("path"))}</code>{kind}</td><td>{_e(f.get("size"))}</td>'
                f"<td><code>{_e(_mode(f))}</code></td>"
                f'<td><code class="digest">{_e(f.get("digest"))}</code></td></tr>'
            )
        parts.append("</table></details>")
        if count > len(files):
            parts.append(
                f'<p class="note">{count - len(files):d} more files are not listed: a Run\'s story lists the first '
                f"{_e(story.get('files_cap'))} files of all its mounts.</p>"
            )
    parts.append("</section>")
    return "".join(parts)


def _timeline(row: RunRow, events: Sequence[EventRow]) -> str:
    if not events:
        return '<h2>Member calls</h2><p class="note" id="timeline">no member call was recorded</p>'
    t0 = min(*(e.started_at for e in events), row.created_at)
    end = max(e.started_at + e.duration_ms / 1000 for e in events)
    span = max(end - t0, 1e-6)
    body = []
    for i, e in enumerate(events, 1):
        left = (e.started_at - t0) / span * 100
        width = max(e.duration_ms / 1000 / span * 100, 0.0)
        outcome = e.error_code or e.outcome
        cls = "error" if e.outcome == "error" else "ok"
        body.append(
            f'<tr class="call"><td>{i:d}</td><td><code class="member">{_e(e.member)}</code></td>'
            f'<td class="num">+{(e.started_at - t0) * 1000:.1f} ms</td><td class="num">{e.duration_ms:.1f} ms</td>'
            f'<td class="outcome">{_badge(outcome)}</td>'
            f'<td><div class="bar"><span class="{cls}" style="left:{left:.3f}%;width:{width:.3f}%"></span></div></td>'
            f"<td><code>{_e(e.allocation_key)}</code></td><td>{_e((e.detail or '')[:500])}</td></tr>"
        )
    return (
        '<h2>Member calls</h2><table id="timeline"><tr><th>#</th><th>member</th><th>at</th><th>took</th>'
        "<th>outcome</th><th>timeline</th><th>allocation</th><th>detail</th></tr>" + "".join(body) + "</table>"
    )


def _phases(row: RunRow) -> str:
    phases = (row.summary or {}).get("phases")
    if not isinstance(phases, dict) or not phases:
        return ""
    cells = "".join(f"<tr><td>{_e(k)}</td><td>{float(v) * 1000:.1f} ms</td></tr>" for k, v in phases.items())
    return f'<h2>Phases</h2><table id="phases"><tr><th>phase</th><th>took</th></tr>{cells}</table>'


def _allocations(allocs: Sequence[AllocationRow]) -> str:
    if not allocs:
        return ""
    body = "".join(
        f"<tr><td><code>{_e(a.allocation_key)}</code></td><td>{_e(a.kind)}</td><td>{_badge(a.state)}</td>"
        f"<td><code>{_e(a.object_id)}</code></td></tr>"
        for a in allocs
    )
    return (
        '<h2>Allocations</h2><table id="allocations"><tr><th>key</th><th>kind</th><th>state</th>'
        f"<th>provider object</th></tr>{body}</table>"
    )


def _output(row: RunRow, chunks: Sequence[OutputRow], note: str | None) -> str:
    summary = row.summary or {}
    cap = summary.get("output_cap_bytes", OUTPUT_CAP)
    parts = [
        '<h2>Output</h2><p class="note">The first '
        f"{_e(human_bytes(int(cap)))} of a Run's output are kept (stdout and stderr together); stderr is shown "
        "in red.</p>"
    ]
    if note:
        parts.append(f'<p class="note" id="truncated">{_e(note)}</p>')
    if not chunks:
        parts.append('<p class="note" id="output">no output was kept</p>')
        return "".join(parts)
    body = "".join(
        f'<span class="{"stderr" if c.stream == "err" else "stdout"}">{_e(c.data.decode("utf-8", "replace"))}</span>'
        for c in chunks
        if c.stream in ("out", "err")
    )
    parts.append(f'<pre id="output">{body}</pre>')
    return "".join(parts)


def render(
    row: RunRow,
    events: Sequence[EventRow],
    allocs: Sequence[AllocationRow],
    chunks: Sequence[OutputRow],
    note: str | None = None,
) -> str:
    """The whole page: one string of HTML that loads nothing else."""
    status = run_status(row)
    story = row.story or {}
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>checkfu Run {_e(row.run_id)}</title><style>{STYLE}</style></head>"
        "<body><main>"
        + _header(row, status)
        + _profile(row, story)
        + _adapter(row, story)
        + _axes(story)
        + _timeline(row, events)
        + _phases(row)
        + _allocations(allocs)
        + _output(row, chunks, note)
        + _staged(story)
        + '<p class="note">Written by <code>checkfu runs show --html</code> from the journal.</p>'
        + "</main></body></html>\n"
    )
