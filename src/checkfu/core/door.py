"""The provider door: the one place the runner calls a provider.

Runs, the registry's ``describe`` and reconciliation all pass through it, so every
call gets the same treatment, in order:

1. the caller's fence runs first (a lease taken over stops the call here, as
   ``SandboxLeaseFenced``; that is the runner's own refusal, not a fault);
2. the member is called under the plan's deadline;
3. whatever the provider raised becomes a fault labelled by the one table below
   (``provider_fault``): a timeout is ``SandboxProviderTimeout``; any error, in
   the vocabulary or not, is ``SandboxProviderFailed`` naming the code it raised
   (a provider that raises ``SandboxPathRejected`` has failed, it has not caught
   the runner out);
4. the answer is judged by the plan (strict decoding and every cross-check); a
   failed check is the provider's fault too;
5. the call is recorded, with its duration and outcome, whatever happened.

A provider fault leaves the door as ``ProviderFault`` wrapping the vocabulary
error, so the caller can apply the plan's ``on_fault`` before raising the error
itself; ``ProviderFault`` never crosses the runner's boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from checkfu.contract.envelope import Member
from checkfu.contract.errors import (
    ERROR_CLASSES,
    SandboxError,
    SandboxProviderFailed,
    SandboxProviderTimeout,
    error_for_code,
)
from checkfu.contract.members import METHOD_NAMES
from checkfu.contract.provider import ProcessStream, Provider
from checkfu.core.clock import Clock, SystemClock
from checkfu.core.session import Accepted, Plan

V = TypeVar("V")

KILL_SECONDS = 30.0
"""How long an abandoned process's ``kill`` may take before the door stops waiting for it."""


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One provider call as the journal keeps it. ``run_id`` is ``None`` for a call of no Run
    (``describe``, reconciliation's enumeration)."""

    run_id: str | None
    member: str
    allocation_key: str | None
    started_at: float
    duration_ms: float
    outcome: str
    """``ok``, ``error`` or ``cancelled``."""
    error_code: str | None
    detail: str | None


class Recorder(Protocol):
    """Keeps the door's call records. One that also has ``async record_call_async(call)`` (the journal's: never
    stalls the event loop) is awaited through it instead."""

    def record_call(self, call: CallRecord) -> None: ...


class ProviderFault(Exception):
    """The provider was at fault; ``error`` says how. Callers unwrap it: it never leaves the runner."""

    def __init__(self, error: SandboxError) -> None:
        super().__init__(error.message)
        self.error = error


def provider_fault(member: str, exc: BaseException) -> SandboxError:
    """What the provider raised, as the vocabulary error the runner reports. The one translation table.

    Whatever a provider raises is its own fault, whatever the code; the code it raised is kept
    in ``reported_code``. A code outside the vocabulary is never turned into a class. An error the
    runner's own code found (``observed``, such as a wire client that could not decode an answer)
    keeps its code: it is a check, like the ones the door makes itself.
    """
    if isinstance(exc, SandboxError):
        code = exc.code if exc.code in ERROR_CLASSES else None
        if exc.observed and code is not None:
            return error_for_code(code, exc.message, field=exc.field, retryable=exc.retryable)  # our own check
        if code == "SandboxProviderFailed":
            return SandboxProviderFailed(exc.message, field=exc.field, retryable=exc.retryable)
        said = f"an error with unknown code {str(exc.code)[:64]!r}" if code is None else code
        return SandboxProviderFailed(
            f"{member}: the provider raised {said}: {exc.message}"[:2000],
            field=exc.field,
            retryable=exc.retryable,
            reported_code=code,
        )
    if isinstance(exc, asyncio.CancelledError):
        return SandboxProviderFailed(f"{member}: the provider raised CancelledError")
    return SandboxProviderFailed(f"{member}: the provider raised {type(exc).__name__}: {exc}"[:500])


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class ProviderDoor:
    """Calls one provider, for anyone who needs it."""

    def __init__(self, provider: Provider, *, source: str, clock: Clock | None = None) -> None:
        self.provider = provider
        self.source = source
        self.clock = clock or SystemClock()

    async def call(
        self,
        plan: Plan[V],
        *,
        run_id: str | None = None,
        recorder: Recorder | None = None,
        fence: Callable[[], Awaitable[None] | None] | None = None,
    ) -> Accepted[V]:
        """Make the call ``plan`` describes, judge the answer, record the call.

        Raises:
            ProviderFault: the provider was at fault (it raised, timed out or answered out of contract).
            SandboxError: ``fence`` refused the call (no provider work was asked for).
            asyncio.CancelledError: the caller was cancelled; the call may already have done its work.
        """
        started = self.clock.now()
        t0 = time.perf_counter()
        error: SandboxError | None = None
        cancelled = False
        try:
            if fence is not None and (fenced := fence()) is not None:
                await fenced
            raw = await self._invoke(plan)
            try:
                return plan.accept(raw)
            except SandboxError as exc:
                if plan.member == "openProcess":
                    await _kill_quietly(raw)
                raise ProviderFault(exc) from None
            except Exception as exc:  # reading what the provider handed over failed in itself
                if plan.member == "openProcess":
                    await _kill_quietly(raw)
                raise ProviderFault(provider_fault(plan.member, exc)) from None
        except ProviderFault as fault:
            error = fault.error
            raise
        except SandboxError as exc:
            error = exc
            raise
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            if recorder is not None:
                record = _record(run_id, plan.member, plan.allocation_key, started, t0, error, cancelled)
                keep = getattr(recorder, "record_call_async", None)
                if keep is not None:
                    await keep(record)
                else:
                    recorder.record_call(record)

    async def _invoke(self, plan: Plan[Any]) -> object:
        """The provider's raw answer, under the plan's deadline; anything it raises is a fault."""
        try:
            method: Callable[..., Awaitable[object]] = getattr(self.provider, METHOD_NAMES[plan.member])
            if plan.member == "describe":
                pending = method()
            elif plan.member == "writeFile":
                pending = method(plan.request, plan.data or b"")
            else:
                pending = method(plan.request)
            # ``asyncio.timeout``, not ``wait_for``: on Python 3.11, ``wait_for`` returns the answer of a call that
            # finished just as the caller was cancelled and drops the cancellation, so a signal during staging (one
            # short ``writeFile`` after another) was lost and the Run carried on (issue 29).
            async with asyncio.timeout(plan.deadline):
                return await pending
        except TimeoutError:
            raise ProviderFault(
                SandboxProviderTimeout(f"{plan.member}: no answer within {plan.deadline:g} s", field=plan.member)
            ) from None
        except asyncio.CancelledError:
            if _being_cancelled():
                raise  # the runner is being cancelled
            raise ProviderFault(provider_fault(plan.member, asyncio.CancelledError())) from None
        except Exception as exc:
            raise ProviderFault(provider_fault(plan.member, exc)) from None

    def refused(
        self,
        member: Member,
        error: SandboxError,
        *,
        run_id: str | None,
        recorder: Recorder | None,
        key: str | None = None,
    ) -> None:
        """Record a call the runner refused before asking the provider anything, or a fault found after the
        call answered (an open process's stream breaking a rule)."""
        if recorder is not None:
            now = self.clock.now()
            recorder.record_call(CallRecord(run_id, member, key, now, 0.0, "error", error.code, error.message[:1000]))


def _record(
    run_id: str | None,
    member: str,
    key: str | None,
    started: float,
    t0: float,
    error: SandboxError | None,
    cancelled: bool,
) -> CallRecord:
    return CallRecord(
        run_id=run_id,
        member=member,
        allocation_key=key,
        started_at=started,
        duration_ms=(time.perf_counter() - t0) * 1000,
        outcome="cancelled" if cancelled else "ok" if error is None else "error",
        error_code=error.code if error else None,
        detail=error.message[:1000] if error else None,
    )


async def _kill_quietly(stream: object) -> None:
    """End a process the runner is abandoning; release reaps it anyway, so a kill that never answers
    (or fails) must not hold the Run."""
    kill = getattr(stream, "kill", None)
    if kill is None:
        return
    with contextlib.suppress(Exception):
        await asyncio.wait_for(kill(), timeout=KILL_SECONDS)


async def kill_process(stream: ProcessStream) -> None:
    """End an open process whose events the runner no longer reads."""
    await _kill_quietly(stream)
