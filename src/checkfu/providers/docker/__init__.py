"""The in-tree Docker provider: sandboxes on the local Docker Engine, every isolation flag set by this code.

``create(progress=..., **options)`` is the entry point the runner's registry calls
(entry point name ``docker``). String options: ``sandbox_user`` (``uid:gid``,
default ``1000:1000``), ``home`` (default ``/home/sandbox``), ``state_dir`` (where
staged files wait for activation), ``cache_tag`` (runner tag of materialized
images), ``workers`` (threads for docker-py calls), ``egress_image`` (the image
an ``allowlist`` sandbox's egress proxy runs in, default ``checkfu/debian:12``)
and ``egress_dns`` (comma-separated addresses of the DNS servers the egress
proxies ask, default the engine's choice) and ``hold`` (``yes``: every sandbox ``provision``
makes is started and at once paused, so ``activate`` only thaws it; what a warm pool's filler
uses; default ``no``). ``progress``, a callable, receives
each line of an image build's output as one ``str``.

One provider drives one engine: the local one (``DOCKER_HOST``, or
``/var/run/docker.sock``) unless ``url`` names another (``unix:///PATH``,
``tcp://HOST:PORT`` with ``tls_dir`` holding ``ca.pem``, ``cert.pem`` and
``key.pem``, or ``ssh://[USER@]HOST[:PORT]``; see ``transport.py``). ``site``
names that engine among several (the runner's registry places one adapter per
engine and journals each allocation with its site); it is used in messages only.

``pin_base_image`` turns a base image tag into the engine's image id, for a
profile written by a person (``ask_pin_early`` sends its question ahead).
"""

from __future__ import annotations

import docker.errors
import requests.exceptions

from checkfu.contract.errors import SandboxAdapterUnavailable
from checkfu.providers.docker.engine import DEFAULT_WORKERS, PROBE_TIMEOUT, Engine, require_engine
from checkfu.providers.docker.envelope import (
    MATERIALIZATION_REVISION,
    PROVIDER,
    PROVIDER_REVISION,
    build_envelope,
    engine_facts,
)
from checkfu.providers.docker.materialize import BuildLine
from checkfu.providers.docker.pinning import ask_pin_early, pin_base_image
from checkfu.providers.docker.provider import DockerProvider
from checkfu.providers.docker.transport import EngineUrl

OPTIONS = (
    "sandbox_user",
    "home",
    "state_dir",
    "cache_tag",
    "workers",
    "egress_image",
    "egress_dns",
    "url",
    "tls_dir",
    "site",
    "hold",
)


def create(progress: BuildLine | None = None, **options: str) -> DockerProvider:
    """A Docker provider configured by string ``options``, reporting build lines to ``progress``
    (see the module docstring).

    Raises:
        SandboxAdapterUnavailable: an unknown option, a malformed value, or no engine that answers.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise SandboxAdapterUnavailable(
            f"{unknown[0]}: unknown option of docker (known: {', '.join(OPTIONS)})", field=unknown[0]
        )
    workers = options.get("workers", str(DEFAULT_WORKERS))
    if not workers.isdigit() or int(workers) < 1:
        raise SandboxAdapterUnavailable(f"workers: {workers!r} is not a positive whole number", field="workers")
    where: EngineUrl | None = None
    if "url" in options:
        where = EngineUrl.parse(options["url"], options.get("tls_dir"))
        where.probe(PROBE_TIMEOUT)
    else:
        require_engine()
    named = f" {options['site']} ({where.url})" if where is not None and "site" in options else ""
    try:
        engine = Engine(workers=int(workers), where=where)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise SandboxAdapterUnavailable(
            f"the Docker tier is not available: the engine{named} cannot be asked ({type(exc).__name__}: {exc})",
            field="provider",
        ) from None
    hold = options.get("hold", "no")
    if hold not in ("yes", "no"):
        raise SandboxAdapterUnavailable(f"hold: {hold!r} is neither yes nor no", field="hold")
    try:
        return DockerProvider(
            engine=engine,
            sandbox_user=options.get("sandbox_user", "1000:1000"),
            home=options.get("home", "/home/sandbox"),
            state_dir=options.get("state_dir"),
            cache_tag=options.get("cache_tag", "checkfu-cache"),
            progress=progress,
            egress_image=options.get("egress_image", "checkfu/debian:12"),
            egress_dns=tuple(options.get("egress_dns", "").split(",")),
            facts=None if engine.local else engine_facts(engine),
            hold=hold == "yes",
        )
    except BaseException:
        engine.close()
        raise


__all__ = [
    "MATERIALIZATION_REVISION",
    "PROVIDER",
    "PROVIDER_REVISION",
    "DockerProvider",
    "Engine",
    "ask_pin_early",
    "build_envelope",
    "create",
    "pin_base_image",
]
