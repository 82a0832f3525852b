"""Admission of a Run's inputs: every check that needs no provider, all of them, before any work.

Each check returns the problems it finds (it never stops at the first), so a
refusal can list them all. A problem is a vocabulary error naming its field;
``refusal`` folds a list of them into the one error that is raised.

What is checked here (beside the profile, which its decoder checks):

- the command: at most 4096 arguments, each valid UTF-8 and at most 128 KiB;
- environment names (``[A-Za-z_][A-Za-z0-9_]*``, at most 256 bytes) and values (no NUL, at most 128 KiB);
- the working directory, mount targets and capture paths: absolute sandbox paths (``paths``), no name
  longer than 255 bytes, and none inside ``/proc`` or ``/sys`` (a working directory there is how runc's
  CVE-2024-21626 escaped; no sandbox path of a Run needs to be there);
- mount targets apart from one another;
- the runner tag: an identifier of the journal's and the labels' own alphabet;
- a profile's packages against the operator's ``CHECKFU_BUILD_NETWORK``: with ``none``, no image build may reach
  the network, so a profile naming packages (which a build fetches from their registries) is refused by field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from checkfu.contract.errors import (
    SandboxBoundExceeded,
    SandboxCapabilityUnavailable,
    SandboxError,
    SandboxPathRejected,
    SandboxProfileInvalid,
    Unmet,
)
from checkfu.contract.paths import is_within, path_problem

MAX_ARGS = 4096
MAX_ARG_CHARS = 131072
NAME_MAX = 255
"""The longest name (one path component) a Linux file system holds, in bytes."""
KERNEL_TREES = ("/proc", "/sys")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
IDENTIFIER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


@dataclass(frozen=True)
class Problem:
    """One input refused: the error it amounts to."""

    error: SandboxError

    @property
    def code(self) -> str:
        return self.error.code

    @property
    def field(self) -> str | None:
        return self.error.field

    @property
    def message(self) -> str:
        return self.error.message


def _shown(value: str, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def argv_problems(argv: Sequence[str]) -> list[Problem]:
    """The command's problems: too many arguments, an argument too long or not UTF-8."""
    out: list[Problem] = []
    if not argv:
        out.append(Problem(SandboxProfileInvalid("command: no command was given (put it after --)", field="argv")))
    if len(argv) > MAX_ARGS:
        out.append(
            Problem(
                SandboxBoundExceeded(f"argv: {len(argv)} arguments, more than {MAX_ARGS}", field="argv"),
            )
        )
    for i, arg in enumerate(argv[:MAX_ARGS]):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            out.append(Problem(SandboxProfileInvalid(f"argv.{i}: {_shown(arg)} is not valid UTF-8", field=f"argv.{i}")))
            continue
        if len(arg) > MAX_ARG_CHARS:
            out.append(
                Problem(SandboxBoundExceeded(f"argv.{i}: longer than {MAX_ARG_CHARS} characters", field=f"argv.{i}"))
            )
    return out


def env_problems(env: Mapping[str, str], *, field: str = "env") -> list[Problem]:
    """Names that are not environment names; values with NUL, not UTF-8 or too long. Values are never shown."""
    out: list[Problem] = []
    for name, value in env.items():
        where = f"{field}.{name}" if ENV_NAME.match(name) else field
        if not ENV_NAME.match(name):
            out.append(
                Problem(
                    SandboxProfileInvalid(
                        f"{field}: {_shown(name)} is not an environment name (letters, digits and _, not starting "
                        "with a digit, at most 256)",
                        field=field,
                    )
                )
            )
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            out.append(Problem(SandboxProfileInvalid(f"{where}: the value is not valid UTF-8", field=where)))
            continue
        if "\x00" in value:
            out.append(Problem(SandboxProfileInvalid(f"{where}: the value holds NUL", field=where)))
        elif len(value) > MAX_ARG_CHARS:
            out.append(Problem(SandboxBoundExceeded(f"{where}: the value is longer than {MAX_ARG_CHARS}", field=where)))
    return out


def sandbox_path_problems(path: str, field: str, *, what: str) -> list[Problem]:
    """A sandbox path the Run names: absolute, normalized, no name over 255 bytes, not in a kernel tree."""
    problem = path_problem(path)
    if problem is not None:
        hint = " (a sandbox path, such as /workspace)" if problem == "must be absolute" else ""
        return [Problem(SandboxPathRejected(f"{field}: {what} {_shown(path)} {problem}{hint}", field=field))]
    out: list[Problem] = []
    long = [part for part in path.split("/") if len(part.encode("utf-8")) > NAME_MAX]
    if long:
        out.append(
            Problem(
                SandboxPathRejected(
                    f"{field}: {what} {_shown(path)} has a name of {len(long[0].encode())} bytes; at most {NAME_MAX}",
                    field=field,
                )
            )
        )
    for tree in KERNEL_TREES:
        if is_within(path, tree):
            out.append(Problem(SandboxPathRejected(f"{field}: {what} {_shown(path)} is inside {tree}", field=field)))
    return out


def workdir_problems(cwd: str | None) -> list[Problem]:
    return [] if cwd is None else sandbox_path_problems(cwd, "workdir", what="the working directory")


def target_problems(targets: Sequence[str]) -> list[Problem]:
    """Mount targets: sandbox paths other than ``/``, apart from one another."""
    out: list[Problem] = []
    for i, target in enumerate(targets):
        field = f"mounts.{i}.target"
        if target == "/":
            out.append(Problem(SandboxPathRejected(f"{field}: a mount may not cover the root '/'", field=field)))
            continue
        out.extend(sandbox_path_problems(target, field, what="the mount target"))
    for i, a in enumerate(targets):
        for j in range(i + 1, len(targets)):
            b = targets[j]
            if path_problem(a) is None and path_problem(b) is None and (is_within(a, b) or is_within(b, a)):
                field = f"mounts.{j}.target"
                out.append(
                    Problem(SandboxPathRejected(f"{field}: {_shown(b)} overlaps the mount at {a!r}", field=field))
                )
    return out


def capture_spec(text: str) -> tuple[str, bool]:
    """A ``--capture`` value as ``(path, is_directory)``: a trailing ``/`` says the path is a directory (every file
    below it is captured, which needs ``listDir``), and is not part of the path; ``/`` itself is a directory. A path
    without one is captured as a file, or as a directory where the provider can list it."""
    if text == "/":
        return text, True
    if text.endswith("/") and len(text) > 1:
        return text[:-1], True
    return text, False


def capture_problems(paths: Iterable[str]) -> list[Problem]:
    out: list[Problem] = []
    for i, text in enumerate(paths):
        path, _ = capture_spec(text)
        out.extend(sandbox_path_problems(path, f"capture.{i}", what="the capture path"))
    return out


def runner_tag_problems(tag: str) -> list[Problem]:
    if IDENTIFIER.match(tag):
        return []
    return [
        Problem(
            SandboxProfileInvalid(
                f"runner_tag: {_shown(tag)} (CHECKFU_RUNNER_TAG) is not an identifier: 1 to 128 letters, digits and "
                "._:- starting with a letter or digit",
                field="runner_tag",
            )
        )
    ]


BUILD_NETWORK_ENV = "CHECKFU_BUILD_NETWORK"
"""The operator's word on whether an image build may reach the network: ``host`` (the default: a build for
``packages`` runs on the host's network, to reach the package registries) or ``none`` (no build may)."""
BUILD_NETWORKS = ("host", "none")


def build_network_problems(packages: Iterable[tuple[str, Sequence[str]]], value: str | None) -> list[Problem]:
    """A profile's ``packages`` (its items) against ``CHECKFU_BUILD_NETWORK``'s ``value`` (``None``: unset).

    Every package manager named is one problem (``SandboxCapabilityUnavailable``, field ``profile.packages.M``) when
    the value is ``none``; a value that is neither ``host`` nor ``none`` refuses them as ``SandboxProfileInvalid``,
    field ``CHECKFU_BUILD_NETWORK``, rather than guess what the operator meant."""
    named = {m: list(names) for m, names in sorted(packages) if names}
    if not named or value is None or value == "" or value == "host":
        return []
    if value not in BUILD_NETWORKS:
        return [
            Problem(
                SandboxProfileInvalid(
                    f"{BUILD_NETWORK_ENV}={_shown(value)} is neither host nor none, and this profile names packages "
                    "an image build would fetch over the network",
                    field=BUILD_NETWORK_ENV,
                )
            )
        ]
    return [
        Problem(
            SandboxCapabilityUnavailable(
                [
                    Unmet(
                        f"profile.packages.{m}",
                        f"installing {', '.join(names)} takes an image build that reaches the network, and "
                        f"{BUILD_NETWORK_ENV}=none forbids it (use a base_image that holds them)",
                    )
                ]
            )
        )
        for m, names in named.items()
    ]


def refusal(problems: Sequence[Problem]) -> SandboxError:
    """One error for every problem found: the first problem's kind, every problem in its message.

    A single problem is raised as it is.
    """
    if len(problems) == 1:
        return problems[0].error
    first = problems[0].error
    lines = "; ".join(f"{p.code}: {p.message}" for p in problems)
    message = f"{len(problems)} problems: {lines}"
    if isinstance(first, SandboxCapabilityUnavailable):
        return SandboxCapabilityUnavailable([Unmet(p.field or "input", p.message) for p in problems])
    return type(first)(message, field=first.field)


def raise_problems(problems: Sequence[Problem]) -> None:
    """Raises the ``refusal`` of ``problems``, if there are any."""
    if problems:
        raise refusal(problems)
