"""The README's main job: ``respflow serve`` with no upstream answers curl-style and openai
calls, and keeps what it answered in its embedded SQLite file across a restart."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

pytestmark = pytest.mark.timeout(90)


@contextlib.contextmanager
def serve(data_home: str, log: list[str]) -> Iterator[str]:
    """``respflow serve`` as the README runs it (no upstream, no --store); its output into ``log``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "respflow", "serve", "--port", str(port), "--pace", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "XDG_DATA_HOME": data_home},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "respflow serve did not come up"
            time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
        log.append(out.decode())


def test_respflow_serve_works_on_the_builtin_simulator() -> None:
    with tempfile.TemporaryDirectory() as data_home:
        first: list[str] = []
        with serve(data_home, first) as base:
            # curl -N style: raw SSE
            with httpx.stream("POST", base + "/v1/responses", json={"model": "m", "input": "hello", "stream": True}, timeout=30) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                raw = b"".join(r.iter_bytes())
            assert raw.startswith(b"event: response.created\ndata: ")
            assert b"event: response.completed" in raw
            # the official client, strict, with the demo gateway tool (two rounds)
            with (
                openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, _strict_response_validation=True) as client,
                client.responses.stream(model="m", input="add_numbers 20 and 22") as stream,
            ):
                final = stream.get_final_response()
            assert [item.type for item in final.output] == ["mcp_call", "message"]
            assert final.output[1].content[0].text == "The tool returned 42."  # type: ignore[union-attr]
        log = first[0]
        where = os.path.join(data_home, "respflow", "respflow.db")
        assert f"store: sqlite at {where}" in log
        assert os.path.exists(where)
        assert "serving on http://127.0.0.1" in log
        assert "rounds=2" in log and "outcome=completed" in log
        assert "authorization" not in log.lower()

        # a second start on the same file still knows the response, and can continue it
        second: list[str] = []
        with (
            serve(data_home, second) as base,
            openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, _strict_response_validation=True) as client,
        ):
            kept = client.responses.retrieve(final.id)
            assert kept.output_text == "The tool returned 42."
            follow = client.responses.create(model="m", input="thanks", previous_response_id=final.id)
            assert follow.previous_response_id == final.id
            assert [i.type for i in client.responses.input_items.list(follow.id).data] == ["message"]
