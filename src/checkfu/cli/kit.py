"""``checkfu kit export``: the provider author kit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from checkfu.cli.outputs import refuse_dash
from checkfu.conformance.author_kit import export_kit

app = typer.Typer(help="The provider author kit: JSON Schemas and golden vectors.", no_args_is_help=True)


@app.command("export")
def export(directory: Annotated[Path, typer.Argument(help="where to write the kit", show_default=False)]) -> None:
    """Write JSON Schemas (draft 2020-12) and golden vectors for every wire message."""
    refuse_dash(directory, "DIRECTORY", "the kit is a directory of files")
    try:
        count = export_kit(directory)
    except OSError as exc:
        Console(stderr=True).print(
            f"cannot write the kit to {escape(str(directory))}: {escape(str(exc.strerror or exc))}"
        )
        raise typer.Exit(1) from None
    Console(highlight=False).print(f"wrote {count:d} files to {escape(str(directory))}")
