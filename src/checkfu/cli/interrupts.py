"""How a command that allocates sandboxes takes SIGINT and SIGTERM (issue 29).

At any phase, either signal stops the command: its task is cancelled, what it holds is released or compensated
(journal first, then the provider; those wind-ups are shielded, so a second signal does not cut them short), the
Run is settled in the journal, and the command exits ``128 + the signal``: 130 for SIGINT, 143 for SIGTERM, as
docker does. SIGKILL cannot be caught: what a killed command held is reclaimed, and its Runs and sandboxes settled,
by the next ``checkfu runner reconcile``, which finds their owner gone.

- ``Interrupted``: the command was stopped by a signal; ``checkfu`` exits with its ``exit_code``.
- ``sigterm_interrupts()``: while no event loop runs (a command's checks before its loop starts), SIGTERM raises
  ``Interrupted`` where the command is, as Ctrl-C raises ``KeyboardInterrupt``.
- ``signals_cancel(got)``: on a running loop, SIGINT and SIGTERM cancel the current task; their numbers are kept in
  ``got``.
- ``run_interruptible(main)``: ``asyncio.run`` with both; raises ``Interrupted`` once ``main`` has wound up.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the command, after what it held was wound up."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(self.name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """``128 + signum``: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within: SIGTERM raises ``Interrupted(SIGTERM)`` in the main thread (SIGINT raises ``KeyboardInterrupt``, as
    always). An event loop's own handlers (``signals_cancel``) take over while one runs."""
    if not _main_thread():
        yield
        return

    def on_term(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@contextlib.contextmanager
def signals_cancel(got: list[int]) -> Iterator[None]:
    """Within, on a running event loop in the main thread: SIGINT and SIGTERM cancel the current task, each
    signal's number appended to ``got``. Afterwards the handlers in place before are back."""
    task = asyncio.current_task()
    if task is None or not _main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}

    def on_signal(signum: int) -> None:
        got.append(signum)
        task.cancel()

    for sig in SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
            if callable(before[sig]) or before[sig] in (signal.SIG_IGN, signal.SIG_DFL):
                signal.signal(sig, before[sig])


def run_interruptible(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, SIGINT and SIGTERM cancelling it (``signals_cancel``).

    Raises:
        Interrupted: a signal cancelled ``main``, which has wound up.
    """

    got: list[int] = []

    async def body() -> tuple[T] | None:
        with signals_cancel(got):
            try:
                return (await main,)
            except asyncio.CancelledError:
                if got:
                    return None  # raised below, once the loop is closed (a KeyboardInterrupt never leaves a task)
                raise

    done = asyncio.run(body())
    if done is None:
        raise Interrupted(got[0])
    return done[0]
