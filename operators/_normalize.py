"""normalize: `SseLine` → `Frame`.

In: the data payload of one SSE event. Out: one `Frame` — the payload parsed once (orjson),
its type looked up in the catalogue (unknown types become pass-through ``OTHER`` frames), vLLM
names rewritten to OpenAI's (``response.done`` → ``response.completed``,
``response.reasoning_part.*`` → ``response.content_part.*``, a ``completed`` whose status is
``incomplete`` → ``response.incomplete``), in the frame *and* its wire JSON.

A payload that is not a JSON object, or whose ``type`` is not a string, or a line split found
not to be UTF-8, becomes a *malformed* frame: the validate stage decides (strict error,
lenient counted skip). No state. Raises `ProtocolError` (``invalid_output_index``) under every
policy when ``output_index`` is present and not an unsigned 32-bit integer.
"""

from __future__ import annotations

from typing import Any

import orjson

from operators._errors import ProtocolError
from operators._frames import CATALOGUE, OTHER, RENAMES, Frame
from operators._split import SseLine

_U32_MAX = 0xFFFFFFFF


class Normalizer:
    """Parse and classify upstream events."""

    __slots__ = ()

    def feed(self, line: SseLine) -> list[Frame]:
        """One payload in, one frame out."""
        return [self.normalize(line)]

    def feed_all(self, lines: list[SseLine]) -> list[Frame]:
        """A batch of payloads in, their frames out (``partial`` on an error)."""
        out: list[Frame] = []
        normalize = self.normalize
        try:
            for line in lines:
                out.append(normalize(line))
        except ProtocolError as exc:
            exc.partial = out
            raise
        return out

    def flush(self) -> list[Frame]:
        """Nothing is held back."""
        return []

    def normalize(self, line: SseLine) -> Frame:
        """One payload in, one frame out."""
        payload, line_no = line
        try:
            data: Any = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return Frame("", {}, OTHER, line_no, _why(payload))
        if type(data) is not dict:
            return Frame("", {}, OTHER, line_no, "json")
        kind = data.get("type")
        spec = CATALOGUE.get(kind)  # type: ignore[arg-type]
        if spec is None:
            if kind is None:
                return Frame("", data, OTHER, line_no)
            if type(kind) is not str:
                return Frame("", data, OTHER, line_no, "json")
            renamed = RENAMES.get(kind)
            if renamed is None:
                return Frame(kind, data, OTHER, line_no)
            kind = data["type"] = renamed
            spec = CATALOGUE[kind]
        if kind == "response.completed":
            response = data.get("response")
            if type(response) is dict and response.get("status") == "incomplete":
                kind = data["type"] = "response.incomplete"
                spec = CATALOGUE[kind]
        if "output_index" in data:
            index = data["output_index"]
            if type(index) is not int or index < 0 or index > _U32_MAX:
                raise ProtocolError(
                    "upstream stream has an invalid 'output_index': expected an unsigned "
                    "32-bit integer",
                    code="invalid_output_index",
                    stage="normalize",
                    line=line_no,
                )
        return Frame(spec.type, data, spec, line_no)


def _why(data: bytes) -> str:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "utf8"
    return "json"
