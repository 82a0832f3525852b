"""The command line's consoles: a line printed to a pipe takes the plain path, and writes exactly what rich would."""

from __future__ import annotations

import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from checkfu.cli.consoles import PlainWhenPiped, console, refresh

PIECES = st.sampled_from(
    [
        "[dim]",
        "[/]",
        "[bold yellow]",
        "[/bold yellow]",
        "[green]",
        "\\[",
        "[",
        "]",
        ":smile:",
        ":",
        "\t",
        "\n",
        "\r",
        "\x1b[31m",
        "\x07",
        " ",
        "  ",
        "•",
        "字",
        "😀",
        "é",
        "a",
        "/work/main/examples",
        "[link=https://example.com]",
    ]
)
MARKUP = st.lists(PIECES, max_size=12).map("".join) | st.text(max_size=40)
KWARGS: dict[str, Any] = {"highlight": False, "soft_wrap": True, "color_system": None, "force_terminal": False}


def _printed(con_type: type[Console], markup: str, **extra: Any) -> tuple[str, str | None]:
    out = io.StringIO()
    con = con_type(file=out, **KWARGS, **extra)
    try:
        con.print(markup)
    except Exception as exc:  # bad markup: both must refuse it the same way
        return out.getvalue(), type(exc).__name__
    return out.getvalue(), None


@settings(max_examples=400, deadline=None)
@given(MARKUP)
def test_the_plain_path_writes_what_rich_writes(markup: str) -> None:
    assert _printed(PlainWhenPiped, markup) == _printed(Console, markup)


@settings(max_examples=100, deadline=None)
@given(MARKUP)
def test_without_emoji_codes_too(markup: str) -> None:
    assert _printed(PlainWhenPiped, markup, emoji=False) == _printed(Console, markup, emoji=False)


def test_a_pipe_takes_the_plain_path_and_a_terminal_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    real = Console.print

    def counted(self: Console, *objects: Any, **kwargs: Any) -> None:
        calls.append(objects)
        real(self, *objects, **kwargs)

    monkeypatch.setattr(Console, "print", counted)
    piped = PlainWhenPiped(file=io.StringIO(), **KWARGS)
    piped.print("[dim]• activate   1.0 ms[/]")
    assert calls == []  # rich's own path was not taken
    assert piped.file.getvalue() == "• activate   1.0 ms\n"  # type: ignore[attr-defined]
    terminal = PlainWhenPiped(file=io.StringIO(), highlight=False, soft_wrap=True, force_terminal=True)
    terminal.print("[dim]x[/]")
    assert len(calls) == 1
    assert "\x1b[" in terminal.file.getvalue()  # type: ignore[attr-defined]  # styled, as a terminal shows it
    tab = PlainWhenPiped(file=io.StringIO(), **KWARGS)
    tab.print("a\tb")
    assert len(calls) == 2  # rich expands tabs: its own path
    with_args = PlainWhenPiped(file=io.StringIO(), **KWARGS)
    with_args.print("a", style="bold")
    assert len(calls) == 3
    recording = PlainWhenPiped(file=io.StringIO(), record=True, **KWARGS)
    recording.print("a")
    assert len(calls) == 4 and recording.export_text() == "a\n"


def test_a_capture_still_captures() -> None:
    con = PlainWhenPiped(file=io.StringIO(), **KWARGS)
    with con.capture() as captured:
        con.print("[dim]inside[/]")
    assert captured.get() == "inside\n"
    assert con.file.getvalue() == ""  # type: ignore[attr-defined]


def test_a_refreshed_console_keeps_the_plain_path() -> None:
    made = console(stderr=True, highlight=False, soft_wrap=True)
    refresh()
    assert isinstance(made, PlainWhenPiped)
