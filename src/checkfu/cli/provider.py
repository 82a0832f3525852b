"""``checkfu provider``: serve an in-tree provider over the wire."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from checkfu.cli.state import client_credential
from checkfu.contract.errors import SandboxAdapterUnavailable
from checkfu.runner.registry import load_registry
from checkfu.wire.server import create_app
from checkfu.wire.serving import serve

err = Console(stderr=True, highlight=False, soft_wrap=True)

provider_app = typer.Typer(help="Provider services: serve one over the wire.", no_args_is_help=True)

CredentialOpt = Annotated[
    Path | None,
    typer.Option(
        "--credential-file",
        help="file holding the credential clients must present (default: $CHECKFU_PROVIDER_CREDENTIAL)",
    ),
]


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise typer.BadParameter(f"{value!r} is not HOST:PORT (for example 127.0.0.1:8790)", param_hint="--listen")
    return host.strip("[]"), int(port)


@provider_app.command("serve")
def provider_serve(
    name: Annotated[str, typer.Argument(help="an installed provider: docker, host-process, memory")],
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT to listen on")] = "127.0.0.1:8790",
    credential_file: CredentialOpt = None,
) -> None:
    """Serve an installed provider as an HTTP service that `checkfu run --provider URL` can drive."""
    host, port = _listen(listen)
    credential = client_credential(credential_file)
    if credential is None:
        raise typer.BadParameter(
            "a service needs a credential: give --credential-file FILE or set CHECKFU_PROVIDER_CREDENTIAL",
            param_hint="--credential-file",
        )
    registry = asyncio.run(load_registry(entry_point_names=[name]))
    found = registry.by_provider(name)
    if len(found) != 1:
        why = "; ".join(f"{k}: {v}" for k, v in registry.unavailable.items()) or "not installed"
        raise SandboxAdapterUnavailable(f"cannot serve {name!r}: {why}", field="provider")
    adapter = found[0]
    err.print(
        f"serving {escape(str(adapter.target))} on http://{host}:{port} "
        "(its runner_enforced axes are stated as provider_attested over the wire; Ctrl-C stops)"
    )
    asyncio.run(serve(create_app(adapter.provider, [credential]), host, port))
