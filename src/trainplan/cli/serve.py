"""`trainplan serve [--port P] [--host 127.0.0.1]`: the local planning page."""

from __future__ import annotations

import ipaddress
import socket
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


def _check_port(host: str, port: int) -> None:
    """Bind once before uvicorn does: uvicorn logs a bind failure and exits; we say it in one line."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise TrainplanError(f"cannot resolve {host!r}: {exc.strerror}", field="--host") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            raise TrainplanError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", field="--port") from None


def serve_command(
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8765,
    host: Annotated[str, typer.Option(help="Address to bind (default: this machine only).")] = "127.0.0.1",
) -> None:
    """Serve the planning page: pick a model, method, precision, batch and GPU; see memory and ranked options."""
    try:
        import uvicorn

        from trainplan.serve.app import create_app

        from trainplan.serve.app import LOOPBACK_HOSTS

        app = create_app(allowed_hosts=LOOPBACK_HOSTS if _loopback(host) else (*LOOPBACK_HOSTS, host))
    except ImportError as exc:
        raise TrainplanError(f"trainplan serve needs FastAPI and uvicorn ({exc.name} is missing): pip install 'trainplan[serve]'") from None
    _check_port(host, port)
    if not _loopback(host):
        typer.echo(f"warning: binding {host}: the page is reachable from other machines; it has no authentication", err=True)
    typer.echo(f"trainplan serve: http://{host}:{port}/ (Ctrl-C stops it)")
    uvicorn.run(app, host=host, port=port, log_level="warning", ws="none")  # the page uses no websockets
