"""Relayed streams are accepted by the official openai client under strict validation, and what
the client itself accumulated from the relayed deltas (its own snapshots: an independent
reference, not our terminal) equals our fold of the same input; its final response — which
it takes from our terminal — equals the fold too, ids included."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from respflow.flows import decode, live
from respflow.operators import ToolRegistry, Validation
from respflow.sinks import CollectSink
from tests._support import AUTHORED, RECORDED, client_final_response, fixture_bytes, sidecar


def relay(body: bytes, tools: list[Any] | None = None, **kw: Any) -> bytes:
    sink = CollectSink()
    registry = ToolRegistry(tools) if tools else None
    asyncio.run(live([body], sink, placement="inline", tools=registry, **kw))
    return sink.getvalue()


def events(sse_bytes: bytes) -> list[dict[str, Any]]:
    return [json.loads(m) for m in re.findall(rb"^data: (.*)$", sse_bytes, flags=re.M)]


def fold(body: bytes, tools: list[Any] | None = None, **kw: Any) -> dict[str, Any]:
    return decode(body, validation=Validation.LENIENT, tools=ToolRegistry(tools) if tools else None, **kw).to_dict()


def client_accumulation(body: bytes) -> tuple[dict[int, str], dict[int, str], list[str]]:
    """What the official client accumulated itself, per output_index: the text of each
    message (its last ``output_text.delta`` snapshot, parts joined) and the arguments of each
    function call (its last ``function_call_arguments.delta`` snapshot); and the item types
    it saw added, in order."""
    import httpx
    import openai

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    texts: dict[tuple[int, int], str] = {}
    arguments: dict[int, str] = {}
    added: list[str] = []
    client = openai.OpenAI(api_key="t", base_url="http://x.test/v1", http_client=httpx.Client(transport=httpx.MockTransport(handler)), _strict_response_validation=True)
    with client.responses.stream(model="m", input="hi") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                texts[(event.output_index, event.content_index)] = event.snapshot
            elif event.type == "response.function_call_arguments.delta":
                arguments[event.output_index] = event.snapshot
            elif event.type == "response.output_item.added":
                added.append(event.item.type)
    joined: dict[int, str] = {}
    for (index, _), text in sorted(texts.items()):
        joined[index] = joined.get(index, "") + text
    return joined, arguments, added


def without_parsed(value: Any) -> Any:
    """The stream helper returns a ParsedResponse: drop the ``parsed*`` fields it adds."""
    if isinstance(value, dict):
        return {k: without_parsed(v) for k, v in value.items() if k not in ("parsed", "parsed_arguments")}
    if isinstance(value, list):
        return [without_parsed(v) for v in value]
    return value


# failed and incomplete terminals; and a recording that ends with a bare Response object and
# [DONE] but no terminal event: it ends failed (the upstream ended without a terminal event)
NOT_COMPLETED = {"authored/failed.sse", "authored/incomplete.sse", "web-search-gpt-oss-20b.sse"}


@pytest.mark.parametrize("name", RECORDED + AUTHORED)
def test_relayed_stream_is_accepted_strictly_and_equals_the_fold(name: str) -> None:
    body = fixture_bytes(name)
    tools = sidecar(name).get("request_tools")
    out = relay(body, tools, response_id="resp_gw")
    evs = events(out)
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    assert evs[0]["type"] == "response.created"
    assert sum(e["type"] in ("response.completed", "response.failed", "response.incomplete") for e in evs) == 1
    assert re.search(rb"^(id|retry):", out, flags=re.M) is None
    ours = fold(body, tools, response_id="resp_gw")
    if name in NOT_COMPLETED:
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            client_final_response(out, strict=True)
        assert evs[-1]["response"]["status"] == ours["status"]
        assert evs[-1]["response"]["output"] == ours["output"]
        return
    # the independent reference: what the client accumulated from the deltas it was sent
    texts, arguments, added = client_accumulation(out)
    by_index = dict(enumerate(ours["output"]))
    assert [item["type"] for item in ours["output"]] == added
    for index, text in texts.items():
        assert "".join(p.get("text", "") for p in by_index[index]["content"]) == text
    done_args = {e["output_index"]: e["arguments"] for e in evs if e["type"] == "response.function_call_arguments.done"}
    for index, args in arguments.items():
        # the deltas, or the authoritative arguments of the done when they differ (a vLLM
        # parser may stream a stray leading "{}" that its done corrects)
        assert by_index[index]["arguments"] in (args, done_args.get(index))
    assert texts or arguments or not any(i["type"] in ("message", "function_call") for i in ours["output"])
    # and the final response it reports (from our terminal) is the fold
    theirs = without_parsed(client_final_response(out, strict=True).model_dump(mode="json", exclude_unset=True))
    assert theirs["id"] == "resp_gw"
    assert theirs["output"] == ours["output"]
    assert theirs["usage"] == ours["usage"]
    assert theirs["status"] == ours["status"]


def test_relay_cli_prints_sse() -> None:
    import subprocess
    import sys

    from tests._support import FIXTURES

    result = subprocess.run(
        [sys.executable, "-m", "respflow", "relay", str(FIXTURES / "text-openai-gpt-4o.sse"), "--response-id", "resp_cli"],
        capture_output=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    evs = events(result.stdout)
    assert evs[0]["response"]["id"] == "resp_cli"
    assert evs[-1]["type"] == "response.completed"
    assert result.stdout.startswith(b"event: response.created\ndata: ")
