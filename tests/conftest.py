"""Shared pytest set-up: async tests run on asyncio through anyio's plugin, the slow-run
gate, a throwaway PostgreSQL cluster for the journal's PostgreSQL tests, and Node.js with
the pinned Ajv for the author kit's cross-language schema test.

The cluster: ``initdb`` into a fresh directory, started on a free loopback port (and a
socket directory of its own), one database per test, stopped with ``pg_ctl stop -m
immediate`` at the end of the session. PostgreSQL refuses to run as root, so as root
the cluster runs as the ``postgres`` user. Where PostgreSQL 15 is not installed the
tests that need it skip, unless ``CHECKFU_REQUIRE_POSTGRES=1`` (as in CI) makes that a
failure. Node.js and Ajv (``scripts/setup`` installs both) likewise: a test that needs them
skips without them, unless ``CHECKFU_REQUIRE_NODE=1``.
"""

from __future__ import annotations

import gc
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

PG_BIN = Path("/usr/lib/postgresql/15/bin")

# Every ``checkfu`` a test starts runs in its own process: a start-up server (``checkfu server``) of the developer's
# would otherwise run it, and one a test left would outlive the session. The server's own tests turn it on.
os.environ["CHECKFU_SERVER"] = "off"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


STRICT_LEAKS = os.environ.get("CHECKFU_STRICT_LEAKS") == "1"
"""Collect after every test, so an object left unclosed (a socket, a stream) is reported in the test that made it,
and fail that test: the default run only reports such a warning, since the collector runs at random points and the
test it would fail is seldom the one that leaked."""


def pytest_configure(config: pytest.Config) -> None:
    if STRICT_LEAKS:  # the last matching filter wins: this one over pyproject's "always"
        config.addinivalue_line("filterwarnings", "error::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(autouse=STRICT_LEAKS)
def _collected_after() -> Iterator[None]:
    yield
    gc.collect()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("CHECKFU_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="long run; set CHECKFU_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _host_bridge_survives() -> Iterator[None]:
    """Fail the test that deletes the shared engine's ``docker0`` (a private ``dockerd`` with ``--bridge
    none`` does, as it starts): every bridged container on the machine stops starting after that."""
    bridge = Path("/sys/class/net/docker0")
    before = bridge.exists()
    yield
    if before and not bridge.exists():
        pytest.fail("the host's docker0 vanished during this test (a private dockerd must get a bridge of its own)")


# PostgreSQL ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_cluster_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


@dataclass(frozen=True)
class PgCluster:
    host: str
    port: int
    user: str

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"

    def create_database(self) -> str:
        name = f"j_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(host=self.host, port=self.port, user=self.user, dbname="postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return name


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    if not (PG_BIN / "initdb").exists():
        if os.environ.get("CHECKFU_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL 15 is not installed ({PG_BIN}) and CHECKFU_REQUIRE_POSTGRES=1")
        pytest.skip(f"PostgreSQL 15 is not installed ({PG_BIN})")
    root = Path(tempfile.mkdtemp(prefix="checkfu-pg-"))  # not under pytest's 0700 base: postgres must reach it
    user = pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        user = "postgres"
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    data, sockets, log = root / "data", root / "sock", root / "log"
    port = _free_port()
    run = lambda *argv: subprocess.run(_as_cluster_user([*argv]), check=True, capture_output=True, timeout=120)  # noqa: E731
    run(str(PG_BIN / "initdb"), "-D", str(data), "-U", user, "--auth=trust", "-E", "UTF8", "--no-sync")
    run("mkdir", str(sockets))
    opts = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
    try:
        run(str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w", "-t", "60", "start")
    except subprocess.CalledProcessError as exc:
        text = log.read_text(errors="replace") if log.exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"pg_ctl start failed: {exc.stderr!r} {text}") from None
    try:
        yield PgCluster(host="127.0.0.1", port=port, user=user)
    finally:
        subprocess.run(
            _as_cluster_user([str(PG_BIN / "pg_ctl"), "-D", str(data), "stop", "-m", "immediate"]),
            capture_output=True,
            check=False,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


# Node.js and Ajv ------------------------------------------------------------------------------

AJV_DIR = Path(__file__).parent / "wire" / "ajv"
"""The pinned Ajv (``package.json`` and ``package-lock.json``), installed there by ``scripts/setup``."""


@dataclass(frozen=True)
class NodeAjv:
    node: str
    directory: Path


@pytest.fixture(scope="session")
def node_ajv() -> NodeAjv:
    """``node`` and the directory holding Ajv; skips without them, fails under ``CHECKFU_REQUIRE_NODE=1``."""
    node = shutil.which("node")
    missing = (
        "Node.js is not installed"
        if node is None
        else None
        if (AJV_DIR / "node_modules" / "ajv" / "package.json").is_file()
        else f"Ajv is not installed in {AJV_DIR} (scripts/setup runs npm ci there)"
    )
    if missing is not None:
        if os.environ.get("CHECKFU_REQUIRE_NODE") == "1":
            pytest.fail(f"{missing} and CHECKFU_REQUIRE_NODE=1")
        pytest.skip(missing)
    assert node is not None
    return NodeAjv(node=node, directory=AJV_DIR)
