"""The OpenAPI 3.1 document of a provider service, generated from the models the code uses."""

from __future__ import annotations

import functools
from typing import Any

from pydantic.json_schema import models_json_schema

from checkfu.contract.envelope import MEMBERS
from checkfu.contract.frames import FRAME_TYPES
from checkfu.contract.members import MESSAGES
from checkfu.contract.model import Model
from checkfu.wire.credentials import OPERATION_SECRET, OPERATION_SECRET_PATTERN
from checkfu.wire.errors import STATUS, WireError
from checkfu.wire.files import FILES_MEDIA_TYPE, REQUEST_HEADER, ReadFilesHead

REF = "#/components/schemas/{model}"


def _error_responses() -> dict[str, Any]:
    body = {"application/json": {"schema": {"$ref": REF.format(model="WireError")}}}
    statuses = sorted({*STATUS.values(), 503})
    return {str(s): {"description": "a vocabulary error", "content": body} for s in statuses}


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The document: every member's path, request and result, the error body, and the process frames."""
    models: list[type[Model]] = [WireError, ReadFilesHead]
    for request, result in MESSAGES.values():
        models += [request, result]
    for frames in FRAME_TYPES.values():
        models += list(frames.values())
    unique = list(dict.fromkeys(models))
    refs, top = models_json_schema([(m, "validation") for m in unique], ref_template=REF)
    schemas = dict(top.get("$defs", {}))
    security: list[dict[str, list[str]]] = [{"credential": []}]
    paths: dict[str, Any] = {}
    for member in MEMBERS:
        request, result = MESSAGES[member]
        req_ref = refs[(request, "validation")]
        res_ref = refs[(result, "validation")]
        op: dict[str, Any] = {"operationId": member, "security": security, "responses": _error_responses()}
        if member == "openProcess":
            responses = {k: v for k, v in _error_responses().items() if k in ("400", "401", "404", "405", "501")}
            paths["/v1/openProcess"] = {
                "get": {
                    "operationId": "openProcess",
                    "summary": "WebSocket of the frames of checkfu.contract.frames: JSON text frames (start, "
                    "stdin_end, window, kill; start, out_end, err_end, exit, window, error) and binary data "
                    "frames (one tag byte, 0x01 stdin, 0x02 out, 0x03 err, then the bytes)",
                    "security": security,
                    "parameters": [
                        {
                            "name": OPERATION_SECRET,
                            "in": "header",
                            "required": False,
                            "description": "the operation's secret, made by the client that starts it and sent on "
                            "each of its connections: a connection that presents another is answered SandboxNotFound",
                            "schema": {"type": "string", "pattern": OPERATION_SECRET_PATTERN},
                        }
                    ],
                    "responses": {"101": {"description": "switching to the WebSocket protocol"}, **responses},
                }
            }
            continue
        if member == "writeFile":
            op["parameters"] = [
                {
                    "name": REQUEST_HEADER,
                    "in": "header",
                    "required": True,
                    "description": "the WriteFileRequest, as ASCII JSON",
                    "content": {"application/json": {"schema": req_ref}},
                }
            ]
            op["requestBody"] = {
                "required": True,
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            }
        elif member == "describe":
            op["requestBody"] = {"required": False, "content": {"application/json": {"schema": req_ref}}}
        else:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": req_ref}}}
        if member == "readFiles":
            head = refs[(ReadFilesHead, "validation")]
            content = {
                FILES_MEDIA_TYPE: {
                    "schema": {"type": "string", "format": "binary"},
                    "x-checkfu-head": head,
                }
            }
            op["responses"]["200"] = {
                "description": "one line of JSON (a ReadFilesHead), then each file's bytes in order",
                "content": content,
            }
        else:
            op["responses"]["200"] = {"description": "the result", "content": {"application/json": {"schema": res_ref}}}
        paths[f"/v1/{member}"] = {"post": op}
    return {
        "openapi": "3.1.0",
        "info": {"title": "checkfu sandbox provider", "version": "v1"},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"credential": {"type": "http", "scheme": "bearer"}},
        },
    }
