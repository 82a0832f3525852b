"""The in-tree Docker provider: sandboxes on the local Docker Engine, every isolation flag set by this code.

``create(**options)`` is the entry point the runner's registry calls (entry point
name ``docker``). Options, all strings: ``sandbox_user`` (``uid:gid``, default
``1000:1000``), ``home`` (default ``/home/sandbox``), ``state_dir`` (where
staged files wait for activation), ``cache_tag`` (runner tag of materialized
images) and ``workers`` (threads for docker-py calls).
"""

from __future__ import annotations

from checkfu.providers.docker.engine import DEFAULT_WORKERS, Engine
from checkfu.providers.docker.envelope import MATERIALIZATION_REVISION, PROVIDER, PROVIDER_REVISION, build_envelope
from checkfu.providers.docker.materialize import BuildProgress
from checkfu.providers.docker.provider import DockerProvider

OPTIONS = ("sandbox_user", "home", "state_dir", "cache_tag", "workers")


def create(**options: str) -> DockerProvider:
    """A Docker provider configured by string ``options`` (see the module docstring).

    Raises:
        ValueError: an unknown option, or a malformed value.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown docker provider options: {', '.join(unknown)}")
    kwargs: dict[str, object] = {}
    for name in ("sandbox_user", "home", "state_dir", "cache_tag"):
        if name in options:
            kwargs[name] = options[name]
    workers = int(options.get("workers", DEFAULT_WORKERS))
    return DockerProvider(
        engine=Engine(workers=workers),
        sandbox_user=str(kwargs.get("sandbox_user", "1000:1000")),
        home=str(kwargs.get("home", "/home/sandbox")),
        state_dir=str(kwargs["state_dir"]) if "state_dir" in kwargs else None,
        cache_tag=str(kwargs.get("cache_tag", "checkfu-cache")),
    )


__all__ = [
    "MATERIALIZATION_REVISION",
    "PROVIDER",
    "PROVIDER_REVISION",
    "BuildProgress",
    "DockerProvider",
    "Engine",
    "build_envelope",
    "create",
]
