"""The base model and the scalar types every contract message is built from.

Models are frozen, keyword-only and refuse unknown fields. Scalars are strict
(no string-to-number or number-to-bool coercion); sequences decode from JSON
arrays into tuples. Cross-field rules live in each model's ``model_validator``
so they fire on construction and on decode alike.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Hashable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    Strict,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from checkfu.contract.errors import SandboxError, SandboxProtocolViolation

MAX_SAFE_INT = 2**53 - 1
"""The largest integer every JSON implementation reads exactly (I-JSON, RFC 7493)."""

Int = Annotated[int, Strict(), Field(ge=-MAX_SAFE_INT, le=MAX_SAFE_INT)]
NonNegInt = Annotated[int, Strict(), Field(ge=0, le=MAX_SAFE_INT)]
PosInt = Annotated[int, Strict(), Field(ge=1, le=MAX_SAFE_INT)]
ExitCode = Annotated[int, Strict(), Field(ge=0, le=255)]
"""A process's exit status as a shell reports it: 0..255, ``128 + n`` for death by signal ``n``."""
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict(), Field(max_length=65536)]


def _bytes_in(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            data = None
        # Only the one canonical spelling: padding only where it completes the last quantum (``AAAA=`` is not).
        if data is None or base64.b64encode(data).decode("ascii") != value:
            raise PydanticCustomError("base64", "is not standard base64 (RFC 4648 section 4, padded)")
        return data
    raise PydanticCustomError("bytes_type", "should be base64 text")


BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$"
"""Standard padded base64 as the schema states it: whole quanta, padding only at the end, and the bits the
padding leaves over zero (so each byte string has exactly one spelling, as the decoder requires)."""

Bytes = Annotated[
    bytes,
    PlainValidator(_bytes_in, json_schema_input_type=str),
    PlainSerializer(lambda b: base64.b64encode(b).decode("ascii"), return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "type": "string",
            "contentEncoding": "base64",
            "$comment": "base64 rule: standard padded base64 (RFC 4648 section 4), one spelling per byte string",
            "pattern": BASE64_PATTERN,
        }
    ),
]
"""Bytes travel as standard, padded base64 (what Go's ``encoding/json`` does for ``[]byte``)."""

Sha256Digest = Annotated[str, Strict(), Field(pattern=r"^sha256:[0-9a-f]{64}$")]
"""``sha256:`` and 64 lowercase hex digits."""

Identifier = Annotated[str, Strict(), Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")]
"""An opaque id chosen by the runner or the provider: 1..128 characters, no spaces or slashes."""

TIMESTAMP_PATTERN = (
    r"^[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
    r"T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?Z$"
)
"""An RFC 3339 instant in UTC, spelled one way: ``2026-12-01T22:05:42Z``, a fraction of a second allowed, the
offset always ``Z``. The pattern cannot see that February has no 30th: the decoder checks that the date is real."""


def _real_instant(value: str) -> str:
    try:
        parse_timestamp(value)
    except ValueError:
        raise PydanticCustomError("timestamp", "is not a real date and time (RFC 3339, UTC)") from None
    return value


Timestamp = Annotated[
    str,
    Strict(),
    Field(
        pattern=TIMESTAMP_PATTERN,
        json_schema_extra={"$comment": "timestamp rule: an RFC 3339 instant in UTC, Z offset, a real date"},
    ),
    AfterValidator(_real_instant),
]
"""An instant as the wire carries it (``TIMESTAMP_PATTERN``), naming a real date and time."""


def parse_timestamp(value: str) -> float:
    """Seconds since the epoch of a ``Timestamp``.

    Raises:
        ValueError: not a ``Timestamp`` or not a real date and time.
    """
    if re.fullmatch(TIMESTAMP_PATTERN[1:-1], value) is None:
        raise ValueError(f"{value!r} is not an RFC 3339 UTC timestamp")
    whole, _, fraction = value[:-1].partition(".")
    instant = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return instant.timestamp() + (float("0." + fraction) if fraction else 0.0)


def format_timestamp(seconds: float) -> str:
    """The ``Timestamp`` of ``seconds`` since the epoch, to the whole second below it."""
    return datetime.fromtimestamp(int(seconds // 1), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


H = TypeVar("H", bound=Hashable)


def _unique(items: Sequence[H]) -> Sequence[H]:
    seen: set[H] = set()
    for i, item in enumerate(items):
        if item in seen:
            raise PydanticCustomError(
                "duplicate", "duplicate entry {item} at index {index}", {"item": repr(item)[:80], "index": i}
            )
        seen.add(item)
    return items


UNIQUE = AfterValidator(_unique)
"""Refuses a duplicate in a set-valued list (pair it with ``UNIQUE_ITEMS`` for the schema)."""

UNIQUE_ITEMS = Field(json_schema_extra={"uniqueItems": True})
NONEMPTY = Field(min_length=1)


def rule_error(error: type[SandboxError], field: str, message: str) -> PydanticCustomError:
    """A cross-field rule's failure, raised inside a validator.

    The decoder turns it into ``error`` with the full dotted path of ``field``
    (prefixed by wherever the message sits inside an outer one).
    """
    return PydanticCustomError("contract_rule", "{message}", {"message": message, "code": error.code, "field": field})


def schema_rules(*rules: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """A ``json_schema_extra`` that states a model's cross-field rules in its JSON Schema, as ``allOf``.

    Each rule is a JSON Schema (usually ``if``/``then``) saying what the model's
    ``model_validator`` enforces, so the published schema and the decoder are
    written side by side; the author kit's tests hold them to the same vectors.
    """

    def extra(schema: dict[str, Any]) -> None:
        schema["allOf"] = [*schema.get("allOf", []), *rules]

    return extra


def without_default(schema: dict[str, Any]) -> None:
    """A ``json_schema_extra`` that drops a field's unconditional ``default`` (a rule states a conditional one)."""
    schema.pop("default", None)


class Model(BaseModel):
    """Base of every contract message: frozen, strict scalars, no unknown fields."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        validate_default=False,
        hide_input_in_errors=True,
    )

    decode_error: ClassVar[type[SandboxError]] = SandboxProtocolViolation
    """The vocabulary member a decode failure of this message becomes."""
