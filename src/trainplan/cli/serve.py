"""`trainplan serve [--port P] [--host 127.0.0.1]`: the local planning page."""

from __future__ import annotations

import ipaddress
from typing import Annotated

import typer

from trainplan.errors import TrainplanError


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_command(
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8765,
    host: Annotated[str, typer.Option(help="Address to bind (default: this machine only).")] = "127.0.0.1",
) -> None:
    """Serve the planning page: pick a model, method, precision, batch and GPU; see memory and ranked options."""
    try:
        import uvicorn

        from trainplan.serve.app import create_app

        app = create_app()
    except ImportError as exc:
        raise TrainplanError(f"trainplan serve needs FastAPI and uvicorn ({exc.name} is missing): pip install 'trainplan[serve]'") from None
    if not _loopback(host):
        typer.echo(f"warning: binding {host}: the page is reachable from other machines; it has no authentication", err=True)
    typer.echo(f"trainplan serve: http://{host}:{port}/ (Ctrl-C stops it)")
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    except OSError as exc:  # port in use, address not on this machine
        raise TrainplanError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", field="--port") from None
