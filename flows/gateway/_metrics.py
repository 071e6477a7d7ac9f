"""The gateway's Prometheus metrics and OpenTelemetry spans.

Metrics (``GET /metrics``, Prometheus text format; with ``PROMETHEUS_MULTIPROC_DIR`` set —
``respflow serve --workers N`` sets it — every worker's values, summed):

| metric | what |
|---|---|
| ``respflow_requests_total{stream, outcome}`` | every request once: completed, incomplete, failed, cancelled, client_error, rejected, error |
| ``respflow_streams_active`` | responses being served (background runs included) |
| ``respflow_time_to_first_event_seconds`` | request received → first client event |
| ``respflow_time_to_first_token_seconds`` | request received → first text or argument delta |
| ``respflow_inter_event_seconds`` | gaps between the client events of one stream |
| ``respflow_events_relayed_total`` | client events sent |
| ``respflow_upstream_errors_total{code}`` | upstream failures by `UpstreamError` code |
| ``respflow_rounds`` | upstream rounds per response |
| ``respflow_tool_calls_total{tool, result}``, ``respflow_tool_call_seconds{tool}`` | gateway tool calls: ok, error, timeout |
| ``respflow_backpressure_wait_seconds_total`` | time the pump spent parked on a full buffer |
| ``respflow_client_stalls_total`` | streams aborted because the client stopped reading |
| ``respflow_store_operation_seconds{backend, op}`` | store operations |

Labels are bounded: ``tool`` is a configured gateway or hosted tool's name, ``mcp`` for every
tool of a request-declared MCP server; no ids, no model names.

The hot path records per relayed batch into a `StreamMeter` of the stream's own (plain
numbers, no lock) and adds them to the metrics once, when the stream ends.

Spans (OpenTelemetry; a no-op unless a tracer provider is set — `configure_tracing` sets one from
the standard ``OTEL_*`` variables): ``POST /v1/responses`` per request, ``upstream round`` per
round (``traceparent`` goes upstream), ``tool call`` per gateway tool call, ``store <op>`` per
store operation. Attributes: counts, outcomes, tool labels — never prompts, outputs, keys or ids.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import os
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import trace
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from respflow.sinks import Sink

tracer = trace.get_tracer("respflow")

_NO_SPAN: AbstractContextManager[trace.Span] = contextlib.nullcontext(trace.INVALID_SPAN)


def tracing() -> bool:
    """True once a tracer provider is set (`configure_tracing`, or the embedding app's own)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def start_span(name: str, **kwargs: Any) -> AbstractContextManager[trace.Span]:
    """``tracer.start_as_current_span(name, **kwargs)`` once a tracer provider is set; until
    then a null context that yields the invalid (non-recording) span. The API's no-op path
    still builds and enters a context manager and attaches a context: ≈ 8 µs a span, two per
    request, measured; a provider set later is used from the next span on."""
    if not tracing():
        return _NO_SPAN
    return tracer.start_as_current_span(name, **kwargs)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
GAP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
OUTCOMES = frozenset({"completed", "incomplete", "failed", "cancelled", "client_error", "rejected", "error"})
STORE_OPERATIONS = (
    "save_response",
    "get_response",
    "delete_response",
    "items",
    "page",
    "create_conversation",
    "get_conversation",
    "update_conversation",
    "delete_conversation",
    "conversation_ids",
    "add_conversation_items",
    "delete_conversation_item",
    "start_background",
    "append_many",
    "events_after",
    "update_body",
    "finish_background",
    "renew_leases",
    "request_cancel",
    "purge_expired",
)


def outcome_label(outcome: str) -> str:
    """The bounded ``outcome`` label of a log line's outcome (``client_error: bad_tools`` →
    ``client_error``)."""
    head = outcome.split(":", 1)[0].split(" ", 1)[0]
    if head in OUTCOMES:
        return head
    return "cancelled" if head == "client" else "error"  # "client disconnected" before the body


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class Metrics:
    """One process's metrics (their own registry: several gateways in one process do not clash)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        """False: nothing is recorded per stream, tool call or store operation (the A/B of
        ``respflow bench --serve --metrics-cost``; ``respflow serve --no-metrics``)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("respflow_requests_total", "Requests, each counted once when it ends.", ["stream", "outcome"], registry=r)
        self.active = Gauge("respflow_streams_active", "Responses being served now.", registry=r, multiprocess_mode="livesum")
        self.first_event = Histogram(
            "respflow_time_to_first_event_seconds", "Request received to first client event.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.first_token = Histogram(
            "respflow_time_to_first_token_seconds",
            "Request received to first text or argument delta.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_event = Histogram("respflow_inter_event_seconds", "Gaps between the client events of one stream.", buckets=GAP_BUCKETS, registry=r)
        self.events = Counter("respflow_events_relayed_total", "Client events sent.", registry=r)
        self.upstream_errors = Counter("respflow_upstream_errors_total", "Upstream failures.", ["code"], registry=r)
        self.rounds = Histogram("respflow_rounds", "Upstream rounds per response.", buckets=(1, 2, 3, 4, 5, 6, 8, 10, 15, 20), registry=r)
        self.tool_calls = Counter("respflow_tool_calls_total", "Gateway tool calls.", ["tool", "result"], registry=r)
        self.tool_seconds = Histogram("respflow_tool_call_seconds", "Gateway tool call duration.", ["tool"], buckets=LATENCY_BUCKETS, registry=r)
        self.backpressure = Counter(
            "respflow_backpressure_wait_seconds_total", "Time the pump spent parked on a full buffer.", registry=r
        )
        self.stalls = Counter("respflow_client_stalls_total", "Streams aborted because the client stopped reading.", registry=r)
        self.store_seconds = Histogram(
            "respflow_store_operation_seconds", "Store operations.", ["backend", "op"], buckets=LATENCY_BUCKETS, registry=r
        )
        self._parked_seen = 0.0

    # -- recording ---------------------------------------------------------------------------

    def request(self, stream: bool, outcome: str, rounds: int) -> None:
        if not self.enabled:
            return
        self.requests.labels("true" if stream else "false", outcome_label(outcome)).inc()
        if rounds:
            self.rounds.observe(rounds)

    def tool_call(self, tool: str, result: str, seconds: float) -> None:
        if not self.enabled:
            return
        self.tool_calls.labels(tool, result).inc()
        self.tool_seconds.labels(tool).observe(seconds)

    def add_parked(self, total: float) -> None:
        """The process's pump-parked total so far (`respflow.flows._runner.parked_seconds`)."""
        if total > self._parked_seen:
            self.backpressure.inc(total - self._parked_seen)
            self._parked_seen = total

    def meter(self, started: float) -> StreamMeter | None:
        """A new stream's meter (None when disabled)."""
        return StreamMeter(started) if self.enabled else None

    def stream_ended(self, meter: StreamMeter | None) -> None:
        """Add one stream's numbers (one call per stream, not per event)."""
        if meter is None:
            return
        if meter.events:
            self.events.inc(meter.events)
        if meter.first_event is not None:
            self.first_event.observe(meter.first_event - meter.started)
        if meter.first_token is not None:
            self.first_token.observe(meter.first_token - meter.started)
        if meter.gaps:
            _observe_many(self.inter_event, meter.counts, meter.gap_sum)

    def instrument_store(self, store: Any) -> None:
        """Time every operation of ``store`` (and give each a span)."""
        if not self.enabled:
            return
        backend = str(getattr(store, "backend", "store"))
        for op in STORE_OPERATIONS:
            method = getattr(store, op, None)
            if method is not None and not getattr(method, "_respflow_timed", False):
                setattr(store, op, self._timed(method, backend, op))

    def _timed(self, method: Callable[..., Awaitable[Any]], backend: str, op: str) -> Callable[..., Awaitable[Any]]:
        child = self.store_seconds.labels(backend, op)
        name = f"store {op}"

        @functools.wraps(method)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            with start_span(name, attributes={"respflow.store.backend": backend}):
                try:
                    return await method(*args, **kwargs)
                finally:
                    child.observe(time.perf_counter() - started)

        timed._respflow_timed = True  # type: ignore[attr-defined]
        return timed

    # -- exposition --------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The metrics in Prometheus text format (every worker's, in multiprocess mode)."""
        if multiprocess_dir() is not None:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)


def _observe_many(histogram: Histogram, counts: list[int], total: float) -> None:
    """Add bucketed observations at once (prometheus_client has no public bulk observe; its
    histogram keeps per-bucket values and a sum, which is all an observation changes)."""
    buckets = getattr(histogram, "_buckets", None)
    value_sum = getattr(histogram, "_sum", None)
    if buckets is None or value_sum is None or len(buckets) != len(counts):
        for index, count in enumerate(counts):  # the public way, one at a time
            bound = GAP_BUCKETS[index] if index < len(GAP_BUCKETS) else GAP_BUCKETS[-1] * 2
            for _ in range(count):
                histogram.observe(bound)
        return
    for bucket, count in zip(buckets, counts, strict=True):
        if count:
            bucket.inc(count)
    value_sum.inc(total)


class StreamMeter:
    """One stream's numbers, recorded per relayed batch without a lock (see `Metrics`)."""

    __slots__ = ("counts", "events", "first_event", "first_token", "gap_sum", "gaps", "last", "started")

    def __init__(self, started: float) -> None:
        self.started = started
        self.events = 0
        self.first_event: float | None = None
        self.first_token: float | None = None
        self.last = 0.0
        self.gaps = 0
        self.gap_sum = 0.0
        self.counts = [0] * (len(GAP_BUCKETS) + 1)

    def record(self, data: bytes) -> None:
        if data[:1] == b":":  # a keep-alive comment: no event
            return
        count = data.count(b"\n\n")
        if not count:
            return
        now = time.monotonic()
        if self.first_event is None:
            self.first_event = now
        else:  # the gap before this batch's first event
            gap = now - self.last
            self.counts[bisect.bisect_left(GAP_BUCKETS, gap)] += 1
            self.gap_sum += gap
            self.gaps += 1
        if count > 1:  # events sent together: no gap between them
            self.counts[0] += count - 1
            self.gaps += count - 1
        self.last = now
        self.events += count
        if self.first_token is None and (b"output_text.delta" in data or b"arguments.delta" in data):
            self.first_token = now


class MeteredSink:
    """A sink that records what goes through it into a `StreamMeter`."""

    __slots__ = ("inner", "meter")

    def __init__(self, inner: Sink, meter: StreamMeter) -> None:
        self.inner = inner
        self.meter = meter

    async def send(self, data: bytes) -> None:
        self.meter.record(data)
        await self.inner.send(data)

    async def aclose(self) -> None:
        await self.inner.aclose()


def configure_tracing() -> bool:
    """Export spans over OTLP when the standard ``OTEL_*`` variables ask for it
    (``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or
    ``OTEL_TRACES_EXPORTER=otlp|console``); otherwise leave tracing off (the API's no-op)."""
    exporter_kind = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if exporter_kind == "none" or (not exporter_kind and not endpoint):
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    if exporter_kind == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "respflow")}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True
