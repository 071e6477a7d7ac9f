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

from respflow.operators._errors import ProtocolError
from respflow.operators._frames import CATALOGUE, OTHER, RENAMES, EventSpec, Frame, ParsedFrame
from respflow.operators._split import SseLine


class Normalizer:
    """Parse and classify upstream events."""

    __slots__ = ()

    def feed(self, line: SseLine) -> list[Frame]:
        """One payload in, one frame out."""
        return self.feed_all([line])

    def normalize(self, line: SseLine) -> Frame:
        """One payload in, one frame out."""
        return self.feed_all([line])[0]

    def flush(self) -> list[Frame]:
        """Nothing is held back."""
        return []

    def feed_all(self, lines: list[SseLine]) -> list[Frame]:
        """A batch of payloads in, their frames out, in order (``partial`` on an error).

        The one implementation: the per-item methods call it with one line.
        """
        out: list[Frame] = []
        append = out.append
        loads = orjson.loads
        catalogue = CATALOGUE
        completed = CATALOGUE["response.completed"]
        parsed = ParsedFrame
        frame: Frame
        for payload, line_no in lines:
            try:
                data: Any = loads(payload)
            except orjson.JSONDecodeError:
                append(Frame("", {}, OTHER, line_no, _why(payload)))
                continue
            try:
                # the shape of every sub-event (a delta is one): an object with a catalogued
                # type and an output_index; anything else raises here and is classified below
                spec = catalogue[data["type"]]
                index = data["output_index"]
            except (KeyError, TypeError):
                try:
                    append(_classify(data, line_no))
                except ProtocolError as exc:
                    exc.partial = out
                    raise
                continue
            if type(index) is not int or index >> 32 or spec is completed:
                try:  # not 0 <= index <= 0xFFFFFFFF (an error), or a completed to look into
                    append(_classify(data, line_no))
                except ProtocolError as exc:
                    exc.partial = out
                    raise
                continue
            # Frame(spec.type, data, spec, line_no) without the Python-level __init__ call,
            # which costs ~100 ns per token (ParsedFrame is a Frame)
            frame = parsed()
            frame.type = spec.type
            frame.data = data
            frame.spec = spec
            frame.line = line_no
            frame.malformed = None
            append(frame)
        return out


def _classify(data: Any, line_no: int) -> Frame:
    """Every event off the hot path: not an object, no or an unknown type, a vLLM name, a
    response-level event (no output_index), vLLM's incomplete-as-completed."""
    if type(data) is not dict:
        return Frame("", {}, OTHER, line_no, "json")
    kind = data.get("type")
    spec = CATALOGUE.get(kind) if type(kind) is str else None
    if spec is None:
        spec = _renamed(data) if type(kind) is str else None
        if spec is None:
            return _unlisted(data, line_no)
    if spec.type == "response.completed":  # also a renamed response.done
        spec = _completed(data)
    index = data.get("output_index", 0)  # absent is fine; null is not
    if type(index) is not int or index >> 32:
        raise _invalid_index(line_no)
    return Frame(spec.type, data, spec, line_no)


def _invalid_index(line_no: int) -> ProtocolError:
    return ProtocolError(
        "upstream stream has an invalid 'output_index': expected an unsigned 32-bit integer",
        code="invalid_output_index",
        stage="normalize",
        line=line_no,
    )


def _renamed(data: dict[str, Any]) -> EventSpec | None:
    """A vLLM name for an OpenAI event: renamed in place; None for any other unlisted type."""
    renamed = RENAMES.get(data["type"])
    if renamed is None:
        return None
    data["type"] = renamed
    return CATALOGUE[renamed]


def _unlisted(data: dict[str, Any], line_no: int) -> Frame:
    """An untyped event, or one of a type we do not know: passed on as OTHER."""
    kind = data.get("type")
    if kind is None:
        return Frame("", data, OTHER, line_no)
    if type(kind) is not str:
        return Frame("", data, OTHER, line_no, "json")
    return Frame(kind, data, OTHER, line_no)


def _completed(data: dict[str, Any]) -> EventSpec:
    """vLLM reports a truncated answer as ``completed`` with status ``incomplete``."""
    response = data.get("response")
    if type(response) is dict and response.get("status") == "incomplete":
        data["type"] = "response.incomplete"
        return CATALOGUE["response.incomplete"]
    return CATALOGUE["response.completed"]


def _why(data: bytes) -> str:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "utf8"
    return "json"
