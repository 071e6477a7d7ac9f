"""The serving benchmark's parts, each a small asyncio program run in its own process.

* `paced_upstream` — a Responses upstream (``POST …/responses``) that streams one message at
  the pace the request asks for (``metadata: {"rate": R, "events": E, "cut": K}``): every text
  delta carries its send time (``<1712345678.123456>``), so a client measures per-event latency
  end to end; ``cut`` ends the body after K deltas without a terminal (an upstream that cuts).
* `byte_pipe` — the baseline: an asyncio proxy that moves bytes and parses nothing.
* `swarm` — N concurrent streaming clients; per-event latency (receive - send) p50/p99/max,
  events received, errors (a stream that ends without a terminal event is one).

``python -m respflow.flows._loadgen upstream PORT | pipe UPSTREAM_PORT PORT |
swarm URL N RATE EVENTS [background=1] [resume=K]`` runs one of them (the swarm prints one
JSON line; ``background=1`` sends ``background: true``; ``resume=K`` cuts each stream after K
deltas and, 0.3 s later, resumes it with ``GET …/responses/{id}?stream=true&starting_after=N``,
reporting the reconnect → first replayed event time).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from dataclasses import dataclass
from typing import Any


def _event(data: dict[str, Any]) -> bytes:
    kind: str = data["type"]
    return b"event: " + kind.encode() + b"\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


class _Numbered:
    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, data: dict[str, Any]) -> bytes:
        data["sequence_number"] = self.seq
        self.seq += 1
        return _event(data)


async def _read_request(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    body = json.loads(await reader.readexactly(length) or b"{}")
    return body if isinstance(body, dict) else None


async def _serve_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        body = await _read_request(reader)
        if body is None:
            return
        meta = body.get("metadata") or {}
        rate, events = float(meta.get("rate", 20)), int(meta.get("events", 100))
        cut = int(meta["cut"]) if "cut" in meta else None
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")

        def send(data: bytes) -> None:
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))

        ev = _Numbered()
        resp = {
            "id": "resp_up",
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "model": str(body.get("model", "m")),
            "output": [],
            "tools": [],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
        }
        item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        send(
            ev({"type": "response.created", "response": resp})
            + ev({"type": "response.in_progress", "response": resp})
            + ev({"type": "response.output_item.added", "output_index": 0, "item": item})
            + ev(
                {
                    "type": "response.content_part.added",
                    "item_id": "msg_1",
                    "output_index": 0,
                    "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []},
                }
            )
        )
        texts: list[str] = []
        t0 = time.monotonic()
        for i in range(events):
            if cut is not None and i >= cut:
                writer.write(b"0\r\n\r\n")  # a clean end of the body, but no terminal event
                await writer.drain()
                return
            if rate > 0:
                await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
            delta = f"<{time.time():.6f}>"
            texts.append(delta)
            send(
                ev(
                    {
                        "type": "response.output_text.delta",
                        "item_id": "msg_1",
                        "output_index": 0,
                        "content_index": 0,
                        "delta": delta,
                        "logprobs": [],
                    }
                )
            )
            await writer.drain()
        text = "".join(texts)
        part = {"type": "output_text", "text": text, "annotations": []}
        done = dict(item, status="completed", content=[part])
        usage = {"input_tokens": 1, "output_tokens": events, "total_tokens": events + 1}
        send(
            ev({"type": "response.output_text.done", "item_id": "msg_1", "output_index": 0, "content_index": 0, "text": text, "logprobs": []})
            + ev({"type": "response.content_part.done", "item_id": "msg_1", "output_index": 0, "content_index": 0, "part": part})
            + ev({"type": "response.output_item.done", "output_index": 0, "item": done})
            + ev({"type": "response.completed", "response": dict(resp, status="completed", output=[done], usage=usage)})
        )
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, RuntimeError):
        pass  # the client went away (uvloop says so with a RuntimeError on a closed transport)
    finally:
        writer.close()


async def paced_upstream(port: int, ready: asyncio.Event | None = None) -> None:
    """Serve the paced upstream on 127.0.0.1:``port`` until cancelled."""
    server = await asyncio.start_server(_serve_stream, "127.0.0.1", port, backlog=4096)
    async with server:
        if ready is not None:
            ready.set()
        await server.serve_forever()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except Exception:  # a closed peer ends the pipe
        pass
    finally:
        writer.close()


async def byte_pipe(upstream_port: int, port: int) -> None:
    """The baseline proxy: bytes both ways, nothing parsed."""

    async def handle(creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        ureader, uwriter = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(_pipe(creader, uwriter), _pipe(ureader, cwriter))

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def forward_proxy(upstream_port: int, port: int) -> None:
    """The serving stack alone: uvicorn (httptools) and aiohttp on uvloop, forwarding the
    upstream body chunk by chunk — no parsing, no graph, no relay. What respflow serve pays on
    top of this is the pipeline's own cost."""
    import aiohttp
    import uvicorn

    session: list[aiohttp.ClientSession] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if not session:
            session.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)))
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        response = await session[0].post(
            f"http://127.0.0.1:{upstream_port}/v1/responses", data=body, headers={"content-type": "application/json"}
        )
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        while chunk := await response.content.readany():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        response.release()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, http="httptools", lifespan="on")
    _fast_loop()
    asyncio.run(uvicorn.Server(config).serve())


_TERMINAL_MARKS = (b"response.completed", b"response.failed", b"response.incomplete")


@dataclass
class _Stream:
    """What one client stream saw, for a background stream cut and resumed."""

    response_id: str | None = None
    last_seq: int = -1
    terminal: str | None = None


_SEQ = re.compile(rb'"sequence_number":(\d+)')


async def _read_stream(
    reader: asyncio.StreamReader,
    latencies: list[float],
    state: _Stream,
    *,
    abandon_after: int | None = None,
    first_event: list[float] | None = None,
) -> str:
    """Read an SSE answer: ``ended``, ``abandoned`` (after ``abandon_after`` deltas) or
    ``cut`` (the connection closed before a terminal). Records each delta's latency, the
    response id and the last sequence number, and (``first_event``) when the first frame came."""
    buffer = b""
    seen = 0
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            return "cut"
        now = time.time()
        buffer += chunk
        lines = buffer.split(b"\n")
        buffer = lines.pop()
        ended = False
        for line in lines:
            if line.startswith(b"data:"):
                if first_event is not None and not first_event:
                    first_event.append(time.monotonic())
                seq = _SEQ.search(line)
                if seq is not None:
                    number = int(seq.group(1))
                    if number != state.last_seq + 1 and state.response_id is not None:
                        raise RuntimeError(f"event {number} after {state.last_seq}")
                    state.last_seq = number
                if state.response_id is None:
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        state.response_id = str(json.loads(line[5:])["response"]["id"])
                if b"output_text.delta" in line:
                    i = line.find(b"<")
                    j = line.find(b">", i)
                    if 0 <= i < j:
                        with contextlib.suppress(ValueError):
                            latencies.append(now - float(line[i + 1 : j]))
                            seen += 1
            elif line.startswith(b"event:") and any(m in line for m in _TERMINAL_MARKS):
                ended = True
                state.terminal = line[7:].strip().decode()
        if ended:
            return "ended"
        if abandon_after is not None and seen >= abandon_after:
            return "abandoned"


async def _one(
    host: str,
    port: int,
    path: str,
    rate: float,
    events: int,
    latencies: list[float],
    errors: list[str],
    abandon_after: int | None,
    *,
    background: bool = False,
    resume_after: int | None = None,
    resumes: list[float] | None = None,
) -> None:
    """One stream. ``background``: a ``background: true`` request; ``resume_after``: cut it
    after that many deltas and resume it (GET …?stream=true&starting_after=N), recording the
    reconnect → first replayed event time in ``resumes``."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
        request: dict[str, Any] = {"model": "m", "input": "x", "stream": True, "metadata": {"rate": rate, "events": events}}
        if background:
            request["background"] = True
        body = json.dumps(request).encode()
        writer.write(
            b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (path.encode(), host.encode(), len(body), body)
        )
        await writer.drain()
        state = _Stream()
        cut = resume_after if resume_after is not None else abandon_after
        outcome = await _read_stream(reader, latencies, state, abandon_after=cut)
        writer.close()
        if outcome == "abandoned" and resume_after is not None and resumes is not None:
            await asyncio.sleep(0.3)  # away for a while: events to replay when it comes back
            started = time.monotonic()
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(
                b"GET %s/%s?stream=true&starting_after=%d HTTP/1.1\r\nhost: %s\r\n\r\n"
                % (path.encode(), str(state.response_id).encode(), state.last_seq, host.encode())
            )
            await writer.drain()
            first: list[float] = []
            outcome = await _read_stream(reader, latencies, state, first_event=first)
            writer.close()
            if first:
                resumes.append(first[0] - started)
        if outcome == "cut":
            errors.append("stream ended without a terminal event")
        elif state.terminal is not None and state.terminal != "response.completed":
            errors.append(f"stream ended {state.terminal}")
    except Exception as exc:  # the benchmark counts failures
        errors.append(repr(exc)[:200])


async def soak_stream(host: str, port: int, path: str, *, rate: float, events: int, cut: int | None, abandon_after: int | None) -> str:
    """One soak client; what it saw: ``completed``, ``failed``, ``abandoned`` or ``malformed: …``.

    A well-formed stream starts with ``response.created``, numbers its events 0..N without a
    gap and ends with exactly one terminal event.
    """
    reader, writer = await asyncio.open_connection(host, port)
    try:
        meta: dict[str, Any] = {"rate": rate, "events": events}
        if cut is not None:
            meta["cut"] = cut
        body = json.dumps({"model": "m", "input": "x", "stream": True, "metadata": meta}).encode()
        writer.write(
            b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (path.encode(), host.encode(), len(body), body)
        )
        await writer.drain()
        buffer = b""
        seq = 0
        deltas = 0
        terminal: str | None = None
        while terminal is None:
            chunk = await reader.read(65536)
            if not chunk:
                return "malformed: the stream ended without a terminal event"
            buffer += chunk
            lines = buffer.split(b"\n")
            buffer = lines.pop()
            for line in lines:
                if not line.startswith(b"data: "):
                    continue
                event = json.loads(line[6:])
                if event.get("sequence_number") != seq or (seq == 0 and event.get("type") != "response.created"):
                    return f"malformed: event {seq} is {event.get('type')} #{event.get('sequence_number')}"
                seq += 1
                kind = event.get("type")
                if kind == "response.output_text.delta":
                    deltas += 1
                elif kind in ("response.completed", "response.failed", "response.incomplete"):
                    terminal = kind.rsplit(".", 1)[1]
            if abandon_after is not None and deltas >= abandon_after:
                return "abandoned"
        return terminal
    finally:
        writer.close()


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile of sorted ``values`` (nearest rank), or None."""
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


async def swarm(
    url: str,
    streams: int,
    rate: float,
    events: int,
    *,
    abandon_after: int | None = None,
    background: bool = False,
    resume_after: int | None = None,
) -> dict[str, Any]:
    """Open ``streams`` concurrent streams against ``url`` (…/v1/responses); their statistics."""
    hostport, _, path = url.removeprefix("http://").partition("/")
    host, _, port = hostport.partition(":")
    latencies: list[float] = []
    errors: list[str] = []
    resumes: list[float] = []
    t0 = time.time()
    await asyncio.gather(
        *(
            _one(
                host,
                int(port),
                "/" + path,
                rate,
                events,
                latencies,
                errors,
                abandon_after,
                background=background,
                resume_after=resume_after,
                resumes=resumes,
            )
            for _ in range(streams)
        )
    )
    latencies.sort()
    resumes.sort()

    def ms(q: float, values: list[float] = latencies) -> float | None:
        v = quantile(values, q)
        return None if v is None else round(1000 * v, 2)

    extra: dict[str, Any] = {}
    if resume_after is not None:
        extra = {"resumed": len(resumes), "resume_p50_ms": ms(0.5, resumes), "resume_p99_ms": ms(0.99, resumes)}
    return {
        **extra,
        "streams": streams,
        "events": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "p50_ms": ms(0.5),
        "p99_ms": ms(0.99),
        "max_ms": ms(1.0),
        "wall_s": round(time.time() - t0, 2),
    }


def _fast_loop() -> None:
    try:
        import uvloop
    except ImportError:  # the stdlib loop, where uvloop has no wheel
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str]) -> None:
    role = argv[0]
    if role == "upstream":
        _fast_loop()
        asyncio.run(paced_upstream(int(argv[1])))
    elif role == "pipe":
        asyncio.run(byte_pipe(int(argv[1]), int(argv[2])))
    elif role == "forward":
        forward_proxy(int(argv[1]), int(argv[2]))
    elif role == "pipe-uvloop":
        _fast_loop()
        asyncio.run(byte_pipe(int(argv[1]), int(argv[2])))
    elif role == "swarm":
        _fast_loop()
        options = dict(a.split("=", 1) for a in argv[5:])
        stats = swarm(
            argv[1],
            int(argv[2]),
            float(argv[3]),
            int(argv[4]),
            background=options.get("background") == "1",
            resume_after=int(options["resume"]) if "resume" in options else None,
        )
        print(json.dumps(asyncio.run(stats)), flush=True)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
