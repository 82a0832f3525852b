"""``checkfu``, with a Run held at the start of one phase: a fault-injection point owned by the tests.

Usage: ``python paused.py PHASE ARGS...`` runs ``checkfu ARGS...``; when the Run reaches PHASE it
says ``paused before PHASE`` on stderr and waits (an hour) for a signal to end it. The shipped CLI
has no such hook: this wraps the console observer's ``before``, which the job calls as each phase begins.
"""

from __future__ import annotations

import asyncio
import sys

from checkfu.cli import main
from checkfu.cli.common import ConsoleObserver


def hold_before(phase: str) -> None:
    original = ConsoleObserver.before

    async def before(self: ConsoleObserver, name: str) -> None:
        if name == phase:
            print(f"paused before {name}", file=sys.stderr, flush=True)
            await asyncio.sleep(3600)
        await original(self, name)

    ConsoleObserver.before = before  # type: ignore[method-assign]


if __name__ == "__main__":
    hold_before(sys.argv[1])
    sys.argv = ["checkfu", *sys.argv[2:]]
    main()
