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
from checkfu.core.documents import DocumentError, check_nesting, is_toml, parse_toml, read_bounded

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
        if is_toml(path, raw):
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


def read_profile(path: Path | None, provider: str, given: Overrides | None = None) -> ReadProfile:
    """The profile at ``path``, or the built-in default for ``provider``, with docker-style flags ``given`` applied
    over it (a flag wins), checked in full. A file may give any subset of the four resource limits: the rest come
    from ``provider``'s built-in default, each one noted."""
    notes: list[str] = []
    flag_problems: list[Problem] = []
    if path is None:
        name, text = default_for(provider)
        doc: dict[str, Any] = tomllib.loads(text)
    else:
        read_doc, problems = read_document(path)
        if read_doc is None:
            return ReadProfile(doc=None, name=str(path), problems=problems)
        name = str(path)
        doc, notes = with_default_limits(read_doc, provider)
    if given is not None and given.given():
        doc, flag_problems = override(doc, given)
    read = check_document(doc, name)
    read.problems[:0] = flag_problems
    read.notes[:0] = notes
    return read


def pinned(read: ReadProfile, image_id: str) -> SandboxProfile:
    """The profile with its tag replaced by the pinned ``image_id``.

    Raises:
        SandboxProfileInvalid: the pinned profile does not decode (never expected once checked).
    """
    assert read.doc is not None
    from checkfu.contract.codec import decode_value  # noqa: PLC0415

    return decode_value(SandboxProfile, {**read.doc, "base_image": image_id})


# -- docker-style flags over a profile ---------------------------------------------------------------------------

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([bkmgt]?)(?:i?b)?\s*$", re.I)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
LIMITS = ("cpu_millis", "memory_mib", "disk_mib", "pids")


@dataclass(frozen=True)
class Overrides:
    """What docker-style flags say of a profile (``--image``, ``--memory``, ``--cpus``, ``--pids``, ``--disk``,
    ``--network``); ``None`` leaves the profile's value. A flag wins over the profile it is given with."""

    image: str | None = None
    memory: str | None = None
    cpus: str | None = None
    pids: int | None = None
    disk: str | None = None
    network: tuple[str, ...] = ()

    def given(self) -> bool:
        return any(v is not None for v in (self.image, self.memory, self.cpus, self.pids, self.disk)) or bool(
            self.network
        )


def parse_size_mib(text: str, flag: str) -> int:
    """``512m``, ``1g``, ``1.5g``, ``2048k`` (docker's units: b, k, m, g, t, powers of 1024) as whole MiB.

    Raises:
        SandboxProfileInvalid: not a size, or not a whole, positive number of MiB (its field is ``flag``).
    """
    m = _SIZE.match(text)
    if m is None:
        raise SandboxProfileInvalid(f"{flag}: {text[:40]!r} is not a size: write it as 512m or 1g", field=flag)
    number = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    mib = number / (1 << 20)
    if mib < 1 or mib != int(mib):
        hint = " (a number alone is bytes, as docker reads it: write 512m)" if not m.group(2) else ""
        raise SandboxProfileInvalid(f"{flag}: {text[:40]!r} is not a whole number of MiB{hint}", field=flag)
    return int(mib)


def parse_cpus(text: str) -> int:
    """``--cpus 1.5`` (cores, as docker takes them) as thousandths of a core.

    Raises:
        SandboxProfileInvalid: not a positive number of cores in steps of 0.001 (field ``--cpus``).
    """
    try:
        cores = float(text)
    except ValueError:
        cores = -1.0
    if not 0 < cores < 1e6:  # also refuses nan and inf
        cores = -1.0
    millis = round(cores * 1000)
    if cores < 0 or millis < 1 or abs(cores * 1000 - millis) > 1e-6:
        raise SandboxProfileInvalid(
            f"--cpus: {text[:40]!r} is not a number of cores (say 0.5, 1 or 1.5; steps of 0.001)", field="--cpus"
        )
    return millis


def parse_network(values: tuple[str, ...]) -> dict[str, Any]:
    """``--network none`` or ``--network allow:HOST:PORT[,HOST:PORT]`` (repeatable) as a ``network_policy``.

    Raises:
        SandboxProfileInvalid: another mode, or ``none`` with an allowlist (field ``--network``).
    """
    allow: list[str] = []
    none = False
    for value in values:
        if value == "none":
            none = True
        elif value.startswith("allow:") and any(v.strip() for v in value[len("allow:") :].split(",")):
            allow.extend(v.strip() for v in value[len("allow:") :].split(",") if v.strip())
        else:
            raise SandboxProfileInvalid(
                f"--network: {value[:80]!r} is not a network checkfu gives a sandbox: say none, or "
                "allow:HOST:PORT[,HOST:PORT] for an allowlist (the sandbox reaches only those, through the runner)",
                field="--network",
            )
    if none and allow:
        raise SandboxProfileInvalid("--network: none and allow:... contradict each other; give one", field="--network")
    if allow:
        return {"mode": "allowlist", "allowlist": list(dict.fromkeys(allow))}
    return {"mode": "none"}


def override(doc: dict[str, Any], given: Overrides) -> tuple[dict[str, Any], list[Problem]]:
    """``doc`` with what the flags say in place of its own values, and the flags that could not be read."""
    out = dict(doc)
    limits = dict(out.get("resource_limits") or {}) if isinstance(out.get("resource_limits"), dict) else {}
    problems: list[Problem] = []
    readers: list[tuple[str, Any]] = [
        ("memory_mib", lambda: parse_size_mib(given.memory, "--memory") if given.memory is not None else None),
        ("disk_mib", lambda: parse_size_mib(given.disk, "--disk") if given.disk is not None else None),
        ("cpu_millis", lambda: parse_cpus(given.cpus) if given.cpus is not None else None),
    ]
    for key, read in readers:
        try:
            value = read()
        except SandboxProfileInvalid as exc:
            problems.append(Problem(exc))
            continue
        if value is not None:
            limits[key] = value
    if given.pids is not None:
        if given.pids < 1:
            problems.append(_problem(f"--pids: {given.pids} is not a positive number of processes", "--pids"))
        else:
            limits["pids"] = given.pids
    if limits:
        out["resource_limits"] = limits
    if given.image is not None:
        out["base_image"] = given.image
    if given.network:
        try:
            out["network_policy"] = parse_network(given.network)
        except SandboxProfileInvalid as exc:
            problems.append(Problem(exc))
    return out, problems


def with_default_limits(doc: dict[str, Any], provider: str) -> tuple[dict[str, Any], list[str]]:
    """``doc`` with each resource limit it does not give taken from ``provider``'s built-in default, and a note of
    each one taken (a profile may give any subset of the four)."""
    limits = doc.get("resource_limits")
    if limits is not None and not isinstance(limits, dict):
        return doc, []  # checking names what is wrong with it
    given = dict(limits or {})
    missing = [k for k in LIMITS if k not in given]
    if not missing:
        return doc, []
    name, text = default_for(provider)
    defaults = tomllib.loads(text)["resource_limits"]
    for key in missing:
        given[key] = defaults[key]
    notes = [f"resource_limits.{k} = {defaults[k]} from the {name}" for k in missing]
    return {**doc, "resource_limits": given}, notes


def describe_resolved(profile: SandboxProfile, timeout: float | None = None) -> dict[str, Any]:
    """The resolved profile as a summary states it (``--json``'s ``resolved_profile``)."""
    limits = profile.resource_limits
    out: dict[str, Any] = {
        "image": profile.base_image,
        "cpus": limits.cpu_millis / 1000,
        "memory_mib": limits.memory_mib,
        "disk_mib": limits.disk_mib,
        "pids": limits.pids,
        "network": profile.network_policy.mode,
        "allowlist": list(profile.network_policy.allowlist),
    }
    if timeout is not None:
        out["timeout_seconds"] = timeout
    return out


MAX_SECONDS = 366 * 86400.0
"""The longest duration a flag takes: a year (a longer one is a slip of the unit, not a plan)."""
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*$")
_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration_seconds(text: str) -> float | None:
    """``30s``, ``5m``, ``2h``, ``7d`` or a bare number, in seconds; ``None`` when ``text`` is none of those (the
    caller bounds it and names its own field)."""
    m = _DURATION.match(text)
    return None if m is None else float(m.group(1)) * _DURATION_UNITS[m.group(2)]


def parse_seconds(text: str | float, flag: str) -> float:
    """``30s``, ``5m``, ``2h``, ``1d`` or a number of seconds (``90``, ``1.5``), positive and finite.

    Raises:
        SandboxProfileInvalid: not such a duration (its field is ``flag``).
    """
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        read = duration_seconds(text)
        seconds = -1.0 if read is None else read
    if not 0 < seconds <= MAX_SECONDS:  # also refuses nan
        raise SandboxProfileInvalid(
            f"{flag}: {str(text)[:40]!r} is not a duration up to a year: write it as 30s, 5m, 2h or a number of "
            "seconds",
            field=flag.lstrip("-"),
        )
    return seconds
