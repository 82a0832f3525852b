"""Queueing Runs for a fleet of runners and following them to their end: what ``checkfu submit``, ``checkfu runs
wait`` and ``checkfu.submit``/``checkfu.wait`` do, through ``RunnerService.submit`` and ``RunnerService.wait``.

A submitted Run is queued in the journal; any ``checkfu runner serve`` on that database claims it, runs it exactly
as ``checkfu run`` would, and keeps its output there. Following a Run streams the output of each attempt as it
arrives (an attempt taken over after its runner died is followed by the next one) and returns once the Run reached
its one terminal state.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkfu.contract.codec import decode_value, strict_json
from checkfu.contract.errors import SandboxError, SandboxNotFound, SandboxProfileInvalid, error_for_code
from checkfu.contract.profile import SandboxProfile
from checkfu.core.clock import SystemClock
from checkfu.core.documents import DocumentError, check_nesting, parse_toml, read_bounded
from checkfu.core.journal import Journal, RunRow
from checkfu.core.mounts import DirectorySource, GitSource, MountSpec, parse_mount, resolve_mount
from checkfu.core.queue import RunQueue, RunRequest, is_terminal
from checkfu.core.runner import new_run_id

__all__ = [
    "OnOutput",
    "RunResult",
    "build_request",
    "follow",
    "pinned_mounts",
    "request_profile",
    "result_of",
    "submit_request",
]

OnOutput = Callable[[bytes], None]


@dataclass(frozen=True)
class RunResult:
    """A submitted Run's one terminal state."""

    run_id: str
    status: str
    """``succeeded``, ``command_failed``, ``interrupted``, ``refused:<code>``, ``failed`` or ``cancelled``."""
    exit_code: int | None
    attempts: int
    error: SandboxError | None
    """For a refused Run: the vocabulary error it was refused with."""
    summary: dict[str, Any] | None


def pinned_mounts(specs: Sequence[MountSpec]) -> tuple[str, ...]:
    """Each mount as the runner will read it: the source made absolute, a Git ref pinned to its commit.

    Every mount is resolved once here (every byte read and verified), so a bad one is refused before
    it is queued.

    Raises:
        SandboxError: a mount is refused (its field is ``mounts``).
    """
    out: list[str] = []
    for spec in specs:
        resolve_mount(spec)
        src = spec.source
        if isinstance(src, GitSource):
            repo = src.repo.resolve()
            commit = _commit(repo, src.ref)
            out.append(f"{repo}@{commit}:{spec.target}" + (":rw" if spec.writable else ""))
        else:
            assert isinstance(src, DirectorySource)
            out.append(f"{src.path.resolve()}:{spec.target}" + (":rw" if spec.writable else ""))
    return tuple(out)


def _commit(repo: Path, ref: str) -> str:
    """The commit ``ref`` names in ``repo`` now (``resolve_mount`` has checked it names one)."""
    done = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--end-of-options", f"{ref}^{{commit}}"],
        capture_output=True,
        check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"},
    )
    if done.returncode != 0:
        raise SandboxProfileInvalid(f"mount {repo}@{ref}: names no commit", field="mounts")
    return done.stdout.decode().strip()


def submit_request(journal: Journal, request: RunRequest, *, runner_tag: str) -> str:
    """Queue an already checked ``request`` in ``journal``; returns the Run id."""
    profile = decode_value(SandboxProfile, request.profile)
    return RunQueue(journal, SystemClock()).submit(
        request, runner_tag=runner_tag, profile_digest=profile.digest, run_id=new_run_id()
    )


def request_profile(profile: SandboxProfile | Mapping[str, Any] | str | Path) -> SandboxProfile:
    """A queued Run's profile: a ``SandboxProfile``, its JSON as a mapping, or a TOML or JSON file, whose base image
    is pinned already (the runner that claims it may be on another machine, with another engine).

    Raises:
        SandboxProfileInvalid: the profile cannot be read or is not valid.
    """
    if isinstance(profile, SandboxProfile):
        return profile
    if isinstance(profile, Mapping):
        return decode_value(SandboxProfile, dict(profile))
    path = Path(profile)
    try:  # read bounded, as every document a person names is
        raw = read_bounded(path)
        if path.suffix.lower() == ".toml":
            doc = parse_toml(raw, path)
        else:
            try:
                doc = strict_json(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                raise DocumentError(f"{path}: not a valid JSON document: {str(exc).splitlines()[0][:200]}") from None
            check_nesting(doc, path)
    except DocumentError as exc:
        raise SandboxProfileInvalid(f"cannot read the profile: {exc}", field="profile") from None
    return decode_value(SandboxProfile, doc)


def build_request(
    command: Sequence[str],
    profile: SandboxProfile,
    *,
    provider: str,
    mounts: Sequence[str],
    captures: Sequence[str],
    capture_dir: str | None,
    timeout: float,
) -> RunRequest:
    """A Run request as a runner of the fleet takes it: every mount read and pinned now, so a bad one is refused
    before it is queued.

    Raises:
        ValueError: ``command`` is empty or ``timeout`` is not positive.
        SandboxError: a mount is refused (field ``mounts``).
    """
    if not command:
        raise ValueError("command: give at least one argument")
    if not timeout > 0:
        raise ValueError(f"timeout: must be a positive number of seconds, not {timeout}")
    return RunRequest(
        provider=provider,
        command=tuple(command),
        profile=json.loads(profile.model_dump_json()),
        mounts=pinned_mounts([parse_mount(m) for m in mounts]),
        captures=tuple(captures),
        capture_dir=capture_dir,
        timeout=timeout,
    )


def result_of(row: RunRow) -> RunResult:
    error: SandboxError | None = None
    info = (row.summary or {}).get("error")
    if row.status.startswith("refused:") and isinstance(info, dict):
        code = str(info.get("code", row.status.removeprefix("refused:")))
        try:
            error = error_for_code(code, str(info.get("message", "")), field=info.get("field"))
        except (KeyError, ValueError, TypeError):
            error = None
    return RunResult(
        run_id=row.run_id,
        status=row.status,
        exit_code=row.exit_code,
        attempts=row.attempt,
        error=error,
        summary=row.summary,
    )


def follow(
    journal: Journal,
    run_id: str,
    *,
    on_stdout: OnOutput | None = None,
    on_stderr: OnOutput | None = None,
    on_attempt: Callable[[int], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    poll: float = 0.1,
    timeout: float | None = None,
) -> RunResult:
    """Stream a Run's output from ``journal`` until it reaches its terminal state.

    Raises:
        SandboxNotFound: no Run ``run_id``.
        TimeoutError: ``timeout`` seconds passed first (the Run goes on).
    """
    queue = RunQueue(journal, SystemClock())
    if journal.run(run_id) is None:
        raise SandboxNotFound(f"no Run {run_id!r} in this journal", field="run")
    deadline = None if timeout is None else time.monotonic() + timeout
    last = 0
    attempt = 0
    pause = poll
    while True:
        row = journal.run(run_id)  # read before the output: output written before it settled is then all there
        assert row is not None
        chunks = queue.output_since(run_id, last)
        for chunk in chunks:
            last = chunk.id
            if chunk.attempt != attempt:
                attempt = chunk.attempt
                if on_attempt is not None:
                    on_attempt(attempt)
            if chunk.stream == "out" and on_stdout is not None:
                on_stdout(chunk.data)
            elif chunk.stream == "err" and on_stderr is not None:
                on_stderr(chunk.data)
            elif chunk.stream == "warn" and on_warning is not None:
                on_warning(chunk.data.decode("utf-8", "replace"))
        if chunks:
            pause = poll
            continue
        if is_terminal(row.status):
            return result_of(row)
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"Run {run_id} is still {row.status} after {timeout:g} s")
        time.sleep(pause)
        pause = min(pause * 1.5, max(poll, 0.5))
