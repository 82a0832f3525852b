"""checkfu: the sandbox provider seam of an agent-running platform.

``checkfu.submit`` queues a Run for a fleet of runners and ``checkfu.wait`` follows it to its
end (``checkfu.fleet``); they load the runner only when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from checkfu.fleet import RunResult, submit, wait

__all__ = ["RunResult", "__version__", "submit", "wait"]

_FLEET = frozenset({"RunResult", "submit", "wait"})


def __getattr__(name: str) -> Any:
    if name in _FLEET:
        from checkfu import fleet  # noqa: PLC0415 - `import checkfu` stays light

        return getattr(fleet, name)
    raise AttributeError(f"module 'checkfu' has no attribute {name!r}")
