"""A credential is read from a file, standard input or the environment; one given as an argument is warned about.

An argument is in ``/proc/PID/cmdline`` for any user of the machine to read while the command runs. So
``--credential-file -`` reads the first line of standard input (for ``provider serve`` as for the clients, and
leaving the rest of the input unread), and ``--credential SECRET`` still works but says on stderr what it
exposes and what to use instead; ``--credential FILE`` (a path) says nothing.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from listening import wait_listening

CHECKFU = str(Path(sys.executable).with_name("checkfu"))
RISK = "any user of this machine can read it"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CHECKFU_PROVIDER_CREDENTIAL"}
    return {**env, "XDG_STATE_HOME": str(tmp / "state"), "CHECKFU_SERVER": "off", "COLUMNS": "400"}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``checkfu provider serve memory --credential-file -``, its credential written to its stdin."""
    tmp = tmp_path_factory.mktemp("served")
    secret, port = "stdin-" + secrets.token_urlsafe(18), _free_port()
    argv = [CHECKFU, "provider", "serve", "memory", "--listen", f"127.0.0.1:{port}", "--credential-file", "-"]
    with (tmp / "serve.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=log, env=_env(tmp))
    assert proc.stdin is not None
    proc.stdin.write(f"{secret}\n".encode())
    proc.stdin.close()
    try:
        wait_listening(proc, port, tmp / "serve.log")
        assert secret not in Path(f"/proc/{proc.pid}/cmdline").read_text()
        yield f"http://127.0.0.1:{port}", secret
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _grade(tmp: Path, url: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHECKFU, "provider", "grade", url, "--json", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=_env(tmp),
        cwd=tmp,
        timeout=120,
        check=False,
    )


def test_credential_file_dash_reads_the_first_line_of_stdin(service: tuple[str, str], tmp_path: Path) -> None:
    url, secret = service
    done = _grade(tmp_path, url, "--credential-file", "-", stdin=f"{secret}\nwhat follows is not read\n")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["target"].startswith("memory@")
    assert RISK not in done.stderr
    wrong = _grade(tmp_path, url, "--credential-file", "-", stdin="not-the-credential\n")
    assert wrong.returncode != 0 and "SandboxUnauthenticated" in wrong.stderr, wrong.stderr


@pytest.mark.parametrize("stdin", ["", "\n", "   \nsecret-on-line-two\n"], ids=["empty", "blank", "first-blank"])
def test_credential_file_dash_without_a_credential_on_stdin_is_a_usage_error(
    service: tuple[str, str], tmp_path: Path, stdin: str
) -> None:
    done = _grade(tmp_path, service[0], "--credential-file", "-", stdin=stdin)
    assert done.returncode == 2, done.stderr
    assert "--credential-file" in done.stderr and "standard input" in done.stderr
    assert "Traceback" not in done.stderr


def test_credential_dash_leaves_the_rest_of_stdin_to_the_command() -> None:
    script = (
        "import sys\n"
        "from checkfu.cli.state import STDIN, client_credential\n"
        "print(client_credential(STDIN).secret)\n"
        "print(sys.stdin.read(), end='')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input="the-credential\nthe command's input\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "the-credential\nthe command's input\n"


def test_a_credential_given_as_an_argument_works_and_says_what_it_exposes(
    service: tuple[str, str], tmp_path: Path
) -> None:
    url, secret = service
    done = _grade(tmp_path, url, "--credential", secret)
    assert done.returncode == 0, done.stderr
    warning = " ".join(done.stderr.split())
    assert f"warning: --credential puts the secret in this command's arguments, where {RISK}" in warning
    for alternative in ("--credential-file FILE", "--credential-file -", "CHECKFU_PROVIDER_CREDENTIAL"):
        assert alternative in warning
    assert secret not in done.stderr


def test_a_credential_file_given_to_credential_is_read_without_a_warning(
    service: tuple[str, str], tmp_path: Path
) -> None:
    url, secret = service
    holder = tmp_path / "credential"
    holder.write_text(secret + "\n")
    done = _grade(tmp_path, url, "--credential", str(holder))
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
