"""Example (a): the standard graph embedded in your own Starlette app, with your own operator.

``POST /chat`` takes ``{"input": "..."}``, asks an OpenAI-style upstream for a streamed answer
and relays it as Responses SSE — with every e-mail address replaced by ``[email]`` before it
reaches the client: in the text deltas (an address split across deltas included), in the done
events, and in the final Response.

The redactor is a stateful stage (``feed``/``flush``) lifted with ``operators.lift`` and spliced
after ``translate``; the same rule is applied to the final Response with ``Graph.on_finish``.

Run: ``python -m examples.redacting_app http://127.0.0.1:8000/v1`` (any Responses upstream;
``respflow serve`` is one), then ``curl -N localhost:8001/chat -d '{"input": "hi"}'``.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from respflow.flows import Graph, body_bytes, default_client, live, open_stream, sse_body
from respflow.operators import Frame, Response, lift
from respflow.sinks import Sink

EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
MASK = "[email]"


def redact(text: str) -> str:
    return EMAIL.sub(MASK, text)


class EmailRedactor:
    """Redact e-mail addresses from text deltas, holding back a word that is still growing.

    An address can arrive split over several deltas ("jane.doe@" + "example.com"), so the
    text after the last whitespace of each item's stream is held until the word is complete
    (whitespace follows, or the text is done).
    """

    def __init__(self) -> None:
        self._held: dict[tuple[int, int], str] = {}

    def feed(self, frame: Frame) -> list[Frame]:
        data = frame.data
        if frame.type == "response.output_text.delta":
            key = (data.get("output_index", 0), data.get("content_index", 0))
            text = self._held.pop(key, "") + str(data.get("delta", ""))
            cut = max(text.rfind(" "), text.rfind("\n")) + 1
            ready, self._held[key] = text[:cut], text[cut:]
            if not ready:
                return []
            data["delta"] = redact(ready)
            return [frame]
        out: list[Frame] = []
        if frame.type == "response.output_text.done":
            key = (data.get("output_index", 0), data.get("content_index", 0))
            rest = self._held.pop(key, "")
            if rest:
                flushed = dict(data, type="response.output_text.delta", delta=redact(rest))
                flushed.pop("text", None)
                out.append(Frame.new("response.output_text.delta", flushed, frame.line))
            data["text"] = redact(str(data.get("text", "")))
        elif frame.type == "response.content_part.done":
            part = data.get("part")
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                data["part"] = dict(part, text=redact(part["text"]))
        elif frame.type == "response.output_item.done":
            data["item"] = _redact_item(data.get("item"))
        out.append(frame)
        return out

    def flush(self) -> list[Frame]:
        return []


def _redact_item(item: Any) -> Any:
    if not isinstance(item, dict) or item.get("type") != "message":
        return item
    content = [dict(p, text=redact(p["text"])) if isinstance(p, dict) and isinstance(p.get("text"), str) else p for p in item.get("content") or []]
    return dict(item, content=content)


def redact_response(response: Response) -> Response:
    body = response.to_dict()
    body["output"] = [_redact_item(item) for item in body["output"]]
    return Response.model_validate(body)


def redacting_graph() -> Graph:
    return Graph().splice("redact", lift(EmailRedactor, name="redact"), after="translate").on_finish(redact_response)


def chat_app(upstream: str) -> Starlette:
    client = default_client()

    async def chat(request: Request) -> StreamingResponse:
        question = (await request.json()).get("input", "")

        async def run(sink: Sink) -> None:
            http = await open_stream(client, upstream, {"model": "any", "input": question, "stream": True})
            await live(body_bytes(http), sink, graph=redacting_graph())

        return StreamingResponse(sse_body(run), media_type="text/event-stream")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    return Starlette(routes=[Route("/chat", chat, methods=["POST"])], lifespan=lifespan)


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(chat_app(sys.argv[1]), port=8001)
