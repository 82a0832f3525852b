"""Submitting Runs to a fleet of runners, and waiting for them: ``checkfu.submit`` and ``checkfu.wait``.

The same two calls as ``checkfu submit`` and ``checkfu runs wait``::

    import checkfu

    run_id = checkfu.submit(["pytest", "-q"], db="postgresql+psycopg://ci@db/checkfu",
                            profile="examples/profiles/debian-none.toml", mounts=["/srv/src:/workspace"])
    result = checkfu.wait(run_id, db="postgresql+psycopg://ci@db/checkfu", on_stdout=print_bytes)
    assert result.exit_code == 0

A face over the runner's front door (``RunnerService.submit`` and ``RunnerService.wait``,
``checkfu.runner.submission``): a submitted Run is queued in the journal; any ``checkfu runner serve``
on that database claims it, runs it exactly as ``checkfu run`` would, and keeps its output there for
``wait``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checkfu.runner.submission import OnOutput, RunResult, submit_request

if TYPE_CHECKING:
    from checkfu.contract.profile import SandboxProfile
    from checkfu.runner.service import RunnerService

__all__ = ["RunResult", "default_journal_url", "submit", "submit_request", "wait"]


def _service(db: str | None) -> RunnerService:
    from checkfu.runner import RunnerConfig, RunnerService  # noqa: PLC0415

    return RunnerService.open(RunnerConfig.from_environment(journal_url=db), housekeeping=False)


def default_journal_url() -> str:
    """The embedded journal every ``checkfu`` command uses when no ``--db`` is given, in the state directory (the
    user's alone: ``checkfu.core.owner_only.state_dir``)."""
    from checkfu.runner import RunnerConfig  # noqa: PLC0415

    return RunnerConfig.from_environment().default_journal_url()


def submit(
    command: Sequence[str],
    *,
    profile: SandboxProfile | Mapping[str, Any] | str | Path,
    db: str | None = None,
    provider: str = "docker",
    mounts: Sequence[str] = (),
    captures: Sequence[str] = (),
    capture_dir: str | None = None,
    timeout: float = 3600.0,
    runner_tag: str = "sdk",
) -> str:
    """Queue ``command`` for the fleet on ``db``; returns the Run id at once.

    ``profile`` is a ``SandboxProfile``, its JSON as a mapping, or a TOML/JSON file; its base image must be
    pinned (``checkfu submit`` pins a tag on the local engine for you). ``mounts`` are ``SRC:TARGET`` as for
    ``checkfu run``; the runner reads each source itself, so it must see the same path.

    Raises:
        SandboxError: the profile or a mount is refused (nothing is queued).
        ValueError: ``command`` is empty or ``timeout`` is not positive.
    """
    from checkfu.runner.submission import build_request, request_profile  # noqa: PLC0415

    if not command:
        raise ValueError("command: give at least one argument")
    if not timeout > 0:
        raise ValueError(f"timeout: must be a positive number of seconds, not {timeout}")
    request = build_request(
        command,
        request_profile(profile),
        provider=provider,
        mounts=mounts,
        captures=captures,
        capture_dir=capture_dir,
        timeout=timeout,
    )
    service = _service(db)
    try:
        return service.submit(request, runner_tag=runner_tag)
    finally:
        service.close()


def wait(
    run_id: str,
    *,
    db: str | None = None,
    on_stdout: OnOutput | None = None,
    on_stderr: OnOutput | None = None,
    timeout: float | None = None,
) -> RunResult:
    """Wait for a submitted Run, streaming its output to the callbacks; returns its terminal state.

    Raises:
        SandboxNotFound: no such Run in ``db``.
        TimeoutError: ``timeout`` seconds passed first (the Run goes on).
    """
    service = _service(db)
    try:
        return service.wait(run_id, on_stdout=on_stdout, on_stderr=on_stderr, timeout=timeout)
    finally:
        service.close()
