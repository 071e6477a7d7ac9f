"""decode: the synchronous driver — bytes in, Response out, strict by default, inline."""

from __future__ import annotations

from collections.abc import Iterable

from operators import AgentPipeline, Limits, LineSplitter, Response, ToolRegistry, Validation


def decode(
    chunks: bytes | Iterable[bytes],
    *,
    validation: Validation = Validation.STRICT,
    response_id: str | None = None,
    model: str | None = None,
    tools: ToolRegistry | None = None,
    limits: Limits | None = None,
) -> Response:
    """Fold a whole SSE body (one bytes object, or chunks of it) into the final Response.

    Raises:
        RespflowError: a framing error, a protocol violation (strict), a limit exceeded.
    """
    limits = limits or Limits()
    pipeline = AgentPipeline(
        validation=validation, response_id=response_id, model=model, tools=tools, limits=limits
    )
    splitter = LineSplitter(max_line_bytes=limits.max_line_bytes)
    for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
        pipeline.push_all(splitter.feed(chunk))
        if splitter.done:
            break
    pipeline.push_all(splitter.flush())
    pipeline.flush()
    return pipeline.finish()
