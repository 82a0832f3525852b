"""Profiles as the command line reads them: from a file or built in, every problem reported at once.

A profile file is TOML (``.toml``) or JSON, read up to ``MAX_FILE_BYTES``. Its
``base_image`` may name a local tag (``checkfu/debian:12``): the Docker tier pins
it to the engine's image id at admission, so a check without an engine reports
the tag as "pinned at admission" and checks everything else as it will be checked.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from checkfu.contract.codec import strict_json, translate_all
from checkfu.contract.errors import SandboxError, SandboxProfileInvalid
from checkfu.contract.profile import SandboxProfile
from checkfu.core.admission import Problem
from checkfu.core.documents import DocumentError, check_nesting, parse_toml, read_bounded

MAX_FILE_BYTES = 1 << 20
"""A profile is a few hundred bytes; a megabyte is generous, and a reader of ``/dev/zero`` stops there."""
PLACEHOLDER_IMAGE = "sha256:" + "0" * 64
"""Stands in for a tag while the rest of a profile is checked; never sent anywhere."""
TAG = re.compile(r"^[a-z0-9][a-z0-9._/:-]{0,254}$")
"""A local image tag, such as ``checkfu/debian:12``: pinned at admission, never sent as it is."""

DEBIAN_DEFAULT = """\
# The built-in default profile of `checkfu run` (the Docker tier): Debian, no network,
# modest limits, nothing kept after the Run. `checkfu profile init` writes this file.
tier = "container"
# A local tag: `checkfu run` pins it to the engine's image id at admission.
base_image = "checkfu/debian:12"
retention_mode = "ephemeral_zdr"

[network_policy]
mode = "none"              # none | allowlist (with allowlist = ["host:port", ...]) | unrestricted

[resource_limits]
cpu_millis = 1000          # one core
memory_mib = 1024          # memory, the writable areas included (they are memory-backed)
disk_mib = 512             # every writable path together (see docs/profiles.md)
pids = 256

# [packages]               # pinned names per manager, built into an image of their own
# apt = ["curl=7.88.1-10+deb12u12"]
"""

HOST_DEFAULT = """\
# The built-in default profile for `--provider host-process`: the runner host itself, with
# no isolation (that tier says so on every Run), its own network, its working directory kept.
tier = "container"
base_image = "host"
retention_mode = "durable"

[network_policy]
mode = "unrestricted"

[resource_limits]
cpu_millis = 1000
memory_mib = 1024
disk_mib = 512
pids = 256
"""

DEFAULTS: dict[str, tuple[str, str]] = {
    "docker": ("built-in default (checkfu/debian:12, network none)", DEBIAN_DEFAULT),
    "host-process": ("built-in default for the host-process tier", HOST_DEFAULT),
}


@dataclass
class ReadProfile:
    """A profile document as read, and what checking it found."""

    doc: dict[str, Any] | None
    name: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tag: str | None = None
    """The ``base_image`` tag that admission pins, when the document names one."""
    profile: SandboxProfile | None = None
    """The decoded profile (with a placeholder for a tag), when there was no problem."""


def default_for(provider: str) -> tuple[str, str]:
    """The built-in default's name and TOML for ``provider``; the Debian one for any but the host-process tier."""
    return DEFAULTS.get(provider, DEFAULTS["docker"])


def _problem(message: str, field: str | None = None) -> Problem:
    return Problem(SandboxProfileInvalid(message, field=field))


def read_document(path: Path) -> tuple[dict[str, Any] | None, list[Problem]]:
    """The document in ``path`` (TOML when it ends in ``.toml``, else JSON), read by the one bounded reader.

    A FIFO, a device or anything but a regular file is refused by what it is, without blocking on it; at
    most ``MAX_FILE_BYTES`` are read, and TOML and JSON alike may nest at most ``MAX_NESTING`` deep.
    """
    try:
        raw = read_bounded(path, limit=MAX_FILE_BYTES)
        if not raw.strip():
            raise DocumentError(f"{path}: the file is empty")
        if path.suffix.lower() == ".toml":
            doc: Any = parse_toml(raw, path)
        else:
            try:
                doc = strict_json(raw.decode("utf-8"))  # bytes would let json guess UTF-16 or UTF-32
            except UnicodeDecodeError:
                raise DocumentError(f"{path}: not UTF-8") from None
            except ValueError as exc:
                raise DocumentError(f"{path}: not valid JSON: {str(exc).splitlines()[0][:200]}") from None
            check_nesting(doc, path)
    except DocumentError as exc:
        return None, [_problem(f"profile: {exc}", "profile")]
    if not isinstance(doc, dict):
        return None, [_problem(f"profile: {path}: the document is not a table of keys", "profile")]
    return doc, []


def check_document(doc: dict[str, Any], name: str) -> ReadProfile:
    """Every problem of a profile document, unknown keys named; a tag is noted as pinned at admission."""
    read = ReadProfile(doc=doc, name=name)
    probe = dict(doc)
    image = doc.get("base_image")
    if isinstance(image, str) and image != "host" and "sha256:" not in image and TAG.match(image):
        read.tag = image
        read.notes.append(f"base_image {image!r} is a tag: it is pinned to the engine's image id at admission")
        probe["base_image"] = PLACEHOLDER_IMAGE
    try:
        encoded = json.dumps(probe, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        read.problems.append(_problem(f"SandboxProfile: not a JSON value: {exc}"))
        return read
    try:
        read.profile = SandboxProfile.model_validate_json(encoded)
    except ValidationError as exc:
        read.problems.extend(Problem(e) for e in translate_all(SandboxProfile, exc))
    except SandboxError as exc:  # a rule of the profile itself
        read.problems.append(Problem(exc))
    return read


def read_profile(path: Path | None, provider: str) -> ReadProfile:
    """The profile at ``path``, or the built-in default for ``provider``, checked in full."""
    if path is None:
        name, text = default_for(provider)
        return check_document(tomllib.loads(text), name)
    doc, problems = read_document(path)
    if doc is None:
        return ReadProfile(doc=None, name=str(path), problems=problems)
    return check_document(doc, str(path))


def pinned(read: ReadProfile, image_id: str) -> SandboxProfile:
    """The profile with its tag replaced by the pinned ``image_id``.

    Raises:
        SandboxProfileInvalid: the pinned profile does not decode (never expected once checked).
    """
    assert read.doc is not None
    from checkfu.contract.codec import decode_value  # noqa: PLC0415

    return decode_value(SandboxProfile, {**read.doc, "base_image": image_id})
