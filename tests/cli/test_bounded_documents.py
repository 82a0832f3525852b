"""Every document a person names is read bounded: a profile (TOML and JSON alike), an envelope, an adapters
file, evidence and a key. A device such as ``/dev/zero`` or a FIFO is refused by what it is, at once; a file
over the size bound, or nested too deeply, is refused by name; nothing reaches a user as a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from checkfu.cli import app
from checkfu.contract import examples as ex
from checkfu.contract.errors import SandboxAdapterUnavailable
from checkfu.core.documents import MAX_NESTING, DocumentError, parse_toml, read_bounded
from checkfu.core.registry import read_adapters_file

CHECKFU = Path(sys.executable).with_name("checkfu")
PROFILE_TOML = 'tier = "container"\nbase_image = "host"\n'

Maker = Callable[[Path, str], Path]


def zero_link(d: Path, name: str) -> Path:
    (d / name).symlink_to("/dev/zero")
    return d / name


def fifo(d: Path, name: str) -> Path:
    os.mkfifo(d / name)
    return d / name


def huge(d: Path, name: str) -> Path:
    path = d / name
    with path.open("wb") as fh:
        fh.truncate(17 * 1024 * 1024)  # sparse: over the 16 MiB bound without writing it
    return path


def deep_toml(d: Path, name: str) -> Path:
    path = d / name
    path.write_text(PROFILE_TOML + "x = " + "[" * 5000 + "]" * 5000 + "\n")
    return path


def deep_but_parsable_toml(d: Path, name: str) -> Path:
    path = d / name
    path.write_text(PROFILE_TOML + "x = " + "[" * 100 + "]" * 100 + "\n")
    return path


def deep_json(d: Path, name: str) -> Path:
    path = d / name
    path.write_text('{"x": ' + "[" * 100 + "]" * 100 + "}")
    return path


def directory(d: Path, name: str) -> Path:
    (d / name).mkdir()
    return d / name


CASES: dict[str, tuple[Maker, str, str]] = {
    "toml-to-dev-zero": (zero_link, "p.toml", "a character device"),
    "json-to-dev-zero": (zero_link, "p.json", "a character device"),
    "toml-fifo": (fifo, "p.toml", "a FIFO"),
    "json-fifo": (fifo, "p.json", "a FIFO"),
    "toml-over-16-MiB": (huge, "p.toml", "larger than"),
    "toml-5000-deep": (deep_toml, "p.toml", "nested too deeply"),
    "toml-100-deep": (deep_but_parsable_toml, "p.toml", f"nested more than {MAX_NESTING} deep"),
    "json-100-deep": (deep_json, "p.json", f"nested more than {MAX_NESTING} deep"),
    "a-directory": (directory, "p.toml", "a directory"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_checkfu_run_refuses_a_profile_it_cannot_read_bounded(tmp_path: Path, case: str) -> None:
    make, name, phrase = CASES[case]
    path = make(tmp_path, name)
    t0 = time.monotonic()
    done = subprocess.run(
        [str(CHECKFU), "run", "--provider", "host-process", "--profile", str(path), "--", "true"],
        capture_output=True,
        timeout=60,
        check=False,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
        cwd=tmp_path,
    )
    err = " ".join(done.stderr.decode().split())
    assert time.monotonic() - t0 < 30
    assert done.returncode not in (0, 70), err
    assert "Traceback" not in err and "internal error" not in err, err
    assert err.startswith("SandboxProfileInvalid: ") and str(path) in err and phrase in err, err


@pytest.mark.parametrize("case", ["toml-fifo", "toml-to-dev-zero", "toml-5000-deep", "json-fifo"])
def test_profile_check_refuses_the_same_way(tmp_path: Path, case: str) -> None:
    make, name, phrase = CASES[case]
    path = make(tmp_path, name)
    result = CliRunner().invoke(app, ["profile", "check", str(path), "--json"])
    assert result.exit_code == 1, result.output
    assert phrase in json.loads(result.stdout)["error"]["message"]


def test_evidence_and_keys_are_read_bounded(tmp_path: Path) -> None:
    pub = fifo(tmp_path, "key.pub")
    evidence = zero_link(tmp_path, "evidence.json")
    result = CliRunner().invoke(app, ["evidence", "verify", str(evidence), "--pub", str(pub), "--json"])
    assert result.exit_code == 1
    assert "a FIFO" in json.loads(result.stdout)["error"]
    (tmp_path / "real.pub").write_text("not a key")
    result = CliRunner().invoke(app, ["evidence", "verify", str(evidence), "--pub", str(tmp_path / "real.pub")])
    assert result.exit_code == 1


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("adapters = 3\n", "adapters must be [[adapters]] tables"),
        ("adapters = [1]\n", "adapters.0 is not a table"),
        ("[[adapters]]\nfactory = 7\n", "adapters.0.factory must be a non-empty string"),
        ('[[adapters]]\nfactory = "m:f"\noptions = 1\n', "adapters.0.options must be a table"),
        ('[[adapters]]\nfactory = "m:f"\nfactroy = "typo"\n', "unknown key 'factroy'"),
        ("plugins = []\n", "unknown key 'plugins'"),
        ("adapters = " + "[" * 100 + "]" * 100 + "\n", "nested more than"),
    ],
)
def test_an_adapters_file_of_the_wrong_shape_is_refused_by_name(tmp_path: Path, text: str, phrase: str) -> None:
    path = tmp_path / "adapters.toml"
    path.write_text(text)
    with pytest.raises(SandboxAdapterUnavailable) as caught:
        read_adapters_file(path)
    assert phrase in caught.value.message and str(path) in caught.value.message


def test_an_adapters_file_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(SandboxAdapterUnavailable, match="a FIFO"):
        read_adapters_file(fifo(tmp_path, "adapters.toml"))


def test_the_reader_itself(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_bounded(path, limit=10) == b"x" * 10
    with pytest.raises(DocumentError, match="larger than 9 bytes"):
        read_bounded(path, limit=9)
    with pytest.raises(DocumentError, match="No such file"):
        read_bounded(tmp_path / "absent")
    assert parse_toml(b"a = [[1]]\n", "t") == {"a": [[1]]}
    with pytest.raises(DocumentError, match="not UTF-8"):
        parse_toml(b"a = '\xff'\n", "t")
    with pytest.raises(DocumentError, match="not valid TOML: Exceeds the limit"):
        parse_toml(b"a = " + b"1" * 5000 + b"\n", "t")  # found by the decoder fuzz: int() refuses it


def test_an_example_envelope_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "env.json"
    path.write_text(json.dumps(ex.day_one_envelope()))
    result = CliRunner().invoke(app, ["envelope", "check", str(path), "--json"])
    assert result.exit_code == 0, result.output
