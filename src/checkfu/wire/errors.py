"""The wire's error body: ``{"error": {"code", "message", "retryable", "field"?}}``."""

from __future__ import annotations

from pydantic import Field

from checkfu.contract.errors import ErrorCode, SandboxError, error_for_code
from checkfu.contract.model import Bool, Model, Str


class WireErrorDetail(Model):
    code: ErrorCode
    message: Str
    retryable: Bool
    field: Str | None = Field(default=None, description="the dotted path at fault, where there is one")


class WireError(Model):
    error: WireErrorDetail

    @classmethod
    def of(cls, exc: SandboxError) -> WireError:
        return cls(error=WireErrorDetail(code=exc.code, message=exc.message, retryable=exc.retryable, field=exc.field))

    def to_exception(self) -> SandboxError:
        e = self.error
        return error_for_code(e.code, e.message, field=e.field, retryable=e.retryable)
