"""The gateway: the HTTP surface, a request's rounds, gateway-owned tools, the simulator.

* `Gateway` — runs requests against one upstream (rounds, gateway tools, admission counts);
* `gateway_app` — its ASGI app (`GatewayApp`, a Starlette app with the hot path in front);
* `GatewayTool` — a Python callable the gateway runs between rounds;
* `HostedTool` — an executor for a hosted tool type (web_search, …), shown in its own shape;
* `simulator_app` — the built-in upstream simulator.
"""

from respflow.flows.gateway._app import GatewayApp, gateway_app
from respflow.flows.gateway._hosted import HostedTool
from respflow.flows.gateway._rounds import Gateway
from respflow.flows.gateway._simulator import simulator_app
from respflow.flows.gateway._tools import GatewayTool

__all__ = ["Gateway", "GatewayApp", "GatewayTool", "HostedTool", "gateway_app", "simulator_app"]
