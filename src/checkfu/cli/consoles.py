"""The command line's module-level consoles, made again for each command a start-up server's child runs.

A rich ``Console`` settles at construction what its terminal can do (colour system, ``NO_COLOR``, ``FORCE_COLOR``,
``TERM``). One made when a start-up server imported its module would keep the server's answers (no terminal, so
no colour) for every command. So the command line's modules make theirs with ``console(...)``, and ``refresh()``,
which the child calls once it holds the command's streams and environment, constructs each again in place with
the same arguments (a module that imported another's console keeps the same object).

When a console writes to no terminal and in no colour (a pipe, a file: every ``checkfu run`` a script or a benchmark
reads), a line of markup prints as its plain text, written at once (``PlainWhenPiped.print``): the text rich would
have written, without building the segments that only a terminal needs. A Run prints some twenty such lines: rich's
whole path took 0.1 to 0.4 ms a line in one (measured), the plain one about 0.03 ms.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import render

_MADE: list[tuple[Console, dict[str, Any]]] = []


class PlainWhenPiped(Console):
    """A ``Console`` whose ``print`` of one string of markup, with no other argument, writes the string's plain text
    straight to the file when what rich would write is exactly that: no terminal, no colour, soft wrap (no width to
    wrap or crop at), nothing recording, capturing or hooked in, and no tab in the text (rich expands tabs). Anything
    else takes rich's own path. Bad markup raises as rich's own print does (``rich.errors.MarkupError``)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if len(objects) == 1 and not kwargs and type(objects[0]) is str and self._plain():
            text = render(objects[0], emoji=self._emoji, emoji_variant=self._emoji_variant).plain
            if "\t" not in text:
                with self._lock:
                    try:
                        self.file.write(text + "\n")
                        self.file.flush()
                    except BrokenPipeError:
                        self.on_broken_pipe()
                return
        super().print(*objects, **kwargs)

    def _plain(self) -> bool:
        return (
            self.soft_wrap
            and self._markup
            and self._color_system is None
            and not self.record
            and not self.quiet
            and not self._render_hooks
            and self._buffer_index == 0
            and not self.is_jupyter
            and not self.is_terminal
        )


def console(**kwargs: Any) -> Console:
    """``PlainWhenPiped(**kwargs)``, remembered for ``refresh``."""
    made = PlainWhenPiped(**kwargs)
    _MADE.append((made, kwargs))
    return made


def refresh() -> None:
    """Construct every console ``console`` made again, for this process's streams and environment."""
    for made, kwargs in _MADE:
        Console.__init__(made, **kwargs)
