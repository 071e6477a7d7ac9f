"""Every fixture through live (worker and inline), collect and decode gives what the synchronous
core (AgentPipeline.push_all) gives: the same client frames, the same Response."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import pytest

from respflow.flows import CorePool, Graph, collect, decode, live
from respflow.operators import AgentPipeline, LineSplitter, ToolRegistry, Validation, each
from respflow.sinks import CollectSink
from tests._support import AUTHORED, RECORDED, fixture_bytes, sidecar


def reads(body: bytes, seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    out, i = [], 0
    while i < len(body):
        n = rnd.choice([1, 7, 100, 4096, 9000, 65536])
        out.append(body[i : i + n])
        i += n
    return out


def reference(body: bytes, tools: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    pipeline = AgentPipeline(validation=Validation.LENIENT, response_id="resp_gw", tools=ToolRegistry(tools) if tools else None)
    splitter = LineSplitter()
    frames = [f.data for f in pipeline.push_all(splitter.feed(body)).frames]
    frames += [f.data for f in pipeline.push_all(splitter.flush()).frames]
    frames += [f.data for f in pipeline.flush().frames]
    return frames, pipeline.finish().to_dict()


def stable(response: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in response.items() if k != "created_at"}


@pytest.mark.parametrize("name", RECORDED + AUTHORED)
def test_every_driver_agrees_with_the_synchronous_core(name: str) -> None:
    body = fixture_bytes(name)
    tools = sidecar(name).get("request_tools")
    registry = (lambda: ToolRegistry(tools)) if tools else (lambda: None)
    _, ref_response = reference(body, tools)
    outputs = {}
    for placement, inline_max in (("worker", 0), ("inline", 4096), ("worker", 4096)):
        sink = CollectSink()
        response = asyncio.run(live(reads(body, 1), sink, response_id="resp_gw", tools=registry(), placement=placement, inline_max_bytes=inline_max))  # type: ignore[arg-type]
        assert stable(response.to_dict()) == stable(ref_response)
        outputs[(placement, inline_max)] = sink.getvalue()
    first = next(iter(outputs.values()))
    strip = lambda b: b"\n".join(x for x in b.split(b"\n") if b'"created_at"' not in x)  # noqa: E731
    assert all(strip(v) == strip(first) for v in outputs.values())
    collected = asyncio.run(collect(reads(body, 2), response_id="resp_gw", tools=registry(), inline_max_bytes=0))
    assert stable(collected.to_dict()) == stable(ref_response)
    decoded = decode(reads(body, 3), validation=Validation.LENIENT, response_id="resp_gw", tools=registry())
    assert stable(decoded.to_dict()) == stable(ref_response)


def test_graph_frames_equal_the_core_frames_for_any_batching() -> None:
    body = fixture_bytes("tool-call-auto-qwen3-30b.sse")
    ref_frames, _ = reference(body, None)
    from respflow.flows import GraphRun

    for seed in range(5):
        run = GraphRun(Graph(response_id="resp_gw"))
        frames = []
        for chunk in reads(body, seed):
            frames += [f.data for f in run.process(chunk).frames]
        frames += [f.data for f in run.close().frames]
        assert frames == ref_frames


def test_a_user_operator_can_be_spliced_anywhere() -> None:
    seen: list[str] = []

    def tap(frame: Any) -> Any:
        seen.append(frame.type)
        return frame

    def shout(frame: Any) -> Any:
        if frame.type == "response.output_text.delta":
            frame.data["delta"] += "!"
        return frame

    graph = Graph(response_id="resp_gw")
    graph.splice("tap", each(tap, name="tap"), after="validate").splice("shout", each(shout, name="shout"), after="translate")
    assert graph.names == ["split", "normalize", "validate", "tap", "fold", "translate", "shout"]
    sink = CollectSink()
    asyncio.run(live([fixture_bytes("text-openai-gpt-4o.sse")], sink, graph=graph, placement="inline"))
    assert seen[0] == "response.created" and len(seen) == 11
    assert sink.getvalue().count(b'!","item_id"') == 3  # every text delta went through "shout"
    with pytest.raises(ValueError, match="exists already"):
        graph.splice("tap", each(tap, name="tap"), after="fold")
    with pytest.raises(ValueError, match="no step named"):
        graph.splice("other", each(tap, name="other"), before="relay")


def test_a_failing_user_operator_reaches_the_client_as_an_error_event() -> None:
    def boom(frame: Any) -> Any:
        if frame.type == "response.output_text.delta":
            raise ValueError("redactor failed")
        return frame

    graph = Graph(response_id="resp_gw").splice("boom", each(boom, name="boom"), after="translate")
    sink = CollectSink()
    from respflow.operators import RespflowError

    with pytest.raises(RespflowError) as info:
        asyncio.run(live([fixture_bytes("text-openai-gpt-4o.sse")], sink, graph=graph, placement="inline"))
    assert info.value.code == "internal_error"
    assert info.value.stage == "boom"
    out = sink.getvalue()
    assert out.count(b"event: error") == 1
    assert out.index(b"response.content_part.added") < out.index(b"event: error")


def test_a_graph_carries_one_stream() -> None:
    graph = Graph()
    decode(fixture_bytes("text-openai-gpt-4o.sse"), graph=graph, validation=Validation.LENIENT)
    with pytest.raises(RuntimeError, match="one stream"):
        decode(fixture_bytes("text-openai-gpt-4o.sse"), graph=graph)


def test_worker_placement_runs_the_core_on_the_pool_and_releases_it() -> None:
    threads: set[str] = set()

    def where(frame: Any) -> Any:
        threads.add(threading.current_thread().name)
        return frame

    graph = Graph().splice("where", each(where, name="where"), after="translate")
    asyncio.run(collect(reads(fixture_bytes("reasoning-vllm-qwen3-30b.sse"), 4), graph=graph, inline_max_bytes=0))
    assert any(name.startswith("respflow-core") for name in threads)
    assert CorePool._users == 0


@pytest.mark.parametrize("placement", ["worker", "inline"])
def test_strict_collect_raises_the_typed_error_with_partial_frames_delivered(placement: str) -> None:
    from respflow.operators import ProtocolError

    body = fixture_bytes("tool-call-auto-qwen3-30b.sse")
    with pytest.raises(ProtocolError) as info:
        asyncio.run(collect([body], validation=Validation.STRICT, placement=placement, inline_max_bytes=0))  # type: ignore[arg-type]
    assert info.value.code == "call_id_changed"
