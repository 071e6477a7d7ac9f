"""``respflow serve``: the gateway under uvicorn (uvloop + httptools where installed), with the
upstream simulator when no upstream is given (both on one event loop; the simulator on an
ephemeral 127.0.0.1 port).

``--workers N`` (N > 1) runs N such processes behind one port: each binds it with
``SO_REUSEPORT`` (the kernel spreads connections over them) and has its own loop, upstream
pool and, without ``--upstream``, its own simulator; the parent only supervises — it restarts a
worker that dies and stops them all on SIGINT/SIGTERM. The gateway keeps no state between
requests, so workers share nothing.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from typing import Any

import uvicorn
from prometheus_client import multiprocess

from respflow.flows._runner import Placement
from respflow.flows.gateway import Gateway, GatewayTool, gateway_app, simulator_app
from respflow.flows.gateway._metrics import Metrics, configure_tracing
from respflow.sinks.store import store_for

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


def default_store_url() -> str:
    """The embedded store of ``respflow serve``: a SQLite file under ``$XDG_DATA_HOME``."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return "sqlite:///" + os.path.join(base, "respflow", "respflow.db")


def _server(app: Any, sock: socket.socket) -> tuple[uvicorn.Server, socket.socket]:
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        http=_http_protocol(),
        proxy_headers=False,  # the gateway logs no client address; no per-request parse
        server_header=False,
        backlog=4096,
    )
    return uvicorn.Server(config), sock


def _http_protocol() -> str:
    """httptools (C) where installed; uvicorn's h11 elsewhere."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


def _bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
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
    max_streams: int = 1024,
    reuse_port: bool = False,
    hosted: str = "drop",
    unknown_events: str = "forward",
    store: str = "none",
    store_ttl: float | None = None,
    background_retention: float = 3600.0,
    background_lease: float = 15.0,
    metrics: bool = True,
) -> None:
    """Run the gateway until interrupted. ``store``: a store URL (`store_for`)."""
    servers: list[tuple[uvicorn.Server, socket.socket]] = []
    if upstream is None:
        sim_sock = _bind("127.0.0.1", 0)
        upstream = f"http://127.0.0.1:{sim_sock.getsockname()[1]}/v1"
        servers.append(_server(simulator_app(pace=pace), sim_sock))
    gateway = Gateway(
        upstream,
        tools=DEMO_TOOLS if demo_tools else (),
        placement=placement,
        max_streams=max_streams,
        hosted=hosted,
        unknown_events=unknown_events,
        store=store_for(store),
        store_ttl=store_ttl,
        background_retention=background_retention,
        background_lease=background_lease,
        metrics=Metrics(enabled=metrics),
    )
    if configure_tracing():
        log.info("tracing: spans exported as the OTEL_* variables say")
    gw_sock = _bind(host, port, reuse_port=reuse_port)
    servers.append(_server(gateway_app(gateway), gw_sock))
    where = gw_sock.getsockname()
    kind = "built-in simulator" if len(servers) == 2 else "upstream"
    log.info(
        "serving on http://%s:%s/v1 (%s at %s; at most %d streams at once)",
        where[0],
        where[1],
        kind,
        upstream,
        max_streams,
    )
    # What is imported and built by now lives as long as the process: the cyclic GC need not
    # walk it again on every full collection (≈ 0.3 µs per relayed event measured). This is
    # the server's own process; the library never touches gc settings.
    gc.freeze()
    await asyncio.gather(*(server.serve(sockets=[sock]) for server, sock in servers))


def supervise(argv: list[str], workers: int, *, host: str, port: int) -> int:
    """Run ``workers`` copies of ``respflow serve <argv>`` on one port (SO_REUSEPORT) until
    SIGINT/SIGTERM; a worker that dies is restarted (at most once a second)."""
    probe = _bind(host, port, reuse_port=True)  # fail here, once, if the port is taken
    probe.close()
    command = [sys.executable, "-m", "respflow", "serve", *argv, "--reuse-port"]
    # the workers' metrics, summed by whichever worker answers GET /metrics
    made_dir = None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        made_dir = tempfile.mkdtemp(prefix="respflow-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = made_dir
    procs: list[subprocess.Popen[bytes]] = [subprocess.Popen(command) for _ in range(workers)]
    log.info("respflow serve: %d workers on http://%s:%s/v1 (pids %s)", workers, host, port, ", ".join(str(p.pid) for p in procs))
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    last_restart = 0.0
    while not stopping:
        time.sleep(0.2)
        for i, proc in enumerate(procs):
            if proc.poll() is not None and not stopping and time.monotonic() - last_restart > 1.0:
                log.warning("worker %d (pid %d) exited with %s; restarting it", i, proc.pid, proc.returncode)
                multiprocess.mark_process_dead(proc.pid)  # type: ignore[no-untyped-call]
                procs[i] = subprocess.Popen(command)
                last_restart = time.monotonic()
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if made_dir is not None:
        shutil.rmtree(made_dir, ignore_errors=True)
    return 0
