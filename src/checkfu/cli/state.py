"""Where the command line keeps its state: the journal and this runner's tag, in the state directory
(``checkfu.core.owner_only.state_dir``: the user's alone)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from checkfu.contract.errors import SandboxError
from checkfu.core import owner_only
from checkfu.core.clock import SystemClock
from checkfu.core.expiry import ExpiryReport, sweep_expired_snapshots
from checkfu.core.journal import (
    DEFAULT_JOURNAL_DEADLINE,
    AllocationRow,
    Housekeeping,
    Journal,
    JournalError,
    sqlite_url,
)
from checkfu.core.migrate import JournalTooNew
from checkfu.core.registry import Registry
from checkfu.wire.credentials import MAX_BYTES, Credential, CredentialError, read_credential

AFTER_REPLY: list[Callable[[], object]] | None = None
"""In a start-up server's child (``checkfu.cli.startup_server``), a list: what the command leaves until its exit
status has reached its client, done then in order. ``None`` in a command that runs in a process of its own."""


def close_journal(journal: Journal) -> None:
    """Close ``journal``: at once, or in a start-up server's child once the command's status has reached its
    client (``AFTER_REPLY``). Closing a SQLite journal copies its write-ahead log back into the database (a
    checkpoint: about 3 ms of a warm ``checkfu run``), which no record needs: each was committed when written, and
    a command that opens the journal before the copy is done reads them from the log."""
    if AFTER_REPLY is not None:
        AFTER_REPLY.append(journal.close)
    else:
        journal.close()


def state_dir() -> Path:
    """The state directory: made ``0700``, and closed to other users if an older checkfu left it open
    (``checkfu.core.owner_only.state_dir``)."""
    return owner_only.state_dir()


def runner_tag(db: str | None = None) -> str:
    """This runner's tag for the journal at ``db`` (``None``: the default journal in the state directory).

    The tag identifies the journal as well as the state directory, so two runners that share an engine
    but keep different journals never label each other's sandboxes alike: the state directory's tag
    (made once and kept there) for its default journal, and that tag with a digest of the journal's
    identity for any other. ``CHECKFU_RUNNER_TAG`` overrides both, as given.
    """
    override = os.environ.get("CHECKFU_RUNNER_TAG")
    if override:
        return override
    base = _state_tag()
    identity = journal_identity(db) if db else None
    if identity is None or identity == journal_identity(default_journal_url()):
        return base
    return f"{base}-j{hashlib.sha256(identity.encode()).hexdigest()[:12]}"


def _state_tag() -> str:
    path = state_dir() / "runner_tag"
    try:
        tag = path.read_text().strip()
        if tag:
            return tag
    except FileNotFoundError:
        pass
    tag = f"runner-{secrets.token_hex(6)}"
    owner_only.write_file(path, f"{tag}\n".encode())
    return tag


def default_journal_url() -> str:
    return sqlite_url(state_dir() / "journal.sqlite")


def journal_identity(url: str) -> str:
    """What names one journal, however its URL is spelled: an SQLite file by its real path, a server
    database by driver family, user, host, port and name (never the password)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return url
    family = parsed.get_backend_name()
    if family == "sqlite":
        name = parsed.database or ""
        return f"sqlite:{os.path.realpath(name) if name not in ('', ':memory:') else ':memory:'}"
    host = (parsed.host or "").lower()
    if host in ("", "localhost", "127.0.0.1", "::1", "[::1]"):
        host = "localhost"  # the driver's default and every spelling of this machine's loopback
    port = parsed.port or _DEFAULT_PORTS.get(family) or ""
    return f"{family}://{parsed.username or ''}@{host}:{port}/{parsed.database or ''}"


_DEFAULT_PORTS = {"postgresql": 5432}


def current_engine() -> str:
    """The Docker engine this environment reaches (``DOCKER_HOST``, else ``default``): recorded with each Docker Run
    started in place, so that its orphan is reaped only where it lives."""
    return os.environ.get("DOCKER_HOST") or "default"


def open_journal(url: str | None, *, reap: bool = True) -> Journal:
    """The journal at ``url``, or the embedded SQLite file in the state directory.

    Every command opens the journal here, so this is where orphans are reaped (``checkfu.cli.reaping``): a Run
    whose owner process is gone is reclaimed and settled as ``orphaned`` before the command goes on. That costs
    one read when there is nothing to reap, reclaim or sweep (``Journal.housekeeping``). ``reap=False`` for the one
    command that does it itself (``checkfu runner reconcile``, which reports it).

    Raises:
        typer.BadParameter: the journal cannot be opened (a usage error naming ``--db``, exit 2).
    """
    journal = _open(url)
    try:  # one read says which of the passes below have anything to look at (usually none)
        due = journal.housekeeping(runner_tag=runner_tag(url), now=time.time())
    except JournalError:
        due = Housekeeping(sandboxes=True, snapshots=True, orphans=True)  # each pass reports its own trouble
    RECLAIMED.clear()
    if due.sandboxes:
        reclaim_sandboxes(journal, url)  # long-lived sandboxes past their time-to-live or whose owner is gone
    if due.snapshots:
        sweep_expired(journal, url)  # snapshots past their lifetime
    if reap and due.orphans:
        from checkfu.cli.reaping import reap as reap_orphans  # noqa: PLC0415

        reap_orphans(journal, runner_tag=runner_tag(url))
    return journal


def _open(url: str | None) -> Journal:
    try:
        journal = Journal(url or default_journal_url(), deadline=journal_deadline())
    except JournalTooNew as exc:
        raise typer.BadParameter(f"cannot open the journal: {exc}", param_hint="--db") from None
    except (SQLAlchemyError, OSError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise typer.BadParameter(f"cannot open the journal: {reason}", param_hint="--db") from None
    return journal


RECLAIMED: list[Any] = []
"""The sandboxes the last ``open_journal`` of this process reclaimed (``checkfu ps`` shows them); it empties the
list first."""


def reclaim_sandboxes(journal: Journal, url: str | None) -> None:
    """Reclaim this runner's sandboxes whose time-to-live passed or whose owner process is gone, as every
    command that opens the journal does (no daemon): one query when nothing is due; the providers of what is
    due are loaded only then. A failure is reported and left for the next command; it never stops this one."""
    from checkfu.core.sandboxes import due_for_sweep, sweep  # noqa: PLC0415

    tag = runner_tag(url)
    try:
        if not due_for_sweep(journal, tag):
            return
    except Exception:  # a journal too old to hold sandboxes, or one that cannot be read: nothing to reclaim here
        return

    async def registry_for(wanted: set[tuple[str, str | None]]) -> Any:
        from checkfu.control.endpoints import reach  # noqa: PLC0415

        return await reach(journal, wanted, recorder=journal)

    async def run() -> list[Any]:
        return await sweep(journal, tag, registry_for)

    try:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            done = asyncio.run(run())
        else:  # called from async code: its own loop, on a thread of its own
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                done = pool.submit(asyncio.run, run()).result()
    except Exception as exc:
        _say(f"warning: sandboxes due for reclaiming were left for the next command: {exc}")
        return
    RECLAIMED.extend(done)
    for r in done:
        if r.error:
            _say(f"warning: sandbox {r.sandbox_id} ({r.reason}) could not be reclaimed: {r.error}")
        else:
            _say(f"reclaimed sandbox {r.sandbox_id}: {r.reason}")


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def sweep_expired(journal: Journal, db: str | None) -> ExpiryReport | None:
    """Delete (or, under provider custody, settle) this runner's snapshots whose expiry has passed: what every
    command that opens the journal does first, so no daemon is needed. One indexed read when nothing has
    expired; the providers of expired snapshots are loaded only then. It never stops the command: a snapshot
    it cannot delete now stays, and the next command tries again. ``None`` when it did not run (inside an
    event loop already, or the journal could not be read).
    """
    try:
        asyncio.get_running_loop()
        return None  # called from async code: that code sweeps itself (checkfu.core.expiry)
    except RuntimeError:
        pass
    tag = runner_tag(db)
    try:
        if not journal.expired_snapshots(now=time.time(), runner_tag=tag):
            return None
    except JournalError:
        return None

    async def adapters(rows: list[AllocationRow]) -> Registry:
        from checkfu.control.endpoints import reach  # noqa: PLC0415

        return await reach(journal, {(r.target.provider, r.site) for r in rows}, recorder=journal)

    try:
        report = asyncio.run(sweep_expired_snapshots(journal, adapters, SystemClock(), runner_tag=tag))
    except (SandboxError, JournalError) as exc:
        print(f"checkfu: expired snapshots were not swept ({exc}); the next command tries again", file=sys.stderr)
        return None
    done = len(report.deleted) + len(report.settled)
    if done:
        print(f"checkfu: deleted {done} expired snapshot(s)", file=sys.stderr)
    for key, why in {**report.failed, **report.skipped}.items():
        print(f"checkfu: expired snapshot {key} is still held ({why}); the next command tries again", file=sys.stderr)
    return report


def journal_deadline() -> float:
    """How long a journal operation is retried while the journal is locked or unreachable:
    ``CHECKFU_JOURNAL_DEADLINE`` seconds, else the journal's default.

    Raises:
        typer.BadParameter: the variable is not a non-negative number.
    """
    raw = os.environ.get("CHECKFU_JOURNAL_DEADLINE")
    if raw is None:
        return DEFAULT_JOURNAL_DEADLINE
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise typer.BadParameter(f"CHECKFU_JOURNAL_DEADLINE must be a number of seconds, not {raw[:40]!r}")
    return value


def is_url(name: str) -> bool:
    """Whether ``--provider`` names a provider service by URL rather than an installed provider."""
    return name.startswith(("http://", "https://"))


STDIN = Path("-")
"""``--credential-file -``: the credential is the first line of standard input."""


def client_credential(path: Path | None) -> Credential | None:
    """The credential a client (or a service) uses: ``--credential-file FILE``, ``--credential-file -`` (the
    first line of standard input; asked for without echo at a terminal), or ``CHECKFU_PROVIDER_CREDENTIAL``.

    Raises:
        typer.BadParameter: the file cannot be read or holds no usable credential.
    """
    try:
        if path == STDIN:
            return _stdin_credential()
        return read_credential(path)
    except CredentialError as exc:
        raise typer.BadParameter(str(exc), param_hint="--credential-file") from None


def _stdin_credential() -> Credential:
    """The first line of standard input, read a byte at a time: what follows it is left for whoever reads next
    (the command of a ``checkfu run``).

    Raises:
        CredentialError: standard input is closed, empty, or its first line is not a usable credential.
    """
    if sys.stdin is not None and sys.stdin.isatty():
        import getpass  # noqa: PLC0415

        try:
            text = getpass.getpass("credential: ", stream=sys.stderr)
        except EOFError:
            text = ""
    else:
        line = bytearray()
        try:
            while len(line) <= MAX_BYTES:
                byte = os.read(0, 1)
                if not byte or byte == b"\n":
                    break
                line += byte
        except OSError as exc:
            raise CredentialError(f"cannot read the credential from standard input: {exc.strerror or exc}") from None
        text = line.decode("utf-8", "replace")
    text = text.strip()
    if not text:
        raise CredentialError("standard input (--credential-file -) holds no credential on its first line")
    return Credential(text, source="--credential-file - (standard input)")


def enrolled_credential(journal: Journal, url: str) -> Credential | None:
    """The credential issued when the service at ``url`` was enrolled, if it was and its file is readable."""
    from checkfu.control.endpoints import enrolled_credential as enrolled  # noqa: PLC0415

    return enrolled(journal, url)
