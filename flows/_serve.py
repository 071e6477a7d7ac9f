"""``respflow serve``: the gateway under uvicorn, with the upstream simulator when no upstream
is given (both on one event loop; the simulator on an ephemeral 127.0.0.1 port)."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from collections.abc import Coroutine
from typing import Any

import uvicorn

from respflow.flows._runner import Placement
from respflow.flows.gateway import Gateway, GatewayTool, gateway_app, simulator_app

log = logging.getLogger("respflow")


def add_numbers(arguments: dict[str, Any]) -> str:
    """The demo gateway tool: the sum of ``numbers``."""
    numbers = arguments.get("numbers")
    if not isinstance(numbers, list) or not all(isinstance(n, int | float) for n in numbers):
        raise ValueError("'numbers' must be an array of numbers")
    total = sum(numbers)
    return str(int(total) if float(total).is_integer() else total)


DEMO_TOOLS = [
    GatewayTool(
        name="add_numbers",
        fn=add_numbers,
        description="Add a list of numbers and return the sum (runs inside the gateway).",
        parameters={
            "type": "object",
            "properties": {"numbers": {"type": "array", "items": {"type": "number"}}},
            "required": ["numbers"],
        },
    )
]


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop where it is installed (the stdlib loop elsewhere)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def _server(app: Any, sock: socket.socket) -> tuple[uvicorn.Server, socket.socket]:
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", http=_http_protocol())
    return uvicorn.Server(config), sock


def _http_protocol() -> str:
    """httptools (C) where installed; uvicorn's h11 elsewhere."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


async def serve(
    *,
    upstream: str | None,
    host: str = "127.0.0.1",
    port: int = 8000,
    placement: Placement = "worker",
    pace: float = 0.02,
    demo_tools: bool = False,
) -> None:
    """Run the gateway until interrupted."""
    servers: list[tuple[uvicorn.Server, socket.socket]] = []
    if upstream is None:
        sim_sock = _bind("127.0.0.1", 0)
        upstream = f"http://127.0.0.1:{sim_sock.getsockname()[1]}/v1"
        servers.append(_server(simulator_app(pace=pace), sim_sock))
    gateway = Gateway(upstream, tools=DEMO_TOOLS if demo_tools else (), placement=placement)
    gw_sock = _bind(host, port)
    servers.append(_server(gateway_app(gateway), gw_sock))
    where = gw_sock.getsockname()
    kind = "built-in simulator" if len(servers) == 2 else "upstream"
    log.info("serving on http://%s:%s/v1 (%s at %s)", where[0], where[1], kind, upstream)
    # What is imported and built by now lives as long as the process: the cyclic GC need not
    # walk it again on every full collection (≈ 0.3 µs per relayed event measured). This is
    # the server's own process; the library never touches gc settings.
    gc.freeze()
    await asyncio.gather(*(server.serve(sockets=[sock]) for server, sock in servers))
