"""relay_bytes: relay a recorded stream to a sink inline (the ``respflow relay`` driver)."""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable

from operators import AgentPipeline, Limits, LineSplitter, Response, ToolRegistry, Validation
from sinks import Relay, Sink


async def relay_bytes(
    chunks: Iterable[bytes] | AsyncIterable[bytes],
    sink: Sink,
    *,
    validation: Validation = Validation.LENIENT,
    response_id: str | None = None,
    model: str | None = None,
    tools: ToolRegistry | None = None,
    limits: Limits | None = None,
) -> Response:
    """Run a whole SSE body through the pipeline and the relay; returns the final Response.

    No gateway tools run here: frames deferred behind a gateway-owned call are drained at the
    end, in the relay's order. A failure is sent to the sink as an ``error`` event (after every
    frame produced before it) and then raised.
    """
    limits = limits or Limits()
    pipeline = AgentPipeline(
        validation=validation, response_id=response_id, model=model, tools=tools, limits=limits
    )
    splitter = LineSplitter(max_line_bytes=limits.max_line_bytes)
    relay: Relay | None = None

    def relay_for() -> Relay:
        return Relay(sink, response_id=pipeline.folder.response_id, model=model, limits=limits)

    try:
        if isinstance(chunks, AsyncIterable):
            async for chunk in chunks:
                translation = pipeline.push_all(splitter.feed(chunk))
                relay = relay or relay_for()
                await relay.emit_upstream(translation)
                if splitter.done:
                    break
        else:
            for chunk in chunks:
                translation = pipeline.push_all(splitter.feed(chunk))
                relay = relay or relay_for()
                await relay.emit_upstream(translation)
                if splitter.done:
                    break
        translation = pipeline.push_all(splitter.flush())
        relay = relay or relay_for()
        await relay.emit_upstream(translation)
        tail = pipeline.flush()
        tail.defer_from = None
        await relay.emit_upstream(tail)
        await relay.drain()
        response = pipeline.finish()
        await relay.complete(response)
        return response
    except Exception as exc:
        relay = relay or relay_for()
        partial = getattr(exc, "partial", None)
        if partial:
            await relay.emit_upstream(partial)
        if not relay.finished:
            await relay.fail(exc)
        raise
