"""Every declared tool has a fate, with real parts: the simulator or a recording upstream on
127.0.0.1, the gateway under uvicorn, the official openai client, the OpenAI Agents SDK."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from examples.web_search_app import search
from respflow.flows import Gateway, HostedTool, gateway_app, simulator_app
from tests.integration.servers import UpstreamScript, serve, upstream_app

pytestmark = pytest.mark.timeout(90)

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [r.getMessage() for r in bad]


@contextlib.contextmanager
def recording_gateway(**kw: Any) -> Iterator[tuple[UpstreamScript, str]]:
    script = UpstreamScript()
    script.body = (
        b'data: {"type":"response.created","response":{"id":"r","status":"in_progress","output":[]}}\n\n'
        b'data: {"type":"response.completed","response":{"id":"r","status":"completed","output":[]}}\n\n'
    )
    with serve(upstream_app(script)) as up, serve(gateway_app(Gateway(up, **kw))) as gw:
        yield script, gw


HOSTED = ["web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation"]


@pytest.mark.parametrize("kind", HOSTED)
def test_a_hosted_type_without_an_executor_is_not_advertised_and_is_echoed(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="respflow")
    declared = [WEATHER, {"type": kind}]
    with recording_gateway() as (script, gw):
        for _ in range(2):
            r = httpx.post(gw + "/responses", json={"model": "m", "input": "hi", "tools": declared}, timeout=30)
            assert r.status_code == 200, r.text
            assert r.json()["tools"][0] == WEATHER and r.json()["tools"][1]["type"] == kind
    upstream_tools = [t["name"] for t in script.requests[0]["tools"]]
    assert upstream_tools == ["get_weather"]  # the model cannot call what it does not see
    named = [r.getMessage() for r in caplog.records if f"hosted tool {kind!r}" in r.getMessage()]
    assert len(named) == 1  # once, not per request
    no_tracebacks(caplog)


def test_reject_refuses_a_hosted_type_without_an_executor_with_a_400_naming_it() -> None:
    with recording_gateway(hosted="reject") as (script, gw):
        r = httpx.post(gw + "/responses", json={"model": "m", "input": "hi", "tools": [WEATHER, {"type": "web_search"}], "stream": True}, timeout=30)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "unsupported_tool" and error["param"] == "tools"
    assert "tools[1]" in error["message"] and "'web_search'" in error["message"]
    assert script.requests == []


def test_an_unknown_tool_type_is_refused_with_a_400_naming_it() -> None:
    with recording_gateway() as (script, gw):
        r = httpx.post(gw + "/responses", json={"model": "m", "input": "hi", "tools": [{"type": "teleport", "name": "x"}]}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "unsupported_tool"
    assert "'teleport'" in r.json()["error"]["message"]
    assert script.requests == []


def test_client_built_ins_go_upstream_as_functions() -> None:
    declared = [{"type": "shell"}, {"type": "local_shell"}, {"type": "apply_patch"}, {"type": "tool_search", "execution": "client"}]
    with recording_gateway() as (script, gw):
        r = httpx.post(gw + "/responses", json={"model": "m", "input": "hi", "tools": declared}, timeout=30)
    assert r.status_code == 200
    sent = {t["name"]: t for t in script.requests[0]["tools"]}
    assert set(sent) == {"shell", "local_shell", "apply_patch", "tool_search"}
    assert all(t["type"] == "function" for t in sent.values())
    assert sent["shell"]["parameters"]["required"] == ["commands"]
    assert [t["type"] for t in r.json()["tools"]] == ["shell", "local_shell", "apply_patch", "tool_search"]


def official(gw: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw, api_key="sk-test", max_retries=0, _strict_response_validation=True)


def test_a_client_built_in_call_is_shown_as_its_own_item() -> None:
    with (
        serve(simulator_app(pace=0.0)) as up,
        serve(gateway_app(Gateway(up))) as gw,
        official(gw) as client,
        client.responses.stream(model="m", input="run shell ls -la", tools=[{"type": "shell", "environment": {"type": "local"}}]) as stream,
    ):
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    call = final.output[0]
    assert call.type == "shell_call"
    assert call.action.commands == ["run shell ls -la"]  # type: ignore[union-attr]
    assert call.status == "completed" and call.call_id.startswith("call_")  # type: ignore[union-attr]
    assert kinds.count("response.output_item.added") == 1
    assert "response.function_call_arguments.delta" not in kinds


def test_a_hosted_executor_runs_the_call_and_shows_a_web_search_call() -> None:
    gateway = Gateway("http://unused", hosted_tools=[HostedTool("web_search", fn=search)])
    with serve(simulator_app(pace=0.0)) as up:
        gateway.upstream = up
        with serve(gateway_app(gateway)) as gw, official(gw) as client:
            with client.responses.stream(model="m", input="please web_search potato", tools=[{"type": "web_search_preview"}]) as stream:
                kinds = [e.type for e in stream]
                final = stream.get_final_response()
            whole = client.responses.create(model="m", input="please web_search potato", tools=[{"type": "web_search"}])
    ws, message = final.output
    assert ws.type == "web_search_call" and ws.status == "completed"
    assert ws.action.query == "please web_search potato"  # type: ignore[union-attr]
    assert [s.url for s in ws.action.sources or []] == ["https://en.wikipedia.org/wiki/Potato", "https://en.wikipedia.org/wiki/Tomato"]  # type: ignore[union-attr]
    assert message.type == "message" and "starchy tuber" in message.content[0].text  # type: ignore[union-attr]
    i = kinds.index("response.web_search_call.in_progress")
    assert kinds[i : i + 3] == ["response.web_search_call.in_progress", "response.web_search_call.searching", "response.web_search_call.completed"]
    assert [o.type for o in whole.output] == ["web_search_call", "message"]


def test_a_hosted_executor_that_fails_is_a_failed_item_and_the_round_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    def broken(arguments: dict[str, Any]) -> str:
        raise ConnectionError("the search backend is down")

    caplog.set_level(logging.INFO, logger="respflow")
    with serve(simulator_app(pace=0.0)) as up, serve(gateway_app(Gateway(up, hosted_tools=[HostedTool("web_search", fn=broken)]))) as gw, official(gw) as client:
        final = client.responses.create(model="m", input="please web_search potato", tools=[{"type": "web_search"}])
    ws, message = final.output
    assert ws.type == "web_search_call" and ws.status == "failed"
    assert "the search backend is down" in message.content[0].text  # type: ignore[union-attr]
    no_tracebacks(caplog)


def test_a_call_to_a_dropped_hosted_tool_is_a_failed_output_not_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    """The model calls web_search although it was not offered (a model can name any function)."""
    caplog.set_level(logging.INFO, logger="respflow")
    script = UpstreamScript()
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "web_search", "arguments": '{"query":"x"}', "status": "completed"}
    script.body = "".join(
        f"data: {json.dumps(e)}\n\n"
        for e in [
            {"type": "response.created", "response": {"id": "r", "status": "in_progress", "output": []}},
            {"type": "response.output_item.added", "output_index": 0, "item": dict(call, arguments="", status="in_progress")},
            {"type": "response.function_call_arguments.done", "output_index": 0, "item_id": "fc_1", "arguments": call["arguments"]},
            {"type": "response.output_item.done", "output_index": 0, "item": call},
            {"type": "response.completed", "response": {"id": "r", "status": "completed", "output": [call]}},
        ]
    ).encode()
    with serve(upstream_app(script)) as up, serve(gateway_app(Gateway(up, max_rounds=1))) as gw:
        streamed = httpx.post(gw + "/responses", json={"model": "m", "input": "x", "tools": [{"type": "web_search"}], "stream": True}, timeout=30)
        whole = httpx.post(gw + "/responses", json={"model": "m", "input": "x", "tools": [{"type": "web_search"}]}, timeout=30)
    assert streamed.status_code == whole.status_code == 200
    item = whole.json()["output"][0]
    assert (item["type"], item["status"]) == ("web_search_call", "failed")
    assert [t["name"] for t in script.requests[0]["tools"]] == []  # it was never offered
    assert b"response.output_item.done" in streamed.content and b'"status":"failed"' in streamed.content
    no_tracebacks(caplog)


def test_a_failure_mid_stream_reaches_the_official_client_and_a_raw_reader() -> None:
    script = UpstreamScript()
    script.body = (
        b'data: {"type":"response.created","response":{"id":"r","status":"in_progress","output":[]}}\n\n'
        b'data: {"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"m","role":"assistant","status":"in_progress","content":[]}}\n\n'
        b'data: {"type":"response.content_part.added","output_index":0,"item_id":"m","content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}\n\n'
        b'data: {"type":"response.output_text.delta","output_index":0,"item_id":"m","content_index":0,"delta":"partial ","logprobs":[]}\n\n'
        + b'data: {"type":"response.output_text.delta","output_index":0,"item_id":"m","content_index":0,"delta":"' + b"x" * 3000 + b'","logprobs":[]}\n\n'
    )
    script.mode = "cut"  # the upstream connection dies half-way
    script.chunk = 512
    with serve(upstream_app(script)) as up, serve(gateway_app(Gateway(up))) as gw:
        with httpx.stream("POST", gw + "/responses", json={"model": "m", "input": "x", "stream": True}, timeout=30) as r:
            raw = b"".join(r.iter_bytes())
        with official(gw) as client, pytest.raises(openai.APIError) as info, client.responses.stream(model="m", input="x") as stream:
            for _ in stream:
                pass
    events = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    error, failed = events[-2], events[-1]
    assert error["code"] == "upstream_disconnected"
    assert failed["response"]["error"] == {"code": "server_error", "message": error["message"], "type": "upstream_disconnected"}
    assert failed["response"]["output"][0]["content"][0]["text"].startswith("partial ")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "cut mid-stream" in str(info.value)


# ---- the OpenAI Agents SDK ---------------------------------------------------------------------


def run_agent(gw: str, prompt: str, *, streamed: bool) -> str:
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, WebSearchTool, function_tool

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    async def go() -> str:
        client = openai.AsyncOpenAI(base_url=gw, api_key="sk-test", max_retries=0)
        try:
            agent = Agent(
                name="helper",
                instructions="Answer briefly.",
                model=OpenAIResponsesModel(model="m", openai_client=client),
                tools=[WebSearchTool(), get_weather],
            )
            config = RunConfig(tracing_disabled=True)
            if streamed:
                result = Runner.run_streamed(agent, prompt, run_config=config)
                async for _ in result.stream_events():
                    pass
                return str(result.final_output)
            return str((await Runner.run(agent, prompt, run_config=config)).final_output)
        finally:
            await client.close()

    return asyncio.run(go())


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("executor", [False, True], ids=["without_executor", "with_executor"])
def test_the_agents_sdk_with_web_search_and_a_function_tool(streamed: bool, executor: bool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="respflow")
    hosted = [HostedTool("web_search", fn=search)] if executor else []
    with serve(simulator_app(pace=0.0)) as up, serve(gateway_app(Gateway(up, hosted_tools=hosted))) as gw:
        searched = run_agent(gw, "please web_search potato", streamed=streamed)
        weather = run_agent(gw, "what is get_weather in Paris", streamed=streamed)
    if executor:
        assert "starchy tuber" in searched  # the search ran; the model answered from it
    else:
        assert searched == "You said: please web_search potato"  # not offered: a plain answer
    assert weather == "The tool returned sunny in what is get_weather in Paris."
    no_tracebacks(caplog)
