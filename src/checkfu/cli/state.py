"""Where the command line keeps its state: the journal and this runner's tag, in the state directory
(``checkfu.core.owner_only.state_dir``: the user's alone)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from sqlalchemy.exc import SQLAlchemyError

from checkfu.core import owner_only
from checkfu.core.journal import Journal
from checkfu.core.migrate import JournalTooNew
from checkfu.runner.config import ConfigError, RunnerConfig
from checkfu.runner.service import RunnerService
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


def config(db: str | None = None, adapters: Path | None = None) -> RunnerConfig:
    """The runner configuration a command runs with: ``--db`` and ``--adapters`` as given, the rest from the
    environment (``checkfu.runner.RunnerConfig.from_environment``).

    Raises:
        typer.BadParameter: an environment variable is unusable (named).
    """
    try:
        return RunnerConfig.from_environment(journal_url=db, adapters=adapters)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


def state_dir() -> Path:
    """The state directory: made ``0700``, and closed to other users if an older checkfu left it open
    (``checkfu.core.owner_only.state_dir``)."""
    return config().state()


def runner_tag(db: str | None = None) -> str:
    """This runner's tag for the journal at ``db`` (``None``: the default journal in the state directory):
    ``checkfu.runner.RunnerConfig.runner_tag``. ``CHECKFU_RUNNER_TAG`` overrides it, as given."""
    return config(db).runner_tag()


def default_journal_url() -> str:
    return config().default_journal_url()


def current_engine() -> str:
    """The Docker engine this environment reaches (``DOCKER_HOST``, else ``default``): recorded with each Docker Run
    started in place, so that its orphan is reaped only where it lives."""
    return config().engine_name()


def open_service(url: str | None, *, reap: bool = True, adapters: Path | None = None) -> RunnerService:
    """The runner at journal ``url`` (``None``: the embedded SQLite file in the state directory), opened through
    the front door (``checkfu.runner.RunnerService``), which keeps the house first: orphans reaped, sandboxes past
    their time-to-live reclaimed, expired snapshots swept (one read when nothing is due). ``reap=False`` for the
    one command that reaps itself (``checkfu runner reconcile``, which reports it).

    Raises:
        typer.BadParameter: the journal cannot be opened (a usage error naming ``--db``, exit 2).
    """
    try:
        service = RunnerService.open(config(url, adapters), reap=reap, notice=_say)
    except JournalTooNew as exc:
        raise typer.BadParameter(f"cannot open the journal: {exc}", param_hint="--db") from None
    except (SQLAlchemyError, OSError) as exc:
        if isinstance(exc, owner_only.StateDirRefused):
            raise
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise typer.BadParameter(f"cannot open the journal: {reason}", param_hint="--db") from None
    RECLAIMED[:] = service.reclaimed
    return service


def open_journal(url: str | None, *, reap: bool = True) -> Journal:
    """The journal of ``open_service(url)``: for a command that reads and writes the journal and builds nothing
    else from it."""
    return open_service(url, reap=reap).journal


def service_of(journal: Journal, db: str | None, adapters: Path | None = None) -> RunnerService:
    """The front door over a journal a command already opened (it keeps no house of its own)."""
    return RunnerService(config(db, adapters), journal, notice=_say)


RECLAIMED: list[Any] = []
"""The sandboxes the last ``open_journal`` of this process reclaimed (``checkfu ps`` shows them)."""


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def journal_deadline() -> float:
    """How long a journal operation is retried while the journal is locked or unreachable:
    ``CHECKFU_JOURNAL_DEADLINE`` seconds, else the journal's default.

    Raises:
        typer.BadParameter: the variable is not a non-negative number.
    """
    return config().journal_deadline


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
