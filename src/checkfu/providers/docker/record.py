"""What ``DockerProvider`` keeps about each instance: one record, one mapping, one state table.

Every transition of a record lives in ``TRANSITIONS`` and nowhere else (h11's
``_state.py``, "Rule 1"). A record is a frozen value; ``Records``, the provider's
one mapping from instance id to record, is the only code that replaces one, under
its own lock (docker-py calls run in worker threads). A move the table does not
list is a bug in the provider: ``Records`` raises ``RecordStateError`` and
changes nothing.

The record is this object's memory, not the truth: the engine's answer to each call
still decides. It saves engine calls (the container id ``exec`` uses, the view
``writeFile``, ``activate`` and ``release`` use) and remembers what the engine cannot
say (that this object released the instance, that its release began, the handle on
its areas, the background work ``release`` and ``compensate`` wait for, why its egress
proxy did not start). A freshly built provider has no records and finds everything
again by name and label.

The states::

    absent -create-> staging -activate-> activating -activated-> active
    absent -find---> known   -stage----> staging        \\-fail--> known
    (any) -release-> releasing -forget-> released;  absent -forget-> released

- ``known``: found on the engine by an inspect; only its container id is kept.
- ``staging``: created by this object (or found ``provisioning`` by a ``writeFile``):
  its view is kept for ``writeFile``, ``activate`` and ``release``.
- ``activating``: an ``activate`` took the view and is under way.
- ``active``: activated by this object: its view is kept for ``release``.
- ``releasing``: its release began: a late write is refused, not staged.
- ``released``: released or compensated by this object: a call that finds it gone
  is told ``released``.

A record is one container: a container of the same name with another id (the
instance provisioned again, or replaced behind this object's back) is a new
record, born from ``absent``, which takes over the name's background work and
handle (they belong to the name: ``release`` and ``compensate`` of it wait for and
remove them). ``find`` of the record's own container changes nothing in any state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

from checkfu.contract.lifecycle import State
from checkfu.providers.docker import labels as L

RecordState = Literal["absent", "known", "staging", "activating", "active", "releasing", "released"]
"""``absent`` is never held: it is the state before a record is born."""
Event = Literal["create", "find", "stage", "activate", "activated", "fail", "release", "forget"]

TRANSITIONS: dict[RecordState, dict[Event, RecordState]] = {
    "absent": {"create": "staging", "find": "known", "forget": "released"},
    "known": {
        "find": "known",
        "stage": "staging",
        "activate": "activating",
        "release": "releasing",
        "forget": "released",
    },
    "staging": {
        "find": "staging",
        "stage": "staging",
        "activate": "activating",
        "release": "releasing",
        "forget": "released",
    },
    "activating": {
        "find": "activating",
        "stage": "activating",  # a write that found it still provisioning: the activation goes on
        "activate": "activating",  # a second activation that found it still provisioning
        "activated": "active",
        "fail": "known",
        "release": "releasing",
        "forget": "released",
    },
    "active": {
        "find": "active",
        "activated": "active",  # the second of two racing activations
        "fail": "known",  # the second of two racing activations failed: its state is the engine's to say
        "release": "releasing",
        "forget": "released",
    },
    # Once its release began, what a call still under way learns changes nothing.
    "releasing": {
        "find": "releasing",
        "stage": "releasing",
        "activate": "releasing",
        "activated": "releasing",
        "fail": "releasing",
        "release": "releasing",
        "forget": "released",
    },
    "released": {
        "find": "released",
        "stage": "released",
        "activate": "released",
        "activated": "released",
        "fail": "released",
        "release": "releasing",  # found again (its removal was under way): removed again
        "forget": "released",
    },
}

KEEPS_VIEW: frozenset[RecordState] = frozenset({"staging", "active", "releasing"})
"""States whose record may hold a view (``releasing`` keeps the one it had, for a retried release)."""


class RecordStateError(RuntimeError):
    """An event the table does not allow in the record's state: a bug in the provider, never a caller's fault.

    At the seam it becomes ``SandboxProviderFailed`` (as every foreign error does).
    """

    def __init__(self, name: str, state: RecordState, event: Event, why: str = "") -> None:
        super().__init__(
            f"docker provider: {event!r} is not allowed while the record of {name!r} is {state!r}"
            f"{f' ({why})' if why else ''}: an internal error of the provider"
        )
        self.name, self.state, self.event = name, state, event


def record_transition(name: str, state: RecordState, event: Event) -> RecordState:
    """The record's state after ``event``.

    Raises:
        RecordStateError: ``event`` is not allowed in ``state``.
    """
    after = TRANSITIONS[state].get(event)
    if after is None:
        raise RecordStateError(name, state, event)
    return after


@dataclass(frozen=True)
class Instance:
    """A sandbox container as the engine reports it."""

    container_id: str
    name: str
    state: State
    running: bool
    labels: Mapping[str, str]
    volumes: tuple[str, ...]
    """The volumes to remove by name after the container: its mount volumes (and, read back from the engine,
    also its anonymous areas, which the container's removal takes with it, so their removal finds nothing)."""

    # ``mounts``, ``areas`` and ``writable`` are read from the labels once (each ``writeFile`` asks for them)

    @property
    def runner_tag(self) -> str:
        return self.labels.get(L.RUNNER_TAG, "")

    @functools.cached_property
    def mounts(self) -> tuple[str, ...]:
        return L.json_list(self.labels, L.MOUNTS)

    @functools.cached_property
    def areas(self) -> tuple[str, ...]:
        return L.json_list(self.labels, L.AREAS)

    @functools.cached_property
    def writable(self) -> tuple[str, ...]:
        """The writable mounts' targets: mount targets that are writable areas of their own."""
        areas = set(self.areas)
        return tuple(t for t in self.mounts if t in areas)

    @property
    def held(self) -> bool:
        """Provisioned held: started and paused at ``provision``, thawed by ``activate``."""
        return self.labels.get(L.HOLD) == "1"

    @property
    def stager(self) -> str | None:
        return self.labels.get(L.STAGER) or None

    @property
    def restore(self) -> str | None:
        return self.labels.get(L.RESTORE) or None

    @property
    def retention(self) -> str:
        return self.labels.get(L.RETENTION, "")

    @property
    def proxy(self) -> str | None:
        """The egress proxy's name, for an ``allowlist`` instance."""
        return self.labels.get(L.PROXY) or None

    @property
    def allowlist(self) -> tuple[str, ...]:
        return L.json_list(self.labels, L.ALLOWLIST)


@dataclass(frozen=True)
class Handle:
    """An instance's handle on its area volumes (``snapshots``): its name, the image the instance runs, the
    area volumes it mounts, and its create configuration."""

    name: str
    container: str
    """The id of the instance's container (a later container of the same name is another instance)."""
    image: str
    volumes: tuple[str, ...]
    config: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerRecord:
    """Everything this provider object keeps about one instance's container.

    Its ``state`` moves only through ``TRANSITIONS``, by ``Records``.
    """

    name: str
    """The instance id: the container's name (``labels.instance_name``)."""
    container_id: str | None
    """The container's id, as the engine reported it; ``None`` only for a record born ``released`` (a release or
    compensation of an instance this object never saw)."""
    state: RecordState
    view: Instance | None = None
    """The container as this object made, staged or activated it (``None`` but in ``KEEPS_VIEW``)."""
    handle: Handle | None = None
    """The handle on its areas, once made (``snapshots``); the name's, taken over by a later record of it."""
    proxy_failure: str | None = None
    """Why its egress proxy did not start (the engine's reason), for ``activate`` to report."""
    background: tuple[Future[Any], ...] = ()
    """Work under way for it that ``release`` and ``compensate`` wait for; the name's, like ``handle``."""

    @property
    def running_id(self) -> str | None:
        """The container id calls may use without asking the engine first (the engine's answer still decides)."""
        return self.container_id if self.state != "released" else None

    @property
    def staged(self) -> Instance | None:
        """The provisioning view ``writeFile`` and ``activate`` may use without asking the engine."""
        return self.view if self.view is not None and self.view.state == "provisioning" else None

    def refuses_writes(self, container_id: str) -> bool:
        """A write to ``container_id`` must be refused: its release began, or the name is another container's."""
        return self.container_id != container_id or self.state in ("releasing", "released")


_UNCHANGED: Any = object()


class Records:
    """The provider's one mapping from instance id to its ``ContainerRecord``; every change goes through here.

    Thread-safe: each method holds the mapping's lock for as long as it reads and replaces one record.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, ContainerRecord] = {}

    def get(self, name: str) -> ContainerRecord | None:
        with self._lock:
            return self._by_name.get(name)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_name)

    # lifecycle ---------------------------------------------------------------------------------

    def _born(self, name: str, container_id: str | None, event: Event, view: Instance | None) -> ContainerRecord:
        """A new record of ``name`` (call with the lock held), taking over the name's handle and background work."""
        old = self._by_name.get(name)
        record = ContainerRecord(
            name=name,
            container_id=container_id,
            state=record_transition(name, "absent", event),
            view=view,
            handle=old.handle if old is not None else None,
            background=old.background if old is not None else (),
        )
        self._by_name[name] = record
        return record

    def create(self, view: Instance) -> ContainerRecord:
        """This object created ``view``'s container: a record ``staging`` with its view."""
        with self._lock:
            return self._born(view.name, view.container_id, "create", view)

    def find(self, name: str, container_id: str) -> ContainerRecord:
        """The engine reported ``name`` as ``container_id``: its record, a new ``known`` one for another container."""
        with self._lock:
            record = self._by_name.get(name)
            if record is not None and record.container_id == container_id:
                record_transition(name, record.state, "find")
                return record
            return self._born(name, container_id, "find", None)

    def move(self, name: str, container_id: str, event: Event, view: Instance | None = None) -> None:
        """Apply ``event`` to ``name``'s record, when that record is ``container_id``'s (else the event is about a
        container this object no longer tracks, and changes nothing); ``view`` is kept when the state keeps one.

        Raises:
            RecordStateError: the table does not allow ``event`` in the record's state.
        """
        with self._lock:
            record = self._by_name.get(name)
            if record is None or record.container_id != container_id:
                return
            after = record_transition(name, record.state, event)
            if after not in KEEPS_VIEW:
                kept = None
            elif view is not None and after != "releasing":
                kept = view
            else:
                kept = record.view
            self._by_name[name] = dataclasses.replace(record, state=after, view=kept)

    def forget(self, name: str) -> None:
        """This object released or compensated ``name``: its record is ``released``, without view or handle."""
        with self._lock:
            record = self._by_name.get(name)
            if record is None:
                self._born(name, None, "forget", None)
                return
            after = record_transition(name, record.state, "forget")
            self._by_name[name] = dataclasses.replace(record, state=after, view=None, handle=None)

    # what belongs to the name ------------------------------------------------------------------

    def _update(self, name: str, **changes: Any) -> ContainerRecord | None:
        record = self._by_name.get(name)
        if record is None:
            return None
        self._by_name[name] = dataclasses.replace(record, **changes)
        return record

    def add_background(self, name: str, future: Future[Any]) -> None:
        """Keep ``future`` for ``settle``.

        Raises:
            RecordStateError: ``name`` has no record (work is started only for an instance found or made here).
        """
        with self._lock:
            record = self._by_name.get(name)
            if record is None:
                raise RecordStateError(name, "absent", "find", "work started for an instance never found nor made here")
            self._by_name[name] = dataclasses.replace(record, background=(*record.background, future))

    def settle(self, name: str) -> None:
        """Wait for the work kept for ``name``, and for what that work started in turn; outcomes do not matter."""
        while True:
            with self._lock:
                old = self._update(name, background=())
            futures = old.background if old is not None else ()
            if not futures:
                return
            for future in futures:
                with contextlib.suppress(BaseException):
                    future.result()

    def keep_handle(self, name: str, handle: Handle) -> None:
        with self._lock:
            self._update(name, handle=handle)

    def drop_handle(self, name: str) -> Handle | None:
        """Forget ``name``'s handle; the one it had."""
        with self._lock:
            old = self._update(name, handle=None)
        return old.handle if old is not None else None

    def proxy_failed(self, name: str, reason: str) -> None:
        with self._lock:
            self._update(name, proxy_failure=reason)

    def take_proxy_failure(self, name: str) -> str | None:
        with self._lock:
            old = self._update(name, proxy_failure=None)
        return old.proxy_failure if old is not None else None
