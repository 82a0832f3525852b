"""Provider faults over the wire with nothing simulated: ``checkfu provider serve host-process`` runs
as a process of its own, is SIGKILLed and started again on the same port, and a loopback fault
proxy written here stands between it and the runner to cut, delay or repeat what it sends.

The sandbox process of every scene appends its pid to a marker file, so "never runs twice" is
read from the file system, not from anything either side says. After each scene the runner's
compensation (through the restarted service, which knows the instance only by its label) leaves
no process of the Run alive and every journal row settled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from wire_rig import host_profile

from checkfu.contract.ceiling import THIRD_PARTY
from checkfu.contract.codec import digest
from checkfu.contract.errors import (
    SandboxError,
    SandboxProtocolViolation,
    SandboxProviderFailed,
    SandboxProviderTimeout,
)
from checkfu.contract.process import ProcessExit, ProcessOutput
from checkfu.core.driver import Limits, RunSession
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Registry, adapter_from_factory
from checkfu.core.runner import Runner
from checkfu.wire.client import RemoteProvider

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(sys.platform != "linux", reason="the host-process tier is Linux")]

PROFILE = host_profile()
CHECKFU = str(Path(sys.executable).with_name("checkfu"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServedProcess:
    """``checkfu provider serve host-process`` as a child process on a fixed loopback port."""

    def __init__(self, tmp: Path) -> None:
        self.port = _free_port()
        self.secret = "wire-secret-" + secrets.token_urlsafe(18)
        self.credential = tmp / "credential"
        self.credential.write_text(self.secret)
        self.env = {**os.environ, "XDG_STATE_HOME": str(tmp / "xdg"), "CHECKFU_STATE": str(tmp / "state")}
        self.log = tmp / "serve.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [CHECKFU, "provider", "serve", "host-process", "--listen", f"127.0.0.1:{self.port}"]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*argv, "--credential-file", str(self.credential)],
                env=self.env,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.starts += 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the service exited {self.proc.returncode}: {self.log.read_text()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.05)
        raise AssertionError(f"the service never listened: {self.log.read_text()}")

    def kill(self) -> None:
        """SIGKILL, as a crash: the service's own sandbox processes are in sessions of their own and live on."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()


# A loopback fault proxy ------------------------------------------------------------------------


@dataclass
class Faults:
    """What the proxy does to what the service sends; each fault happens once, then the proxy relays."""

    cut_ws_after: int | None = None
    """Abort the first WebSocket connection once this many bytes of frames went down to the client."""
    delay_member: str | None = None
    delay: float = 0.0
    twice_member: str | None = None
    """Send the (whole) answer to this member twice, on the connection that asked."""
    done: set[str] = field(default_factory=set)


class FaultProxy:
    """Relays loopback TCP to the service, one upstream connection per client connection.

    HTTP requests are relayed one at a time, each answer read whole from an upstream that closes
    after it (``connection: close`` is asked for), so that an answer can be held back or repeated;
    a WebSocket upgrade turns the connection into a byte relay that can be cut in the middle.
    """

    def __init__(self, upstream_port: int, faults: Faults) -> None:
        self.upstream_port = upstream_port
        self.faults = faults
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> FaultProxy:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.transport.abort()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.writers.add(writer)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()
            self.tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        f = self.faults
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head[:-4].split(b"\r\n")
            member = lines[0].split(b" ")[1].decode().split("?")[0].rsplit("/", 1)[-1]
            names = {ln.partition(b":")[0].strip().lower(): ln.partition(b":")[2].strip() for ln in lines[1:]}
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            self.writers.add(up_writer)
            if names.get(b"upgrade", b"").lower() == b"websocket":
                up_writer.write(head)
                await self._pipe_ws(reader, writer, up_reader, up_writer)
                return
            body = await reader.readexactly(int(names.get(b"content-length", b"0")))
            kept = [ln for ln in lines if not ln.lower().startswith(b"connection:")]
            up_writer.write(b"\r\n".join([*kept, b"connection: close"]) + b"\r\n\r\n" + body)
            answer = await up_reader.read(-1)
            up_writer.close()
            resp_head, _, resp_body = answer.partition(b"\r\n\r\n")
            resp_lines = [ln for ln in resp_head.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
            answer = b"\r\n".join(resp_lines) + b"\r\n\r\n" + resp_body
            if member == f.delay_member and "delay" not in f.done:
                f.done.add("delay")
                await asyncio.sleep(f.delay)
            if member == f.twice_member and "twice" not in f.done:
                f.done.add("twice")
                answer += answer
            writer.write(answer)
            await writer.drain()

    async def _pipe_ws(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        f = self.faults
        cut = f.cut_ws_after if "cut" not in f.done else None
        if cut is not None:
            f.done.add("cut")

        async def up() -> None:
            while chunk := await reader.read(65536):
                up_writer.write(chunk)
                await up_writer.drain()

        async def down() -> None:
            head = await up_reader.readuntil(b"\r\n\r\n")  # the 101: never cut
            writer.write(head)
            sent = 0
            while chunk := await up_reader.read(65536):
                if cut is not None and sent + len(chunk) > cut:
                    writer.write(chunk[: cut - sent])
                    await writer.drain()
                    return  # both sides are aborted below: the connection drops mid-stream
                writer.write(chunk)
                sent += len(chunk)
                await writer.drain()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            up_writer.transport.abort()


# The scene ----------------------------------------------------------------------------------------


@dataclass
class Scene:
    served: ServedProcess
    remote: RemoteProvider
    journal: Journal
    session: RunSession
    marker: Path
    platform: Any

    def runs(self) -> list[int]:
        """The pids the marker holds: one line for each time the sandbox process started."""
        if not self.marker.exists():
            return []
        return [int(x) for x in self.marker.read_text().split()]

    def marking(self, then: str) -> list[str]:
        return ["sh", "-c", f'echo $$ >> "{self.marker}"; {then}']

    async def active(self) -> Any:
        image = (await self.session.materialize(PROFILE, self.platform)).image
        inst = await self.session.provision(PROFILE, self.platform, image)
        await self.session.activate(inst)
        return inst

    async def settle(self) -> None:
        """Release or compensate what is left, then check that nothing of the Run is."""
        await self.session.release_all()
        rows = self.journal.allocations_for_run(self.session.run_id)
        assert rows and {r.state for r in rows} <= {"released", "compensated"}, [(r.key, r.state) for r in rows]
        for pid in self.runs():
            assert not _alive(pid), f"sandbox process {pid} outlived the compensation"
        instances = Path(self.served.env["XDG_STATE_HOME"]) / "checkfu" / "host-process" / "instances"
        assert not instances.exists() or not any(instances.iterdir()), list(instances.iterdir())


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def until(condition: Callable[[], bool], seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the condition never held")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServedProcess]:
    service = ServedProcess(tmp_path)
    service.start()
    try:
        yield service
    finally:
        service.kill()


@pytest.fixture
async def scene(served: ServedProcess, tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    made: list[Scene] = []

    async def make(url: str | None = None, limits: Limits | None = None) -> Scene:
        remote = RemoteProvider(url or served.url, served.secret)
        adapter = await adapter_from_factory(lambda: remote, url or served.url, {})
        registry = Registry()
        registry.add(adapter)
        journal = Journal(sqlite_url(tmp_path / f"journal-{len(made)}.sqlite"))
        envelope = adapter.envelope
        journal.record_enrollment(  # as `checkfu provider enroll` would after checking its evidence
            envelope.target,
            endpoint=adapter.site,
            source="test rig",
            kind="evidence",
            envelope_digest=digest(envelope),
            envelope=envelope.model_dump_json(),
            ceiling=THIRD_PARTY.model_dump_json(),
            now=0.0,
        )
        runner = Runner(registry, journal, runner_tag="wire-served", limits=limits or Limits())
        platform = adapter.envelope.platforms[0]
        session = runner.start(adapter.envelope.target, PROFILE, platform=platform).session
        s = Scene(served, remote, journal, session, tmp_path / f"runs-{len(made)}", platform)
        made.append(s)
        return s

    yield make
    for s in made:
        with contextlib.suppress(Exception):
            await s.session.release_all()
        await s.remote.aclose()
        s.journal.close()


# Restarts -------------------------------------------------------------------------------------------


async def test_an_exec_whose_service_is_killed_and_restarted_is_typed_reclaimed_and_ran_once(
    served: ServedProcess, scene: Callable[..., Any]
) -> None:
    s: Scene = await scene()
    inst = await s.active()
    call = asyncio.ensure_future(s.session.exec(inst, s.marking("exec sleep 60"), timeout=30))
    await until(lambda: len(s.runs()) == 1)
    served.restart()  # SIGKILL mid-call; a new service on the same port remembers only labels
    with pytest.raises(SandboxError) as caught:
        await asyncio.wait_for(call, 30)
    assert isinstance(caught.value, SandboxProtocolViolation), caught.value  # an exec is never sent again
    (pid,) = s.runs()
    assert not _alive(pid)  # compensated by its key through the restarted service
    await asyncio.sleep(0.3)
    assert len(s.runs()) == 1
    await s.settle()


async def test_a_stream_whose_service_is_killed_and_restarted_ends_typed_and_ran_once(
    served: ServedProcess, scene: Callable[..., Any]
) -> None:
    s: Scene = await scene()
    inst = await s.active()
    proc = await s.session.open_process(inst, s.marking("exec cat"))
    await proc.send_stdin(b"before")
    events = proc.events()
    first = await anext(events)
    assert isinstance(first, ProcessOutput) and first.data == b"before"
    served.restart()

    async def rest() -> None:
        async for event in events:
            assert not isinstance(event, ProcessExit)

    with pytest.raises(SandboxError) as caught:
        await asyncio.wait_for(rest(), 30)
    assert type(caught.value) is SandboxProviderFailed and caught.value.reported_code == "SandboxNotFound"
    assert len(s.runs()) == 1  # the reattach found no operation and did not start one
    await s.settle()


async def test_a_service_killed_for_good_fails_typed_and_the_restarted_one_reclaims(
    served: ServedProcess, scene: Callable[..., Any]
) -> None:
    s: Scene = await scene()
    inst = await s.active()
    call = asyncio.ensure_future(s.session.exec(inst, s.marking("exec sleep 60"), timeout=30))
    await until(lambda: len(s.runs()) == 1)
    served.kill()  # nobody listens any more: the compensation cannot reach a provider
    with pytest.raises(SandboxError):
        await asyncio.wait_for(call, 60)
    (row,) = s.journal.allocations_for_run(s.session.run_id)
    assert row.state != "compensated"  # nothing claims a reclaim that did not happen
    (pid,) = s.runs()
    assert _alive(pid)
    served.start()
    await s.settle()  # the next try, through the new service, reclaims by its label
    assert len(s.runs()) == 1


# Drops, lateness and repeats at the fault proxy --------------------------------------------------


async def test_a_stream_dropped_mid_output_resumes_whole_and_ran_once(
    served: ServedProcess, scene: Callable[..., Any]
) -> None:
    async with FaultProxy(served.port, Faults(cut_ws_after=40_000)) as proxy:
        s: Scene = await scene(proxy.url)
        inst = await s.active()
        proc = await s.session.open_process(inst, s.marking("head -c 300000 /dev/zero | tr '\\0' x"))
        out = bytearray()
        code = None
        async for event in proc.events():
            if isinstance(event, ProcessOutput):
                out.extend(event.data)
            elif isinstance(event, ProcessExit):
                code = event.exit_code
        assert "cut" in proxy.faults.done
        assert code == 0 and bytes(out) == b"x" * 300_000  # resumed where it was cut: nothing lost or repeated
        assert len(s.runs()) == 1
        await s.settle()


async def test_a_start_whose_answer_is_dropped_is_reattached_never_started_again(
    served: ServedProcess, scene: Callable[..., Any]
) -> None:
    async with FaultProxy(served.port, Faults(cut_ws_after=0)) as proxy:
        s: Scene = await scene(proxy.url)
        inst = await s.active()
        proc = await s.session.open_process(inst, s.marking("echo started"))
        out = bytearray()
        async for event in proc.events():
            if isinstance(event, ProcessOutput):
                out.extend(event.data)
        assert "cut" in proxy.faults.done and bytes(out) == b"started\n"
        assert len(s.runs()) == 1
        await s.settle()


async def test_an_exec_answer_after_its_deadline_is_a_timeout_reclaimed_and_ran_once(
    served: ServedProcess, scene: Callable[..., Any]
) -> None:
    async with FaultProxy(served.port, Faults(delay_member="exec", delay=3.0)) as proxy:
        s: Scene = await scene(proxy.url, Limits(deadlines={"exec": 1.0}))
        inst = await s.active()
        with pytest.raises(SandboxProviderTimeout):
            await s.session.exec(inst, s.marking("true"), timeout=0.5)
        row = s.journal.allocation(inst.allocation_key)
        assert row is not None and row.state == "compensated"
        await asyncio.sleep(3.0)  # the late answer lands on a connection the client gave up
        assert len(s.runs()) == 1
        await s.settle()


async def test_an_exec_answer_sent_twice_is_a_protocol_violation_reclaimed_and_ran_once(
    served: ServedProcess, scene: Callable[..., Any]
) -> None:
    async with FaultProxy(served.port, Faults(twice_member="exec")) as proxy:
        s: Scene = await scene(proxy.url)
        inst = await s.active()
        out = await s.session.exec(inst, s.marking("echo hi"), timeout=5)
        assert out.stdout == b"hi\n"
        await asyncio.sleep(0.1)  # the second copy is on the idle connection by now
        with pytest.raises(SandboxProtocolViolation, match="no request asked for"):
            await s.session.exec(inst, s.marking("echo again"), timeout=5)
        assert len(s.runs()) == 1  # the second exec was never sent on a connection out of step
        row = s.journal.allocation(inst.allocation_key)
        assert row is not None and row.state == "compensated"
        await s.settle()
