"""respflow's assembled graphs and drivers, the gateway, and the ``respflow`` CLI.

* `Graph` — one stream's reactive graph (split → normalize → validate → fold → translate),
  with `Graph.splice` for user operators; `GraphRun` drives it one read at a time.
* `live`, `collect`, `decode` — the three drivers over one graph.
* `batches` — the runner (event loop + shared core pool, bounded buffers).
* `Gateway`, `gateway_app`, `GatewayTool` — the gateway (an ASGI app) and its own tools;
  `simulator_app` — the built-in upstream (all in `respflow.flows.gateway`).
* `Upstream`, `default_client`, `open_stream`, `body_bytes` — the upstream transport (aiohttp).
"""

from respflow.flows._drivers import collect, decode, live, sse_body
from respflow.flows._graph import STANDARD_STEPS, Graph, GraphRun
from respflow.flows._runner import BatchQueue, CorePool, Placement, Strand, batches
from respflow.flows._transport import (
    Upstream,
    UpstreamBody,
    body_bytes,
    default_client,
    open_stream,
)
from respflow.flows.gateway import (
    Gateway,
    GatewayApp,
    GatewayTool,
    HostedTool,
    gateway_app,
    simulator_app,
)

__all__ = [
    "STANDARD_STEPS",
    "BatchQueue",
    "CorePool",
    "Gateway",
    "GatewayApp",
    "GatewayTool",
    "Graph",
    "GraphRun",
    "HostedTool",
    "Placement",
    "Strand",
    "Upstream",
    "UpstreamBody",
    "batches",
    "body_bytes",
    "collect",
    "decode",
    "default_client",
    "gateway_app",
    "live",
    "open_stream",
    "simulator_app",
    "sse_body",
]
