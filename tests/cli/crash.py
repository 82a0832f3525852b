"""``checkfu`` (or the SDK) held in one phase, for the crash pass: a fault-injection point owned by the tests.

Usage: ``python crash.py PHASE ARGS...`` runs ``checkfu ARGS...``; ``python crash.py PHASE --sdk PROFILE MOUNT``
makes a ``checkfu.Sandbox`` of PROFILE with MOUNT staged, runs ``true`` in it and closes it. When the work reaches
PHASE it says ``held in PHASE`` on stderr and holds there, for the test to signal it from outside. The shipped code
has no such hook: this wraps the code each phase runs.

Where each phase is held, as a signal would find it:

- ``resolve``: hashing a mount, in its worker thread (the hashing polls for a cancellation, as it does between
  chunks);
- ``select``, ``materialize``, ``adopt``, ``process``: as the phase begins (``ConsoleObserver.before``; the CLI's
  ``run`` only);
- ``provision``: inside the Docker provider's create, in its worker thread, between the stager (with its mount
  volumes) and the sandbox container: the moment a thread cannot be stopped and goes on creating;
- ``stage``: inside the second ``writeFile``;
- ``activate``, ``release``: inside the Docker provider's start and removal, in its worker thread.

A hold inside a worker thread lasts ``HOLD`` seconds, then the work goes on (a thread cannot be stopped); a hold
on the event loop lasts until the process is signalled.

With ``CRASH_SELF=SIGINT`` (or ``SIGTERM``) and PHASE ``stage``, the process signals itself just before its second
``writeFile`` is handed to the provider, instead of holding: the signal is then pending as the call starts and
answers at once, the race in which ``asyncio.wait_for`` (Python 3.11) dropped it and the Run carried on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

import checkfu
from checkfu.cli import main
from checkfu.cli.common import ConsoleObserver
from checkfu.core import door, job
from checkfu.providers.docker import provider, spec

HOLD = 2.0
"""Seconds a worker thread is held."""


def say(phase: str) -> None:
    print(f"held in {phase}", file=sys.stderr, flush=True)


def hold_in_thread(phase: str) -> None:
    say(phase)
    time.sleep(HOLD)


def install(phase: str) -> None:
    """Hold the work in ``phase`` (see the module's docstring)."""
    if phase == "resolve":
        original_resolve = job.resolve_mount

        def resolve_mount(mount_spec: Any, *, progress: Any = None, **kw: Any) -> Any:
            say(phase)
            for _ in range(int(HOLD * 100)):
                time.sleep(0.01)
                if progress is not None:
                    progress(0, 1)  # raises once the Run is cancelled, as hashing does between chunks
            return original_resolve(mount_spec, progress=progress, **kw)

        job.resolve_mount = resolve_mount  # type: ignore[assignment]
    elif phase in ("select", "materialize", "adopt", "process"):
        original_before = ConsoleObserver.before

        async def before(self: ConsoleObserver, name: str) -> None:
            if name == phase:
                say(phase)
                await asyncio.sleep(3600)
            await original_before(self, name)

        ConsoleObserver.before = before  # type: ignore[method-assign]
    elif phase == "provision":
        original_spec = spec.sandbox_spec

        def sandbox_spec(*args: Any, **kw: Any) -> Any:
            hold_in_thread(phase)
            return original_spec(*args, **kw)

        spec.sandbox_spec = sandbox_spec
    elif phase == "stage":
        original_invoke = door.ProviderDoor._invoke
        calls = [0]
        itself = os.environ.get("CRASH_SELF")

        async def invoke(self: door.ProviderDoor, plan: Any) -> object:
            if plan.member == "writeFile":
                calls[0] += 1
                if calls[0] == 2:
                    if itself:
                        say(phase)
                        os.kill(os.getpid(), getattr(signal, itself))
                    else:
                        say(phase)
                        await asyncio.sleep(3600)
            return await original_invoke(self, plan)

        door.ProviderDoor._invoke = invoke  # type: ignore[method-assign]
    elif phase in ("activate", "release"):
        name = f"_{phase}_blocking"
        original_blocking = getattr(provider.DockerProvider, name)

        def blocking(self: Any, *args: Any, **kw: Any) -> Any:
            hold_in_thread(phase)
            return original_blocking(self, *args, **kw)

        setattr(provider.DockerProvider, name, blocking)
    else:
        raise SystemExit(f"crash.py: no such phase {phase!r}")


def sdk(profile: str, mount: str) -> None:
    """A program of the SDK's: Ctrl-C (``KeyboardInterrupt``, raised once the SDK wound up) ends it with 130."""
    try:
        with checkfu.Sandbox(profile=profile, provider="docker", mounts=[mount], ttl=600) as sb:
            print(f"sandbox {sb.sandbox_id}", file=sys.stderr, flush=True)
            sb.exec(["true"])
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    install(sys.argv[1])
    if sys.argv[2:3] == ["--sdk"]:
        sdk(sys.argv[3], sys.argv[4])
    else:
        sys.argv = ["checkfu", *sys.argv[2:]]
        main()
