"""The gateway's HTTP surface: an ASGI app (a Starlette app) around one `Gateway`.

``POST /v1/responses`` — the hot path — is served by `GatewayApp` itself, before the Starlette
middleware stack: every client event passes through exactly one ``send`` (uvicorn's), not
through two middleware wrappers per event. Every other route (``GET /health``, …) is an
ordinary Starlette route.

Per request, in order: admission (over ``max_streams`` in flight → an immediate ``503`` with
``Retry-After``, never a queue), the body read (bounded: ``413``), the JSON checks (``400``),
then the run — streamed through the relay, or collected into one JSON Response. A streamed
request's client that goes away cancels the run (which closes the upstream); one that stops
reading for ``client_stall_timeout`` seconds aborts it. Every request gets one log line:
``POST /v1/responses stream=… id=… rounds=… items=… outcome=… 0.123s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from respflow.flows._runner import parked_seconds
from respflow.flows.gateway._background import Background
from respflow.flows.gateway._http import (
    error_body,
    error_payload,
    error_status,
    send_json,
    sse_response,
)
from respflow.flows.gateway._metrics import StreamMeter, outcome_label, start_span
from respflow.flows.gateway._rounds import Gateway, new_response_id
from respflow.flows.gateway._routes import state_routes
from respflow.operators import RelayError, RequestError, RespflowError, UpstreamError
from respflow.sinks.store import tenant_of

log = logging.getLogger("respflow")

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_JSON_HEADERS = [(b"content-type", b"application/json")]
_FORWARD = (b"authorization", b"openai-organization", b"openai-project")


def forwarded_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The request headers that go upstream: credentials and ``x-*`` (never logged)."""
    out: dict[str, str] = {}
    for name, value in raw:
        lowered = name.lower()
        if lowered in _FORWARD or lowered.startswith(b"x-"):
            out[lowered.decode("latin-1")] = value.decode("latin-1")
    return out


async def read_json_body(receive: Receive, headers: list[tuple[bytes, bytes]], limit: int) -> dict[str, Any]:
    """The request body as a JSON object (bounded by ``limit`` bytes).

    Raises:
        RequestError: over the limit (413), not JSON or not an object (400).
        ClientGone: the client disconnected before the body was read.
    """
    for name, value in headers:
        if name.lower() == b"content-length" and value.isdigit() and int(value) > limit:
            raise RequestError(f"the request body is over {limit} bytes", status=413, code="request_too_large")
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestError(f"the request body is over {limit} bytes", status=413, code="request_too_large")
        chunks.append(chunk)
        more = message.get("more_body", False)
    try:
        body = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError:
        raise RequestError("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", code="invalid_json")
    return body


class ClientGone(Exception):
    """The client disconnected."""


class _Watch:
    """Why a streamed request's task was cancelled, if it was."""

    __slots__ = ("finished", "reason")

    def __init__(self) -> None:
        self.reason: str | None = None
        self.finished = False


class AsgiSink:
    """Client SSE straight to the ASGI server: the response starts with the first bytes sent.

    A send that has not completed within ``stall_timeout`` seconds (the client stopped reading)
    aborts the stream: one timer per stream checks it, not one per send.
    """

    __slots__ = ("_handle", "_loop", "_meter", "_send", "_since", "_stall", "_task", "_watch", "started")

    def __init__(self, send: Send, *, stall_timeout: float, task: asyncio.Task[Any], watch: _Watch, meter: StreamMeter | None = None) -> None:
        self._send = send
        self._meter = meter
        self.started = False
        self._stall = stall_timeout
        self._task = task
        self._watch = watch
        self._since: float | None = None
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        if stall_timeout > 0:
            self._handle = self._loop.call_at(self._loop.time() + stall_timeout, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        since = self._since
        if since is not None and now - since >= self._stall and not self._watch.finished:
            if self._watch.reason is None:
                self._watch.reason = "client_stalled"
                self._task.cancel()
            return
        self._handle = self._loop.call_at((since if since is not None else now) + self._stall, self._check)

    async def send(self, data: bytes) -> None:
        self._since = self._loop.time()
        if self._meter is not None:
            self._meter.record(data)
        if not self.started:
            self.started = True
            await self._send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        await self._send({"type": "http.response.body", "body": data, "more_body": True})
        self._since = None

    async def aclose(self) -> None:
        self.stop()
        if self.started:
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def _watch_disconnect(receive: Receive, watch: _Watch, task: asyncio.Task[Any]) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            if not watch.finished and watch.reason is None:
                watch.reason = "client_disconnected"
                task.cancel()
            return


class GatewayApp(Starlette):
    """The gateway's ASGI app: the hot path first, then Starlette's routes and middleware."""

    def __init__(self, gateway: Gateway, *, max_body_bytes: int = 4 << 20) -> None:
        self.gateway = gateway
        self.max_body_bytes = max_body_bytes
        self.background: Background | None = None
        if gateway.store is not None:
            self.background = Background(
                gateway, gateway.store, retention=gateway.background_retention, lease=gateway.background_lease
            )
        background = self.background

        async def health(request: Request) -> JSONResponse:
            return JSONResponse(
                {"status": "ok", "upstream": gateway.upstream, "streams": gateway.active, "max_streams": gateway.max_streams}
            )

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            tasks: list[asyncio.Task[None]] = []
            if gateway.store is not None:
                await gateway.store.open()
                log.info("store: %s at %s", gateway.store.backend, gateway.store.where)
                # background runs' logs expire after their retention even without a --store-ttl
                tasks.append(asyncio.get_running_loop().create_task(_purge(gateway)))
            if background is not None:
                tasks.append(asyncio.get_running_loop().create_task(background.maintain()))
            try:
                yield
            finally:
                if background is not None:
                    await background.aclose()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await gateway.aclose()

        async def metrics(request: Request) -> Response:
            gateway.metrics.add_parked(parked_seconds())
            return Response(gateway.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

        routes = [Route("/health", health, methods=["GET"]), Route("/metrics", metrics, methods=["GET"]), *state_routes(gateway, background)]
        super().__init__(routes=routes, lifespan=lifespan)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            root: str = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            if path == "/v1/responses":
                with start_span("POST /v1/responses", kind=SpanKind.SERVER):
                    await self.create_response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def _done(self, stream: str, response_id: str | None, rounds: int, items: int, outcome: str, started: float) -> None:
        """A request ended: its log line, and (unless a background run counts it when it
        ends) its metrics."""
        _log_line(stream, response_id, rounds, items, outcome, started)
        span = trace.get_current_span()
        if span.is_recording():  # counts and outcomes only: no ids, prompts or outputs
            span.set_attributes({"respflow.stream": stream == "true", "respflow.outcome": outcome_label(outcome), "respflow.rounds": rounds})
        if not outcome.startswith("background:"):
            metrics = self.gateway.metrics
            metrics.request(stream == "true", outcome, rounds)
            if outcome == "client_error: client_stalled":
                metrics.stalls.inc()
            metrics.add_parked(parked_seconds())

    def _error_outcome(self, exc: RespflowError) -> str:
        if isinstance(exc, UpstreamError):
            self.gateway.metrics.upstream_errors.labels(exc.code).inc()
        return _error_outcome(exc)

    async def create_response(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/responses``."""
        started = time.monotonic()
        gateway = self.gateway
        if gateway.active >= gateway.max_streams:
            gateway.rejected += 1
            body = error_body(
                f"the gateway is at its limit of {gateway.max_streams} concurrent responses; retry shortly",
                kind="server_error",
                code="too_many_streams",
            )
            await send_json(send, 503, body, [(b"retry-after", b"1")])
            self._done("?", None, 0, 0, "rejected: too_many_streams", started)
            return
        gateway.active += 1
        gateway.metrics.active.set(gateway.active)
        passed = False  # a background run took over this admission slot
        try:
            try:
                body = await read_json_body(receive, scope["headers"], self.max_body_bytes)
            except ClientGone:
                self._done("?", None, 0, 0, "client disconnected", started)
                return
            except RequestError as exc:
                await send_json(send, error_status(exc), error_payload(exc))
                self._done("?", None, 0, 0, f"client_error: {exc.code}", started)
                return
            headers = forwarded_headers(scope["headers"])
            if body.get("background") is True and self.background is not None:
                queued = await self._queue(body, headers, send, started)
                if queued is not None:
                    passed = True
                    await self._answer_background(queued, body, headers, scope, receive, send, started)
            elif body.get("stream") is True:
                await self._streamed(body, headers, receive, send, started)
            else:
                await self._collected(body, headers, send, started)
        finally:
            if not passed:
                gateway.active -= 1
                gateway.metrics.active.set(gateway.active)

    async def _queue(self, body: Mapping[str, Any], headers: dict[str, str], send: Send, started: float) -> dict[str, Any] | None:
        """Queue a ``background: true`` request (its run takes over the admission slot); the
        queued Response, or None when it was refused (the error answered here)."""
        assert self.background is not None
        stream = "true" if body.get("stream") is True else "false"
        try:
            return await self.background.start(body, headers, tenant_of(headers.get("authorization")))
        except RespflowError as exc:
            await send_json(send, error_status(exc), error_payload(exc))
            self._done(stream, None, 0, 0, self._error_outcome(exc), started)
        except Exception:
            log.exception("the gateway failed to queue a background request")
            await send_json(send, 500, error_body("the gateway failed; see its log", kind="server_error", code="internal_error"))
            self._done(stream, None, 0, 0, "error: internal_error", started)
        return None

    async def _answer_background(
        self,
        queued: dict[str, Any],
        body: Mapping[str, Any],
        headers: dict[str, str],
        scope: Scope,
        receive: Receive,
        send: Send,
        started: float,
    ) -> None:
        """Not streamed: the queued Response at once. Streamed: the run's frames, followed
        from its log (a disconnect stops the following, never the run)."""
        assert self.background is not None
        rid = str(queued["id"])
        if body.get("stream") is not True:
            await send_json(send, 200, queued)
            self._done("false", rid, 0, 0, "background: queued", started)
            return
        follower = self.background.follow(tenant_of(headers.get("authorization")), rid, -1)
        try:
            await sse_response(follower)(scope, receive, send)
        finally:
            self._done("true", rid, 0, 0, "background: followed", started)

    async def _collected(self, body: Mapping[str, Any], headers: dict[str, str], send: Send, started: float) -> None:
        response_id = new_response_id()
        try:
            response, rounds = await self.gateway.run(
                body, headers, None, response_id=response_id, tenant=tenant_of(headers.get("authorization"))
            )
        except RespflowError as exc:
            await send_json(send, error_status(exc), error_payload(exc))
            self._done("false", response_id, 0, 0, self._error_outcome(exc), started)
            return
        except Exception:
            log.exception("the gateway failed on a request")
            await send_json(send, 500, error_body("the gateway failed; see its log", kind="server_error", code="internal_error"))
            self._done("false", response_id, 0, 0, "error: internal_error", started)
            return
        data = response.to_json()
        await send({"type": "http.response.start", "status": 200, "headers": [*_JSON_HEADERS, (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data, "more_body": False})
        self._done("false", response_id, rounds, len(response.output), response.status, started)

    async def _streamed(self, body: Mapping[str, Any], headers: dict[str, str], receive: Receive, send: Send, started: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        watch = _Watch()
        meter = self.gateway.metrics.meter(started)
        sink = AsgiSink(send, stall_timeout=self.gateway.client_stall_timeout, task=task, watch=watch, meter=meter)
        watcher = asyncio.get_running_loop().create_task(_watch_disconnect(receive, watch, task))
        response_id = new_response_id()
        outcome, rounds, items = "completed", 0, 0
        try:
            try:
                response, rounds = await self.gateway.run(
                    body, headers, sink, response_id=response_id, tenant=tenant_of(headers.get("authorization"))
                )
                items = len(response.output)
                outcome = response.status
            except asyncio.CancelledError:
                if watch.reason is None:
                    raise  # the server is shutting down
                task.uncancel()
                outcome = "cancelled: client disconnected" if watch.reason == "client_disconnected" else "client_error: client_stalled"
                return
            except RelayError as exc:
                outcome = f"client_error: {exc.code}"
                return
            except RespflowError as exc:
                outcome = self._error_outcome(exc)
                if not sink.started:
                    sink.stop()
                    await send_json(send, error_status(exc), error_payload(exc))
                    return
            except Exception as exc:
                outcome = f"error: internal_error ({type(exc).__name__})"
                log.exception("the gateway failed on a streamed request")
                if not sink.started:
                    sink.stop()
                    await send_json(send, 500, error_body("the gateway failed; see its log", kind="server_error", code="internal_error"))
                    return
            watch.finished = True
            await sink.aclose()
        finally:
            watch.finished = True
            sink.stop()
            watcher.cancel()
            self.gateway.metrics.stream_ended(meter)
            self._done("true", response_id, rounds, items, outcome, started)


async def _purge(gateway: Gateway, every: float = 60.0) -> None:
    """Delete stored rows past their retention, once a minute."""
    assert gateway.store is not None
    while True:
        await asyncio.sleep(every)
        try:
            removed = await gateway.store.purge_expired()
        except Exception as exc:  # a store that failed now may answer next time
            log.warning("store: purging expired rows failed: %s", type(exc).__name__)
            continue
        if removed:
            log.info("store: purged %d expired rows", removed)


def _error_outcome(exc: RespflowError) -> str:
    status = error_status(exc)
    return f"client_error: {exc.code}" if status < 500 else f"error: {exc.code}"


def _log_line(stream: str, response_id: str | None, rounds: int, items: int, outcome: str, started: float) -> None:
    log.info(
        "POST /v1/responses stream=%s id=%s rounds=%d items=%d outcome=%s %.3fs",
        stream,
        response_id or "-",
        rounds,
        items,
        outcome,
        time.monotonic() - started,
    )


def gateway_app(gateway: Gateway, *, max_body_bytes: int = 4 << 20) -> GatewayApp:
    """The ASGI app of ``gateway``: ``POST /v1/responses`` (streaming and not), ``GET /health``."""
    return GatewayApp(gateway, max_body_bytes=max_body_bytes)
