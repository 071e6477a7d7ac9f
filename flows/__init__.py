"""respflow's assembled graphs and drivers, the gateway, and the ``respflow`` CLI.

* `Graph` — one stream's reactive graph (split → normalize → validate → fold → translate),
  with `Graph.splice` for user operators; `GraphRun` drives it one read at a time.
* `live`, `collect`, `decode` — the three drivers over one graph.
* `batches` — the runner (event loop + shared core pool, bounded buffers).
* `Gateway`, `gateway_app`, `GatewayTool` — the gateway (an ASGI app) and its own tools;
  `simulator_app` — the built-in upstream.
"""

from respflow.flows._drivers import collect, decode, live, sse_body
from respflow.flows._gateway import Gateway, gateway_app
from respflow.flows._gateway_tools import GatewayTool
from respflow.flows._graph import STANDARD_STEPS, Graph, GraphRun
from respflow.flows._runner import BatchQueue, CorePool, Placement, Strand, batches
from respflow.flows._simulator import simulator_app
from respflow.flows._transport import body_bytes, default_client, open_stream

__all__ = [
    "STANDARD_STEPS",
    "BatchQueue",
    "CorePool",
    "Gateway",
    "GatewayTool",
    "Graph",
    "GraphRun",
    "Placement",
    "Strand",
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
