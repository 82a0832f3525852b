"""TLS on the wire: the certificate a provider service presents, and what a client trusts.

A service given a certificate and its key (``checkfu provider serve --tls-cert FILE --tls-key
FILE``) serves ``https://`` and ``wss://``. A client of an ``https://`` URL always verifies the
service's certificate and host name against the system's trust store, which OpenSSL reads from
``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` when they are set, and in addition against the CA file
it is given (``RemoteProvider(ca_file=...)``, the adapters file's ``ca_file``), or else the one
``CHECKFU_PROVIDER_CA`` names: how a service with a self-signed certificate, or one of a
private CA, is trusted. Verification is never turned off.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CA_ENV = "CHECKFU_PROVIDER_CA"


class TlsError(ValueError):
    """A certificate, key or CA file cannot be used; the message names the file and why."""


@dataclass(frozen=True)
class ServerTls:
    """The certificate chain a service presents (PEM) and its private key (PEM, not encrypted)."""

    cert: Path
    key: Path

    def check(self) -> None:
        """Load both once, so a bad file is refused before the service starts.

        Raises:
            TlsError: a file cannot be read, is not PEM, the key is encrypted, or it does not match the certificate.
        """
        for path in (self.cert, self.key):
            if not path.is_file():
                raise TlsError(f"{path}: no such file")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(self.cert, self.key, password=lambda: b"")
        except OSError as exc:
            if isinstance(exc, ssl.SSLError):
                raise TlsError(
                    f"{self.cert} and {self.key} are not a PEM certificate and its unencrypted key"
                    f" ({exc.reason or exc})"
                ) from None
            raise TlsError(f"cannot read {exc.filename or self.cert}: {exc.strerror or exc}") from None


def client_context(ca_file: str | Path | None = None, *, environ: Mapping[str, str] | None = None) -> ssl.SSLContext:
    """What a client of an ``https://`` service trusts: the system's store, and ``ca_file`` or ``CHECKFU_PROVIDER_CA``.

    Raises:
        TlsError: the CA file cannot be read or holds no PEM certificate.
    """
    env = os.environ if environ is None else environ
    chosen = ca_file if ca_file is not None else (env.get(CA_ENV) or None)
    context = ssl.create_default_context()  # verifies the certificate and the host name; reads SSL_CERT_FILE/_DIR
    if chosen is not None:
        source = "" if ca_file is not None else f" ({CA_ENV})"
        try:
            context.load_verify_locations(cafile=os.fspath(chosen))
        except FileNotFoundError:
            raise TlsError(f"the CA file {chosen}{source} does not exist") from None
        except ssl.SSLError as exc:
            raise TlsError(f"the CA file {chosen}{source} holds no PEM certificate ({exc.reason or exc})") from None
        except OSError as exc:
            raise TlsError(f"cannot read the CA file {chosen}{source}: {exc.strerror or exc}") from None
    return context


TRUST_HINT = (
    f"trust its CA with {CA_ENV}=FILE (or SSL_CERT_FILE), and check that the URL names a host its certificate is for"
)
"""What to do about a certificate a client could not verify."""


__all__ = ["CA_ENV", "TRUST_HINT", "ServerTls", "TlsError", "client_context"]
