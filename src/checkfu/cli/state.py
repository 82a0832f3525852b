"""Where the command line keeps its state: the journal and this runner's tag."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import typer
from sqlalchemy.exc import SQLAlchemyError

from checkfu.runner.journal import Journal, sqlite_url
from checkfu.runner.migrate import JournalTooNew
from checkfu.wire.credentials import Credential, CredentialError, read_credential


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    path = Path(base) / "checkfu"
    path.mkdir(parents=True, exist_ok=True)
    return path


def runner_tag() -> str:
    """This runner's tag, made once and kept in the state directory (``CHECKFU_RUNNER_TAG`` overrides)."""
    override = os.environ.get("CHECKFU_RUNNER_TAG")
    if override:
        return override
    path = state_dir() / "runner_tag"
    try:
        tag = path.read_text().strip()
        if tag:
            return tag
    except FileNotFoundError:
        pass
    tag = f"runner-{secrets.token_hex(6)}"
    path.write_text(tag + "\n")
    return tag


def open_journal(url: str | None) -> Journal:
    """The journal at ``url``, or the embedded SQLite file in the state directory.

    Raises:
        typer.BadParameter: the journal cannot be opened (a usage error naming ``--db``, exit 2).
    """
    try:
        return Journal(url or sqlite_url(state_dir() / "journal.sqlite"))
    except JournalTooNew as exc:
        raise typer.BadParameter(f"cannot open the journal: {exc}", param_hint="--db") from None
    except (SQLAlchemyError, OSError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise typer.BadParameter(f"cannot open the journal: {reason}", param_hint="--db") from None


def is_url(name: str) -> bool:
    """Whether ``--provider`` names a provider service by URL rather than an installed provider."""
    return name.startswith(("http://", "https://"))


def client_credential(path: Path | None) -> Credential | None:
    """The credential a client sends: ``--credential-file`` or ``CHECKFU_PROVIDER_CREDENTIAL``.

    Raises:
        typer.BadParameter: the file cannot be read or holds no usable credential.
    """
    try:
        return read_credential(path)
    except CredentialError as exc:
        raise typer.BadParameter(str(exc), param_hint="--credential-file") from None


def enrolled_credential(journal: Journal, url: str) -> Credential | None:
    """The credential issued when the service at ``url`` was enrolled, if it was and its file is readable."""
    for row in journal.enrollments():
        if row.source.rstrip("/") == url.rstrip("/") and row.credential_path:
            try:
                return read_credential(Path(row.credential_path))
            except CredentialError:
                return None
    return None
