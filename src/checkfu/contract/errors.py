"""The closed error vocabulary of the sandbox provider seam.

Every failure that crosses the runner's or the wire's boundary is one of the
classes below; no other exception does. The first split is who is at fault::

    SandboxError                      (abstract: cannot be raised directly)
    +-- SandboxRequestError           refused before any provider work
    |   +-- SandboxProfileInvalid
    |   +-- SandboxCapabilityUnavailable
    |   +-- SandboxAdapterUnavailable
    |   +-- SandboxAdapterAmbiguous
    |   +-- SandboxDigestMismatch
    |   +-- SandboxOperationUnsupported
    |   +-- SandboxUnauthenticated
    |   +-- SandboxEnrollmentRefused
    +-- SandboxProviderError          a provider statement failed a check
    |   +-- SandboxEnvelopeInvalid
    |   +-- SandboxResultInvalid
    |   +-- SandboxIdentityMismatch
    |   +-- SandboxPathRejected
    |   +-- SandboxBoundExceeded
    |   +-- SandboxProviderFailed
    +-- SandboxStateError             the world moved under the caller
    |   +-- SandboxLeaseFenced
    |   +-- SandboxStateConflict
    |   +-- SandboxNotFound
    +-- SandboxTransportError         the conversation itself broke
        +-- SandboxProviderTimeout
        +-- SandboxProtocolViolation

Each leaf has a stable wire ``code`` equal to its class name, a human message
naming the field, axis or path at fault, the dotted ``field`` path where there
is one, and a ``retryable`` flag. Foreign errors are translated at the seam by
table (see ``error_for_code``); a code this module does not know becomes
``SandboxProviderFailed``. A class is never built from a name a peer sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

Fault = Literal["request", "provider", "state", "transport"]


class SandboxError(Exception):
    """Root of the vocabulary. Abstract: raise one of its leaves."""

    code: ClassVar[str] = ""
    fault: ClassVar[Fault]
    default_retryable: ClassVar[bool] = False
    observed: bool = False
    """Set (with ``observed_by_runner``) on an error the runner's own code found about a provider's answer,
    such as a wire client that could not decode it; unset on anything a provider reported."""

    def __init__(self, message: str, *, field: str | None = None, retryable: bool | None = None) -> None:
        if not type(self).code:
            raise TypeError(f"{type(self).__name__} is abstract; raise one of its leaves")
        super().__init__(message)
        self.message = message
        self.field = field
        self.retryable = self.default_retryable if retryable is None else retryable

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A leaf is a class with no further subclasses in this module; its code is its name.
        if not cls.__name__.endswith("Error"):
            cls.code = cls.__name__

    def to_wire(self) -> dict[str, Any]:
        """The wire body member ``{"code", "message", "retryable", "field"?}``."""
        body: dict[str, Any] = {"code": self.code, "message": self.message, "retryable": self.retryable}
        if self.field is not None:
            body["field"] = self.field
        return body

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, field={self.field!r})"


class SandboxRequestError(SandboxError):
    fault = "request"


class SandboxProviderError(SandboxError):
    fault = "provider"


class SandboxStateError(SandboxError):
    fault = "state"


class SandboxTransportError(SandboxError):
    fault = "transport"


class SandboxProfileInvalid(SandboxRequestError):
    """A profile (or a request built from it) breaks a rule of the contract."""


@dataclass(frozen=True, slots=True)
class Unmet:
    """One requirement of a profile or attempt that an envelope does not meet."""

    field: str
    reason: str


class SandboxCapabilityUnavailable(SandboxRequestError):
    """The selected adapter's envelope cannot serve the profile; lists every unmet need."""

    def __init__(self, unmet: Sequence[Unmet], *, provider: str = "") -> None:
        if not unmet:
            raise ValueError("SandboxCapabilityUnavailable needs at least one unmet requirement")
        self.unmet = tuple(unmet)
        who = f"provider {provider!r} " if provider else "the envelope "
        lines = "; ".join(f"{u.field}: {u.reason}" for u in self.unmet)
        super().__init__(f"{who}cannot serve this profile: {lines}", field=self.unmet[0].field)


class SandboxAdapterUnavailable(SandboxRequestError):
    """No adapter advertises the attempt's execution target."""


class SandboxAdapterAmbiguous(SandboxRequestError):
    """More than one adapter advertises the attempt's execution target."""


class SandboxDigestMismatch(SandboxRequestError):
    """Content read for a mount (or a pinned digest) does not match its declared digest."""


class SandboxOperationUnsupported(SandboxRequestError):
    """A member the envelope does not declare was asked for."""


class SandboxUnauthenticated(SandboxRequestError):
    """A wire request carried no valid enrollment credential."""


class SandboxEnrollmentRefused(SandboxRequestError):
    """An enrollment claimed more than the server-owned ceiling allows."""


class SandboxEnvelopeInvalid(SandboxProviderError):
    """An advertised capability envelope does not decode or breaks a cross-field rule."""


class SandboxResultInvalid(SandboxProviderError):
    """A provider result does not decode strictly."""


class SandboxIdentityMismatch(SandboxProviderError):
    """A result's echo differs from the runner's own record."""


class SandboxPathRejected(SandboxProviderError):
    """A path is not absolute, normalized, bounded, or inside an admitted root."""


class SandboxBoundExceeded(SandboxProviderError):
    """An output, file or listing exceeds the runner's limit."""


class SandboxProviderFailed(SandboxProviderError):
    """The provider failed the call: it raised an error, in the vocabulary or outside it.

    Whatever a provider raises is the provider's fault, whatever its code: a provider that
    raises ``SandboxPathRejected`` for a path the runner never sent has failed, it has not
    caught the runner out. ``reported_code`` keeps the vocabulary code the provider raised
    (``None`` when it raised something outside the vocabulary or failed in itself).
    """

    default_retryable = True

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        retryable: bool | None = None,
        reported_code: str | None = None,
    ) -> None:
        super().__init__(message, field=field, retryable=retryable)
        self.reported_code = reported_code


class SandboxLeaseFenced(SandboxStateError):
    """The caller's lease was taken over, or a result carries another lease or epoch."""


class SandboxStateConflict(SandboxStateError):
    """A member was called in a state the lifecycle table does not allow."""


class SandboxNotFound(SandboxStateError):
    """The instance, snapshot or allocation does not exist (or no longer does)."""


class SandboxProviderTimeout(SandboxTransportError):
    """A call did not finish before its deadline."""

    default_retryable = True


class SandboxProtocolViolation(SandboxTransportError):
    """A peer broke the wire protocol: a bad frame, body or status."""


ERROR_CLASSES: Mapping[str, type[SandboxError]] = {
    cls.code: cls
    for cls in (
        SandboxEnvelopeInvalid,
        SandboxProfileInvalid,
        SandboxCapabilityUnavailable,
        SandboxAdapterUnavailable,
        SandboxAdapterAmbiguous,
        SandboxResultInvalid,
        SandboxIdentityMismatch,
        SandboxLeaseFenced,
        SandboxPathRejected,
        SandboxBoundExceeded,
        SandboxStateConflict,
        SandboxOperationUnsupported,
        SandboxNotFound,
        SandboxProviderTimeout,
        SandboxProviderFailed,
        SandboxProtocolViolation,
        SandboxUnauthenticated,
        SandboxEnrollmentRefused,
        SandboxDigestMismatch,
    )
}
"""The closed vocabulary, by wire code."""

ErrorCode = Literal[
    "SandboxEnvelopeInvalid",
    "SandboxProfileInvalid",
    "SandboxCapabilityUnavailable",
    "SandboxAdapterUnavailable",
    "SandboxAdapterAmbiguous",
    "SandboxResultInvalid",
    "SandboxIdentityMismatch",
    "SandboxLeaseFenced",
    "SandboxPathRejected",
    "SandboxBoundExceeded",
    "SandboxStateConflict",
    "SandboxOperationUnsupported",
    "SandboxNotFound",
    "SandboxProviderTimeout",
    "SandboxProviderFailed",
    "SandboxProtocolViolation",
    "SandboxUnauthenticated",
    "SandboxEnrollmentRefused",
    "SandboxDigestMismatch",
]


E = TypeVar("E", bound=SandboxError)


def observed_by_runner(exc: E) -> E:
    """Mark ``exc`` as found by the runner's own code (a decode or transport check), not reported by a provider."""
    exc.observed = True
    return exc


def error_for_code(code: str, message: str, *, field: str | None = None, retryable: bool | None = None) -> SandboxError:
    """Rebuild an error a peer reported, by table; unknown codes become ``SandboxProviderFailed``.

    ``SandboxCapabilityUnavailable`` arrives as a single unmet requirement naming ``field``.
    """
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        return SandboxProviderFailed(f"provider reported unknown error code {code[:64]!r}: {message}", field=field)
    if cls is SandboxCapabilityUnavailable:
        return SandboxCapabilityUnavailable([Unmet(field or "profile", message)])
    return cls(message, field=field, retryable=retryable)
