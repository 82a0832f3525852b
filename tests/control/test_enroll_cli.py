"""Enrollment as an operator does it: test, verify and sign, enroll, then run; and not before."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHECKFU = Path(sys.executable).with_name("checkfu")
BOOTSTRAP = "bootstrap-credential-of-the-service"

SERVE = r"""
import asyncio, sys
from checkfu.testing import day_one_envelope, MemoryProvider
from checkfu.wire.server import create_app
from checkfu.wire.serving import serve
env = day_one_envelope().model_copy(update={"provider": "stranger", "placement": "hosted"})
secrets = [line.strip() for line in open(sys.argv[2]) if line.strip()]
asyncio.run(serve(create_app(MemoryProvider(env), secrets), "127.0.0.1", int(sys.argv[1])))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def service(port: int, secrets: Path) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(port), str(secrets)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def checkfu(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(CHECKFU), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "XDG_STATE_HOME": str(cwd / "state"), **env},
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_a_service_is_run_only_after_it_is_enrolled(tmp_path: Path) -> None:
    secrets = tmp_path / "service-credentials"
    secrets.write_text(BOOTSTRAP + "\n")
    port = free_port()
    profile = tmp_path / "profile.json"
    with service(port, secrets) as url:
        out = subprocess.run(
            [sys.executable, "-c", "from checkfu.testing.memory import BASE_IMAGE; print(BASE_IMAGE)"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        profile.write_text(
            json.dumps(
                {
                    "tier": "container",
                    "base_image": out,
                    "network_policy": {"mode": "none"},
                    "resource_limits": {"cpu_millis": 500, "memory_mib": 128, "disk_mib": 64, "pids": 64},
                    "retention_mode": "ephemeral_zdr",
                }
            )
        )
        before = checkfu(
            "run",
            "--provider",
            url,
            "--profile",
            str(profile),
            "--",
            "echo",
            "hi",
            cwd=tmp_path,
            CHECKFU_PROVIDER_CREDENTIAL=BOOTSTRAP,
        )
        assert before.returncode != 0
        assert "is not enrolled" in " ".join(before.stderr.split()), before.stderr
        assert checkfu("keys", "generate", "--out", "state/checkfu/keys/conformance", cwd=tmp_path).returncode == 0
        verify = checkfu(
            "provider",
            "verify",
            url,
            "--key",
            "state/checkfu/keys/conformance",
            "--out",
            "ev.json",
            "--credential",
            BOOTSTRAP,
            cwd=tmp_path,
        )
        assert verify.returncode == 0, verify.stderr
        enrolled = checkfu(
            "provider", "enroll", url, "--evidence", "ev.json", "--credential", BOOTSTRAP, "--json", cwd=tmp_path
        )
        assert enrolled.returncode == 0, enrolled.stderr
        body = json.loads(enrolled.stdout)
        assert body["tally"] == {"pass": 5, "fail": 0, "skip": 4}
        issued = Path(body["credential_file"])
        assert issued.stat().st_mode & 0o777 == 0o600
        assert issued.read_text().strip() not in enrolled.stdout + enrolled.stderr
    # The operator gives the service its new credential and restarts it.
    secrets.write_text(issued.read_text())
    with service(port, secrets) as url:
        after = checkfu("run", "--provider", url, "--profile", str(profile), "--", "echo", "enrolled", cwd=tmp_path)
        assert after.returncode == 0, after.stderr
        assert after.stdout == "enrolled\n"
        listed = json.loads(checkfu("provider", "list", "--json", cwd=tmp_path).stdout)
        (stranger,) = [a for a in listed["adapters"] if a["target"].startswith("stranger@")]
        assert stranger["enrolled"] == "yes" and stranger["in_tree"] is False


# A refusal under --json is a JSON document too, with the exit code of the refusal -----------------------------


def _refusal(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    doc = json.loads(done.stdout)
    assert set(doc) == {"ok", "error"} and doc["ok"] is False, doc
    error = doc["error"]
    assert isinstance(error, dict) and set(error) == {"code", "message", "field"}, doc
    return error


def test_enroll_json_prints_a_refusal_as_json(tmp_path: Path) -> None:
    from checkfu.conformance.evidence import generate_keys  # noqa: PLC0415

    _, pub = generate_keys(tmp_path / "conformance")
    garbage = tmp_path / "evidence.json"
    garbage.write_text('{"not": "evidence"}\n')
    argv = ["provider", "enroll", "memory", "--evidence", str(garbage), "--pub", str(pub), "--json"]
    done = checkfu(*argv, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    error = _refusal(done)
    assert error["code"] == "SandboxEnrollmentRefused" and error["field"] == "evidence"
    assert "SandboxEnrollmentRefused" in done.stderr  # and a person reads it on stderr, as without --json


def test_enroll_json_prints_a_usage_refusal_as_json_and_keeps_its_exit_code(tmp_path: Path) -> None:
    garbage = tmp_path / "evidence.json"
    garbage.write_text("{}\n")
    done = checkfu("provider", "enroll", "memory", "--evidence", str(garbage), "--json", cwd=tmp_path)  # no --pub
    assert done.returncode == 2, done.stderr
    error = _refusal(done)
    assert error["field"] == "--pub" and "--pub" in str(error["message"])


# security_boundary is not admissible through "matrix evidence" -------------------------------------------------


def test_matrix_evidence_is_refused_by_name_saying_why_and_what_to_do_instead(tmp_path: Path) -> None:
    from checkfu.conformance.evidence import generate_keys  # noqa: PLC0415

    _, pub = generate_keys(tmp_path / "conformance")
    _, matrix_pub = generate_keys(tmp_path / "matrix")
    evidence = tmp_path / "evidence.json"
    evidence.write_text("{}\n")
    for flags in (
        ["--matrix-evidence", str(evidence)],
        ["--matrix-pub", str(matrix_pub)],
        ["--matrix-evidence", str(evidence), "--matrix-pub", str(matrix_pub)],
    ):
        argv = ["provider", "enroll", "memory", "--evidence", str(evidence), "--pub", str(pub), *flags]
        done = checkfu(*argv, cwd=tmp_path)
        assert done.returncode == 1, done.stderr
        said = " ".join(done.stderr.split())
        assert "SandboxEnrollmentRefused" in said and "security_boundary" in said, said
        assert "not in-tree" in said and "advisory_filter" in said, said
        assert "--evidence alone" in said, said
        error = _refusal(checkfu(*argv, "--json", cwd=tmp_path))
        assert error["code"] == "SandboxEnrollmentRefused" and error["field"] == "egress_certification"
    assert not (tmp_path / "state" / "checkfu" / "credentials").exists()  # nothing was issued
