"""The tool policy: every declared type has one fate; client built-ins in both directions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import ResponseOutputItem
from pydantic import TypeAdapter

from respflow.operators import (
    AgentPipeline,
    LineSplitter,
    ToolKind,
    ToolRegistry,
    TranslateError,
    Validation,
)
from respflow.operators._tools import CLIENT_BUILTINS, HOSTED_TYPES, tool_fate
from tests._support import sse

ITEM = TypeAdapter(ResponseOutputItem)


@pytest.mark.parametrize(
    ("decl", "drop", "reject"),
    [
        ({"type": "function", "name": "f"}, "client", "client"),
        ({"type": "custom", "name": "c"}, "client", "client"),
        ({"type": "namespace", "name": "n", "tools": []}, "client", "client"),
        ({"type": "shell"}, "client_builtin", "client_builtin"),
        ({"type": "local_shell"}, "client_builtin", "client_builtin"),
        ({"type": "apply_patch"}, "client_builtin", "client_builtin"),
        ({"type": "tool_search"}, "client_builtin", "client_builtin"),
        ({"type": "mcp", "server_label": "x"}, "gateway", "gateway"),
        ({"type": "web_search"}, "dropped", "refused"),
        ({"type": "image_generation"}, "dropped", "refused"),
        ({"type": "computer_use_preview"}, "refused", "refused"),
        ({"type": "teleport"}, "refused", "refused"),
    ],
)
def test_every_type_has_one_fate(decl: dict[str, Any], drop: str, reject: str) -> None:
    assert tool_fate(decl, hosted=(), hosted_policy="drop") == drop
    assert tool_fate(decl, hosted=(), hosted_policy="reject") == reject


def test_a_hosted_type_with_an_executor_is_the_gateways() -> None:
    for kind in HOSTED_TYPES:
        assert tool_fate({"type": kind}, hosted=[kind], hosted_policy="reject") == "gateway"


def test_the_registry_follows_the_fates() -> None:
    declared = [{"type": "function", "name": "f"}, {"type": "web_search"}, {"type": "shell"}]
    registry = ToolRegistry(declared, hosted=(), hosted_policy="drop")
    assert [t["name"] for t in registry.upstream_tools()] == ["f", "shell"]
    assert registry.dropped == ["web_search"] and registry.unavailable == {"web_search"}
    assert registry.route("web_search").kind is ToolKind.GATEWAY  # a call to it: a failed output
    assert registry.public_tools == declared
    with pytest.raises(TranslateError) as info:
        ToolRegistry(declared, hosted=(), hosted_policy="reject")
    assert info.value.code == "unsupported_tool" and "tools[1]" in info.value.message
    with pytest.raises(TranslateError) as unknown:
        ToolRegistry([{"type": "teleport"}], hosted=())
    assert unknown.value.code == "unsupported_tool" and "'teleport'" in unknown.value.message


def test_outside_a_gateway_hosted_types_keep_their_upstream_route() -> None:
    registry = ToolRegistry([{"type": "web_search_preview"}, {"type": "teleport"}])  # fold/relay of a recording
    assert registry.route("web_search").kind is ToolKind.GATEWAY
    assert registry.dropped == []


def call_stream(name: str, arguments: str, *, done: bool = True) -> bytes:
    call = {"type": "function_call", "id": "fc_9", "call_id": "call_9", "name": name, "arguments": "", "status": "in_progress"}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "r", "status": "in_progress", "output": []}},
        {"type": "response.in_progress", "response": {"id": "r", "status": "in_progress"}},
        {"type": "response.output_item.added", "output_index": 0, "item": call},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "fc_9", "delta": arguments[:5]},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "fc_9", "delta": arguments[5:]},
    ]
    if done:
        full = dict(call, arguments=arguments, status="completed")
        events += [
            {"type": "response.function_call_arguments.done", "output_index": 0, "item_id": "fc_9", "arguments": arguments},
            {"type": "response.output_item.done", "output_index": 0, "item": full},
            {"type": "response.completed", "response": {"id": "r", "status": "completed", "output": [full]}},
        ]
    return sse(*events)


def translate(kind: str, body: bytes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    pipeline = AgentPipeline(validation=Validation.LENIENT, tools=ToolRegistry([{"type": kind}]))
    splitter = LineSplitter()
    frames = [f.data for f in pipeline.push_all(splitter.feed(body) + splitter.flush()).frames]
    frames += [f.data for f in pipeline.flush().frames]
    return frames, pipeline.finish().to_dict()


ARGS = {
    "shell": {"commands": ["ls -la", "pwd"], "timeout_ms": 1000},
    "local_shell": {"command": ["ls", "-la"], "env": {"A": "1"}, "working_directory": "/tmp"},
    "apply_patch": {"operation": {"type": "update_file", "path": "a.py", "diff": "@@ -1 +1 @@\n-a\n+b"}},
    "tool_search": {"query": "calendar tools"},
}


@pytest.mark.parametrize("kind", sorted(CLIENT_BUILTINS))
def test_a_client_built_in_call_becomes_its_public_item(kind: str) -> None:
    builtin = CLIENT_BUILTINS[kind]
    frames, response = translate(kind, call_stream(builtin.function, json.dumps(ARGS[kind])))
    kinds = [f["type"] for f in frames]
    assert "response.function_call_arguments.delta" not in kinds  # withheld: no valid shape yet
    added, done = (f for f in frames if f["type"] in ("response.output_item.added", "response.output_item.done"))
    assert added["item"]["type"] == done["item"]["type"] == builtin.item_type
    assert added["item"]["status"] == "in_progress" and done["item"]["status"] == "completed"
    # the official client's own models accept both
    ITEM.validate_python(added["item"])
    final = ITEM.validate_python(done["item"])
    assert response["output"] == [done["item"]]
    assert final.call_id == "call_9"  # type: ignore[union-attr]
    # and back: a continuation turn sends the call upstream as the function it was
    upstream = ToolRegistry([{"type": kind}]).upstream_input([done["item"], {"type": builtin.output_type, "call_id": "call_9", "output": "ok"}])
    assert upstream[0]["type"] == "function_call" and upstream[0]["name"] == builtin.function
    assert json.loads(upstream[0]["arguments"]) == builtin.arguments(done["item"])
    assert upstream[1] == {"type": "function_call_output", "call_id": "call_9", "output": "ok"}


def test_a_client_built_in_cut_before_its_done_is_shown_incomplete() -> None:
    frames, response = translate("shell", call_stream("shell", json.dumps(ARGS["shell"]), done=False))
    done = [f for f in frames if f["type"] == "response.output_item.done"]
    assert done[0]["item"]["status"] == "incomplete"
    assert response["status"] == "failed"
    assert response["output"][0]["type"] == "shell_call" and response["output"][0]["status"] == "incomplete"


def test_frames_after_a_client_built_in_wait_for_it() -> None:
    """A message after the call, streamed before the call is done, is held behind it."""
    pipeline = AgentPipeline(validation=Validation.LENIENT, tools=ToolRegistry([{"type": "shell"}]))
    splitter = LineSplitter()
    head = call_stream("shell", json.dumps(ARGS["shell"]), done=False)
    t = pipeline.push_all(splitter.feed(head))
    assert t.defer_from == 0
