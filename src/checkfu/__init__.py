"""checkfu: the sandbox provider seam of an agent-running platform.

``checkfu.Sandbox`` and ``checkfu.AsyncSandbox`` drive a long-lived sandbox from code (``checkfu.sandbox``,
``docs/sdk.md``). ``checkfu.submit`` queues a Run for a fleet of runners and ``checkfu.wait`` follows it to its
end (``checkfu.fleet``); they load the runner only when first used.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing`'s: `import checkfu` (and `checkfu --version`) stays as light as Python's start-up
__version__ = "0.1.0"
"""The version ``checkfu --version`` prints; a test holds it equal to the installed distribution's."""

if TYPE_CHECKING:
    from typing import Any

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
