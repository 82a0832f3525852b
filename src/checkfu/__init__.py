"""checkfu: the sandbox provider seam of an agent-running platform.

``checkfu.Sandbox`` and ``checkfu.AsyncSandbox`` drive a long-lived sandbox from code (``checkfu.sandbox``,
``docs/sdk.md``). ``checkfu.submit`` queues a Run for a fleet of runners and ``checkfu.wait`` follows it to its
end (``checkfu.fleet``); they load the runner only when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from checkfu.fleet import RunResult, submit, wait
    from checkfu.sandbox import AsyncSandbox, Sandbox

__all__ = ["AsyncSandbox", "RunResult", "Sandbox", "__version__", "submit", "wait"]

_FLEET = frozenset({"RunResult", "submit", "wait"})
_SANDBOX = frozenset({"AsyncSandbox", "Sandbox"})


def __getattr__(name: str) -> Any:
    if name in _FLEET:
        from checkfu import fleet  # noqa: PLC0415 - `import checkfu` stays light

        return getattr(fleet, name)
    if name in _SANDBOX:
        from checkfu import sandbox  # noqa: PLC0415 - `import checkfu` stays light

        return getattr(sandbox, name)
    raise AttributeError(f"module 'checkfu' has no attribute {name!r}")
