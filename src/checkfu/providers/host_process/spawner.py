"""The spawner: one long-lived thread per provider that forks every process born in a cgroup.

A child inherits the cgroups of the thread that forks it (v1 places tasks per
thread), so the spawner moves itself into an instance's cgroups, forks, and
moves back. Keeping one thread instead of starting one per process spares the
event loop ``Thread.start``, which blocks until the new thread runs.

The spawner must never run anything while it sits in an instance's cgroups: it
checks its own cgroups after every job, and a thread that finds itself still
inside one (its move back failed) retires, since exiting takes it out. It starts
no successor (a thread inherits its creator's cgroups): jobs already queued fail
with ``SpawnerRetired`` and the next ``submit`` starts a fresh thread from the
caller's. A thread that sits idle for ``IDLE_SECONDS`` retires too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from checkfu.providers.host_process.cgroups import NAME_PREFIX

T = TypeVar("T")
IDLE_SECONDS = 10.0

_Job = tuple[Callable[[], Any], "concurrent.futures.Future[Any]"]


class SpawnerRetired(OSError):
    """A job was queued behind a spawner thread that had to retire; retrying starts a clean one.

    It carries no errno, so it is never read as a program that cannot start.
    """


def stranded() -> bool:
    """Whether the calling thread is in an instance's cgroup."""
    try:
        return NAME_PREFIX in Path("/proc/thread-self/cgroup").read_text()
    except OSError:
        return True


class Spawner:
    """Runs jobs one at a time on its own thread (see the module docstring)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Queue ``fn``; its future settles with what it returns or raises."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            self._jobs.put((fn, future))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="checkfu-hp-spawner", daemon=True)
                self._thread.start()
        return future

    def _serve(self) -> None:
        while True:
            try:
                fn, future = self._jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._thread = None
                        return
                continue
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)
            if stranded():
                self._retire()
                return

    def _retire(self) -> None:
        """Leave for good, failing what is queued: a thread started from here would be born stranded too."""
        pending: list[_Job] = []
        with self._lock:
            self._thread = None
            while not self._jobs.empty():
                pending.append(self._jobs.get_nowait())
        for _, future in pending:
            if future.set_running_or_notify_cancel():
                future.set_exception(SpawnerRetired("the spawner thread was left inside an instance's cgroup"))

    async def run(self, fn: Callable[[], T], *, abandon: Callable[[T], None]) -> T:
        """Run ``fn`` on the spawner; if the caller is cancelled after it ran, ``abandon`` its result."""
        future = self.submit(fn)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:

            def orphaned(done: concurrent.futures.Future[T]) -> None:
                if not done.cancelled() and done.exception() is None:
                    threading.Thread(target=abandon, args=(done.result(),), daemon=True).start()

            future.add_done_callback(orphaned)
            raise
