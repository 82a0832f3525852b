"""Lease fencing: each Run attempt holds ``(lease_id, lease_epoch)`` in the journal's database.

A takeover bumps the epoch with a compare-and-set, so exactly one holder is current.
Every provider call first renews the caller's lease; a holder whose lease was taken
over (or ended) is refused with ``SandboxLeaseFenced`` before the provider is asked.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

import sqlalchemy as sa

from checkfu.contract.errors import SandboxLeaseFenced, SandboxNotFound
from checkfu.contract.target import Lease
from checkfu.core.clock import Clock
from checkfu.core.journal import LEASE_CURRENT, Journal, fenced, journaled, lease_params, leases

DEFAULT_TTL = 600.0


def _proc_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # Field 22 (starttime) counts from after the parenthesised command name.
    return stat.rsplit(")", 1)[1].split()[19]


def current_owner() -> str:
    """This process as a lease owner: host, pid and the pid's start time (pids are recycled)."""
    pid = os.getpid()
    return f"{socket.gethostname()}/{pid}/{_proc_start(pid)}"


def owner_alive(owner: str) -> bool | None:
    """Whether ``owner`` still runs: ``None`` when it lives on another host and cannot be seen."""
    try:
        host, pid, start = owner.rsplit("/", 2)
        pid_n = int(pid)
    except ValueError:
        return None
    if host != socket.gethostname():
        return None
    return _proc_start(pid_n) == start


def boot_id() -> str | None:
    """The kernel's boot id (a new one at every boot), or ``None`` where there is none to read."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def owner_gone(owner: str, boot: str | None) -> bool:
    """Whether the process ``owner`` (``host/pid/start``) is surely gone: on this host, and either the machine
    booted since (another boot id), or no process of that pid started at that time runs now (a reused pid is
    another process). An owner on another host cannot be seen from here: never taken for gone."""
    try:
        host, _pid, _start = owner.rsplit("/", 2)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False
    here = boot_id()
    if boot is not None and here is not None and boot != here:
        return True
    return owner_alive(owner) is False


_RENEW = fenced(expires_at=sa.bindparam("until"))
"""Built once: renewal runs before every provider call."""
_HAND_OVER = fenced(owner=sa.bindparam("new_owner"), expires_at=sa.bindparam("until"))
_END = fenced(ended=True)
_CURRENT = sa.select(leases.c.expires_at).where(*LEASE_CURRENT)
"""A current lease's deadline (no row: taken over or ended)."""


@dataclass(frozen=True)
class LeaseRecord:
    lease_id: str
    run_id: str
    owner: str
    epoch: int
    expires_at: float
    ended: bool


class LeaseStore:
    """Leases in the journal's database.

    With ``heartbeat``, something else (a runner of the fleet, ``checkfu.core.fleet``) renews every
    lease of this owner every fraction of ``ttl``, so a renewal asked for a longer time (a call's whole
    deadline, a command's timeout) is held to ``ttl``: a runner that dies in the middle of a long call is
    taken over one ``ttl`` later, not at the call's deadline.
    """

    def __init__(self, journal: Journal, clock: Clock, *, ttl: float = DEFAULT_TTL, heartbeat: bool = False) -> None:
        self.journal = journal
        self.clock = clock
        self.ttl = ttl
        self.heartbeat = heartbeat

    def _span(self, ttl: float | None) -> float:
        return self.ttl if self.heartbeat or ttl is None else ttl

    def span(self, ttl: float | None) -> float:
        """How long a renewal asked for ``ttl`` holds the lease (``ttl``; with ``heartbeat``, the lease's own TTL)."""
        return self._span(ttl)

    def fenced(self, lease: Lease) -> SandboxLeaseFenced:
        """The error of a renewal of ``lease`` that found it no longer current: taken over, or ended."""
        return self._fenced(lease)

    def acquire(self, run_id: str, *, owner: str | None = None, ttl: float | None = None) -> Lease:
        """A new lease on ``run_id``, at epoch 1, held by ``owner`` (this process by default) for ``ttl``."""
        lease = Lease(lease_id=f"lease-{uuid.uuid4().hex}", lease_epoch=1)
        row = {
            "lease_id": lease.lease_id,
            "run_id": run_id,
            "owner": owner or current_owner(),
            "epoch": 1,
            "expires_at": self.clock.now() + (ttl or self.ttl),
            "ended": False,
        }
        self._insert(row)  # its values are chosen once: a retry finds the row its first attempt committed
        return lease

    @journaled("lease acquire")
    def _insert(self, row: dict[str, object]) -> None:
        with self.journal.tx() as c:
            self.journal.insert_once(c, leases, row, key="lease_id")

    @journaled("lease renew")
    def renew(self, lease: Lease, *, ttl: float | None = None) -> None:
        """Extend ``lease`` if it is still current.

        Raises:
            SandboxLeaseFenced: the lease was taken over (another epoch) or ended.
        """
        with self.journal.tx() as c:
            done = c.execute(_RENEW, lease_params(lease, until=self.clock.now() + self._span(ttl))).rowcount
        if done != 1:
            raise self._fenced(lease)

    @journaled("lease takeover")
    def takeover(
        self, lease_id: str, *, owner: str | None = None, ttl: float | None = None, only_if_reclaimable: bool = False
    ) -> Lease:
        """Become the holder of ``lease_id`` by bumping its epoch; the old holder is fenced.

        With ``only_if_reclaimable`` (reconciliation), the compare-and-set also requires the
        lease to be ended, expired or its owner gone *at the moment of the update*, so an
        owner that renewed after the caller looked is never taken over.

        Raises:
            SandboxNotFound: no such lease.
            SandboxLeaseFenced: another takeover won the race, or the lease is no longer reclaimable.
        """
        rec = self.record(lease_id)
        now = self.clock.now()
        condition = [leases.c.lease_id == lease_id, leases.c.epoch == rec.epoch]
        if only_if_reclaimable and owner_alive(rec.owner) is not False:
            condition.append(sa.or_(leases.c.ended.is_(True), leases.c.expires_at < now))
        with self.journal.tx() as c:
            done = c.execute(
                leases.update()
                .where(*condition)
                .values(
                    epoch=rec.epoch + 1,
                    owner=owner or current_owner(),
                    ended=False,
                    expires_at=now + (ttl or self.ttl),
                )
            ).rowcount
        if done != 1:
            raise SandboxLeaseFenced(
                f"lease {lease_id}: taken over or renewed by its owner meanwhile", field="lease.lease_epoch"
            )
        return Lease(lease_id=lease_id, lease_epoch=rec.epoch + 1)

    @journaled("lease hand over")
    def hand_over(self, lease: Lease, *, owner: str, until: float, what: str) -> None:
        """Give ``lease``, while it is still current, to ``owner`` until ``until`` (seconds since the epoch): a
        pool Run's sandbox waiting for an adopter, a live sandbox for whoever holds it next.

        Raises:
            SandboxLeaseFenced: the lease was taken over or ended while ``what`` was being made.
        """
        with self.journal.tx() as c:
            done = c.execute(_HAND_OVER, lease_params(lease, new_owner=owner, until=until)).rowcount
        if done != 1:
            raise SandboxLeaseFenced(f"{what} was taken over while it was made", field="lease")

    @journaled("lease extend")
    def extend(self, lease: Lease, *, until: float) -> bool:
        """Move ``lease``'s deadline to ``until`` (seconds since the epoch), whoever holds it, while it is current;
        returns whether it was (``False``: taken over or ended, nothing written)."""
        with self.journal.tx() as c:
            return bool(c.execute(_RENEW, lease_params(lease, until=until)).rowcount == 1)

    @journaled("lease deadline")
    def deadline(self, lease: Lease) -> float | None:
        """``lease``'s deadline while it is current (at its epoch, not ended); ``None`` once it is not."""
        with self.journal.tx() as c:
            found = c.execute(_CURRENT, lease_params(lease)).scalar_one_or_none()
        return None if found is None else float(found)

    @journaled("lease end")
    def end(self, lease: Lease) -> None:
        """Give the lease up; later calls under it are fenced. Ending a fenced lease does nothing."""
        with self.journal.tx() as c:
            c.execute(_END, lease_params(lease))

    @journaled("lease record")
    def record(self, lease_id: str) -> LeaseRecord:
        with self.journal.tx() as c:
            row = c.execute(sa.select(leases).where(leases.c.lease_id == lease_id)).mappings().first()
        if row is None:
            raise SandboxNotFound(f"lease {lease_id} is not in the journal", field="lease.lease_id")
        return LeaseRecord(**{k: row[k] for k in LeaseRecord.__dataclass_fields__})

    def reclaimable(self, lease_id: str) -> bool:
        """Whether an open allocation under ``lease_id`` may be reclaimed by someone else:
        the lease ended, expired, or its owner process is gone."""
        try:
            rec = self.record(lease_id)
        except SandboxNotFound:
            return True
        if rec.ended or rec.expires_at < self.clock.now():
            return True
        return owner_alive(rec.owner) is False

    def _fenced(self, lease: Lease) -> SandboxLeaseFenced:
        try:
            rec = self.record(lease.lease_id)
        except SandboxNotFound:
            return SandboxLeaseFenced(f"lease {lease.lease_id} is unknown", field="lease.lease_id")
        if rec.epoch != lease.lease_epoch:
            return SandboxLeaseFenced(
                f"lease {lease.lease_id} was taken over: epoch {rec.epoch} is current, this runner holds "
                f"{lease.lease_epoch}",
                field="lease.lease_epoch",
            )
        return SandboxLeaseFenced(f"lease {lease.lease_id} has ended", field="lease.lease_id")
