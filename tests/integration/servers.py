"""Real HTTP servers on 127.0.0.1 for integration tests (uvicorn in a thread of its own)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


class UpstreamScript:
    """What the test upstream does, and what it observed (read from the test thread)."""

    def __init__(self) -> None:
        self.mode = "replay"
        self.body = b""
        self.chunk = 4096
        self.pace = 0.0
        self.flood_bytes = 100 * 1024 * 1024
        self.sent_bytes = 0
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.closed_at: float | None = None
        self.finished = False


def flood_event(n: int) -> bytes:
    pad = "x" * 900
    return (
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","output_index":0,'
        b'"item_id":"msg_f","content_index":0,"logprobs":[],"delta":"' + f"{n} {pad}".encode() + b'"}\n\n'
    )


FLOOD_HEAD = (
    b'data: {"type":"response.created","response":{"id":"resp_flood","status":"in_progress","output":[]}}\n\n'
    b'data: {"type":"response.in_progress","response":{"id":"resp_flood","status":"in_progress"}}\n\n'
    b'data: {"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"msg_f","role":"assistant","status":"in_progress","content":[]}}\n\n'
    b'data: {"type":"response.content_part.added","output_index":0,"item_id":"msg_f","content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}\n\n'
)


def upstream_app(script: UpstreamScript) -> Starlette:
    async def responses(request: Request) -> Response:
        body = await request.json()
        script.requests.append(body)
        script.headers.append(dict(request.headers))
        if script.mode == "status500":
            return JSONResponse({"error": {"message": "model exploded", "type": "server_error", "code": "boom"}}, status_code=500)

        async def stream() -> AsyncIterator[bytes]:
            try:
                if script.mode == "flood":
                    yield FLOOD_HEAD
                    n = 0
                    while script.sent_bytes < script.flood_bytes:
                        event = flood_event(n)
                        script.sent_bytes += len(event)
                        n += 1
                        yield event
                    return
                data = script.body
                for i in range(0, len(data), script.chunk):
                    piece = data[i : i + script.chunk]
                    if script.mode == "cut" and i + script.chunk >= len(data) // 2:
                        yield piece[: len(piece) // 2]
                        raise RuntimeError("upstream cut on purpose")
                    script.sent_bytes += len(piece)
                    yield piece
                    if script.pace:
                        await asyncio.sleep(script.pace)
                if script.mode == "stall":
                    await asyncio.sleep(3600)
                script.finished = True
            finally:
                script.closed_at = time.monotonic()

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])


@contextlib.contextmanager
def serve(app: Any, *, sndbuf: int | None = None) -> Iterator[str]:
    """Run ``app`` under uvicorn on 127.0.0.1 in a background thread; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sndbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="auto", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def wait_for(predicate: Any, timeout: float, what: str) -> float:
    """Poll ``predicate`` until true; return the seconds it took (fails after ``timeout``)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)
    return time.monotonic() - start


def mcp_app() -> Any:
    """A real MCP server (the official SDK) with two tools, over streamable HTTP."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("calc")

    @server.tool()
    def multiply(a: float, b: float) -> float:
        """Multiply two numbers."""
        return a * b

    @server.tool()
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    return server.streamable_http_app()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(base: str) -> bool:
    """``GET /health`` answers 200 (``base``: the server's root URL)."""
    try:
        return httpx.get(base + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@contextlib.contextmanager
def replica(upstream: str, store: str, *extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``respflow serve`` in its own process on ``store``; yields its base URL (…/v1) and the
    process. Its log goes to a file (a pipe could fill), shown if it fails to start."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "respflow", "serve", "--upstream", upstream, "--port", str(port), "--store", store, *extra],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: healthy(base) or proc.poll() is not None, 60, "the replica to start")
            if proc.poll() is not None:
                log.seek(0)
                raise AssertionError(log.read().decode())
            yield base + "/v1", proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
