"""Metrics and traces with real parts: the gateway under uvicorn in front of the simulator (or a
dead upstream), the official openai client, ``GET /metrics`` parsed with prometheus_client's own
parser, spans recorded by the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from respflow.flows import Gateway, GatewayTool, gateway_app, simulator_app
from respflow.sinks.store import store_for
from tests.integration.servers import free_port, serve

pytestmark = pytest.mark.timeout(120)

NUMBERS = {"type": "object", "properties": {"numbers": {"type": "array", "items": {"type": "number"}}}, "required": ["numbers"]}
TOOL = GatewayTool("add_numbers", lambda args: str(sum(args["numbers"])), "Add numbers.", NUMBERS)


def samples(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``GET /metrics``: (name, sorted labels) → value."""
    text = httpx.get(base.removesuffix("/v1") + "/metrics").text
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def gateway() -> Iterator[str]:
    with (
        tempfile.TemporaryDirectory() as d,
        serve(simulator_app(pace=0.0)) as up,
        serve(gateway_app(Gateway(up, tools=[TOOL], store=store_for(f"sqlite:///{d}/s.db")))) as gw,
    ):
        yield gw


def test_metrics_count_what_happened(gateway: str) -> None:
    client = openai.OpenAI(base_url=gateway, api_key="sk-test", max_retries=0)
    received = 0
    for prompt in ("hello there", "add_numbers 2 and 40"):
        with client.responses.create(model="m", input=prompt, stream=True) as stream:
            received += sum(1 for _ in stream)
    plain = client.responses.create(model="m", input="not streamed")
    assert plain.status == "completed"
    bad = httpx.post(gateway + "/responses", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400
    found = samples(gateway)
    assert value(found, "respflow_requests_total", stream="true", outcome="completed") == 2
    assert value(found, "respflow_requests_total", stream="false", outcome="completed") == 1
    assert value(found, "respflow_requests_total", stream="false", outcome="client_error") == 1
    assert value(found, "respflow_streams_active") == 0
    assert value(found, "respflow_events_relayed_total") == received
    assert value(found, "respflow_time_to_first_event_seconds_count") == 2
    assert value(found, "respflow_time_to_first_token_seconds_count") == 2
    assert value(found, "respflow_inter_event_seconds_count") == received - 2  # one gap fewer than events, per stream
    assert value(found, "respflow_inter_event_seconds_bucket", le="+Inf") == received - 2
    assert value(found, "respflow_rounds_count") == 3 and value(found, "respflow_rounds_sum") == 4  # the tool call took 2
    assert value(found, "respflow_tool_calls_total", tool="add_numbers", result="ok") == 1
    assert value(found, "respflow_tool_call_seconds_count", tool="add_numbers") == 1
    assert value(found, "respflow_store_operation_seconds_count", backend="sqlite", op="save_response") == 3
    assert value(found, "respflow_client_stalls_total") == 0
    assert ("respflow_backpressure_wait_seconds_total", ()) in found


def test_a_dead_upstream_is_counted_by_its_code() -> None:
    with serve(gateway_app(Gateway(f"http://127.0.0.1:{free_port()}/v1"))) as gw:
        client = openai.OpenAI(base_url=gw, api_key="sk-test", max_retries=0)
        with pytest.raises(openai.APIStatusError):
            client.responses.create(model="m", input="x")
        with pytest.raises(openai.APIStatusError):
            list(client.responses.create(model="m", input="x", stream=True))
        found = samples(gw)
    assert value(found, "respflow_requests_total", stream="false", outcome="error") == 1
    assert value(found, "respflow_requests_total", stream="true", outcome="error") == 1
    assert value(found, "respflow_upstream_errors_total", code="upstream_unreachable") == 2
    assert value(found, "respflow_streams_active") == 0


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    """The process's tracer provider, recording into memory (set once: OTel allows one)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def test_a_two_round_request_has_its_span_tree(spans: InMemorySpanExporter) -> None:
    seen: list[dict[str, str]] = []
    simulator = simulator_app(pace=0.0)

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await simulator(scope, receive, send)

    with (
        tempfile.TemporaryDirectory() as d,
        serve(recording) as up,
        serve(gateway_app(Gateway(up, tools=[TOOL], store=store_for(f"sqlite:///{d}/s.db")))) as gw,
    ):
        spans.clear()
        client = openai.OpenAI(base_url=gw, api_key="sk-secret-key", max_retries=0)
        response = client.responses.create(model="m", input="add_numbers 2 and 40 please")
        assert "42" in response.output_text
    finished = spans.get_finished_spans()
    (request,) = [s for s in finished if s.name == "POST /v1/responses"]
    assert request.kind == trace.SpanKind.SERVER
    assert request.attributes is not None and request.attributes["respflow.rounds"] == 2
    assert request.attributes["respflow.outcome"] == "completed"
    children = [s for s in finished if s.parent is not None and s.parent.span_id == request.context.span_id]
    rounds = [s for s in children if s.name == "upstream round"]
    assert [s.attributes["respflow.round"] for s in rounds if s.attributes] == [1, 2]
    assert [s.attributes["respflow.tool"] for s in children if s.name == "tool call" and s.attributes] == ["add_numbers"]
    assert {s.name for s in children} >= {"upstream round", "tool call", "store save_response"}
    # the upstream got the trace: one traceparent per round, of this request's trace
    parents = [h["traceparent"] for h in seen if "traceparent" in h]
    assert len(parents) == 2 and all(p.split("-")[1] == f"{request.context.trace_id:032x}" for p in parents)
    # no prompt, output, key or id in any attribute
    text = json.dumps([dict(s.attributes or {}) for s in finished], default=str)
    for secret in ("add_numbers 2 and 40 please", "sk-secret-key", response.id, "42"):
        assert secret not in text


def test_workers_share_their_metrics() -> None:
    """``respflow serve --workers 2``: whichever worker answers ``/metrics`` counts both."""
    import subprocess
    import sys
    import time

    from tests.integration.servers import healthy

    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "respflow", "serve", "--workers", "2", "--port", str(port), "--store", "none", "--pace", "0"],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while not healthy(base):
                assert proc.poll() is None and time.monotonic() < deadline, "the workers did not start"
                time.sleep(0.1)
            time.sleep(1.0)  # both workers up
            for _ in range(12):  # new connections: the kernel spreads them over the workers
                with httpx.Client() as c:
                    answer = c.post(base + "/v1/responses", json={"model": "m", "input": "hi"})
                    assert answer.status_code == 200
            totals = set()
            for _ in range(4):
                with httpx.Client() as c:
                    found = {}
                    for family in text_string_to_metric_families(c.get(base + "/metrics").text):
                        for sample in family.samples:
                            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
                totals.add(value(found, "respflow_requests_total", stream="false", outcome="completed"))
            assert totals == {12.0}
        finally:
            proc.terminate()
            proc.wait(30)


def test_the_example_dashboard_asks_only_for_metrics_the_gateway_has(gateway: str) -> None:
    """examples/grafana-dashboard.json: every metric a panel queries is one /metrics exposes."""
    import re
    from pathlib import Path

    dashboard = json.loads(Path("examples/grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    wanted = {re.sub(r"_(bucket|sum|count|total)$", "", name) for expr in exprs for name in re.findall(r"respflow_[a-z_]+", expr)}
    text = httpx.get(gateway.removesuffix("/v1") + "/metrics").text
    families = {f.name for f in text_string_to_metric_families(text) if f.name.startswith("respflow_") and not f.name.endswith("_created")}
    assert wanted == families  # every metric a panel queries exists, and every metric has a panel
