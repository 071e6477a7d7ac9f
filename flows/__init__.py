"""respflow's assembled graphs and drivers, the gateway, and the ``respflow`` CLI.

* `Graph` — one stream's reactive graph (split → normalize → validate → fold → translate),
  with `Graph.splice` for user operators; `GraphRun` drives it one read at a time.
* `live`, `collect`, `decode` — the three drivers over one graph.
* `batches` — the runner (event loop + shared core pool, bounded buffers).
"""

from flows._drivers import collect, decode, live
from flows._graph import STANDARD_STEPS, Graph, GraphRun
from flows._runner import BatchQueue, CorePool, Placement, Strand, batches

__all__ = [
    "STANDARD_STEPS",
    "BatchQueue",
    "CorePool",
    "Graph",
    "GraphRun",
    "Placement",
    "Strand",
    "batches",
    "collect",
    "decode",
    "live",
]
