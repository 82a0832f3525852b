"""The self-serve surface: ``checkfu provider test`` and ``verify``, ``checkfu evidence verify``,
``checkfu keys generate`` and the pytest plugin, each run as a user runs it, in a process of its own."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

CHECKFU = Path(sys.executable).with_name("checkfu")


def run(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(CHECKFU), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "XDG_STATE_HOME": str(cwd / "state"), **(env or {})},
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One key pair and one signed evidence file for the memory provider, shared by the module."""
    d = tmp_path_factory.mktemp("evidence")
    done = run("keys", "generate", "--out", str(d / "signer"), cwd=d)
    assert done.returncode == 0, done.stderr
    assert (d / "signer").stat().st_mode & 0o777 == 0o600
    done = run("provider", "verify", "memory", "--key", str(d / "signer"), "--out", str(d / "evidence.json"), cwd=d)
    assert done.returncode == 0, done.stderr
    return {"dir": d, "key": d / "signer", "pub": d / "signer.pub", "file": d / "evidence.json"}


def test_provider_test_writes_json_and_junit_and_exits_zero(tmp_path: Path) -> None:
    done = run("provider", "test", "memory", "--json", "r.json", "--junit", "r.xml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    cases = report["cases"]
    assert [c["number"] for c in cases] == list(range(1, 10))
    for c in cases:
        assert set(c) >= {"number", "name", "outcome", "reason", "seconds"}
        assert c["outcome"] in ("pass", "fail", "skip")
    assert [c["number"] for c in cases if c["outcome"] == "skip"] == [9]
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "9" and suite.get("skipped") == "1"
    assert "pass" in done.stderr and "case 9" in done.stderr  # the table, case by case


def test_provider_test_exits_nonzero_when_a_case_fails(tmp_path: Path) -> None:
    adapters = tmp_path / "claims.json"
    envelope = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from checkfu.testing import memory_envelope; print(memory_envelope().model_dump_json())",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    envelope.update(provider="claims", enforcement=dict.fromkeys(envelope["enforcement"], "runner_enforced"))
    adapters.write_text(json.dumps(envelope))
    # A service that claims runner_enforced (served verbatim), tested by URL.
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE_VERBATIM, str(adapters)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        done = run(
            "provider",
            "test",
            url,
            "--credential",
            "conformance-secret",
            "--case",
            "1",
            "--json",
            "r.json",
            cwd=tmp_path,
        )
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
    assert done.returncode == 1, done.stderr
    (case,) = json.loads((tmp_path / "r.json").read_text())["cases"]
    assert (case["number"], case["outcome"]) == (1, "fail")
    assert "only an in-tree adapter may" in case["reason"]


SERVE_VERBATIM = r"""
import asyncio, sys
from checkfu.contract.codec import decode
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.testing import MemoryProvider
from checkfu.wire.server import create_app
from checkfu.wire.serving import served

async def main():
    env = decode(SandboxProviderCapabilities, open(sys.argv[1]).read())
    app = create_app(MemoryProvider(env), ["conformance-secret"], attest_enforcement=False)
    async with served(app) as url:
        print(url, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""
"""A service that serves its envelope verbatim, runner_enforced claims and all."""


def test_an_unknown_target_is_a_clear_refusal(tmp_path: Path) -> None:
    done = run("provider", "test", "no-such-provider", cwd=tmp_path)
    assert done.returncode != 0
    assert "SandboxAdapterUnavailable" in done.stderr and "no-such-provider" in done.stderr


def test_evidence_round_trips(signed: dict[str, Any]) -> None:
    done = run("evidence", "verify", str(signed["file"]), "--pub", str(signed["pub"]), "--json", cwd=signed["dir"])
    assert done.returncode == 0, done.stderr
    verified = json.loads(done.stdout)
    assert verified["ok"] is True
    assert verified["execution_target"]["provider"] == "memory"
    assert verified["tally"] == {"pass": 8, "fail": 0, "skip": 1}
    assert verified["envelope_digest"].startswith("sha256:")


def test_the_evidence_is_an_in_toto_statement_in_dsse(signed: dict[str, Any]) -> None:
    dsse = json.loads(signed["file"].read_text())
    assert dsse["payloadType"] == "application/vnd.in-toto+json"
    (signature,) = dsse["signatures"]
    assert signature["keyid"] and signature["sig"]
    statement = json.loads(base64.b64decode(dsse["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    (subject,) = statement["subject"]
    assert subject["name"] == "memory@memory 1/memory-images 1[test]"
    assert len(subject["digest"]["sha256"]) == 64
    predicate = statement["predicate"]
    assert predicate["suite_version"] and predicate["finished_at"].endswith("Z")
    assert [c["number"] for c in predicate["cases"]] == list(range(1, 10))
    assert predicate["cases"][8]["reason"]  # a skip says why


def test_a_changed_byte_is_refused(signed: dict[str, Any], tmp_path: Path) -> None:
    dsse = json.loads(signed["file"].read_text())
    payload = base64.b64decode(dsse["payload"])
    assert b'"outcome":"pass"' in payload
    dsse["payload"] = base64.b64encode(payload.replace(b'"outcome":"pass"', b'"outcome":"fail"', 1)).decode()
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(dsse))
    done = run("evidence", "verify", str(changed), "--pub", str(signed["pub"]), cwd=tmp_path)
    assert done.returncode == 1
    assert "does not verify" in done.stderr and "changed" in done.stderr


def test_a_wrong_key_is_refused(signed: dict[str, Any], tmp_path: Path) -> None:
    assert run("keys", "generate", "--out", str(tmp_path / "other"), cwd=tmp_path).returncode == 0
    done = run("evidence", "verify", str(signed["file"]), "--pub", str(tmp_path / "other.pub"), cwd=tmp_path)
    assert done.returncode == 1
    assert "signed by another key" in done.stderr


def test_evidence_for_another_envelope_is_refused(signed: dict[str, Any], tmp_path: Path) -> None:
    other = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from checkfu.testing import day_one_envelope; print(day_one_envelope().model_dump_json())",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    path = tmp_path / "other-envelope.json"
    path.write_text(json.dumps(other))
    done = run(
        "evidence", "verify", str(signed["file"]), "--pub", str(signed["pub"]), "--envelope", str(path), cwd=tmp_path
    )
    assert done.returncode == 1
    assert "not this envelope" in done.stderr


def test_keys_are_never_overwritten(signed: dict[str, Any]) -> None:
    before = signed["key"].read_bytes()
    done = run("keys", "generate", "--out", str(signed["key"]), cwd=signed["dir"])
    assert done.returncode == 2 and "never overwritten" in done.stderr
    assert signed["key"].read_bytes() == before


def test_the_pytest_plugin_runs_the_cases_in_a_users_suite(tmp_path: Path) -> None:
    (tmp_path / "test_mine.py").write_text("def test_my_own_thing():\n    assert True\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--checkfu-provider=memory", "-rs"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "9 passed, 1 skipped" in done.stdout, done.stdout
    assert "case 9: allowlist egress" in done.stdout or "allowlist" in done.stdout


@pytest.mark.parametrize("which", ["signer.pub", "signer"])
def test_keys_are_never_written_through_a_link_even_a_dangling_one(tmp_path: Path, which: str) -> None:
    (tmp_path / "elsewhere").mkdir()
    target = tmp_path / "elsewhere" / "planted"
    link = tmp_path / which
    link.symlink_to(target)  # dangling: following it would make the file there
    done = run("keys", "generate", "--out", str(tmp_path / "signer"), cwd=tmp_path, env={"COLUMNS": "400"})
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stderr
    assert f"{link} is a symbolic link" in said and "--out" in said, done.stderr
    assert not target.exists() and list((tmp_path / "elsewhere").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["elsewhere", which])  # no half pair either
    assert link.is_symlink()
