"""A provider a stranger wrote in JavaScript from the author kit alone (``examples/provider-node``),
held to the conformance suite through the real CLI.

The server is started with ``node examples/provider-node/server.js`` on a free loopback port, as
its README says, and ``checkfu provider test URL --json`` (the credential in the environment, as
the README says too) must pass cases 1-5 and skip 6-9 (the seed's day-one tier). Around that: a
wrong credential is ``SandboxUnauthenticated``; the provider's decoder holds to every kit vector,
and its copy of the kit's schemas is the kit's;
every invalid request vector of a member it serves is refused over the wire with exactly the
vector's code and field; the lifecycle's edges (staging, sealing, the environment, timeouts,
truncation, exit codes, release twice); compensation after the provider lost every record; and
nothing of the provider (process, namespace holder, directory) is left once it released
everything and stopped. Only the server process started here is ever signalled, by its pid.

Needs Node.js (skips without it, fails under ``CHECKFU_REQUIRE_NODE=1``) and root (the provider
builds namespaces and mounts; skips otherwise).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

REPO = Path(__file__).resolve().parents[2]
PROVIDER_DIR = REPO / "examples" / "provider-node"
SERVER = PROVIDER_DIR / "server.js"
CHECKFU = Path(sys.executable).with_name("checkfu")
LABEL = "CHECKFU_NODE_PROVIDER_INSTANCE"
"""The environment variable every host-side process of an instance carries (sandbox.js)."""

SERVED = ["describe", "materialize", "provision", "writeFile", "activate", "exec", "inspect", "release", "compensate"]
NOT_SERVED = ["openProcess", "readFiles", "listAllocations", "listDir", "snapshot", "deleteSnapshot", "clone", "resume"]
STATUS = {
    "SandboxProtocolViolation": 400,
    "SandboxUnauthenticated": 401,
    "SandboxNotFound": 404,
    "SandboxLeaseFenced": 409,
    "SandboxStateConflict": 409,
    "SandboxCapabilityUnavailable": 422,
    "SandboxDigestMismatch": 422,
    "SandboxIdentityMismatch": 422,
    "SandboxPathRejected": 422,
    "SandboxProfileInvalid": 422,
    "SandboxOperationUnsupported": 501,
}


# Node.js, and the provider as a process ------------------------------------------------------


@pytest.fixture(scope="module")
def node() -> str:
    """``node``; skips without it, fails under ``CHECKFU_REQUIRE_NODE=1``; skips when not root."""
    found = shutil.which("node")
    if found is None:
        if os.environ.get("CHECKFU_REQUIRE_NODE") == "1":
            pytest.fail("Node.js is not installed and CHECKFU_REQUIRE_NODE=1")
        pytest.skip("Node.js is not installed")
    if os.geteuid() != 0:
        pytest.skip("the Node.js provider builds namespaces and mounts, so it runs as root")
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Provider:
    url: str
    port: int
    credential: str
    state_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path


def post(
    provider: Provider,
    member: str,
    body: bytes | dict[str, Any] = b"",
    *,
    credential: str | None = "",
    headers: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> tuple[int, dict[str, Any]]:
    """POST /v1/<member>; returns the status and the JSON body. credential "" means the provider's."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    h = {"Content-Type": content_type, **(headers or {})}
    token = provider.credential if credential == "" else credential
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    conn = http.client.HTTPConnection("127.0.0.1", provider.port, timeout=60)
    try:
        conn.request("POST", f"/v1/{member}", body=data, headers=h)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def labeled_pids(state_dir: Path) -> list[int]:
    """Every live process labeled with an instance directory under state_dir."""
    want = f"{LABEL}={state_dir}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(var.startswith(want) for var in environ.split(b"\0")):
            found.append(int(entry.name))
    return found


@contextmanager
def running_provider(
    node: str, workdir: Path, *, port: int | None = None, state_dir: Path | None = None
) -> Iterator[Provider]:
    """Start the server; yield once it answers describe; stop it (SIGTERM to its pid) at the end."""
    port = port or _free_port()
    credential = secrets.token_urlsafe(24)
    tmp = workdir / "tmp"
    tmp.mkdir(exist_ok=True)
    state = state_dir or tmp / f"checkfu-node-provider-{port}"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PORT": str(port), "TMPDIR": str(tmp)}
    env["CHECKFU_PROVIDER_CREDENTIAL"] = credential
    if state_dir is not None:
        env["CHECKFU_NODE_PROVIDER_STATE"] = str(state_dir)
    env["CHECKFU_NODE_PROVIDER_LOG"] = "1"
    log = workdir / f"provider-{port}-{secrets.token_hex(4)}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([node, str(SERVER)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    provider = Provider(f"http://127.0.0.1:{port}", port, credential, state, proc, log)
    try:
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None, f"the provider exited: {log.read_text()}"
            try:
                if post(provider, "describe")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"the provider did not answer: {log.read_text()}"
            time.sleep(0.05)
        yield provider
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


@pytest.fixture(scope="module")
def provider(node: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    with running_provider(node, tmp_path_factory.mktemp("node-provider")) as p:
        yield p


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh ``checkfu kit export``."""
    out = tmp_path_factory.mktemp("kit") / "kit"
    done = subprocess.run(
        [str(CHECKFU), "kit", "export", str(out)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return out


# The conformance suite, through the CLI ----------------------------------------------------------


def test_conformance_passes_cases_1_to_5_and_skips_6_to_9_and_leaves_nothing(node: str, tmp_path: Path) -> None:
    with running_provider(node, tmp_path) as p:
        done = subprocess.run(
            [str(CHECKFU), "provider", "test", p.url, "--json", "report.json"],
            cwd=tmp_path,
            env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "CHECKFU_PROVIDER_CREDENTIAL": p.credential},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr + p.log.read_text()
        report = json.loads((tmp_path / "report.json").read_text())
        outcomes = {case["number"]: case["outcome"] for case in report["cases"]}
        assert outcomes == {1: "pass", 2: "pass", 3: "pass", 4: "pass", 5: "pass"} | dict.fromkeys(
            range(6, 10), "skip"
        ), report["cases"]
        assert all(case["reason"] for case in report["cases"])
        # It declares no optional member, so nothing optional is called; of its four assurances, two can be seen
        # to hold from outside (reaps_process_tree needs openProcess to watch a process; cold_compensation a
        # provider made to forget), and the grade card says so.
        exercised = {case["number"]: case["exercised"] for case in report["cases"] if case["exercised"]}
        assert exercised == {4: ["release_destroys", "release_idempotent"]}, report["cases"]
        # the provider cleaned up on release and compensate, while still running
        assert not p.state_dir.exists(), list(p.state_dir.rglob("*"))
        assert labeled_pids(p.state_dir) == []
    assert p.proc.returncode == 0, p.log.read_text()
    assert labeled_pids(p.state_dir) == []
    assert not p.state_dir.exists()
    assert "internal error" not in p.log.read_text()


def test_a_wrong_or_missing_credential_is_unauthenticated(provider: Provider) -> None:
    for credential in ["wrong", provider.credential + "x", provider.credential[:-1], None]:
        for member in ["describe", "exec", "snapshot", "no-such-member"]:
            status, body = post(provider, member, b"{not json", credential=credential)
            assert status == 401, (credential, member, body)
            assert body["error"]["code"] == "SandboxUnauthenticated"
            assert body["error"]["field"] == "authorization"
    status, body = post(
        provider, "describe", headers={"Authorization": f"Basic {provider.credential}"}, credential=None
    )
    assert (status, body["error"]["code"]) == (401, "SandboxUnauthenticated")


def test_members_not_served_are_unsupported(provider: Provider) -> None:
    for member in NOT_SERVED:
        status, body = post(provider, member, {})
        assert (status, body["error"]["code"]) == (501, "SandboxOperationUnsupported"), member
    status, body = post(provider, "teleport", {})
    assert (status, body["error"]["code"], body["error"]["field"]) == (501, "SandboxOperationUnsupported", "path")


# The kit: vectors, schemas, and every invalid request over the wire -------------------------------


def test_the_decoder_holds_to_every_kit_vector(node: str, kit: Path) -> None:
    done = subprocess.run(
        [node, str(PROVIDER_DIR / "check-vectors.js"), str(kit)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 failed" in done.stdout


def test_the_schemas_beside_the_provider_are_the_kits(kit: Path) -> None:
    ours = sorted((PROVIDER_DIR / "schemas").glob("*.schema.json"))
    assert len(ours) == 19
    stale = [f.name for f in ours if f.read_bytes() != (kit / "schemas" / f.name).read_bytes()]
    assert stale == [], f"copy them again from `checkfu kit export`: {stale}"


def _ascii_json(text: str) -> str:
    """The Checkfu-Request header is ASCII JSON: escape what is not, keeping every other byte as written."""
    out = []
    for ch in text:
        if ord(ch) < 0x80:
            out.append(ch)
        else:
            units = ch.encode("utf-16-be")
            out.extend(f"\\u{int.from_bytes(units[k : k + 2], 'big'):04x}" for k in range(0, len(units), 2))
    return "".join(out)


def test_every_invalid_request_vector_is_refused_over_the_wire(provider: Provider, kit: Path) -> None:
    index = json.loads((kit / "index.json").read_text())
    checked = 0
    for member in SERVED:
        request = index["members"][member]["request"]
        for rel in index["messages"][request]["vectors"]:
            vector = json.loads((kit / rel).read_text())
            if vector["valid"]:
                continue
            text = vector["document_text"] if "document_text" in vector else json.dumps(vector["document"])
            if member == "writeFile":
                status, body = post(
                    provider,
                    member,
                    b"",
                    headers={"Checkfu-Request": _ascii_json(text)},
                    content_type="application/octet-stream",
                )
            else:
                status, body = post(provider, member, text.encode())
            expect = vector["expect"]
            assert body["error"]["code"] == expect["code"], (rel, body)
            assert body["error"].get("field") == expect["field"], (rel, body)
            assert status == STATUS[expect["code"]], (rel, status)
            checked += 1
    assert checked > 150


# The lifecycle's edges ------------------------------------------------------------------------------


def _digest(profile: dict[str, Any]) -> str:
    """RFC 8785 of a profile of ASCII strings and integers is json.dumps with sorted keys and no spaces."""
    return "sha256:" + hashlib.sha256(json.dumps(profile, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Session:
    """One allocation driven by hand: the envelope's own profile, one mount of two files."""

    FILES: ClassVar[dict[str, bytes]] = {
        "data.bin": b"\x00\x01 exactly these bytes \xff",
        "bin/run.sh": b"#!/bin/sh\necho ran\n",
    }

    def __init__(self, provider: Provider, key: str) -> None:
        self.p = provider
        envelope = post(provider, "describe")[1]["envelope"]
        self.target = {
            k: envelope[k] for k in ["provider", "provider_revision", "materialization_revision", "placement"]
        }
        self.lease = {"lease_id": "lease-1", "lease_epoch": 1}
        self.key = key
        self.profile = {
            "tier": "container",
            "base_image": envelope["fixed_base_images"][0],
            "packages": {},
            "network_policy": {"mode": "none", "allowlist": []},
            "resource_limits": envelope["minimum_resources"],
            "retention_mode": "ephemeral_zdr",
        }
        self.platform = envelope["platforms"][0]
        self.instance_id = ""

    def ids(self) -> dict[str, Any]:
        return {"target": self.target, "lease": self.lease, "allocation_key": self.key, "instance_id": self.instance_id}

    def provision(self) -> dict[str, Any]:
        files = [
            {
                "path": "data.bin",
                "size": len(self.FILES["data.bin"]),
                "digest": "sha256:" + hashlib.sha256(self.FILES["data.bin"]).hexdigest(),
            },
            {
                "path": "bin/run.sh",
                "mode": 0o755,
                "size": len(self.FILES["bin/run.sh"]),
                "digest": self._git(self.FILES["bin/run.sh"]),
            },
        ]
        request = {
            "target": self.target,
            "lease": self.lease,
            "profile": self.profile,
            "profile_digest": _digest(self.profile),
            "platform": self.platform,
            "allocation_key": self.key,
            "runner_tag": "runner-node-test",
            "mounts": [{"target": "/workspace", "files": files}],
            "root_image": self.profile["base_image"],
        }
        status, body = post(
            self.p, "materialize", {k: request[k] for k in ["target", "lease", "profile", "profile_digest", "platform"]}
        )
        assert status == 200, body
        status, body = post(self.p, "provision", request)
        assert status == 200, body
        self.instance_id = body["instance_id"]
        return body

    @staticmethod
    def _git(data: bytes) -> str:
        return "git:" + hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    def write(
        self, path: str, data: bytes, *, digest_of: bytes | None = None, mode: int = 0o644
    ) -> tuple[int, dict[str, Any]]:
        request = {**self.ids(), "path": path, "mode": mode, "size": len(data)}
        request["digest"] = "sha256:" + hashlib.sha256(data if digest_of is None else digest_of).hexdigest()
        return post(
            self.p,
            "writeFile",
            data,
            headers={"Checkfu-Request": json.dumps(request)},
            content_type="application/octet-stream",
        )

    def stage_all(self) -> None:
        for name, data in self.FILES.items():
            status, body = self.write(f"/workspace/{name}", data, mode=0o755 if name.endswith(".sh") else 0o644)
            assert status == 200, body

    def exec(self, argv: list[str], **extra: Any) -> dict[str, Any]:
        request = {**self.ids(), "argv": argv, "timeout_ms": 10000, "max_output_bytes": 1 << 20, **extra}
        status, body = post(self.p, "exec", request)
        assert status == 200, body
        body["out"] = base64.b64decode(body["stdout"])
        body["err"] = base64.b64decode(body["stderr"])
        return body


def test_staging_sealing_and_exec_behave_as_the_contract_says(provider: Provider) -> None:
    s = Session(provider, "ak-node-lifecycle")
    assert s.provision()["state"] == "provisioning"

    # staging: only the plan's files, with the plan's bytes; activation waits for all of them
    status, body = s.write("/elsewhere/x", b"x")
    assert (status, body["error"]["code"], body["error"]["field"]) == (422, "SandboxPathRejected", "path")
    status, body = s.write("/workspace/not-planned", b"x")
    assert (status, body["error"]["code"]) == (422, "SandboxPathRejected")
    status, body = s.write("/workspace/data.bin", b"other bytes of other size")
    assert (status, body["error"]["code"], body["error"]["field"]) == (422, "SandboxDigestMismatch", "size")
    data = Session.FILES["data.bin"]
    status, body = s.write("/workspace/data.bin", data, digest_of=b"something else")
    assert (status, body["error"]["code"]) == (422, "SandboxDigestMismatch")
    status, body = s.write("/workspace/bin/run.sh", b"#!/bin/sh\necho RAN\n")  # same size, not the Git blob
    assert (status, body["error"]["code"], body["error"]["field"]) == (422, "SandboxDigestMismatch", "digest")
    status, body = post(provider, "activate", s.ids())
    assert (status, body["error"]["code"]) == (409, "SandboxStateConflict")
    status, body = post(provider, "exec", {**s.ids(), "argv": ["true"], "timeout_ms": 1000, "max_output_bytes": 10})
    assert (status, body["error"]["code"]) == (409, "SandboxStateConflict")
    s.stage_all()
    status, body = post(provider, "activate", s.ids())
    assert (status, body["state"], body["instance_id"], body["allocation_key"]) == (200, "active", s.instance_id, s.key)
    assert body["lease"] == s.lease and body["target"] == s.target
    status, body = s.write("/workspace/data.bin", data)
    assert (status, body["error"]["code"]) == (409, "SandboxStateConflict")

    # the sandbox: exactly the staged bytes, sealed; only /tmp writable; exactly the request's environment
    r = s.exec(["cat", "/workspace/data.bin"])
    assert (r["exit_code"], r["out"], r["timed_out"]) == (0, data, False)
    assert s.exec(["/workspace/bin/run.sh"])["out"] == b"ran\n"
    r = s.exec(
        ["sh", "-c", "echo x >/workspace/data.bin || echo x >/new || echo sealed; echo ok >/tmp/t && cat /tmp/t"]
    )
    assert r["out"] == b"sealed\nok\n", r
    assert s.exec(["cat", "/tmp/t"])["out"] == b"ok\n"  # /tmp lives as long as the instance
    assert s.exec(["env"])["out"] == b""
    assert s.exec(["env"], env={"A": "1", "B_2": "two words"})["out"].splitlines() == [b"A=1", b"B_2=two words"]
    assert s.exec(["id", "-u"])["out"] == b"65534\n"
    assert s.exec(["pwd"], cwd="/workspace/bin")["out"] == b"/workspace/bin\n"
    assert s.exec(["cat"], stdin=base64.b64encode(b"in\x00put").decode())["out"] == b"in\x00put"
    assert s.exec(["sh", "-c", "echo err >&2; exit 3"])["exit_code"] == 3
    assert s.exec(["sh", "-c", "kill -TERM $$"])["exit_code"] == 128 + signal.SIGTERM

    # bounds: output capped per stream and flagged; the timeout kills the whole process tree
    r = s.exec(["sh", "-c", "head -c 5000 /dev/zero; head -c 10 /dev/zero >&2"], max_output_bytes=100)
    assert (len(r["out"]), r["stdout_truncated"], len(r["err"]), r["stderr_truncated"]) == (100, True, 10, False)
    started = time.monotonic()
    r = s.exec(["sh", "-c", "sleep 30 & sleep 30"], timeout_ms=500)
    assert r["timed_out"] is True and r["exit_code"] == 128 + signal.SIGKILL
    assert time.monotonic() - started < 10
    r = s.exec(["echo", "no hurry"], timeout_ms=3_000_000_000)  # beyond a JavaScript timer's 2^31 - 1 ms
    assert (r["timed_out"], r["out"]) == (False, b"no hurry\n")
    assert labeled_pids(provider.state_dir) != []  # the instance's namespace holder, and only that
    assert len(labeled_pids(provider.state_dir)) == 1

    # release destroys, and a second release answers the same identity; inspect says released
    status, first = post(provider, "release", s.ids())
    assert (status, first["state"], first["destroyed"]) == (200, "released", True)
    status, second = post(provider, "release", s.ids())
    assert status == 200 and second == first
    status, body = post(provider, "inspect", s.ids())
    assert (status, body["state"]) == (200, "released")
    assert labeled_pids(provider.state_dir) == []
    assert not (provider.state_dir / f"alloc-{s.key}").exists()
    status, body = post(
        provider,
        "compensate",
        {"target": s.target, "lease": s.lease, "allocation_key": s.key, "runner_tag": "runner-node-test"},
    )
    assert (status, body["reclaimed"]) == (200, 0)


def test_identity_target_and_lease_are_checked(provider: Provider) -> None:
    s = Session(provider, "ak-node-identity")
    s.provision()
    other = {**s.ids(), "target": {**s.target, "provider_revision": "someone else 9"}}
    status, body = post(provider, "inspect", other)
    assert (status, body["error"]["code"], body["error"]["field"]) == (
        422,
        "SandboxIdentityMismatch",
        "target.provider_revision",
    )
    status, body = post(provider, "inspect", {**s.ids(), "allocation_key": "ak-someone-else"})
    assert (status, body["error"]["code"]) == (422, "SandboxIdentityMismatch")
    status, body = post(provider, "inspect", {**s.ids(), "instance_id": "nd-nothing"})
    assert (status, body["error"]["code"]) == (404, "SandboxNotFound")
    status, body = post(provider, "inspect", {**s.ids(), "lease": {"lease_id": "lease-1", "lease_epoch": 2}})
    assert status == 200 and body["lease"]["lease_epoch"] == 2
    status, body = post(provider, "inspect", s.ids())  # epoch 1 is fenced now
    assert (status, body["error"]["code"]) == (409, "SandboxLeaseFenced")
    status, body = post(
        provider,
        "compensate",
        {"target": s.target, "lease": s.lease, "allocation_key": s.key, "runner_tag": "runner-node-test"},
    )
    assert (status, body["reclaimed"]) == (200, 1)  # a half-provisioned allocation: its directory


def test_concurrent_activations_start_one_sandbox(provider: Provider) -> None:
    s = Session(provider, "ak-node-concurrent")
    s.provision()
    s.stage_all()
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: post(provider, "activate", s.ids()), range(4)))
    assert [(status, body["state"]) for status, body in answers] == [(200, "active")] * 4
    assert len(labeled_pids(provider.state_dir)) == 1  # one namespace holder
    status, body = post(provider, "release", s.ids())
    assert status == 200 and body["destroyed"] is True
    assert labeled_pids(provider.state_dir) == []


def test_compensation_and_release_work_after_the_provider_lost_every_record(node: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    port = _free_port()
    with running_provider(node, tmp_path, port=port, state_dir=state) as p:
        s = Session(p, "ak-node-cold")
        s.provision()
        s.stage_all()
        status, _ = post(p, "activate", s.ids())
        assert status == 200
        assert len(labeled_pids(state)) == 1
        p.proc.send_signal(signal.SIGKILL)  # a crash: no chance to clean up
        p.proc.wait(timeout=15)
    deadline = time.monotonic() + 10
    while labeled_pids(state) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert labeled_pids(state) == []  # the holder died with its provider (pdeathsig)
    assert (state / "alloc-ak-node-cold").is_dir()  # but the allocation is still there

    with running_provider(node, tmp_path, port=port, state_dir=state) as p:
        s.p = p
        status, body = post(p, "release", s.ids())  # an id this key was given, released with no record of it
        assert (status, body["state"], body["instance_id"]) == (200, "released", s.instance_id)
        assert not state.exists()
        s2 = Session(p, "ak-node-cold-2")
        s2.provision()
        s2.stage_all()
        assert post(p, "activate", s2.ids())[0] == 200
    # a clean stop destroys what it knew of
    assert not state.exists()
    assert labeled_pids(state) == []

    with running_provider(node, tmp_path, port=port, state_dir=state) as p:
        s3 = Session(p, "ak-node-cold-3")
        s3.provision()
        p.proc.send_signal(signal.SIGKILL)
        p.proc.wait(timeout=15)
    assert (state / "alloc-ak-node-cold-3").is_dir()
    with running_provider(node, tmp_path, port=port, state_dir=state) as p:
        compensate = {
            "target": s3.target,
            "lease": s3.lease,
            "allocation_key": s3.key,
            "runner_tag": "runner-node-test",
        }
        status, body = post(p, "compensate", compensate)
        assert (status, body["reclaimed"]) == (200, 1)
        assert not state.exists()
        status, body = post(p, "compensate", compensate)
        assert (status, body["reclaimed"]) == (200, 0)
