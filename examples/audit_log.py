"""Example (b): a custom flow that taps the graph and writes an audit log of every frame.

The tap is a plain function lifted with ``operators.each`` and spliced right after
``translate``: it sees every public frame, in order, before any client would. Each line of the
log is one JSON object: the frame's type, output_index and its size in bytes (not the content:
an audit log should not copy what the model said).

Run: ``python -m examples.audit_log tests/fixtures/reasoning-vllm-qwen3-30b.sse audit.jsonl``
"""

from __future__ import annotations

import sys
from typing import IO

import orjson

from respflow.flows import Graph, decode
from respflow.operators import Frame, Response, Validation, each


def audited_graph(log: IO[bytes]) -> Graph:
    """The standard graph with an audit tap after translate."""

    def audit(frame: Frame) -> Frame:
        record = {
            "line": frame.line,
            "type": frame.type,
            "output_index": frame.data.get("output_index"),
            "bytes": len(orjson.dumps(frame.data)),
        }
        log.write(orjson.dumps(record) + b"\n")
        return frame

    return Graph().splice("audit", each(audit, name="audit"), after="translate")


def audit_recording(path: str, log_path: str) -> Response:
    with open(path, "rb") as recording, open(log_path, "wb") as log:
        return decode(recording.read(), graph=audited_graph(log), validation=Validation.LENIENT)


if __name__ == "__main__":
    response = audit_recording(sys.argv[1], sys.argv[2])
    print(f"{response.status}: {len(response.output)} items; audit log in {sys.argv[2]}")
