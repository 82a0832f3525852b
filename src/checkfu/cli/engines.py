"""``--engine NAME=URL``: the Docker engines the Docker tier places sandboxes on, each its own site.

A URL is ``unix:///path/to/docker.sock``, ``tcp://HOST:PORT`` (always with TLS: the client's
``ca.pem``, ``cert.pem`` and ``key.pem`` are read from ``--engine-certs DIR/NAME/``, as docker
keeps a context's), or ``ssh://[USER@]HOST[:PORT]`` (through the ``ssh`` client and the remote
``docker system dial-stdio``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer

from checkfu.cli.state import state_dir

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
SCHEMES = ("unix://", "tcp://", "ssh://")
TLS_FILES = ("ca.pem", "cert.pem", "key.pem")

EngineOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--engine",
        help="NAME=URL of a Docker engine to place sandboxes on (repeatable): unix:///PATH, tcp://HOST:PORT (TLS), "
        "ssh://[USER@]HOST[:PORT]",
    ),
]
EngineCertsOpt = Annotated[
    Path | None,
    typer.Option("--engine-certs", help="directory holding NAME/{ca,cert,key}.pem for each tcp:// engine"),
]


def engine_sites(engines: list[str] | None, certs: Path | None) -> dict[str, list[dict[str, Any]]] | None:
    """The ``sites`` of ``load_registry`` for ``--engine`` values: one Docker adapter per engine.

    Raises:
        typer.BadParameter: a malformed value, a repeated name, or a tcp:// engine without its TLS files.
    """
    if not engines:
        return None
    sites: list[dict[str, Any]] = []
    seen: set[str] = set()
    for value in engines:
        name, sep, url = value.partition("=")
        if not sep or not NAME.match(name):
            raise typer.BadParameter(
                f"{value[:120]!r} is not NAME=URL (NAME: lowercase letters, digits, '.', '_', '-')",
                param_hint="--engine",
            )
        if name in seen:
            raise typer.BadParameter(f"engine {name!r} is named twice", param_hint="--engine")
        seen.add(name)
        if not url.startswith(SCHEMES):
            raise typer.BadParameter(
                f"engine {name}: {url[:120]!r} is not unix:///PATH, tcp://HOST:PORT or ssh://[USER@]HOST[:PORT]",
                param_hint="--engine",
            )
        site: dict[str, Any] = {"site": name, "url": url}
        if url.startswith("tcp://"):
            where = (certs or state_dir() / "engines") / name
            missing = [f for f in TLS_FILES if not (where / f).is_file()]
            if missing:
                raise typer.BadParameter(
                    f"engine {name}: a tcp:// engine is reached with TLS only, and {where} lacks {', '.join(missing)}",
                    param_hint="--engine-certs",
                )
            site["tls_dir"] = str(where)
        sites.append(site)
    return {"docker": sites}
