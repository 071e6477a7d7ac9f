"""Example (d): make the hosted ``web_search`` tool real, backed by your own search.

Coding agents and the OpenAI Agents SDK (``WebSearchTool()``) declare ``{"type": "web_search"}``
and expect the server to run it. An OpenAI-style upstream such as vLLM cannot: it only knows
functions. Register a `HostedTool` and the gateway does it: the model sees a ``web_search``
function, the gateway runs your search between two rounds, and the client sees a
``web_search_call`` item (its query and sources) followed by the model's answer — the shape it
would get from OpenAI.

Here the "web" is a small in-memory index; swap ``search`` for a real search API, or give
``HostedTool("web_search", mcp_url=…)`` to serve it from an MCP server.

Run: ``python -m examples.web_search_app`` (the gateway on :8002, in front of the built-in
simulator), then with the official client::

    client.responses.create(model="any", input="please web_search potatoes",
                            tools=[{"type": "web_search"}])
"""

from __future__ import annotations

import re
import sys
from typing import Any

from respflow.flows import Gateway, GatewayApp, HostedTool, gateway_app

INDEX: list[dict[str, str]] = [
    {
        "url": "https://en.wikipedia.org/wiki/Potato",
        "title": "Potato",
        "text": "The potato is a starchy tuber of the plant Solanum tuberosum, first domesticated in the Andes.",
    },
    {
        "url": "https://en.wikipedia.org/wiki/Tomato",
        "title": "Tomato",
        "text": "The tomato is the edible berry of the plant Solanum lycopersicum, a relative of the potato.",
    },
    {
        "url": "https://en.wikipedia.org/wiki/Server-sent_events",
        "title": "Server-sent events",
        "text": "Server-sent events let a server push a stream of text events to a client over one HTTP response.",
    },
]
_WORD = re.compile(r"[a-z0-9]+")


def search(arguments: dict[str, Any]) -> dict[str, Any]:
    """Rank the index by the words it shares with the query; the best two are the result."""
    words = set(_WORD.findall(str(arguments.get("query", "")).lower()))
    scored = sorted(INDEX, key=lambda doc: -len(words & set(_WORD.findall((doc["title"] + " " + doc["text"]).lower()))))
    hits = [doc for doc in scored[:2] if words & set(_WORD.findall((doc["title"] + " " + doc["text"]).lower()))]
    output = "\n".join(f"{doc['title']} ({doc['url']}): {doc['text']}" for doc in hits) or "no results"
    return {"output": output, "sources": [{"url": doc["url"], "title": doc["title"]} for doc in hits]}


def search_gateway(upstream: str) -> Gateway:
    """A gateway in front of ``upstream`` that runs ``web_search`` with `search`."""
    return Gateway(upstream, hosted_tools=[HostedTool("web_search", fn=search)])


def search_app(upstream: str) -> GatewayApp:
    return gateway_app(search_gateway(upstream))


if __name__ == "__main__":  # pragma: no cover - a manual run
    import asyncio

    import uvicorn

    from respflow.flows import simulator_app

    async def main() -> None:
        sim = uvicorn.Server(uvicorn.Config(simulator_app(pace=0.02), port=8003, log_level="warning"))
        app = uvicorn.Server(uvicorn.Config(search_app("http://127.0.0.1:8003/v1"), port=int(sys.argv[1]) if len(sys.argv) > 1 else 8002))
        await asyncio.gather(sim.serve(), app.serve())

    asyncio.run(main())
