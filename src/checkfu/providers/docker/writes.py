"""``writeFile`` on the Docker engine: each file verified, then spooled or uploaded, for ``activate`` to finish.

A file for a sealed (read-only) mount goes into the instance's spool (``staging.py``),
whose full segments an uploader extracts into the mount volumes through the stager
while writes go on; a large one (``DIRECT_BYTES``) goes up on its own, hashed beside
its upload. A file for a writable mount is spooled for its own area and extracted into
the started sandbox (``fill_writable``). ``activate`` drains what is left (``drain``).
A write whose instance's release began is refused, never staged (``record.py``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from checkfu.contract.envelope import Member
from checkfu.contract.errors import SandboxDigestMismatch, SandboxError, SandboxPathRejected, SandboxProviderFailed
from checkfu.contract.lifecycle import transition
from checkfu.contract.members import WriteFileRequest
from checkfu.contract.mounts import link_problem
from checkfu.providers.docker import spec
from checkfu.providers.docker.engine import Engine, translate
from checkfu.providers.docker.record import Instance, Records
from checkfu.providers.docker.staging import (
    DIRECT_BYTES,
    INLINE_BYTES,
    SEGMENT_BYTES,
    SLICE_BYTES,
    FileArchive,
    Spool,
    SpooledArchive,
    Spools,
    writable_spool_name,
)


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _check_digest(request: WriteFileRequest, actual: str) -> None:
    """Raises ``SandboxDigestMismatch`` when ``actual`` is not the digest ``request`` states."""
    if actual != request.digest:
        raise SandboxDigestMismatch(
            f"digest: the bytes are {actual}, the request states {request.digest}", field="digest"
        )


class StagedWrites:
    """The staged files of every instance of one provider: its spools, and the uploads into its stagers.

    Every engine call here blocks: call through the engine's pool (``stage_inline`` excepted, which makes none).
    """

    def __init__(
        self,
        *,
        engine: Engine,
        user: spec.SandboxUser,
        spools: Spools,
        rw_spools: Spools,
        fanout: ThreadPoolExecutor,
        records: Records,
        in_background: Callable[..., None],
    ) -> None:
        self.engine = engine
        self.user = user
        self.spools = spools
        self.rw_spools = rw_spools
        self._fanout = fanout
        self._records = records
        self._in_background = in_background

    def _upload_segment(self, stager: str, segment: Path) -> None:
        """Extract one sealed spool segment into ``stager``'s mount volumes (with a stated length, not chunked)."""
        self.engine.api.put_archive(stager, "/", SpooledArchive(segment))

    def drain(self, spool: Spool, stager: str, member: Member) -> None:
        """Upload ``spool``'s sealed segments now, in order, on this thread.

        Raises:
            SandboxProviderFailed: an upload (this one or an earlier one in the background) failed.
        """
        try:
            spool.drain(functools.partial(self._upload_segment, stager))
        except Exception as exc:
            raise self._staging_failed(member, exc) from exc

    @staticmethod
    def _staging_failed(member: Member, exc: BaseException) -> SandboxError:
        reason = translate(exc, "put_archive").message
        return SandboxProviderFailed(
            f"{member}: uploading staged files into the instance's mount volumes failed ({reason}); "
            "the instance cannot be activated: release it and provision again"
        )

    def _drain_in_background(self, instance: Instance, spool: Spool, stager: str) -> None:
        """Upload the spool's sealed segments in the pool while writes go on; a failure is kept on the spool, for
        the next ``writeFile`` or ``activate`` to report (``release`` and ``compensate`` wait for it first).

        Once the queue is empty the uploader takes what the open segment gathered meanwhile (when it holds at
        least ``SEGMENT_BYTES`` and no writer holds the spool): a slow writer's files go up as they come, a
        fast writer's in few requests (each request costs the engine a mount of the stager and a fresh
        extraction process, measured at about 60 ms).
        """

        def drain() -> None:
            upload = functools.partial(self._upload_segment, stager)
            while True:
                try:
                    spool.drain(upload)
                except Exception:
                    return
                if not spool.lock.acquire(blocking=False):
                    return  # a writer holds it: its next full segment is sealed and scheduled by that writer
                try:
                    if spool.size() < SEGMENT_BYTES or not spool.seal():
                        return
                finally:
                    spool.lock.release()

        self._in_background(instance.name, drain)

    def _check_spool(self, spool: Spool) -> None:
        failure = spool.failure
        if failure is not None:
            raise self._staging_failed("writeFile", failure)

    @staticmethod
    def _verify(
        instance: Instance, request: WriteFileRequest, data: bytes, target: str, *, hash_now: bool = True
    ) -> str:
        """The stager of ``instance``, once ``data`` has the stated length and SHA-256 (and, for a symlink, a
        UTF-8 target that stays inside the mount). With ``hash_now`` false the digest is left to the caller
        (an upload that hashes beside itself and checks before its last slice).

        Raises:
            SandboxDigestMismatch: the length or the digest differs.
            SandboxPathRejected: a symlink's target leads outside its mount, or is not UTF-8.
            SandboxProviderFailed: the instance has no stager.
        """
        if len(data) != request.size:
            raise SandboxDigestMismatch(
                f"size: {len(data)} bytes arrived, the request states {request.size}", field="size"
            )
        if hash_now:
            _check_digest(request, _sha256(data))
        if request.symlink:
            try:
                why = link_problem(request.path[len(target) + 1 :], data.decode("utf-8"))
            except UnicodeDecodeError:
                why = "has a target that is not UTF-8"
            if why is not None:
                raise SandboxPathRejected(f"path: the symlink {request.path!r} {why}", field="path")
        if target in instance.writable:
            return ""  # a writable mount is spooled for its own area, filled after start: no stager
        if instance.stager is None:
            raise SandboxProviderFailed(f"instance {instance.name!r} has mounts but no stager")
        return instance.stager

    def spool_for(self, instance: Instance, target: str) -> Spool:
        if target in instance.writable:
            index = instance.mounts.index(target)
            return self.rw_spools.get(writable_spool_name(instance.name, index), instance.runner_tag)
        return self.spools.get(instance.name, instance.runner_tag)

    def stage(self, instance: Instance, request: WriteFileRequest, target: str, data: bytes) -> None:
        spool = self.spool_for(instance, target)
        rw = target in instance.writable
        large = not rw and not request.symlink and len(data) >= DIRECT_BYTES  # hashed beside its upload
        stager = self._verify(instance, request, data, target, hash_now=not large)
        self._check_spool(spool)
        with spool.lock:
            self._refuse_if_releasing(instance)
            if large or (not rw and request.path in spool.partial):  # a marked path goes up on its own
                self._put_direct(spool, stager, request, target, data, hashed=not large)
            else:
                self._append(instance, spool, stager, request, target, data)

    def _put_direct(
        self, spool: Spool, stager: str, request: WriteFileRequest, target: str, data: bytes, *, hashed: bool
    ) -> None:
        """Upload one file on its own, after what was written before it (call with the spool's lock held).

        Unless ``hashed``, its SHA-256 is computed in the pool while the upload streams ``data`` (never copied),
        and checked before the last slice goes: a mismatch stops the upload short. The path is marked on disk
        for the upload's length, so a file left partly written (a mismatch, a failed upload, a crash) keeps
        ``activate`` from starting the sandbox until a later write of the path succeeds.

        Raises:
            SandboxDigestMismatch: the bytes do not have the stated SHA-256.
        """
        spool.seal()
        self.drain(spool, stager, "writeFile")  # what was written before goes first
        digest = None if hashed else self._fanout.submit(_sha256, data)

        def before_tail() -> None:
            if digest is not None:
                _check_digest(request, digest.result())

        body = FileArchive(
            request.path,
            target,
            data,
            mode=request.mode,
            uid=self.user.uid,
            gid=self.user.gid,
            symlink=request.symlink,
            before_tail=before_tail,
            slice_bytes=SLICE_BYTES,
        )
        spool.mark(request.path)
        try:
            self.engine.api.put_archive(stager, "/", body)
        except BaseException:
            if body.failure is not None:
                raise body.failure from None
            raise
        spool.unmark(request.path)

    def _append(
        self, instance: Instance, spool: Spool, stager: str, request: WriteFileRequest, target: str, data: bytes
    ) -> None:
        """Append to the spool (call with its lock held); a full segment of a sealed mount's spool goes to the
        uploader."""
        rw = target in instance.writable
        spool.append(
            request.path,
            target,
            data,
            mode=request.mode,
            uid=self.user.uid,
            gid=self.user.gid,
            symlink=request.symlink,
            from_root=not rw,
        )
        if not rw and spool.size() >= SEGMENT_BYTES and not spool.uploading() and spool.seal():
            self._drain_in_background(instance, spool, stager)

    def _refuse_if_releasing(self, instance: Instance) -> None:
        """Raises ``SandboxStateConflict`` once ``instance``'s release began: a write whose call was cancelled but
        whose thread went on must not make spool files (or uploads) again after the release removed them. Call
        with the spool's lock held (the release discards the spool under it)."""
        record = self._records.get(instance.name)
        if record is None or record.refuses_writes(instance.container_id):
            transition("released", "writeFile")

    def stage_inline(self, instance: Instance, request: WriteFileRequest, target: str, data: bytes) -> bool:
        """Stage a small file on the calling thread when that takes no engine call and no wait: verified, then
        appended to the spool while its lock is free (a full segment is sealed and handed to the uploader, in the
        pool). Whether it did; when not, ``_stage_blocking`` (in the pool) does it all, the checks included.

        Raises:
            SandboxDigestMismatch: the length or the digest differs.
            SandboxProviderFailed: an earlier upload of the spool failed.
        """
        spool = self.spool_for(instance, target)
        if len(data) >= INLINE_BYTES or request.path in spool.partial:
            return False
        stager = self._verify(instance, request, data, target)
        self._check_spool(spool)
        if not spool.lock.acquire(blocking=False):
            return False
        try:
            self._refuse_if_releasing(instance)
            self._append(instance, spool, stager, request, target, data)
            return True
        finally:
            spool.lock.release()

    def fill_writable(self, instance: Instance, target: str) -> None:
        """Extract a writable mount's spool into its area of the started sandbox (the engine writes into the
        running container's own volume at ``target``; the root file system stays read-only)."""
        spool = self.spool_for(instance, target)
        with spool.lock:
            if spool.size() == 0:
                return
            spool.close()
            self.engine.api.put_archive(instance.container_id, target, SpooledArchive(spool.path))
            spool.discard()
