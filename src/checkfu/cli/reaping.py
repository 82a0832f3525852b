"""Orphans reaped without asking: every command that opens the journal reaps first.

A Run started in place (``checkfu run``) records its owner process. Once that process is gone
(``kill -9``, a crash, a lost terminal), the Run is an orphan: the first ``checkfu`` command to
open the journal afterwards reclaims what it holds through the runner's reconciliation
(``checkfu.core.reconcile.reap_orphans``) and settles it as ``orphaned``. With nothing to
reap this costs one indexed query; the provider is loaded only when there is an orphan.
"""

from __future__ import annotations

import asyncio
import sys

from rich.markup import escape

from checkfu.cli.consoles import console
from checkfu.contract.codec import decode
from checkfu.contract.errors import SandboxError
from checkfu.contract.target import ExecutionTarget
from checkfu.core.clock import SystemClock
from checkfu.core.journal import Journal, JournalError, OwnedRun
from checkfu.core.reconcile import ReapReport, describe_owner, orphans, reap_orphans

err = console(stderr=True, highlight=False, soft_wrap=True)


def _providers(runs: list[OwnedRun]) -> list[str]:
    names: set[str] = set()
    for run in runs:
        if run.target:
            try:
                names.add(decode(ExecutionTarget, run.target).provider)
            except SandboxError:
                continue
    return sorted(names)


def reap(journal: Journal, *, runner_tag: str | None = None, quiet: bool = False) -> ReapReport | None:
    """Reap the journal's orphans, if any; ``None`` when there were none (the common case: one query).

    Never raises: reaping is done on the side of whatever command opened the journal, and what it could not
    finish is said on stderr (with what finishes it) and left for the next command.
    """
    try:
        asyncio.get_running_loop()
        return None  # opened from within a loop (a library caller): reaping would need one of its own
    except RuntimeError:
        pass
    try:
        gone = orphans(journal, runner_tag=runner_tag)
    except JournalError:
        return None
    if not gone:
        return None
    from checkfu.cli.state import current_engine  # noqa: PLC0415

    here = current_engine()
    elsewhere: dict[str, str] = {}
    for orphan in list(gone):
        row = journal.run(orphan.run_id)
        engine = (row.story or {}).get("engine") if row is not None else None
        if engine is not None and engine != here:
            elsewhere[orphan.run_id] = str(engine)
            gone.remove(orphan)
    if elsewhere and not quiet:
        for run_id, engine in elsewhere.items():
            err.print(
                f"[yellow]checkfu[/]: Run {escape(run_id)} is orphaned, and its sandbox is on another Docker engine "
                f"({escape(engine)}); reap it from there: `DOCKER_HOST={escape(engine)} checkfu runs list`"
            )
    if not gone:
        return None
    command = "checkfu " + " ".join(sys.argv[1:2])

    async def run() -> ReapReport:
        from checkfu.control.endpoints import reach  # noqa: PLC0415

        wanted: set[tuple[str, str | None]] = set()
        for orphan in gone:  # each allocation where it was journaled: a provider service's at its endpoint
            wanted |= {(r.target.provider, r.site) for r in journal.open_allocations(run_id=orphan.run_id)}
        if not wanted:  # nothing is held: the providers by name, as ever (they settle the Runs)
            wanted = {(name, None) for name in _providers(gone)}
        registry = await reach(journal, wanted, recorder=journal)
        return await reap_orphans(journal, registry, SystemClock(), gone, reaper=command.strip())

    try:
        report = asyncio.run(run())
    except Exception as exc:  # the command that opened the journal goes on; the orphan waits for the next
        if not quiet:
            err.print(f"[yellow]checkfu[/]: {len(gone):d} orphaned Run(s) could not be reaped now: {escape(str(exc))}")
        return None
    if not quiet:
        owners = {r.run_id: r.owner for r in gone}
        for run_id in report.reaped:
            err.print(
                f"[dim]checkfu: reaped orphaned Run {escape(run_id)} (its owner, "
                f"{escape(describe_owner(owners[run_id]))}, is gone): everything it held is released[/]"
            )
        if report.left:
            err.print(
                f"[yellow]checkfu[/]: {len(report.pending):d} orphaned Run(s) still hold {len(report.left):d} "
                "allocation(s) that could not be released now; the next command tries again, or run "
                "`checkfu runner reconcile` once the provider answers:"
            )
            for key, why in report.left.items():
                err.print(f"  {escape(key)}: {escape(why[:300])}")
    return report
