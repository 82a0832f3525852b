"""The wire's error body, ``{"error": {"code", "message", "retryable", "field"?}}``, and its HTTP statuses.

A vocabulary error travels as that body under an ordinary status chosen by the
table below; the receiving side rebuilds the error from its ``code`` through the
vocabulary's own table (an unknown code is ``SandboxProviderFailed``), never from
the status.
"""

from __future__ import annotations

from checkfu.contract.errors import SandboxError, error_for_code
from checkfu.contract.frames import ErrorDetail
from checkfu.contract.model import Model

WireErrorDetail = ErrorDetail


class WireError(Model):
    error: ErrorDetail

    @classmethod
    def of(cls, exc: SandboxError) -> WireError:
        return cls(error=ErrorDetail.of(exc))

    def to_exception(self) -> SandboxError:
        e = self.error
        return error_for_code(e.code, e.message, field=e.field, retryable=e.retryable)


STATUS: dict[str, int] = {
    "SandboxUnauthenticated": 401,
    "SandboxEnrollmentRefused": 403,
    "SandboxNotFound": 404,
    "SandboxStateConflict": 409,
    "SandboxLeaseFenced": 409,
    "SandboxBoundExceeded": 413,
    "SandboxProfileInvalid": 422,
    "SandboxCapabilityUnavailable": 422,
    "SandboxPathRejected": 422,
    "SandboxDigestMismatch": 422,
    "SandboxIdentityMismatch": 422,
    "SandboxEnvelopeInvalid": 422,
    "SandboxResultInvalid": 500,
    "SandboxProtocolViolation": 400,
    "SandboxAdapterUnavailable": 503,
    "SandboxAdapterAmbiguous": 500,
    "SandboxOperationUnsupported": 501,
    "SandboxProviderFailed": 500,
    "SandboxProviderTimeout": 504,
}
"""The HTTP status each code travels under."""


def status_of(exc: SandboxError) -> int:
    status = STATUS.get(exc.code, 500)
    if status == 500 and exc.retryable:
        return 503
    return status
