"""The upstream transport: POST ``{base}/responses`` with httpx, stream the body as bytes.

Errors are mapped onto `UpstreamError` with a stable code and the HTTP status a gateway should
answer with: ``upstream_unreachable`` (502), ``upstream_connect_timeout`` (504),
``upstream_status`` (the upstream's own status, with a bounded excerpt of its body),
``upstream_disconnected`` (the body was cut), ``upstream_timeout`` (504; raised by the runner,
which times each read — never time parked on backpressure).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any

import httpx
import orjson

from respflow.operators import UpstreamError

ERROR_BODY_BYTES = 4096
"""How much of an upstream error body is read (and at most 300 characters are shown)."""

_HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "accept-encoding"}


def default_client(*, connect_timeout: float = 10.0, socket_options: list[Any] | None = None) -> httpx.AsyncClient:
    """An httpx client for upstream streams: connect timeout only (reads are timed per read)."""
    transport = httpx.AsyncHTTPTransport(socket_options=socket_options) if socket_options else None
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=connect_timeout, read=None, write=connect_timeout, pool=connect_timeout),
        transport=transport,
    )


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Request headers to pass upstream (auth included; hop-by-hop ones dropped)."""
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}


async def open_stream(
    client: httpx.AsyncClient,
    base_url: str,
    body: Mapping[str, Any],
    *,
    headers: Mapping[str, str] | None = None,
) -> httpx.Response:
    """Send the request; return the streaming response once its status is known to be 2xx.

    Raises:
        UpstreamError: unreachable, connect timeout, or a non-2xx status (body excerpt kept).
    """
    url = base_url.rstrip("/") + "/responses"
    send_headers = {"content-type": "application/json", "accept": "text/event-stream"}
    send_headers.update(forward_headers(headers or {}))
    request = client.build_request("POST", url, content=orjson.dumps(body), headers=send_headers)
    try:
        response = await client.send(request, stream=True)
    except httpx.ConnectTimeout:
        raise _upstream_error(
            f"could not connect to the upstream at {_origin(url)} in time", "upstream_connect_timeout", 504
        ) from None
    except (httpx.ConnectError, httpx.NetworkError, httpx.UnsupportedProtocol) as exc:
        raise _upstream_error(
            f"could not reach the upstream at {_origin(url)}: {type(exc).__name__}", "upstream_unreachable"
        ) from None
    if response.status_code >= 300:
        excerpt = await _read_bounded(response)
        await response.aclose()
        raise UpstreamError(
            f"the upstream answered HTTP {response.status_code}: {excerpt[:300]}",
            code="upstream_status",
            status=response.status_code,
            body_excerpt=excerpt,
            stage="transport",
        )
    return response


JSON_BODY_BYTES = 16 << 20
"""The largest non-streamed JSON Response body accepted from an upstream."""


def json_as_sse(response: Mapping[str, Any]) -> bytes:
    """A complete (non-streamed) Response object as the SSE stream that would have carried it:
    created, in_progress, each output item added and done, then the terminal event."""
    status = response.get("status") or "completed"
    snapshot = {k: v for k, v in response.items() if k not in ("output", "usage")}
    head = dict(snapshot, status="in_progress", output=[])
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": head},
        {"type": "response.in_progress", "response": head},
    ]
    output = response.get("output")
    for index, item in enumerate(output if isinstance(output, list) else []):
        if isinstance(item, dict):
            events.append({"type": "response.output_item.added", "output_index": index, "item": item})
            events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    terminal = {"completed": "response.completed", "failed": "response.failed", "incomplete": "response.incomplete"}
    events.append({"type": terminal.get(str(status), "response.completed"), "response": dict(response)})
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)


async def body_bytes(response: httpx.Response) -> AsyncGenerator[bytes, None]:
    """The response body as it arrives; closes the response when done, cut or cancelled.

    An upstream that answers a streaming request with a plain JSON Response (it ignored
    ``stream``) is read whole (bounded) and turned into the equivalent SSE stream, so nothing
    it said is lost.
    """
    try:
        if response.headers.get("content-type", "").startswith("application/json"):
            yield json_as_sse(await _json_body(response))
            return
        async for chunk in response.aiter_bytes():
            if chunk:
                yield chunk
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.NetworkError) as exc:
        raise _upstream_error(
            f"the upstream connection was cut mid-stream ({type(exc).__name__})", "upstream_disconnected"
        ) from None
    finally:
        await response.aclose()


async def _json_body(response: httpx.Response) -> dict[str, Any]:
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) > JSON_BODY_BYTES:
            raise _upstream_error(f"the upstream's JSON body is over {JSON_BODY_BYTES} bytes", "upstream_status")
    try:
        parsed = orjson.loads(bytes(data))
    except orjson.JSONDecodeError:
        raise _upstream_error("the upstream answered with JSON that does not parse", "upstream_status") from None
    if not isinstance(parsed, dict):
        raise _upstream_error("the upstream's JSON body is not a Response object", "upstream_status")
    return parsed


def _upstream_error(message: str, code: str, status: int = 502) -> UpstreamError:
    return UpstreamError(message, code=code, status=status, stage="transport")


async def _read_bounded(response: httpx.Response) -> str:
    data = bytearray()
    try:
        async for chunk in response.aiter_bytes():
            data += chunk
            if len(data) >= ERROR_BODY_BYTES:
                break
    except httpx.HTTPError:
        pass
    text = bytes(data[:ERROR_BODY_BYTES]).decode("utf-8", "replace")
    return " ".join(text.split())


def _origin(url: str) -> str:
    parsed = httpx.URL(url)
    return f"{parsed.scheme}://{parsed.host}:{parsed.port or ''}".rstrip(":")
