"""End to end with real parts: the simulator and an MCP server (official SDK) on 127.0.0.1, the
gateway under uvicorn, the official openai client (strict validation) as the consumer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from respflow.flows import Gateway, GatewayTool, gateway_app, simulator_app
from tests.integration.servers import UpstreamScript, mcp_app, serve, upstream_app, wait_for

pytestmark = pytest.mark.timeout(90)


def add_numbers(args: dict[str, Any]) -> str:
    return str(sum(args["numbers"]))


def explode(args: dict[str, Any]) -> str:
    raise RuntimeError("the tool blew up")


async def sleepy(args: dict[str, Any]) -> str:
    await asyncio.sleep(30)
    return "never"


NUMBERS = {"type": "object", "properties": {"numbers": {"type": "array", "items": {"type": "number"}}}, "required": ["numbers"]}
TOOLS = [
    GatewayTool("add_numbers", add_numbers, "Add numbers.", NUMBERS),
    GatewayTool("explode", explode, "Always fails.", {"type": "object", "properties": {}}),
    GatewayTool("sleepy", sleepy, "Takes too long.", {"type": "object", "properties": {}}),
]


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, str]]:
    with serve(simulator_app(pace=0.0)) as sim, serve(mcp_app()) as mcp:
        gateway = Gateway(sim, tools=TOOLS, tool_timeout=0.5, keepalive_interval=0.1)
        with serve(gateway_app(gateway)) as gw:
            yield {"gateway": gw, "simulator": sim, "mcp": mcp.removesuffix("/v1") + "/mcp"}


_CLIENTS: list[openai.OpenAI] = []


def client(base_url: str, strict: bool = True) -> openai.OpenAI:
    c = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0, _strict_response_validation=strict)
    _CLIENTS.append(c)
    return c


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def content(response: Any) -> list[tuple[Any, ...]]:
    out = []
    for item in response.output:
        d = item.model_dump(mode="json", exclude_unset=True)
        kind = d["type"]
        if kind == "message":
            out.append((kind, "".join(p.get("text", "") for p in d["content"])))
        elif kind == "reasoning":
            out.append((kind, "".join(p["text"] for p in d.get("content") or [])))
        elif kind == "function_call":
            out.append((kind, d.get("namespace"), d["name"], json.loads(d["arguments"])))
        elif kind == "custom_tool_call":
            out.append((kind, d["name"], d["input"]))
        elif kind == "mcp_call":
            out.append((kind, d["server_label"], d["name"], json.loads(d["arguments"]), d.get("output"), d.get("error") is not None))
        elif kind == "mcp_list_tools":
            out.append((kind, d["server_label"], sorted(t["name"] for t in d["tools"])))
        else:
            out.append((kind,))
    return out


def scenario_tools(name: str, urls: dict[str, str]) -> list[Any]:
    return {
        "text": [],
        "reasoning": [],
        "function": [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}],
        "custom": [{"type": "custom", "name": "raw_echo", "description": "Echo raw text."}],
        "namespace": [{"type": "namespace", "name": "travel", "description": "Travel tools.", "tools": [{"type": "function", "name": "timezone", "description": "Timezone of a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]}],
        "gateway": [],
        "mcp": [{"type": "mcp", "server_label": "calc", "server_url": urls["mcp"], "require_approval": "never"}],
    }[name]


PROMPTS = {
    "text": "hello there",
    "reasoning": "please think about the sky",
    "function": "what is get_weather in Paris",
    "custom": "raw_echo this text",
    "namespace": "timezone of Paris",
    "gateway": "add_numbers 2 and 40",
    "mcp": "multiply 6 and 7",
}

EXPECT: dict[str, list[tuple[Any, ...]]] = {
    "text": [("message", "You said: hello there")],
    "reasoning": [("reasoning", "The user asks: please think about the sky. I will answer briefly."), ("message", "You said: please think about the sky")],
    "function": [("function_call", None, "get_weather", {"city": "what is get_weather in Paris"})],
    "custom": [("custom_tool_call", "raw_echo", "raw_echo this text")],
    "namespace": [("function_call", "travel", "timezone", {"city": "timezone of Paris"})],
    "gateway": [("mcp_call", "gateway", "add_numbers", {"numbers": [2, 40]}, "42", False), ("message", "The tool returned 42.")],
    "mcp": [("mcp_list_tools", "calc", ["multiply", "shout"]), ("mcp_call", "calc", "multiply", {"a": 6, "b": 7}, "42.0", False), ("message", "The tool returned 42.0.")],
}


@pytest.mark.parametrize("name", list(PROMPTS))
def test_streamed_answer_is_accepted_strictly_and_equals_the_non_streaming_one(stack: dict[str, str], name: str) -> None:
    c = client(stack["gateway"])
    tools = scenario_tools(name, stack)
    kwargs: dict[str, Any] = {"model": "sim-model", "input": PROMPTS[name]}
    if tools:
        kwargs["tools"] = tools
    with c.responses.stream(**kwargs) as s:
        events = list(s)
        streamed = s.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events].count("response.created") == 1
    assert events[-1].type == "response.completed"
    indexes = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert indexes == list(range(len(streamed.output)))
    plain = c.responses.create(**kwargs)
    assert content(streamed) == content(plain) == EXPECT[name]
    assert streamed.status == plain.status == "completed"
    assert streamed.usage is not None and plain.usage is not None
    assert streamed.usage.total_tokens == plain.usage.total_tokens
    raw = list(c.responses.create(stream=True, **kwargs))
    assert raw[-1].type == "response.completed"


def test_a_failing_and_a_slow_tool_become_error_outputs_and_the_round_goes_on(stack: dict[str, str]) -> None:
    c = client(stack["gateway"])
    for prompt, needle in (("explode please", "the tool blew up"), ("sleepy please", "timed out")):
        with c.responses.stream(model="sim", input=prompt) as s:
            kinds = [e.type for e in s]
            final = s.get_final_response()
        assert "response.mcp_call.failed" in kinds
        call = final.output[0].model_dump()
        assert call["type"] == "mcp_call" and call["status"] == "failed"
        assert call["error"]["type"] == "mcp_tool_execution_error" and needle in call["error"]["content"][0]["text"]
        assert final.output[1].type == "message" and "ERROR" in final.output[1].content[0].text  # type: ignore[union-attr]
        assert final.status == "completed"


def test_keepalives_are_comments_while_tools_run(stack: dict[str, str]) -> None:
    with httpx.stream("POST", stack["gateway"] + "/responses", json={"model": "sim", "input": "sleepy please", "stream": True}, timeout=30) as r:
        body = b"".join(r.iter_bytes())
    assert b": keep-alive" in body
    assert b"\nid:" not in body and b"\nretry:" not in body


def test_health_and_request_errors(stack: dict[str, str]) -> None:
    gw = stack["gateway"]
    assert httpx.get(gw.removesuffix("/v1") + "/health").json()["status"] == "ok"
    r = httpx.post(gw + "/responses", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(gw + "/responses", json={"input": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = httpx.post(gw + "/responses", content=b"x" * (5 << 20), headers={"content-type": "application/json"})
    assert r.status_code == 413
    with pytest.raises(openai.BadRequestError) as info:
        client(gw).responses.create(model="m", input="x", tools=[{"type": "custom"}])  # type: ignore[list-item]
    assert info.value.status_code == 400


def test_upstream_down_is_an_openai_shaped_502() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with serve(gateway_app(Gateway(f"http://127.0.0.1:{port}/v1"))) as gw:
        c = client(gw)
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as info:
                if stream:
                    with c.responses.stream(model="m", input="hi") as s:
                        list(s)
                else:
                    c.responses.create(model="m", input="hi")
            assert info.value.status_code == 502
            assert info.value.body["code"] == "upstream_unreachable"  # type: ignore[index]


def test_upstream_4xx_is_passed_on() -> None:
    script = UpstreamScript()
    script.mode = "status500"
    with serve(upstream_app(script)) as up, serve(gateway_app(Gateway(up))) as gw:
        with pytest.raises(openai.InternalServerError) as info:
            client(gw).responses.create(model="m", input="hi")
        assert info.value.status_code == 500
        assert "model exploded" in str(info.value)


def test_upstream_cut_mid_stream_gives_an_error_event() -> None:
    from tests._support import fixture_bytes

    script = UpstreamScript()
    script.mode, script.body, script.chunk = "cut", fixture_bytes("reasoning-vllm-qwen3-30b.sse"), 2048
    with serve(upstream_app(script)) as up, serve(gateway_app(Gateway(up))) as gw:
        with pytest.raises(openai.APIError) as info, client(gw).responses.stream(model="m", input="hi") as s:
            list(s)
        assert "cut" in str(info.value)


def test_client_disconnect_closes_the_upstream_request() -> None:
    from respflow.flows._bench import synthetic_stream

    script = UpstreamScript()
    script.body, script.chunk, script.pace = synthetic_stream(items=3, deltas=400), 512, 0.005  # ≈ 15 s
    with serve(upstream_app(script)) as up, serve(gateway_app(Gateway(up))) as gw:
        with httpx.stream("POST", gw + "/responses", json={"model": "m", "input": "hi", "stream": True}, timeout=30) as r:
            for _ in r.iter_bytes():
                break
        # the behaviour, not a time: the upstream saw its request closed (a generous bound on a
        # loaded machine) long before its ≈ 15 s answer was sent
        wait_for(lambda: script.closed_at is not None, 30, "the upstream request to be closed")
        assert not script.finished


def test_auth_is_forwarded_upstream_and_the_body_untouched(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from tests._support import fixture_bytes

    script = UpstreamScript()
    script.body = fixture_bytes("text-openai-gpt-4o.sse")
    with serve(upstream_app(script)) as up, serve(gateway_app(Gateway(up))) as gw, caplog.at_level(logging.INFO, logger="respflow"):
        c = openai.OpenAI(base_url=gw, api_key="sk-secret-123", max_retries=0)
        c.responses.create(model="m", input="hi", metadata={"ticket": "42"}, temperature=0.5)
        c.close()
    assert script.headers[-1]["authorization"] == "Bearer sk-secret-123"
    sent = script.requests[-1]
    assert sent["metadata"] == {"ticket": "42"} and sent["temperature"] == 0.5 and sent["stream"] is True
    assert "sk-secret" not in caplog.text
    assert "stream=false" in caplog.text


def test_the_round_cap_stops_a_tool_loop() -> None:
    with serve(simulator_app(pace=0.0)) as sim, serve(gateway_app(Gateway(sim, tools=TOOLS, max_rounds=1))) as gw:
        c = client(gw, strict=False)
        final = c.responses.create(model="m", input="add_numbers 1 and 2")
    assert final.status == "incomplete"
    assert [i.type for i in final.output] == ["mcp_call"]
    assert final.incomplete_details is not None and final.incomplete_details.reason == "max_tool_rounds"  # type: ignore[comparison-overlap]


def test_an_unreachable_mcp_server_is_a_failed_listing_and_the_answer_goes_on(stack: dict[str, str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tools = [{"type": "mcp", "server_label": "gone", "server_url": f"http://127.0.0.1:{port}/mcp", "require_approval": "never"}]
    with client(stack["gateway"]).responses.stream(model="m", input="hello", tools=tools) as s:  # type: ignore[arg-type]
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.mcp_list_tools.failed" in kinds
    listing = final.output[0].model_dump()
    assert listing["type"] == "mcp_list_tools" and listing["tools"] == [] and "gone" in listing["error"]
    assert content(final)[1] == ("message", "You said: hello")


def test_concurrent_streams_stay_separate(stack: dict[str, str]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def one(n: int) -> tuple[int, list[int], str]:
        with client(stack["gateway"]).responses.stream(model="m", input=f"add_numbers {n} and 1") as s:
            seqs = [e.sequence_number for e in s]
            final = s.get_final_response()
        return n, seqs, final.output_text

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    for n, seqs, text in results:
        assert seqs == list(range(len(seqs)))
        assert text == f"The tool returned {n + 1}."


def test_a_continuation_turn_with_a_custom_tool_output(stack: dict[str, str]) -> None:
    c = client(stack["gateway"])
    tools = scenario_tools("custom", stack)
    first = c.responses.create(model="m", input="raw_echo this text", tools=tools)
    call = first.output[0].model_dump(exclude_unset=True)
    assert call["type"] == "custom_tool_call"
    follow = [
        {"role": "user", "content": "raw_echo this text"},
        call,
        {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "ECHOED"},
    ]
    with c.responses.stream(model="m", input=follow, tools=tools) as s:  # type: ignore[arg-type]
        final = s.get_final_response()
    assert final.output_text == "The tool returned ECHOED."


def test_customize_splices_into_every_rounds_graph_and_finishes_the_response() -> None:
    from respflow.flows import Graph
    from respflow.operators import Frame, Response, each

    seen: list[str] = []

    def tap(frame: Frame) -> Frame:
        seen.append(frame.type)
        return frame

    def stamp(response: Response) -> Response:
        body = response.to_dict()
        body["metadata"] = {"checked": "yes"}
        return Response.model_validate(body)

    def customize(graph: Graph) -> Graph:
        return graph.splice("tap", each(tap, name="tap"), after="translate").on_finish(stamp)

    with (
        serve(simulator_app(pace=0.0)) as sim,
        serve(gateway_app(Gateway(sim, tools=TOOLS, customize=customize))) as gw,
        client(gw).responses.stream(model="m", input="add_numbers 1 and 2") as s,
    ):
        final = s.get_final_response()
    assert final.metadata == {"checked": "yes"}
    assert seen.count("response.created") == 2  # the tap ran in both rounds' graphs
    assert final.output_text == "The tool returned 3."


def test_a_tool_returning_odd_values_still_gives_a_clean_stream() -> None:
    tools = [
        GatewayTool("surrogate", lambda args: "bad \udc00 text", "Returns a lone surrogate.", {"type": "object", "properties": {}}),
        GatewayTool("unserializable", lambda args: {1, 2}, "Returns a set.", {"type": "object", "properties": {}}),
    ]
    with serve(simulator_app(pace=0.0)) as sim, serve(gateway_app(Gateway(sim, tools=tools))) as gw:
        c = client(gw)
        with c.responses.stream(model="m", input="surrogate please") as s:
            final = s.get_final_response()
        assert final.output[0].model_dump()["output"] == "bad ? text"
        with c.responses.stream(model="m", input="unserializable please") as s:
            final = s.get_final_response()
        call = final.output[0].model_dump()
        assert call["status"] == "failed" and "TypeError" in call["error"]["content"][0]["text"]
