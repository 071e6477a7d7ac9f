"""Relayed streams are accepted by the official openai client under strict validation, and the
client's final response equals our fold of the same input — ids included."""

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
