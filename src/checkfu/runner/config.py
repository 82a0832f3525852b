"""One runner's configuration: where it keeps its state, which journal it writes, the tag it labels with, the
adapters file it loads and the Docker engine it reaches.

Everything a face (the CLI, the SDK, an embedding platform) used to work out on its own from the environment is
worked out here, once. ``RunnerConfig.from_environment`` reads what the ``checkfu`` command reads
(``XDG_STATE_HOME``, ``CHECKFU_RUNNER_TAG``, ``CHECKFU_ADAPTERS``, ``DOCKER_HOST``, ``CHECKFU_JOURNAL_DEADLINE``);
a platform may instead give each field itself and leave the environment out of it.

Nothing here imports SQLAlchemy, pydantic or docker-py: a configuration is cheap to make.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from checkfu.core import owner_only

DEFAULT_JOURNAL_DEADLINE = 30.0
"""How long a journal operation is retried while the journal is locked or unreachable (``checkfu.core.journal``
holds the same figure; a test keeps the two equal)."""

TAG_ENV = "CHECKFU_RUNNER_TAG"
ADAPTERS_ENV = "CHECKFU_ADAPTERS"
DEADLINE_ENV = "CHECKFU_JOURNAL_DEADLINE"
DEFAULT_ENGINE = "default"


class ConfigError(ValueError):
    """A configuration value is unusable; ``field`` names it (an option or an environment variable)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class RunnerConfig:
    """What opens one runner. Every field may be left ``None`` for its default.

    - ``state_dir``: the user's own directory for the journal, the tag, captures, keys and enrolled credentials
      (default ``$XDG_STATE_HOME/checkfu``); made ``0700``, refused if another user owns it.
    - ``journal_url``: an SQLAlchemy URL (default: ``journal.sqlite`` in the state directory; PostgreSQL for a fleet).
    - ``tag``: the runner tag every provider object is labelled with (default: made once and kept in the state
      directory, suffixed with a digest of the journal when it is not the default one, so two journals on one engine
      never label alike).
    - ``adapters``: an adapters file (``docs/adapters.md``), or none.
    - ``engine``: the Docker engine (``DOCKER_HOST``'s value), recorded with each Docker Run so an orphan is reaped
      only where it lives.
    - ``journal_deadline``: seconds a journal operation is retried while the journal is locked or away.
    """

    state_dir: Path | None = None
    journal_url: str | None = None
    tag: str | None = None
    adapters: Path | None = None
    engine: str | None = None
    journal_deadline: float = DEFAULT_JOURNAL_DEADLINE

    @classmethod
    def from_environment(
        cls,
        *,
        journal_url: str | None = None,
        adapters: Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> RunnerConfig:
        """The configuration the ``checkfu`` command runs with: ``journal_url`` (``--db``) and ``adapters``
        (``--adapters``) as given, the rest from ``environ`` (default: this process's environment).

        Raises:
            ConfigError: ``CHECKFU_JOURNAL_DEADLINE`` is not a non-negative number of seconds.
        """
        env = os.environ if environ is None else environ
        raw_adapters = env.get(ADAPTERS_ENV)
        xdg = env.get("XDG_STATE_HOME") if environ is not None else None
        return cls(
            state_dir=Path(xdg) / "checkfu" if xdg else None,  # None: the default reads this process's environment
            journal_url=journal_url or None,
            tag=env.get(TAG_ENV) or None,
            adapters=adapters if adapters is not None else (Path(raw_adapters) if raw_adapters else None),
            engine=env.get("DOCKER_HOST") or None,
            journal_deadline=journal_deadline(env.get(DEADLINE_ENV)),
        )

    def with_journal(self, journal_url: str | None) -> RunnerConfig:
        """This configuration with another journal (``None``: the default one); its tag follows the journal."""
        return replace(self, journal_url=journal_url or None)

    def state(self) -> Path:
        """The state directory, made ``0700`` if it is not there yet.

        Raises:
            StateDirRefused: it belongs to another user.
        """
        return owner_only.state_dir(self.state_dir)

    def default_journal_url(self) -> str:
        return f"sqlite+pysqlite:///{self.state() / 'journal.sqlite'}"

    def journal(self) -> str:
        """The journal's URL: the one given, else the embedded SQLite file in the state directory."""
        return self.journal_url or self.default_journal_url()

    def runner_tag(self) -> str:
        """This runner's tag: the one given, else the state directory's (made once, kept there), with a digest of
        the journal's identity when it is not the state directory's own journal."""
        if self.tag:
            return self.tag
        base = self._state_tag()
        if not self.journal_url:
            return base
        identity = journal_identity(self.journal_url)
        if identity == journal_identity(self.default_journal_url()):
            return base
        return f"{base}-j{hashlib.sha256(identity.encode()).hexdigest()[:12]}"

    def _state_tag(self) -> str:
        path = self.state() / "runner_tag"
        try:
            tag = path.read_text().strip()
            if tag:
                return tag
        except FileNotFoundError:
            pass
        tag = f"runner-{secrets.token_hex(6)}"
        owner_only.write_file(path, f"{tag}\n".encode())
        return tag

    def engine_name(self) -> str:
        """The Docker engine this runner reaches: ``engine``, else ``default``."""
        return self.engine or DEFAULT_ENGINE

    def provider_options(self) -> dict[str, dict[str, str]]:
        """The in-tree providers' own state under a state directory given in full (``{}`` when it is the default:
        they keep theirs where they always have, beside it)."""
        if self.state_dir is None:
            return {}
        return {
            "host-process": {"state_dir": str(self.state_dir / "host-process")},
            "docker": {"state_dir": str(self.state_dir / "docker")},
        }

    def captures(self) -> Path:
        """Where ``--capture`` files are kept when no directory is named."""
        return self.state() / "captures"


def journal_deadline(raw: str | None) -> float:
    """``CHECKFU_JOURNAL_DEADLINE``'s value as seconds (``None``: the default).

    Raises:
        ConfigError: it is not a non-negative number.
    """
    if raw is None:
        return DEFAULT_JOURNAL_DEADLINE
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ConfigError(f"{DEADLINE_ENV} must be a number of seconds, not {raw[:40]!r}", field=DEADLINE_ENV)
    return value


_DEFAULT_PORTS = {"postgresql": 5432}


def journal_identity(url: str) -> str:
    """What names one journal, however its URL is spelled: an SQLite file by its real path, a server database by
    driver family, user, host, port and name (never the password)."""
    from sqlalchemy.engine import make_url  # noqa: PLC0415 - only when a journal is named
    from sqlalchemy.exc import ArgumentError  # noqa: PLC0415

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
