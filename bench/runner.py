"""Discover ``bench/b*_*.py`` modules, run the requested ones, print and save their figures.

Each module defines ``NAMES`` (the B-numbers it produces) and ``async def run() -> list[Figure]``;
a module that cannot run raises ``SystemExit`` with the reason.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import Figure, save  # noqa: E402


def modules() -> list[Path]:
    return sorted(HERE.glob("b[0-9]*_*.py"), key=lambda p: int(p.name[1:].split("_")[0]))


def main(argv: list[str]) -> int:
    wanted = {a.upper() for a in argv}
    failed = 0
    for path in modules():
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        names = set(getattr(mod, "NAMES", ()))
        if wanted and not (names & wanted):
            continue
        try:
            figures: list[Figure] = asyncio.run(mod.run())
        except SystemExit as exc:
            print(f"{','.join(sorted(names))}: cannot run: {exc}", file=sys.stderr)
            failed += 1
            continue
        for fig in figures:
            print(fig.line(), flush=True)
        save(figures)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
