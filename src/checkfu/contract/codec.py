"""Strict decoding and canonical encoding of contract messages.

``decode`` is the one door from bytes to a model: it refuses malformed JSON,
duplicate object keys, ``NaN``/``Infinity``, lone surrogates, unbounded nesting
and anything the model refuses, always as a member of the closed vocabulary,
naming the dotted field path at fault. Past it, no code sees a ``dict``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NoReturn, TypeVar

import rfc8785
from pydantic import ValidationError

from checkfu.contract.errors import ERROR_CLASSES, SandboxError, SandboxPathRejected
from checkfu.contract.model import Model

M = TypeVar("M", bound=Model)

MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
"""No message on the seam may be larger than this, bytes included."""

_ERROR_TYPES: dict[str, type[SandboxError]] = {"sandbox_path": SandboxPathRejected}
"""Pydantic error types that map to a vocabulary member of their own, by type, never by text."""


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _Malformed(f"duplicate object key {key[:80]!r}")
        obj[key] = value
    return obj


def _no_constants(name: str) -> NoReturn:
    raise _Malformed(f"{name} is not JSON")


class _Malformed(ValueError):
    pass


def field_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as a dotted path: ``("platforms", 1, "os")`` -> ``platforms.1.os``."""
    return ".".join(str(part) for part in loc if part != "[key]")


def _owner_error(model: type[Model], loc: tuple[int | str, ...]) -> type[SandboxError]:
    """The ``decode_error`` of the innermost message that contains the field at fault.

    A bad field inside a profile inside a provision request is refused as
    ``SandboxProfileInvalid``; a provision request missing its profile, as the
    request's own error.
    """
    owner = model.decode_error
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or part == "[key]":
            continue  # an index or key stays within the same element type
        if not (isinstance(current, type) and issubclass(current, Model)):
            continue
        info = current.model_fields.get(part)
        if info is None:
            break
        current = _inner_model(info.annotation)
        if isinstance(current, type) and issubclass(current, Model) and current.decode_error is not Model.decode_error:
            owner = current.decode_error
    return owner


def _inner_model(annotation: Any) -> Any:
    """The model class an annotation holds, looking through tuples, dicts and optionals."""
    if isinstance(annotation, type) and issubclass(annotation, Model):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return annotation if isinstance(annotation, type) else None


def translate(model: type[Model], exc: ValidationError) -> SandboxError:
    """The first error of a pydantic ``ValidationError`` as a vocabulary member."""
    return _translate_one(model, exc.errors(include_url=False, include_input=False)[0])


def translate_all(model: type[Model], exc: ValidationError) -> list[SandboxError]:
    """Every error of a pydantic ``ValidationError`` as a vocabulary member, in order.

    An unknown key is named with the keys that are known there; a missing one is called missing.
    """
    out: list[SandboxError] = []
    for e in exc.errors(include_url=False, include_input=False):
        if e["type"] == "extra_forbidden":
            loc = e["loc"]
            owner = _model_at(model, loc[:-1])
            known = ", ".join(owner.model_fields) if owner is not None else ""
            field = field_path(loc)
            name = str(loc[-1]) if loc else "?"
            hint = f" (the keys here are: {known})" if known else ""
            cls = _owner_error(model, loc)
            out.append(cls(f"{model.__name__}: {field}: unknown key {name!r}{hint}", field=field))
        elif e["type"] == "missing":
            field = field_path(e["loc"])
            out.append(_owner_error(model, e["loc"])(f"{model.__name__}: {field}: missing (required)", field=field))
        else:
            out.append(_translate_one(model, e))
    return out


def _model_at(model: type[Model], loc: tuple[int | str, ...]) -> type[Model] | None:
    """The model class whose fields sit at ``loc`` (an unknown key's parent), when it is one."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or part == "[key]":
            continue
        if not (isinstance(current, type) and issubclass(current, Model)):
            return None
        info = current.model_fields.get(str(part))
        if info is None:
            return None
        current = _inner_model(info.annotation)
    return current if isinstance(current, type) and issubclass(current, Model) else None


def _translate_one(model: type[Model], first: Any) -> SandboxError:
    loc = first["loc"]
    ctx = first.get("ctx") or {}
    field: str | None
    if first["type"] == "contract_rule":
        field = field_path((*loc, ctx["field"]))
        cls = ERROR_CLASSES[ctx["code"]]
        message = ctx["message"]
    else:
        field = field_path(loc) or None
        cls = _ERROR_TYPES.get(first["type"]) or _owner_error(model, loc)
        message = first["msg"]
    where = f"{field}: " if field else ""
    return cls(f"{model.__name__}: {where}{message}", field=field)


def build(model: type[M], **fields: Any) -> M:
    """Construct a message in Python, with decode's errors instead of pydantic's."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise translate(model, exc) from None


def decode(model: type[M], raw: bytes | str) -> M:
    """Decode one JSON document into ``model``, strictly.

    Raises:
        SandboxError: the model's ``decode_error`` (or a more specific member such
            as ``SandboxPathRejected``) naming the field at fault; never anything else.
    """
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise model.decode_error(f"{model.__name__}: document exceeds {MAX_DOCUMENT_BYTES} bytes")
    try:
        # A first pass with the standard parser refuses what the fast parser
        # would quietly accept: duplicate keys and the non-JSON constants.
        json.loads(raw, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)
    except (_Malformed, ValueError, RecursionError) as exc:
        reason = str(exc) if isinstance(exc, _Malformed) else _describe_parse_error(exc)
        raise model.decode_error(f"{model.__name__}: not a valid JSON document: {reason}") from None
    return _validate_json(model, raw)


def strict_json(raw: bytes | str) -> Any:
    """One JSON document parsed as ``decode`` parses it: duplicate keys and NaN/Infinity refused.

    Raises:
        ValueError: naming what is wrong.
    """
    try:
        return json.loads(raw, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _describe_parse_error(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8"
    return str(exc).splitlines()[0][:200]


def _validate_json(model: type[M], raw: bytes | str) -> M:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise translate(model, exc) from None
    except RecursionError:
        raise model.decode_error(f"{model.__name__}: nested too deeply") from None


def decode_value(model: type[M], value: Any) -> M:
    """Decode an already-parsed JSON-like value (for example from TOML) as ``decode`` would."""
    try:
        raw = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise model.decode_error(f"{model.__name__}: not a JSON value: {_describe_parse_error(exc)}") from None
    return decode(model, raw)


def revalidate(model: type[M], value: object) -> M:
    """Re-check a value a peer handed over in-process, as strictly as if it came off the wire.

    An in-process provider may return a model built with ``model_construct`` or a
    look-alike of another class; neither is taken on trust.
    """
    if type(value) is not model:
        raise model.decode_error(f"{model.__name__}: expected a {model.__name__}, got {type(value).__name__}")
    try:
        raw = value.model_dump_json(warnings="error")
    except Exception as exc:  # a forged instance may fail to serialize in any way
        raise model.decode_error(f"{model.__name__}: does not serialize: {type(exc).__name__}") from None
    return _validate_json(model, raw)


def encode(value: Model) -> bytes:
    """The wire JSON of a message."""
    return value.model_dump_json().encode()


def canonical(value: Model) -> bytes:
    """RFC 8785 canonical JSON of a message: byte-stable across languages."""
    return rfc8785.dumps(value.model_dump(mode="json"))


def digest(value: Model) -> str:
    """``sha256:`` of the canonical JSON of a message."""
    return "sha256:" + hashlib.sha256(canonical(value)).hexdigest()
