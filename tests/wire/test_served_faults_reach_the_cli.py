"""What a provider service did, as the person at ``checkfu`` hears it: a misbehaving provider (``checkfu.testing``)
served over loopback, and the real ``checkfu`` console script driving it in a process of its own.

Each fault must come out under the code the contract and the author kit give it, naming the field at fault,
with the exit status and the ``--json`` document that say what happened, and nothing left allocated:

- a result echoing another lease, or another epoch of it, is ``SandboxLeaseFenced`` (not a protocol fault);
- a service that refuses the caller's credential is ``SandboxUnauthenticated`` itself, saying which credential
  to give (not ``SandboxProviderFailed`` wrapping it);
- a ``release`` answering ``destroyed: false`` against an envelope that promises destruction is loud: a warning,
  ``ok: false``, exit 125;
- ``--capture`` asks for what the envelope serves (``readFiles``; ``listDir`` for a directory) at admission,
  before any provider work.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from wire_rig import Service

from checkfu.contract.codec import decode_value
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import SandboxLeaseFenced
from checkfu.core.driver import Limits
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.registry import Adapter, Registry, endpoint
from checkfu.core.runner import Runner
from checkfu.testing import MemoryProvider, Misbehaving, memory_profile, release_keeps, stale_epoch, wrong_lease_id
from checkfu.testing.memory import BASE_IMAGE, memory_envelope
from enrolled import enroll_adapters, enroll_service

CHECKFU = str(Path(sys.executable).with_name("checkfu"))
SCRUBBED = ("CHECKFU_DEBUG", "CHECKFU_RUNNER_TAG", "XDG_STATE_HOME", "COLUMNS", "CHECKFU_PROVIDER_CREDENTIAL")


def flat(text: str) -> str:
    return " ".join(text.split())


class Done:
    def __init__(self, argv: list[str], code: int, out: bytes, err: bytes) -> None:
        self.argv, self.code, self.out, self.err = argv, code, out, err.decode("utf-8", "replace")
        assert "Traceback" not in self.err, str(self)

    @property
    def said(self) -> str:
        return flat(self.err)

    def __str__(self) -> str:
        return f"$ {' '.join(self.argv)}\n-> {self.code}\nstdout: {self.out[-2000:]!r}\nstderr:\n{self.err[-4000:]}"


class Cli:
    """``checkfu`` with a state directory and a runner tag of its own, run as a real process."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.tag = f"test-{uuid.uuid4().hex[:8]}"

    @property
    def journal_path(self) -> Path:
        return self.home / "state" / "checkfu" / "journal.sqlite"

    def __call__(self, *args: str, **env: str) -> Done:
        import subprocess  # noqa: PLC0415

        base = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
        base.update(XDG_STATE_HOME=str(self.home / "state"), CHECKFU_RUNNER_TAG=self.tag, CHECKFU_SERVER="off")
        base.update(COLUMNS="400")
        base.update(env)
        argv = [CHECKFU, *args]
        proc = subprocess.run(argv, cwd=self.home, env=base, capture_output=True, timeout=120, check=False)
        return Done(argv, proc.returncode, proc.stdout, proc.stderr)

    def open_allocations(self) -> list[Any]:
        if not self.journal_path.exists():
            return []
        journal = Journal(sqlite_url(self.journal_path))
        try:
            return journal.open_allocations(runner_tag=self.tag)
        finally:
            journal.close()


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    c = Cli(tmp_path)
    yield c
    assert c.open_allocations() == [], "an allocation of this CLI's tag is still open in the journal"


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    path = tmp_path / "memory.toml"
    path.write_text(
        f'tier = "container"\nbase_image = "{BASE_IMAGE}"\nretention_mode = "ephemeral_zdr"\n'
        '[network_policy]\nmode = "none"\n'
        "[resource_limits]\ncpu_millis = 500\nmemory_mib = 128\ndisk_mib = 64\npids = 64\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def served(serve: Callable[..., Service]) -> Callable[..., tuple[MemoryProvider, Misbehaving, Service]]:
    """``served(envelope=None)``: a misbehaving memory provider behind a service of its own."""

    def make(envelope: dict[str, Any] | None = None) -> tuple[MemoryProvider, Misbehaving, Service]:
        memory = MemoryProvider(None if envelope is None else decode_value(SandboxProviderCapabilities, envelope))
        double = Misbehaving(memory)
        return memory, double, serve(double)

    return make


def run_json(done: Done, path: Path) -> dict[str, Any]:
    assert path.exists(), f"--json wrote nothing\n{done}"
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


# 1. a wrong lease echo is SandboxLeaseFenced -----------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(("fault", "field"), [(wrong_lease_id, "lease.lease_id"), (stale_epoch, "lease.lease_epoch")])
@pytest.mark.parametrize("member", ["provision", "activate", "openProcess", "release"])
async def test_a_service_echoing_another_lease_is_lease_fenced_and_reclaimed(
    served: Callable[..., tuple[MemoryProvider, Misbehaving, Service]],
    tmp_path: Path,
    fault: Any,
    field: str,
    member: str,
) -> None:
    memory, double, service = served()
    remote = service.remote()
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    try:
        registry = Registry()
        registry.add(Adapter(envelope=memory.envelope, provider=remote, source=f"remote {service.url}"))
        enroll_adapters(journal, registry)  # a service is selected only once enrolled at its endpoint
        runner = Runner(registry, journal, runner_tag="lease-echo", limits=Limits())
        profile = memory_profile()
        platform = memory.envelope.platforms[0]
        session = runner.start(memory.target, profile, platform=platform).session
        double.set(member, fault)  # type: ignore[arg-type]
        with pytest.raises(SandboxLeaseFenced) as caught:
            image = (await session.materialize(profile, platform)).image
            inst = await session.provision(profile, platform, image)
            await session.activate(inst)
            proc = await session.open_process(inst, ["true"])
            await proc.close_stdin()
            async for _ in proc.events():
                pass
            await session.release(inst)
        assert caught.value.field == field
        assert "echoes" in caught.value.message
        await session.release_all()
        assert session.left == {}
        assert memory.live_objects() == ()
        assert journal.open_allocations(run_id=session.run_id) == []
    finally:
        await remote.aclose()
        journal.close()


def test_checkfu_run_says_lease_fenced_for_a_wrong_echo(
    served: Callable[..., tuple[MemoryProvider, Misbehaving, Service]], cli: Cli, profile: Path, tmp_path: Path
) -> None:
    memory, double, service = served()
    enroll_served(cli, service)
    double.set("activate", wrong_lease_id)
    summary = tmp_path / "summary.json"
    done = cli(
        "run", "--provider", service.url, "--profile", str(profile), "--json", str(summary), "--", "true",
        CHECKFU_PROVIDER_CREDENTIAL=service.secret,
    )  # fmt: skip
    assert done.code == 125, str(done)
    assert "SandboxLeaseFenced" in done.said and "lease.lease_id" in done.said, str(done)
    doc = run_json(done, summary)
    assert doc["ok"] is False and doc["error"]["code"] == "SandboxLeaseFenced"
    assert doc["error"]["field"] == "lease.lease_id"
    assert memory.live_objects() == ()


# 2. a refused credential is SandboxUnauthenticated, saying which one to give ------------------------------------


@pytest.fixture
def guarded(served: Callable[..., tuple[MemoryProvider, Misbehaving, Service]]) -> Service:
    """An honest memory provider behind a service that accepts only its own credential."""
    return served()[2]


def enroll_served(cli: Cli, service: Service) -> None:
    """Enroll ``service`` in the CLI's journal at its endpoint, as ``checkfu provider enroll`` leaves it: a service is
    selected only once enrolled."""
    made = cli("runs", "list")  # makes the journal, as the CLI makes it
    assert made.code == 0, str(made)
    secret = cli.home / f"enrolled-{uuid.uuid4().hex[:6]}.credential"
    secret.write_text(f"{service.secret}\n", encoding="utf-8")
    enroll_service(sqlite_url(cli.journal_path), service.url, secret)


def enroll_with(cli: Cli, url: str, credential: Path) -> None:
    """Record ``url`` as enrolled with ``credential`` in the CLI's journal (as ``checkfu provider enroll`` would)."""
    from checkfu.contract.ceiling import THIRD_PARTY  # noqa: PLC0415
    from checkfu.contract.codec import digest  # noqa: PLC0415

    made = cli("runs", "list")  # makes the journal
    assert made.code == 0, str(made)
    envelope = memory_envelope()
    journal = Journal(sqlite_url(cli.journal_path))
    try:
        journal.record_enrollment(
            envelope.target,
            endpoint=endpoint(url),
            source=url,
            kind="evidence",
            envelope_digest=digest(envelope),
            envelope=envelope.model_dump_json(),
            ceiling=THIRD_PARTY.model_dump_json(),
            now=time.time(),
            evidence={"key_id": "test", "suite_version": "test", "finished_at": time.time(), "tally": {}, "cases": []},
            credential_path=str(credential),
            credential_fingerprint="sha256:test",
        )
    finally:
        journal.close()


@pytest.mark.parametrize("command", ["run", "grade"])
@pytest.mark.parametrize("given", ["none", "file", "environment", "enrolled"])
def test_a_refused_credential_is_unauthenticated_and_says_which_to_give(
    guarded: Service, cli: Cli, profile: Path, tmp_path: Path, command: str, given: str
) -> None:
    wrong = tmp_path / "wrong.credential"
    wrong.write_text("not-the-services-credential\n", encoding="utf-8")
    args: list[str] = []
    env: dict[str, str] = {}
    if given == "file":
        args = ["--credential-file", str(wrong)]
    elif given == "environment":
        env = {"CHECKFU_PROVIDER_CREDENTIAL": "not-the-services-credential"}
    elif given == "enrolled":
        enroll_with(cli, guarded.url, wrong)
    if command == "run":
        done = cli("run", "--provider", guarded.url, "--profile", str(profile), *args, "--", "true", **env)
        assert done.code == 125, str(done)
    else:
        done = cli("provider", "grade", guarded.url, *args, **env)
        assert done.code == 1, str(done)
    assert done.said.count("SandboxUnauthenticated") >= 1, str(done)
    assert "SandboxProviderFailed" not in done.said, str(done)
    assert guarded.secret not in done.err and "not-the-services-credential" not in done.err
    if given == "none":
        assert "carries no credential" in done.said, str(done)
        assert "--credential-file" in done.said and "CHECKFU_PROVIDER_CREDENTIAL" in done.said, str(done)
    elif given == "file":
        assert f"refused the credential from --credential-file {wrong}" in done.said, str(done)
    elif given == "environment":
        assert "refused the credential from CHECKFU_PROVIDER_CREDENTIAL" in done.said, str(done)
    else:
        assert "refused the credential issued when it was enrolled" in done.said, str(done)
        assert str(wrong) in done.said, str(done)


def test_grade_json_prints_the_refusal_as_json(guarded: Service, cli: Cli) -> None:
    done = cli("provider", "grade", guarded.url, "--json")
    assert done.code == 1, str(done)
    doc = json.loads(done.out)
    assert doc["ok"] is False and doc["error"]["code"] == "SandboxUnauthenticated"
    assert doc["error"]["field"] == "credential"


# 3. release answering destroyed: false against its envelope is loud -----------------------------------------------


def test_a_release_that_keeps_what_the_envelope_promised_to_destroy_is_loud(
    served: Callable[..., tuple[MemoryProvider, Misbehaving, Service]], cli: Cli, profile: Path, tmp_path: Path
) -> None:
    memory, double, service = served()
    enroll_served(cli, service)
    assert memory.envelope.lifecycle_assurances.release_destroys
    double.set("release", release_keeps)
    summary = tmp_path / "summary.json"
    done = cli(
        "run", "--provider", service.url, "--profile", str(profile), "--json", str(summary), "--", "echo", "ran",
        CHECKFU_PROVIDER_CREDENTIAL=service.secret,
    )  # fmt: skip
    assert done.out == b"ran\n", str(done)  # the command ran to its end ...
    assert done.code == 125, str(done)  # ... but its status would hide what the provider kept
    assert "destroyed: false" in done.said and "release_destroys" in done.said, str(done)
    assert "warning" in done.said or "the command exited 0, but" in done.said, str(done)
    doc = run_json(done, summary)
    assert doc["ok"] is False and doc["exit_code"] == 125, doc
    (key,) = doc["left"]
    assert "destroyed" in doc["left"][key], doc
    # It was compensated by its key all the same, and the journal has nothing open.
    assert memory.live_objects() == ()
    assert "compensate" in memory.calls


# 4. --capture asks for what the envelope serves, at admission ---------------------------------------------------


def envelope_without(*, operation: str | None = None, list_dir: bool = True) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(memory_envelope().model_dump_json())
    if operation is not None:
        doc["operations"] = [o for o in doc["operations"] if o != operation]
    doc["list_dir"] = list_dir
    return doc


def test_a_capture_on_a_provider_without_read_files_is_refused_before_any_provider_work(
    served: Callable[..., tuple[MemoryProvider, Misbehaving, Service]], cli: Cli, profile: Path, tmp_path: Path
) -> None:
    memory, _, service = served(envelope_without(operation="readFiles"))
    enroll_served(cli, service)
    memory.calls.clear()  # enrolling it asked for its envelope
    assert not memory.envelope.declares("readFiles")
    summary = tmp_path / "summary.json"
    done = cli(
        "run", "--provider", service.url, "--profile", str(profile), "--json", str(summary),
        "--capture", "/out/result.txt", "--", "echo", "ran",
        CHECKFU_PROVIDER_CREDENTIAL=service.secret,
    )  # fmt: skip
    assert done.code == 125, str(done)
    assert done.out == b"", str(done)  # the command never ran
    assert "SandboxCapabilityUnavailable" in done.said and "readFiles" in done.said, str(done)
    doc = run_json(done, summary)
    assert doc["ok"] is False and doc["error"]["code"] == "SandboxCapabilityUnavailable"
    assert doc["error"]["field"] == "capture"
    assert memory.calls == ["describe"]  # asked for its envelope, and nothing else
    assert not (cli.home / "state" / "checkfu" / "captures").exists()


def test_a_directory_capture_on_a_provider_without_list_dir_is_refused_before_any_provider_work(
    served: Callable[..., tuple[MemoryProvider, Misbehaving, Service]], cli: Cli, profile: Path, tmp_path: Path
) -> None:
    memory, _, service = served(envelope_without(list_dir=False))
    enroll_served(cli, service)
    assert memory.envelope.declares("readFiles") and not memory.envelope.declares("listDir")
    memory.calls.clear()  # enrolling it asked for its envelope
    summary = tmp_path / "summary.json"
    done = cli(
        "run", "--provider", service.url, "--profile", str(profile), "--json", str(summary),
        "--capture", "/out/", "--", "echo", "ran",
        CHECKFU_PROVIDER_CREDENTIAL=service.secret,
    )  # fmt: skip
    assert done.code == 125, str(done)
    assert done.out == b"", str(done)
    assert "SandboxCapabilityUnavailable" in done.said and "listDir" in done.said and "/out/" in done.said
    assert run_json(done, summary)["error"]["field"] == "capture"
    assert memory.calls == ["describe"]


def test_a_directory_found_only_after_the_run_names_list_dir(
    served: Callable[..., tuple[MemoryProvider, Misbehaving, Service]], cli: Cli, profile: Path, tmp_path: Path
) -> None:
    """Without a trailing /, a path may be a file: the Run goes ahead, and a directory found there is named."""
    memory, _, service = served(envelope_without(list_dir=False))
    enroll_served(cli, service)
    into = tmp_path / "captured"
    done = cli(
        "run", "--provider", service.url, "--profile", str(profile), "--capture", "/out", "--capture-dir", str(into),
        "--", "write", "/out/a", "x",
        CHECKFU_PROVIDER_CREDENTIAL=service.secret,
    )  # fmt: skip
    assert done.code == 0, str(done)
    assert "not captured" in done.said and "/out" in done.said and "listDir" in done.said, str(done)
    assert memory.live_objects() == ()


def test_a_directory_capture_with_list_dir_reads_the_files_back(
    served: Callable[..., tuple[MemoryProvider, Misbehaving, Service]], cli: Cli, profile: Path, tmp_path: Path
) -> None:
    _, _, service = served()
    enroll_served(cli, service)
    into = tmp_path / "captured"
    done = cli(
        "run", "--provider", service.url, "--profile", str(profile), "--capture", "/out/", "--capture-dir", str(into),
        "--", "write", "/out/sub/b", "b",
        CHECKFU_PROVIDER_CREDENTIAL=service.secret,
    )  # fmt: skip
    assert done.code == 0, str(done)
    assert (into / "out" / "sub" / "b").read_bytes() == b"b"
