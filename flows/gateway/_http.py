"""The gateway's HTTP answers that are not streams: OpenAI-shaped error bodies, JSON replies."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Send

from respflow.operators import RequestError, RespflowError, UpstreamError

_JSON_HEADERS = [(b"content-type", b"application/json")]


def error_body(message: str, *, kind: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-shaped error body."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_status(exc: RespflowError) -> int:
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return status
    return 400 if isinstance(exc, RequestError) else 502


def error_payload(exc: RespflowError) -> dict[str, Any]:
    """The OpenAI-shaped body for ``exc`` (an upstream's own error message when it gave one)."""
    status = error_status(exc)
    message = exc.message
    if isinstance(exc, UpstreamError) and exc.body_excerpt:
        try:
            upstream = orjson.loads(exc.body_excerpt)
            inner = upstream.get("error") if isinstance(upstream, dict) else None
            if isinstance(inner, dict) and isinstance(inner.get("message"), str):
                message = f"upstream: {inner['message']}"
        except orjson.JSONDecodeError:
            pass
    kind = "invalid_request_error" if status < 500 else "server_error"
    return error_body(message, kind=kind, code=exc.code, param=getattr(exc, "param", None))


async def send_json(send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*_JSON_HEADERS, (b"content-length", str(len(data)).encode()), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": data, "more_body": False})


def sse_response(frames: AsyncIterator[bytes]) -> StreamingResponse:
    """An SSE answer of ``frames`` (a client that goes away ends it, nothing more)."""
    return StreamingResponse(frames, headers={"cache-control": "no-cache"}, media_type="text/event-stream")
