"""The upstream transport: POST ``{base}/responses`` with aiohttp, read the body as it arrives.

`Upstream` is the client of one gateway (one aiohttp session, made on first use inside the
running loop). Its connection pool is explicit: at most ``max_connections`` upstream
connections, a request that waits longer than ``pool_timeout`` for one gets a typed
``upstream_pool_exhausted`` (503) — never a library default cap or an untyped timeout.
`UpstreamBody` is one streaming answer: ``await read()`` returns the bytes that arrived since
the last read (``b""`` at the end) — one call per read, no async-generator layers.

Errors are mapped onto `UpstreamError` with a stable code and the HTTP status a gateway should
answer with: ``upstream_unreachable`` (502), ``upstream_connect_timeout`` (504),
``upstream_pool_exhausted`` (503), ``upstream_status`` (the upstream's own status, with a
bounded excerpt of its body), ``upstream_disconnected`` (the body was cut), ``upstream_timeout``
(504; raised by the runner, which times each read — never time parked on backpressure).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import aiohttp
import orjson
from yarl import URL

from respflow.operators import UpstreamError

ERROR_BODY_BYTES = 4096
"""How much of an upstream error body is read (and at most 300 characters are shown)."""

JSON_BODY_BYTES = 16 << 20
"""The largest non-streamed JSON Response body accepted from an upstream."""

READ_BUFFER = 64 << 10
"""aiohttp's read buffer per connection: a read returns at most about twice this."""

_HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "accept-encoding"}
_SEND_HEADERS = {"content-type": "application/json", "accept": "text/event-stream"}

SocketOption = tuple[int, int, int]


class Upstream:
    """The upstream client of one gateway: an aiohttp session with an explicit pool bound."""

    def __init__(
        self,
        *,
        max_connections: int = 1024,
        pool_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        socket_options: Sequence[SocketOption] = (),
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.max_connections = max_connections
        self.pool_timeout = pool_timeout
        self.connect_timeout = connect_timeout
        self._socket_options = list(socket_options)
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None
        self._slots: asyncio.Semaphore | None = None

    def _socket_factory(self) -> Callable[[Any], socket.socket] | None:
        options = self._socket_options
        if not options:
            return None

        def make_socket(addr: Any) -> socket.socket:
            family, type_, proto, _, _ = addr
            sock = socket.socket(family=family, type=type_, proto=proto)
            for level, name, value in options:
                sock.setsockopt(level, name, value)
            return sock

        return make_socket

    def session(self) -> aiohttp.ClientSession:
        """The aiohttp session (made on first use, inside the running loop)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=0,  # the bound is ours (`_slots`): a typed error, not a silent queue
                keepalive_timeout=30,
                ttl_dns_cache=300,
                socket_factory=self._socket_factory(),
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout, sock_read=None),
                read_bufsize=READ_BUFFER,
                skip_auto_headers=("user-agent",),
            )
            self._slots = asyncio.Semaphore(self.max_connections)
        return self._session

    def _fresh_session(self) -> aiohttp.ClientSession:
        """A session that never reuses a connection (for the one retry after a stale one)."""
        if self._fresh is None or self._fresh.closed:
            self._fresh = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True, socket_factory=self._socket_factory()),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout, sock_read=None),
                read_bufsize=READ_BUFFER,
                skip_auto_headers=("user-agent",),
            )
        return self._fresh

    async def aclose(self) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None

    async def open(
        self, base_url: str, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None
    ) -> UpstreamBody:
        """Send the request; return the streaming body once its status is known to be 2xx.

        Raises:
            UpstreamError: pool exhausted, unreachable, connect timeout, or a non-2xx status.
        """
        session = self.session()
        slots = self._slots
        assert slots is not None
        url = base_url.rstrip("/") + "/responses"
        try:
            async with asyncio.timeout(self.pool_timeout):
                await slots.acquire()
        except TimeoutError:
            raise UpstreamError(
                f"all {self.max_connections} upstream connections are busy (waited {self.pool_timeout:g} s); "
                "raise the gateway's max_connections or lower its max_streams",
                code="upstream_pool_exhausted",
                status=503,
                stage="transport",
            ) from None
        send_headers = dict(_SEND_HEADERS)
        send_headers.update(forward_headers(headers or {}))
        data = orjson.dumps(body)
        try:
            try:
                response = await session.post(url, data=data, headers=send_headers)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if isinstance(exc, aiohttp.ClientConnectorError):
                    raise  # no connection was made: nothing to retry on another one
                # a kept-alive connection the upstream had closed (its idle timeout raced our
                # reuse: a disconnect or a reset before any answer): the request is sent once
                # more, on a new connection (the pool may hold more such stale ones)
                response = await self._fresh_session().post(url, data=data, headers=send_headers)
        except BaseException as exc:
            slots.release()
            if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ServerTimeoutError | TimeoutError):
                raise _upstream_error(
                    f"could not connect to the upstream at {_origin(url)} in time", "upstream_connect_timeout", 504
                ) from None
            if isinstance(exc, aiohttp.ClientError | OSError):
                raise _upstream_error(
                    f"could not reach the upstream at {_origin(url)}: {type(exc).__name__}", "upstream_unreachable"
                ) from None
            raise
        upstream = UpstreamBody(response, slots)
        if response.status >= 300:
            excerpt = await upstream.read_bounded(ERROR_BODY_BYTES)
            await upstream.aclose()
            raise UpstreamError(
                f"the upstream answered HTTP {response.status}: {excerpt[:300]}",
                code="upstream_status",
                status=response.status,
                body_excerpt=excerpt,
                stage="transport",
            )
        return upstream


class UpstreamBody:
    """One upstream answer, read as it arrives. Closing it frees its pool slot once."""

    def __init__(self, response: aiohttp.ClientResponse, slots: asyncio.Semaphore | None = None) -> None:
        self._response = response
        self._content = response.content
        self._slots = slots
        self._json = response.content_type == "application/json"
        self.closed = False

    async def read(self) -> bytes:
        """The bytes that arrived since the last read; ``b""`` at the end of the body.

        An upstream that answered a streaming request with a plain JSON Response (it ignored
        ``stream``) is read whole (bounded) and returned as the equivalent SSE stream, so
        nothing it said is lost.
        """
        if self._json:
            self._json = False
            return json_as_sse(await self._json_body())
        try:
            return await self._content.readany()
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, aiohttp.ClientOSError) as exc:
            raise _upstream_error(
                f"the upstream connection was cut mid-stream ({type(exc).__name__})", "upstream_disconnected"
            ) from None

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            while chunk := await self.read():
                yield chunk
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the connection (an unfinished body is not reused) and free the pool slot."""
        if self.closed:
            return
        self.closed = True
        if self._content.at_eof():  # read to the end: the connection can be reused
            self._response.release()
        else:
            self._response.close()
        if self._slots is not None:
            self._slots.release()

    async def read_bounded(self, limit: int) -> str:
        data = bytearray()
        try:
            while len(data) < limit and (chunk := await self._content.readany()):
                data += chunk
        except aiohttp.ClientError:
            pass
        text = bytes(data[:limit]).decode("utf-8", "replace")
        return " ".join(text.split())

    async def _json_body(self) -> dict[str, Any]:
        data = bytearray()
        while chunk := await self._content.readany():
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


def default_client(
    *,
    max_connections: int = 1024,
    connect_timeout: float = 10.0,
    socket_options: Sequence[SocketOption] = (),
) -> Upstream:
    """An upstream client (connect timeout only: reads are timed per read by the runner)."""
    return Upstream(max_connections=max_connections, connect_timeout=connect_timeout, socket_options=socket_options)


async def open_stream(
    client: Upstream,
    base_url: str,
    body: Mapping[str, Any],
    *,
    headers: Mapping[str, str] | None = None,
) -> UpstreamBody:
    """``client.open(base_url, body, headers=headers)``."""
    return await client.open(base_url, body, headers=headers)


def body_bytes(body: UpstreamBody) -> AsyncIterator[bytes]:
    """The body as an async iterator of chunks (closed when done, cut or cancelled)."""
    return aiter(body)


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Request headers to pass upstream (auth included; hop-by-hop ones dropped)."""
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}


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


def _upstream_error(message: str, code: str, status: int = 502) -> UpstreamError:
    return UpstreamError(message, code=code, status=status, stage="transport")


def _origin(url: str) -> str:
    parsed = URL(url)
    return f"{parsed.scheme}://{parsed.host}:{parsed.port or ''}".rstrip(":")
