"""The drivers: thin loops around one Graph (one AgentPipeline).

| driver    | side  | validation | core runs on       | relay               |
|-----------|-------|------------|--------------------|---------------------|
| `live`    | async | lenient    | worker (or inline) | relay sink → client |
| `collect` | async | lenient    | worker (or inline) | none: the Response  |
| `decode`  | sync  | strict     | inline             | none: the Response  |
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from aiostream import stream

from respflow.flows._graph import Graph, GraphRun
from respflow.flows._runner import Placement, batches
from respflow.operators import (
    Limits,
    RelayError,
    RespflowError,
    Response,
    ToolRegistry,
    Translation,
    Validation,
)
from respflow.sinks import ChannelSink, Relay, Sink, relayed


def _graph(
    graph: Graph | None,
    validation: Validation,
    response_id: str | None,
    model: str | None,
    tools: ToolRegistry | None,
    limits: Limits | None,
) -> Graph:
    if graph is not None:
        return graph
    return Graph(validation=validation, response_id=response_id, model=model, tools=tools, limits=limits)


async def _aiter(chunks: Iterable[bytes] | AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    if isinstance(chunks, AsyncIterable):
        async for chunk in chunks:
            yield chunk
    else:
        for chunk in chunks:
            yield chunk


async def live(
    source: AsyncIterable[bytes] | Iterable[bytes],
    sink: Sink,
    *,
    graph: Graph | None = None,
    validation: Validation = Validation.LENIENT,
    response_id: str | None = None,
    model: str | None = None,
    previous_response_id: str | None = None,
    tools: ToolRegistry | None = None,
    limits: Limits | None = None,
    placement: Placement = "worker",
    out_max: int = 8,
    inline_max_bytes: int = 4096,
    client_stall_timeout: float = 60.0,
    stats: dict[str, Any] | None = None,
    unknown_events: str = "forward",
) -> Response:
    """Stream ``source`` (upstream SSE bytes) through the graph to ``sink`` as client SSE.

    Sends one terminal built from the final Response and returns that Response. On an
    upstream, core or limit error the sink gets every frame produced before it, then an
    ``error`` event, and the error is raised. A client that stops reading for longer than
    ``client_stall_timeout`` seconds (0 disables) aborts the stream (`RelayError`).
    """
    graph = _graph(graph, validation, response_id, model, tools, limits)
    relay = Relay(
        _StallGuard(sink, client_stall_timeout),
        response_id=graph.response_id,
        model=model,
        previous_response_id=previous_response_id,
        limits=graph.limits,
        unknown_events=unknown_events,
    )
    reads = batches(
        _aiter(source),
        GraphRun(graph),
        placement=placement,
        out_max=out_max,
        inline_max_bytes=inline_max_bytes,
        read_timeout=graph.limits.read_timeout,
        stats=stats,
    )
    try:
        async with (stream.iterate(reads) | relayed.pipe(relay)).stream() as relaying:
            async for _ in relaying:
                pass
        await relay.drain()
        response = graph.finish()
        await relay.complete(response)
        return response
    except RelayError:
        raise  # the client side failed: nothing more can be sent to it
    except Exception as exc:  # a RespflowError, or a bug: either way the client gets an error event
        await _fail(relay, exc, graph)
        raise


def _items_so_far(graph: Graph) -> list[dict[str, Any]]:
    """What the response holds so far, in public shapes (for the failed terminal)."""
    try:
        registry = graph.pipeline.translator.registry
        return [i for i in (registry.restore_item(item) for item in graph.pipeline.folder.output()) if i is not None]
    except Exception:  # the fold itself failed: nothing more can be said
        return []


async def _fail(relay: Relay, exc: Exception, graph: Graph) -> None:
    if relay.finished:
        return
    try:
        if isinstance(exc, RespflowError) and exc.partial:
            await relay.emit_upstream(Translation(exc.partial, None))
        status = getattr(exc, "status", None)
        default = 502 if isinstance(exc, RespflowError) else 500
        await relay.fail(exc, status=status if isinstance(status, int) else default, output=_items_so_far(graph))
    except (RespflowError, OSError):
        pass  # the original error is what the caller must see


class _StallGuard:
    """A sink whose sends must complete within ``timeout`` seconds."""

    def __init__(self, sink: Sink, timeout: float) -> None:
        self._sink = sink
        self._timeout = timeout

    async def send(self, data: bytes) -> None:
        if self._timeout <= 0:
            await self._sink.send(data)
            return
        try:
            async with asyncio.timeout(self._timeout):
                await self._sink.send(data)
        except TimeoutError:
            raise RelayError(
                f"the client did not take data for {self._timeout:g} s; the stream was aborted",
                code="client_stalled",
                stage="relay",
            ) from None

    async def aclose(self) -> None:
        await self._sink.aclose()


async def collect(
    source: AsyncIterable[bytes] | Iterable[bytes],
    *,
    graph: Graph | None = None,
    validation: Validation = Validation.LENIENT,
    response_id: str | None = None,
    model: str | None = None,
    tools: ToolRegistry | None = None,
    limits: Limits | None = None,
    placement: Placement = "worker",
    out_max: int = 8,
    inline_max_bytes: int = 4096,
) -> Response:
    """Fold ``source`` into the final Response (no client stream). Raises the typed error."""
    graph = _graph(graph, validation, response_id, model, tools, limits)
    async for _ in batches(
        _aiter(source),
        GraphRun(graph),
        placement=placement,
        out_max=out_max,
        inline_max_bytes=inline_max_bytes,
        read_timeout=graph.limits.read_timeout,
    ):
        pass
    return graph.finish()


def decode(
    chunks: bytes | Iterable[bytes],
    *,
    graph: Graph | None = None,
    validation: Validation = Validation.STRICT,
    response_id: str | None = None,
    model: str | None = None,
    tools: ToolRegistry | None = None,
    limits: Limits | None = None,
) -> Response:
    """Fold a whole SSE body (bytes, or chunks of it) into the final Response, synchronously.

    Raises:
        RespflowError: a framing error, a protocol violation (strict), a limit exceeded.
    """
    graph = _graph(graph, validation, response_id, model, tools, limits)
    run = GraphRun(graph)
    for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
        run.process(chunk)
        if run.done:
            break
    run.close()
    return graph.finish()


async def sse_body(run: Callable[[Sink], Awaitable[Any]], *, buffered: int = 1) -> AsyncIterator[bytes]:
    """An HTTP response body (e.g. for Starlette's ``StreamingResponse``) fed by ``run(sink)``.

    ``run`` — typically ``lambda sink: live(source, sink, …)`` — runs as a task writing into a
    bounded `ChannelSink`; this iterator yields what it wrote. When the consumer stops (the
    client went away), the task is cancelled, which closes the upstream. An error ``run``
    raises after the stream started has already been sent as an ``error`` event.
    """
    sink = ChannelSink(buffered)

    async def produce() -> None:
        try:
            await run(sink)
        except RespflowError:
            pass  # already relayed as an error event
        finally:
            await sink.aclose()

    task = asyncio.ensure_future(produce())
    try:
        async for chunk in sink:
            yield chunk
        await task
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
