"""The command line's module-level consoles, made again for each command a start-up server's child runs.

A rich ``Console`` settles at construction what its terminal can do (colour system, ``NO_COLOR``, ``FORCE_COLOR``,
``TERM``). One made when a start-up server imported its module would keep the server's answers (no terminal, so
no colour) for every command. So the command line's modules make theirs with ``console(...)``, and ``refresh()``,
which the child calls once it holds the command's streams and environment, constructs each again in place with
the same arguments (a module that imported another's console keeps the same object).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

_MADE: list[tuple[Console, dict[str, Any]]] = []


def console(**kwargs: Any) -> Console:
    """``Console(**kwargs)``, remembered for ``refresh``."""
    made = Console(**kwargs)
    _MADE.append((made, kwargs))
    return made


def refresh() -> None:
    """Construct every console ``console`` made again, for this process's streams and environment."""
    for made, kwargs in _MADE:
        Console.__init__(made, **kwargs)
