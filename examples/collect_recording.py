"""Example (c): the final Response of a recorded stream, in five lines.

Run: ``python -m examples.collect_recording tests/fixtures/function-call-vllm-gemma4.sse``
"""

from __future__ import annotations

import sys

from respflow.flows import decode
from respflow.operators import Response, Validation


def collect_recording(path: str) -> Response:
    with open(path, "rb") as recording:
        return decode(recording.read(), validation=Validation.LENIENT)


if __name__ == "__main__":
    print(collect_recording(sys.argv[1]).to_json().decode())
