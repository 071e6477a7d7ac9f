"""translate: public tool shapes, gateway withholding, unnamed buffering (upstream §5, §8.1)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from respflow.operators import (
    AgentPipeline,
    InputDecoder,
    LimitExceededError,
    Limits,
    ToolKind,
    ToolRegistry,
    TranslateError,
    Validation,
)
from respflow.operators._tools import flat_name, fnv1a_hex
from tests._support import (
    added,
    args_delta,
    args_done,
    completed,
    created,
    done,
    fcall,
    in_progress,
    lines,
)

CUSTOM = {"type": "custom", "name": "raw_echo", "description": "echo"}
NAMESPACE = {"type": "namespace", "name": "travel", "tools": [{"type": "function", "name": "timezone", "parameters": {"type": "object"}}]}
TOOLS = [{"type": "function", "name": "get_weather"}, CUSTOM, NAMESPACE, {"type": "web_search"}]


def push(*events: dict[str, Any], tools: list[Any] = TOOLS, validation: Validation = Validation.LENIENT, limits: Limits | None = None) -> tuple[list[dict[str, Any]], list[int | None], AgentPipeline]:
    pipeline = AgentPipeline(validation=validation, tools=ToolRegistry(tools), response_id="resp_gw", limits=limits)
    frames: list[dict[str, Any]] = []
    boundaries: list[int | None] = []
    for line in lines(*events):
        t = pipeline.push(line)
        frames += [f.data for f in t.frames]
        boundaries.append(t.defer_from)
    frames += [f.data for f in pipeline.flush().frames]
    return frames, boundaries, pipeline


def custom_events(deltas: list[str], arguments: str | None = None, fid: str = "fc_c1") -> list[dict[str, Any]]:
    args = arguments if arguments is not None else "".join(deltas)
    return [
        added(fcall(fid, "call_c", "raw_echo")),
        *[args_delta(d, fid) for d in deltas],
        args_done(args, fid, name="raw_echo"),
        done(fcall(fid, "call_c", "raw_echo", args, "completed")),
    ]


def test_registry_routes_each_declaration() -> None:
    reg = ToolRegistry(TOOLS)
    assert reg.route("get_weather").kind is ToolKind.FUNCTION
    assert reg.route("raw_echo").kind is ToolKind.CUSTOM
    member = reg.route("agentic_ns__travel__timezone")
    assert (member.kind, member.namespace, member.name) == (ToolKind.NAMESPACE, "travel", "timezone")
    assert reg.route("web_search").kind is ToolKind.GATEWAY
    assert reg.route("never_declared").kind is ToolKind.FUNCTION
    upstream = {t["name"]: t for t in reg.upstream_tools()}
    assert all(t["type"] == "function" for t in upstream.values())
    assert upstream["raw_echo"]["parameters"]["properties"] == {"input": {"type": "string"}}
    assert "agentic_ns__travel__timezone" in upstream


def test_long_namespace_names_are_shortened_and_round_trip() -> None:
    ns, member = "mcp__" + "n" * 60, "a_really_long_member_name_" + "m" * 30
    flat = flat_name(ns, member)
    assert len(flat) == 64
    assert flat.endswith(fnv1a_hex(f"agentic_ns__{ns}__{member}"))
    reg = ToolRegistry([{"type": "namespace", "name": ns, "tools": [{"type": "function", "name": member}]}])
    route = reg.route(flat)
    assert (route.namespace, route.name) == (ns, member)
    assert fnv1a_hex("") == "cbf29ce484222325"  # the FNV-1a offset basis


def test_colliding_names_are_refused() -> None:
    with pytest.raises(TranslateError) as info:
        ToolRegistry([{"type": "function", "name": "agentic_ns__travel__timezone"}, NAMESPACE])
    assert info.value.code == "tool_name_collision"


def test_custom_function_arguments_are_emitted_incrementally() -> None:
    frames, _, pipeline = push(created(), in_progress(), *custom_events(['{"in', 'put":"hello ', 'world"}']), completed())
    custom = [f for f in frames if "custom" in f["type"] or f["type"].startswith("response.output_item")]
    assert [(f["type"], f.get("delta") or f.get("input") or f.get("item", {}).get("input")) for f in custom] == [
        ("response.output_item.added", ""),
        ("response.custom_tool_call_input.delta", "hello "),
        ("response.custom_tool_call_input.delta", "world"),
        ("response.custom_tool_call_input.done", "hello world"),
        ("response.output_item.done", "hello world"),
    ]
    assert custom[0]["item"] == {"id": "ctc_c1", "type": "custom_tool_call", "status": "in_progress", "call_id": "call_c", "input": "", "name": "raw_echo"}
    assert all(f.get("item_id", "ctc_c1") == "ctc_c1" for f in custom)
    out = pipeline.finish().to_dict()["output"][0]
    assert out == {"id": "ctc_c1", "type": "custom_tool_call", "call_id": "call_c", "name": "raw_echo", "input": "hello world", "status": "completed"}


def test_custom_input_deltas_match_the_authoritative_done_with_extra_keys() -> None:
    frames, _, _ = push(created(), in_progress(), *custom_events(['{"input":"ab', 'c"'], arguments='{"input":"abcdef","x":1}'), completed())
    deltas = [f["delta"] for f in frames if f["type"] == "response.custom_tool_call_input.delta"]
    assert "".join(deltas) == "abcdef"
    assert deltas == ["ab", "c", "def"]


def test_custom_input_rejects_an_authoritative_value_that_contradicts_deltas() -> None:
    with pytest.raises(TranslateError) as info:
        push(created(), in_progress(), *custom_events(['{"input":"hello'], arguments='{"input":"goodbye"}'))
    assert info.value.code == "custom_input_conflict"


def test_malformed_custom_input_escape_is_rejected() -> None:
    with pytest.raises(TranslateError) as info:
        push(created(), in_progress(), *custom_events(['{"input":"a\\q"}']))
    assert info.value.code == "invalid_custom_input"


def test_custom_input_waits_for_a_split_surrogate_pair() -> None:
    pieces = ['{"input":"hi \\ud83d', "\\ude", '00"}']
    frames, _, _ = push(created(), in_progress(), *custom_events(pieces), completed())
    deltas = [f["delta"] for f in frames if f["type"] == "response.custom_tool_call_input.delta"]
    assert deltas == ["hi ", "😀"]


def test_custom_input_over_the_limit_is_rejected() -> None:
    with pytest.raises(LimitExceededError) as info:
        push(created(), in_progress(), *custom_events(['{"input":"' + "x" * 300]), limits=Limits(max_argument_bytes=100))
    assert info.value.code == "argument_bytes"


def test_custom_call_without_deltas_gets_its_input_at_done() -> None:
    frames, _, pipeline = push(created(), in_progress(), added(fcall("fc_c1", "call_c", "raw_echo")), done(fcall("fc_c1", "call_c", "raw_echo", '{"input":"OK"}', "completed")), completed())
    assert [f["type"] for f in frames[2:-1]] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
    ]
    assert pipeline.finish().to_dict()["output"][0]["input"] == "OK"


def test_ordinary_functions_pass_through_unchanged() -> None:
    events = [created(), in_progress(), added(fcall()), args_delta('{"a":'), args_delta("1}"), args_done('{"a":1}'), done(fcall(arguments='{"a":1}', status="completed")), completed()]
    frames, boundaries, _ = push(*events)
    assert frames[2:-1] == list(events[2:-1])
    assert set(boundaries) == {None}


def test_gateway_owned_calls_are_withheld_and_set_the_boundary() -> None:
    ws = fcall("fc_ws", "call_ws", "web_search")
    frames, boundaries, pipeline = push(
        created(), in_progress(), added(fcall(), 0), done(fcall(arguments="{}", status="completed"), 0),
        added(ws, 2), args_delta('{"query":"x"}', "fc_ws", 2), done(dict(ws, arguments='{"query":"x"}', status="completed"), 2), completed(),
    )
    assert not any(f.get("output_index") == 2 for f in frames)
    assert boundaries == [None, None, None, None, 2, 2, 2, 2]
    assert pipeline.translator.gateway_indexes() == [2]
    assert [o["id"] for o in pipeline.finish().to_dict()["output"]] == ["fc_1"]


def test_unnamed_calls_are_buffered_until_named_and_hold_the_boundary() -> None:
    anon = fcall("fc_u", "call_u", "")
    frames, boundaries, _ = push(
        created(), in_progress(), added(anon, 1), args_delta("{}", "fc_u", 1), args_done("{}", "fc_u", 1, name="get_weather"), done(dict(anon, name="get_weather", arguments="{}", status="completed"), 1), completed(),
    )
    assert boundaries == [None, None, 1, 1, None, None, None]
    assert [f["type"] for f in frames[2:6]] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]


def test_parallel_unnamed_functions_with_empty_ids_remain_distinct() -> None:
    a, b = fcall("", "call_a", ""), fcall("", "call_b", "")
    _frames, _, pipeline = push(
        created(), in_progress(), added(a, 0), added(b, 1), args_delta('{"n":1}', "", 0), args_delta('{"n":2}', "", 1),
        done(dict(b, name="get_weather", arguments='{"n":2}', status="completed"), 1),
        done(dict(a, name="raw_echo", arguments='{"input":"A"}', status="completed"), 0),
        completed(),
    )
    out = pipeline.finish().to_dict()["output"]
    assert [(o["type"], o["call_id"]) for o in out] == [("custom_tool_call", "call_a"), ("function_call", "call_b")]
    assert out[0]["id"] != out[1]["id"]
    assert out[1]["arguments"] == '{"n":2}'


def test_parallel_named_custom_functions_with_empty_ids_remain_distinct() -> None:
    a, b = fcall("", "call_a", "raw_echo"), fcall("", "call_b", "raw_echo")
    frames, _, pipeline = push(
        created(), in_progress(), added(a, 0), added(b, 1),
        args_delta('{"input":"A', "", 0), args_delta('{"input":"B', "", 1),
        done(dict(a, arguments='{"input":"A"}', status="completed"), 0), done(dict(b, arguments='{"input":"B"}', status="completed"), 1),
        completed(),
    )
    out = pipeline.finish().to_dict()["output"]
    assert [o["input"] for o in out] == ["A", "B"]
    ids = {f["item"]["id"] for f in frames if f["type"] == "response.output_item.added"}
    assert len(ids) == 2 and all(i.startswith("ctc_") for i in ids)
    done_ids = [f["item"]["id"] for f in frames if f["type"] == "response.output_item.done"]
    assert [o["id"] for o in out] == done_ids


def test_namespace_calls_get_namespace_and_member_name_back() -> None:
    flat = "agentic_ns__travel__timezone"
    call = fcall("fc_t", "call_t", flat)
    frames, _, pipeline = push(created(), in_progress(), added(call), args_done("{}", "fc_t", name=flat), done(dict(call, arguments="{}", status="completed")), completed())
    assert frames[2]["item"]["namespace"] == "travel" and frames[2]["item"]["name"] == "timezone"
    assert frames[3]["name"] == "timezone"
    assert frames[4]["item"]["namespace"] == "travel"
    out = pipeline.finish().to_dict()["output"][0]
    assert (out["namespace"], out["name"]) == ("travel", "timezone")
    assert flat not in json.dumps(frames)


def test_lifecycle_snapshots_show_the_public_tools() -> None:
    frames, _, pipeline = push(created(tools=[{"type": "function", "name": "raw_echo"}]), in_progress(), completed())
    assert frames[0]["response"]["tools"] == TOOLS
    assert pipeline.finish().to_dict()["tools"] == TOOLS


def test_both_policies_translate_the_same_accepted_custom_call() -> None:
    events = [created(), in_progress(), *custom_events(['{"input":"x', 'y"}']), completed()]
    strict, _, _ = push(*events, validation=Validation.STRICT)
    lenient, _, _ = push(*events, validation=Validation.LENIENT)
    assert strict == lenient


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60), cuts=st.lists(st.integers(0, 400), max_size=12), ascii_only=st.booleans(), spaced=st.booleans())
def test_custom_deltas_concatenate_to_the_final_input(text: str, cuts: list[int], ascii_only: bool, spaced: bool) -> None:
    arguments = json.dumps({"input": text}, ensure_ascii=ascii_only, separators=(", ", ": ") if spaced else (",", ":"))
    points = sorted({c % (len(arguments) + 1) for c in cuts})
    pieces = [arguments[a:b] for a, b in zip([0, *points], [*points, len(arguments)], strict=True) if b > a]
    decoder = InputDecoder()
    assert "".join(decoder.feed(p) for p in pieces) == text
    assert decoder.finished
    frames, _, pipeline = push(created(), in_progress(), *custom_events(pieces, arguments), completed())
    deltas = [f["delta"] for f in frames if f["type"] == "response.custom_tool_call_input.delta"]
    assert "".join(deltas) == text
    assert pipeline.finish().to_dict()["output"][0]["input"] == text


def test_continuation_input_items_go_upstream_as_functions() -> None:
    reg = ToolRegistry(TOOLS)
    items: list[Any] = [
        {"role": "user", "content": "hi"},
        {"type": "custom_tool_call", "id": "ctc_1", "call_id": "c1", "name": "raw_echo", "input": 'say "x"'},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
        {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "timezone", "namespace": "travel", "arguments": "{}"},
        {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "calc", "tools": []},
        {"type": "mcp_call", "id": "mcp_1", "server_label": "gateway", "name": "add", "arguments": '{"a":1}', "output": "2"},
        {"type": "mcp_call", "id": "mcp_2", "server_label": "calc", "name": "multiply", "arguments": "{}", "error": {"type": "mcp_tool_execution_error", "content": []}},
    ]
    up = reg.upstream_input(items)
    assert up[0] == {"role": "user", "content": "hi"}
    assert up[1] == {"type": "function_call", "call_id": "c1", "name": "raw_echo", "arguments": '{"input":"say \\"x\\""}'}
    assert up[2] == {"type": "function_call_output", "call_id": "c1", "output": "done"}
    assert up[3]["name"] == "agentic_ns__travel__timezone" and "namespace" not in up[3]
    assert [i["type"] for i in up[4:]] == ["function_call", "function_call_output"] * 2
    assert (up[4]["name"], up[5]["output"]) == ("add", "2")
    assert up[6]["name"] == "mcp__calc__multiply" and up[7]["output"].startswith("ERROR: ")
    assert json.loads(up[1]["arguments"])["input"] == 'say "x"'


def test_tool_choice_goes_upstream_as_the_function_it_became() -> None:
    reg = ToolRegistry(TOOLS)
    assert reg.upstream_tool_choice({"type": "custom", "name": "raw_echo"}) == {"type": "function", "name": "raw_echo"}
    assert reg.upstream_tool_choice({"type": "function", "name": "timezone", "namespace": "travel"}) == {"type": "function", "name": "agentic_ns__travel__timezone"}
    assert reg.upstream_tool_choice("required") == "required"
    assert reg.upstream_tool_choice({"type": "function", "name": "get_weather"}) == {"type": "function", "name": "get_weather"}


@settings(max_examples=300, deadline=None)
@given(raw=st.text(alphabet=st.sampled_from(list('{}"\\: input\\uD83dDE00abcq1')), max_size=40), cuts=st.lists(st.integers(0, 50), max_size=5))
def test_the_decoder_gives_utf8_text_or_a_typed_error_on_any_input(raw: str, cuts: list[int]) -> None:
    decoder = InputDecoder()
    points = sorted({c % (len(raw) + 1) for c in cuts})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    try:
        text = "".join(decoder.feed(p) for p in pieces)
    except TranslateError as exc:
        assert exc.code == "invalid_custom_input"
    else:
        text.encode("utf-8")  # no lone surrogate ever comes out


def test_a_lone_low_surrogate_is_refused() -> None:
    with pytest.raises(TranslateError):
        InputDecoder().feed('{"input":"a\\udc00b"}')
