"""Every example runs, and does what it says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from examples.audit_log import audit_recording
from examples.collect_recording import collect_recording
from examples.redacting_app import EmailRedactor, chat_app, redact
from examples.web_search_app import search, search_app
from respflow.flows import simulator_app
from respflow.operators import Frame
from tests._support import FIXTURES
from tests.integration.servers import serve


def test_collect_recording_in_five_lines() -> None:
    response = collect_recording(str(FIXTURES / "function-call-vllm-gemma4.sse"))
    assert response.to_dict()["output"][0]["name"] == "get_weather"
    source = Path("examples/collect_recording.py").read_text()
    body = source[source.index("def collect_recording") :].split("\n\n\n")[0]
    assert len([line for line in body.splitlines() if line.strip()]) <= 5


def test_collect_recording_runs_as_a_script() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "examples.collect_recording", str(FIXTURES / "text-openai-gpt-4o.sse")],
        capture_output=True, timeout=60, check=True,
    )
    assert json.loads(result.stdout)["status"] == "completed"


def test_audit_log_has_one_line_per_public_frame(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    response = audit_recording(str(FIXTURES / "reasoning-vllm-qwen3-30b.sse"), str(log))
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 222  # every event of the recording passed the tap
    assert records[0]["type"] == "response.created" and records[-1]["type"] == "response.completed"
    assert all(r["bytes"] > 0 for r in records)
    assert response.status == "completed"


def test_the_redactor_catches_an_address_split_across_deltas() -> None:
    redactor = EmailRedactor()
    out = []
    for piece in ["write to jane.", "doe@exam", "ple.com now", " please"]:
        out += redactor.feed(Frame.new("response.output_text.delta", {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": piece}))
    out += redactor.feed(Frame.new("response.output_text.done", {"type": "response.output_text.done", "output_index": 0, "content_index": 0, "text": "write to jane.doe@example.com now please"}))
    deltas = "".join(f.data["delta"] for f in out if f.type == "response.output_text.delta")
    assert deltas == "write to [email] now please"
    assert out[-1].data["text"] == "write to [email] now please"
    assert redact("a@b.co and c.d@e.org") == "[email] and [email]"


def test_the_redacting_app_redacts_the_stream_and_the_final_response() -> None:
    with serve(simulator_app(pace=0.0)) as upstream, serve(chat_app(upstream)) as app:
        url = app.removesuffix("/v1") + "/chat"
        body = httpx.post(url, json={"input": "mail jane.doe@example.com today"}, timeout=30).text
    assert "jane.doe" not in body and "example.com" not in body
    assert body.count("[email]") >= 3  # the deltas, the done events, the final Response
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "You said: mail [email] today"
    final = events[-1]
    assert final["type"] == "response.completed"
    assert final["response"]["output"][0]["content"][0]["text"] == "You said: mail [email] today"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_the_web_search_example_ranks_its_index() -> None:
    found = search({"query": "what is a potato"})
    assert found["sources"][0]["url"] == "https://en.wikipedia.org/wiki/Potato"
    assert search({"query": "zzz"}) == {"output": "no results", "sources": []}


def test_the_web_search_app_answers_with_a_web_search_call_and_the_models_answer() -> None:
    with serve(simulator_app(pace=0.0)) as upstream, serve(search_app(upstream)) as app:
        body = httpx.post(app + "/responses", json={"model": "m", "input": "please web_search server-sent events", "tools": [{"type": "web_search"}]}, timeout=30).json()
    ws, message = body["output"]
    assert ws["type"] == "web_search_call" and ws["status"] == "completed"
    assert ws["action"]["sources"][0]["url"] == "https://en.wikipedia.org/wiki/Server-sent_events"
    assert "push a stream of text events" in message["content"][0]["text"]
