"""checkfu's runner, for a platform that embeds it: ``RunnerConfig`` says where its state and journal are and which
tag, adapters and engine it uses; ``RunnerService`` opens it and offers every use case (``docs/embedding.md``).

This face is pinned (``tests/runner/test_front_door.py``): an embedding platform imports only ``checkfu.runner`` and
``checkfu.contract``. Names load on first use, so importing it costs next to nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from checkfu.core.job import JobResult, Observer, QuietObserver
    from checkfu.core.sandboxes import LiveSandbox
    from checkfu.runner.config import ConfigError, RunnerConfig
    from checkfu.runner.service import RunnerService

__all__ = ["ConfigError", "JobResult", "LiveSandbox", "Observer", "QuietObserver", "RunnerConfig", "RunnerService"]

_HOME = {
    "ConfigError": "checkfu.runner.config",
    "RunnerConfig": "checkfu.runner.config",
    "RunnerService": "checkfu.runner.service",
    "JobResult": "checkfu.core.job",
    "Observer": "checkfu.core.job",
    "QuietObserver": "checkfu.core.job",
    "LiveSandbox": "checkfu.core.sandboxes",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'checkfu.runner' has no attribute {name!r}")
    from importlib import import_module  # noqa: PLC0415

    return getattr(import_module(home), name)


def __dir__() -> list[str]:
    return sorted(__all__)
