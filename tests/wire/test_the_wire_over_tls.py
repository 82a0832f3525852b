"""The wire over TLS: a service with a certificate serves ``https://`` and ``wss://``; a client verifies it.

Certificates are made here with ``cryptography``: a private CA and a certificate it signed for 127.0.0.1 and
localhost, and a self-signed certificate. A client that trusts the CA (given as ``ca_file``, through
``CHECKFU_PROVIDER_CA`` or through ``SSL_CERT_FILE``) drives members and an open process; one that does not is
refused at once with ``SandboxProviderFailed``, field ``tls``, naming what to do; plain HTTP to a TLS service,
and TLS to a plain one, fail typed too. ``checkfu provider serve --tls-cert --tls-key`` is driven by
``checkfu provider grade https://...`` in processes of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from wire_rig import Driven, Service

from checkfu.contract.errors import SandboxAdapterUnavailable, SandboxError, SandboxProviderFailed
from checkfu.contract.process import ProcessExit, ProcessOutput
from checkfu.testing import MemoryProvider, Requests
from checkfu.wire.client import RemoteProvider, create
from checkfu.wire.tls import CA_ENV, ServerTls
from listening import wait_listening

pytestmark = pytest.mark.anyio

CHECKFU = str(Path(sys.executable).with_name("checkfu"))


@dataclass(frozen=True)
class Pki:
    ca: Path
    """What a client trusts: the CA's certificate (or, self-signed, the service's own)."""
    tls: ServerTls


def _key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    path.write_bytes(pem)
    return key


def _cert(
    path: Path,
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool,
) -> None:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    )
    if ca:
        usage = x509.KeyUsage(True, False, False, False, False, True, True, False, False)  # sign, certs, CRLs
        builder = builder.add_extension(usage, critical=True)
    else:
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    path.write_bytes(builder.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))


def make_pki(tmp: Path, kind: str) -> Pki:
    tmp.mkdir(parents=True, exist_ok=True)
    leaf_key = _key(tmp / "service.key")
    if kind == "self-signed":
        _cert(tmp / "service.pem", "127.0.0.1", leaf_key, None, ca=False)
        return Pki(tmp / "service.pem", ServerTls(tmp / "service.pem", tmp / "service.key"))
    ca_key = _key(tmp / "ca.key")
    _cert(tmp / "ca.pem", "checkfu test CA", ca_key, None, ca=True)
    _cert(tmp / "service.pem", "127.0.0.1", leaf_key, ("checkfu test CA", ca_key), ca=False)
    return Pki(tmp / "ca.pem", ServerTls(tmp / "service.pem", tmp / "service.key"))


@pytest.fixture(params=["private-ca", "self-signed"])
def pki(request: pytest.FixtureRequest, tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki", request.param)


@pytest.fixture(autouse=True)
def no_ambient_trust(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing the person running the tests set decides what is trusted here."""
    for name in (CA_ENV, "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def tls_service(pki: Pki) -> Iterator[Service]:
    service = Service(MemoryProvider(), tls=pki.tls)
    service.start()
    yield service
    service.close()


async def _echo(service: Service, remote: RemoteProvider) -> tuple[bytes, int]:
    """An instance, then ``cat`` through ``openProcess``: what came back and the exit."""
    memory = service.provider
    assert isinstance(memory, MemoryProvider)
    driven = Driven(service, remote, Requests(memory.target))
    inst = await driven.active()
    proc = await remote.open_process(driven.process_request(inst, "cat"))
    await proc.send_stdin(b"over tls")
    await proc.close_stdin()
    out, code = bytearray(), -1
    async with asyncio.timeout(20):
        async for event in proc.events():
            if isinstance(event, ProcessOutput):
                out += event.data
            elif isinstance(event, ProcessExit):
                code = event.exit_code
    await driven.release_all()
    return bytes(out), code


async def test_members_and_a_process_go_over_tls_to_a_client_that_trusts_the_ca(tls_service: Service, pki: Pki) -> None:
    assert tls_service.url.startswith("https://")
    remote = tls_service.remote(ca_file=pki.ca)
    assert remote.ws_url().startswith("wss://")
    described = await remote.describe()
    assert described.envelope.target.provider == "memory"
    assert await _echo(tls_service, remote) == (b"over tls", 0)


@pytest.mark.parametrize("variable", [CA_ENV, "SSL_CERT_FILE"])
async def test_the_trusted_ca_may_come_from_the_environment(
    tls_service: Service, pki: Pki, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, str(pki.ca))
    remote = tls_service.remote()
    assert (await remote.describe()).envelope.target.provider == "memory"
    await remote.aclose()


async def test_a_client_that_does_not_trust_the_certificate_is_refused_at_once_and_told_what_to_do(
    tls_service: Service, pki: Pki
) -> None:
    trusting = tls_service.remote(ca_file=pki.ca)
    memory = tls_service.provider
    assert isinstance(memory, MemoryProvider)
    driven = Driven(tls_service, trusting, Requests(memory.target))
    inst = await driven.active()
    wary = tls_service.remote()
    for call in (wary.describe, lambda: wary.open_process(driven.process_request(inst, "cat"))):
        started = time.monotonic()
        with pytest.raises(SandboxProviderFailed) as caught:
            await call()
        error = caught.value
        assert error.field == "tls" and error.retryable is False
        assert "certificate" in error.message and CA_ENV in error.message and "SSL_CERT_FILE" in error.message
        assert time.monotonic() - started < 2  # no retries: another try is refused the same way
    assert memory.calls.count("openProcess") == 0
    await driven.release_all()
    await wary.aclose()


async def test_plain_http_to_a_tls_service_fails_typed(tls_service: Service) -> None:
    remote = RemoteProvider(tls_service.url.replace("https://", "http://"), tls_service.secret)
    started = time.monotonic()
    with pytest.raises(SandboxError) as caught:
        await remote.describe()
    assert caught.value.code in ("SandboxProtocolViolation", "SandboxProviderFailed")
    assert time.monotonic() - started < 5
    await remote.aclose()


async def test_tls_to_a_plain_service_fails_typed(serve: Callable[..., Service], pki: Pki) -> None:
    service = serve(MemoryProvider())
    remote = RemoteProvider(service.url.replace("http://", "https://"), service.secret, ca_file=pki.ca)
    with pytest.raises(SandboxProviderFailed) as caught:
        await remote.describe()
    assert caught.value.field == "tls" and "does it serve TLS" in caught.value.message
    await remote.aclose()


@pytest.mark.parametrize("content", [None, b"not a certificate\n"], ids=["missing", "not-pem"])
async def test_a_ca_file_that_cannot_be_used_is_refused_naming_it(
    tmp_path: Path, content: bytes | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = tmp_path / "ca.pem"
    if content is not None:
        ca.write_bytes(content)
    with pytest.raises(SandboxAdapterUnavailable) as given:
        RemoteProvider("https://127.0.0.1:1", "a-credential", ca_file=ca)
    assert given.value.field == "ca_file" and str(ca) in given.value.message
    with pytest.raises(SandboxAdapterUnavailable):  # the adapters file's factory passes its ca_file on
        create("https://127.0.0.1:1", ca_file=str(ca))
    monkeypatch.setenv(CA_ENV, str(ca))
    with pytest.raises(SandboxAdapterUnavailable) as from_env:
        RemoteProvider("https://127.0.0.1:1", "a-credential")
    assert from_env.value.field == "ca_file" and CA_ENV in from_env.value.message
    RemoteProvider("http://127.0.0.1:1", "a-credential")  # a plain URL never reads it


# The command line ----------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (CA_ENV, "SSL_CERT_FILE", "SSL_CERT_DIR")}
    return {**env, "XDG_STATE_HOME": str(tmp / "state"), "CHECKFU_SERVER": "off", "COLUMNS": "400", **extra}


@contextlib.contextmanager
def _serving(tmp: Path, *tls_args: str) -> Iterator[tuple[int, Path]]:
    port, credential = _free_port(), tmp / "credential"
    credential.write_text("tls-" + secrets.token_urlsafe(18))
    argv = [
        CHECKFU,
        "provider",
        "serve",
        "memory",
        "--listen",
        f"127.0.0.1:{port}",
        "--credential-file",
        str(credential),
    ]
    with (tmp / "serve.log").open("wb") as log:
        proc = subprocess.Popen([*argv, *tls_args], stdout=log, stderr=log, env=_env(tmp))
    try:
        wait_listening(proc, port, tmp / "serve.log")
        yield port, credential
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _checkfu(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHECKFU, *args], capture_output=True, text=True, env=_env(tmp, **env), timeout=120, cwd=tmp, check=False
    )


def test_provider_serve_with_tls_is_graded_over_https_by_a_client_that_trusts_it(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", "private-ca")
    with _serving(tmp_path, "--tls-cert", str(pki.tls.cert), "--tls-key", str(pki.tls.key)) as (port, credential):
        url = f"https://127.0.0.1:{port}"
        trusted = _checkfu(
            tmp_path, "provider", "grade", url, "--credential-file", str(credential), "--json", **{CA_ENV: str(pki.ca)}
        )
        assert trusted.returncode == 0, trusted.stderr
        assert json.loads(trusted.stdout)["target"].startswith("memory@")
        wary = _checkfu(tmp_path, "provider", "grade", url, "--credential-file", str(credential), "--json")
        assert wary.returncode != 0
        assert "SandboxProviderFailed" in wary.stderr and CA_ENV in wary.stderr
        assert "Traceback" not in wary.stderr
    assert "on https://127.0.0.1:" in (tmp_path / "serve.log").read_text()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--tls-cert", "{cert}"], "--tls-key"),
        (["--tls-key", "{key}"], "--tls-cert"),
        (["--tls-cert", "{key}", "--tls-key", "{key}"], "not a PEM certificate"),
        (["--tls-cert", "{cert}", "--tls-key", "{tmp}/nothing.key"], "nothing.key"),
    ],
    ids=["no-key", "no-cert", "key-as-cert", "missing-key"],
)
def test_provider_serve_refuses_tls_files_it_cannot_use_naming_them(
    tmp_path: Path, args: list[str], named: str
) -> None:
    pki = make_pki(tmp_path / "pki", "self-signed")
    values = {"cert": str(pki.tls.cert), "key": str(pki.tls.key), "tmp": str(tmp_path)}
    credential = tmp_path / "credential"
    credential.write_text("tls-refusal-credential")
    argv = [
        "provider",
        "serve",
        "memory",
        "--listen",
        f"127.0.0.1:{_free_port()}",
        "--credential-file",
        str(credential),
    ]
    done = _checkfu(tmp_path, *argv, *(a.format(**values) for a in args))
    assert done.returncode == 2, done.stderr
    assert named in done.stderr.replace("\n", " ")
    assert "Traceback" not in done.stderr
