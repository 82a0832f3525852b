"""The credential every wire request carries, and where both ends read it from.

A request carries it as ``Authorization: Bearer <credential>``. The server compares
it in constant time with each credential it accepts; a request without a valid
one is ``SandboxUnauthenticated``. Both ends read it from ``--credential-file
FILE`` (``-``: the first line of standard input) or, failing that, from
``CHECKFU_PROVIDER_CREDENTIAL``, never from an argument, which any user of the
machine can read. It is never printed, logged or journaled: ``Credential``'s
``repr`` hides it.

Every connection of an ``openProcess`` operation also carries the operation's own
secret (``Checkfu-Operation-Secret``, made by the client that starts it), which
binds the operation to that client (``checkfu.wire.operations``); logs blank it too.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ENV = "CHECKFU_PROVIDER_CREDENTIAL"
ENROLLED = "the credential issued when it was enrolled"
"""How a credential read from the file ``checkfu provider enroll`` issued names its source (its path follows)."""
MAX_BYTES = 4096
OPERATION_SECRET = "Checkfu-Operation-Secret"
"""The header that carries an ``openProcess`` operation's secret on each of its connections."""
OPERATION_SECRET_PATTERN = "^[A-Za-z0-9_-]{22,128}$"
"""At least 128 bits in base64url: what a client must send as an operation's secret, when it sends one."""
_OPERATION_SECRET = re.compile(OPERATION_SECRET_PATTERN)


class CredentialError(ValueError):
    """The credential could not be read, or is not usable; the message says which source and why."""


@dataclass(frozen=True)
class Credential:
    """A secret shared between a runner and a provider service.

    ``source`` says where it was read (``--credential-file FILE``, ``CHECKFU_PROVIDER_CREDENTIAL``, the file issued
    at enrollment), never what it is: a service that refuses it is answered with which credential to give.
    """

    secret: str = field(repr=False)
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.secret or len(self.secret) > MAX_BYTES or not self.secret.isprintable() or " " in self.secret:
            raise CredentialError("a credential is 1 to 4096 printable characters without spaces")

    def __str__(self) -> str:
        return "<credential>"

    @property
    def header(self) -> str:
        return f"Bearer {self.secret}"


def read_credential(path: Path | None = None, *, environ: Mapping[str, str] | None = None) -> Credential | None:
    """The credential in ``path`` (its first line), else in ``CHECKFU_PROVIDER_CREDENTIAL``, else ``None``.

    Raises:
        CredentialError: the file cannot be read or holds no usable credential.
    """
    env = os.environ if environ is None else environ
    if path is not None:
        try:
            with path.open("rb") as fh:
                raw = fh.read(MAX_BYTES + 2)
        except OSError as exc:
            raise CredentialError(f"cannot read the credential file {path}: {exc.strerror or exc}") from None
        text = raw.decode("utf-8", "replace").splitlines()[0].strip() if raw.strip() else ""
        if not text:
            raise CredentialError(f"the credential file {path} is empty")
        return Credential(text, source=f"--credential-file {path}")
    value = env.get(ENV, "").strip()
    return Credential(value, source=ENV) if value else None


def operation_owner(value: str | None) -> bytes | None:
    """What binds an operation to the client that sent ``value`` as its secret (a digest), or ``None`` without one.

    Raises:
        ValueError: ``value`` is not 22 to 128 base64url characters.
    """
    if value is None:
        return None
    if _OPERATION_SECRET.fullmatch(value) is None:
        raise ValueError(f"{OPERATION_SECRET} must be 22 to 128 base64url characters")
    return hashlib.sha256(value.encode("ascii")).digest()


def same_owner(owner: bytes | None, presented: bytes | None) -> bool:
    """Whether a connection that presented ``presented`` may act on an operation bound to ``owner``.

    An operation started without a secret (by a client older than the secret) belongs to nobody: no connection
    may reattach to it, since none can show it started it.
    """
    return owner is not None and presented is not None and hmac.compare_digest(owner, presented)


_SECRET_HEADERS = frozenset({"authorization", OPERATION_SECRET.lower()})


class Redacted(logging.Filter):
    """Blanks the credential in a log record of an ``Authorization`` header, and an operation's secret.

    The ``websockets`` library logs every handshake header at DEBUG (``"> %s: %s"``,
    name and value as arguments), on the client and, through uvicorn, on the server;
    this filter, on the loggers they log to, keeps the credential out of those lines.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple):
            if len(args) == 2 and isinstance(args[0], str) and args[0].lower() in _SECRET_HEADERS:
                record.args = (args[0], "<credential>")
            elif any(_bearer(a) for a in args):
                record.args = tuple("Bearer <credential>" if _bearer(a) else a for a in args)
        return True


def _bearer(value: object) -> bool:
    return isinstance(value, str) and value[:7].lower() == "bearer "


REDACTED = Redacted()

SERVER_LOGGERS = ("uvicorn.error", "websockets.server")
"""Where a served provider's WebSocket handshakes are logged."""


def redact_logs(*names: str) -> None:
    """Put the ``Redacted`` filter on the named loggers (once each)."""
    for name in names:
        logger = logging.getLogger(name)
        if REDACTED not in logger.filters:
            logger.addFilter(REDACTED)


class Accepted:
    """The credentials a service accepts; ``check`` compares in constant time with each."""

    def __init__(self, credentials: Iterable[Credential | str]) -> None:
        self._secrets = [
            (c.secret if isinstance(c, Credential) else Credential(c).secret).encode() for c in credentials
        ]
        if not self._secrets:
            raise CredentialError("a service needs at least one credential to accept")

    def check(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value carries an accepted credential."""
        if not authorization or not authorization.startswith("Bearer "):
            return False
        given = authorization[len("Bearer ") :].encode("utf-8", "replace")
        ok = False
        for secret in self._secrets:
            ok |= hmac.compare_digest(given, secret)
        return ok

    def __repr__(self) -> str:
        return f"Accepted({len(self._secrets)} credentials)"
