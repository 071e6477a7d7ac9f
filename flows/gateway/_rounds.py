"""A request's rounds: `Gateway` in front of any OpenAI-style Responses upstream.

`Gateway.run` serves one request: it lists the tools of MCP servers the request declares,
sends the upstream every tool as a function, streams round 1 through the standard graph and
the relay (or collects it, for a non-streaming request), runs the gateway-owned calls of the
round (concurrently, bounded, each with a timeout; a failure is an error tool output), emits
their public lifecycle through the relay's local door, drains the frames that waited behind
them, and calls the upstream again with the tool outputs appended — up to ``max_rounds``. The
client sees ONE response: one created, one terminal, sequence numbers 0..N, output_index
continuing across rounds, usage summed. A round whose upstream stream ended without a terminal
event ends the response ``failed`` (fold's honest ending), never ``completed``.

The HTTP surface (admission control, the ASGI app) is `respflow.flows.gateway._app`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, cast

import orjson
from opentelemetry import propagate
from pydantic import ValidationError

from respflow.flows._graph import Graph, GraphRun
from respflow.flows._runner import Placement, batches
from respflow.flows._transport import Upstream, default_client
from respflow.flows.gateway._hosted import HostedTool, unavailable_executor
from respflow.flows.gateway._metrics import Metrics, start_span, tracing
from respflow.flows.gateway._state import Resolved, State, stored_item
from respflow.flows.gateway._tools import (
    Executor,
    GatewayTool,
    McpServer,
    gateway_tool_executor,
    list_tools_events,
    run_calls,
)
from respflow.operators import (
    Limits,
    RelayError,
    RequestError,
    RespflowError,
    Response,
    ToolKind,
    ToolRegistry,
    Translation,
    Validation,
)
from respflow.operators._fold import unstorable
from respflow.operators._tools import GATEWAY_BUILTINS, HostedPolicy
from respflow.sinks import Relay, Sink, relayed
from respflow.sinks.store import ANONYMOUS, Store

_CALLS = ("function_call", "custom_tool_call")


def new_response_id() -> str:
    return "resp_" + uuid.uuid4().hex


def _normalize_input(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return list(value)
    raise RequestError("'input' must be a string or an array of input items", param="input")


def _sum_usage(total: dict[str, Any] | None, usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if usage is None:
        return total
    if total is None:
        return orjson.loads(orjson.dumps(usage))  # type: ignore[no-any-return]
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        total[key] = int(total.get(key) or 0) + int(usage.get(key) or 0)
    for details, fields in (
        ("input_tokens_details", ("cached_tokens", "cache_write_tokens")),
        ("output_tokens_details", ("reasoning_tokens",)),
    ):
        mine = total.setdefault(details, {})
        theirs = usage.get(details) or {}
        for f in fields:
            mine[f] = int(mine.get(f) or 0) + int(theirs.get(f) or 0)
    return total


log = logging.getLogger("respflow")


_NOT_UPSTREAM = frozenset({"previous_response_id", "conversation", "background"})
"""Request fields the gateway answers itself (state it resolved, runs it keeps)."""


@dataclass
class _Turn:
    """One request, as the rounds see it."""

    body: Mapping[str, Any]
    headers: Mapping[str, str]
    model: str
    response_id: str
    registry: ToolRegistry
    executors: dict[str, Executor]
    mcp_servers: list[McpServer]
    relay: Relay | None
    base: dict[str, Any]
    tenant: str
    resolved: Resolved
    turn_input: list[dict[str, Any]]


def _round_items(graphs: list[Graph], registry: ToolRegistry) -> list[dict[str, Any]]:
    """The current round's items so far, in their public shapes (gateway calls withheld)."""
    if not graphs:
        return []
    try:
        items = graphs[-1].pipeline.folder.output_indexed()
    except Exception:  # a failure in the fold itself: nothing more can be said
        return []
    return [i for i in (registry.restore_item(item) for _, item in items) if i is not None]


def _checked(body: Mapping[str, Any]) -> tuple[str, list[Any], list[Any]]:
    """A request's model, input items and declared tools, checked."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("'model' is required and must be a string", param="model")
    input_items = _normalize_input(body.get("input"))
    declared = body.get("tools") or []
    if not isinstance(declared, list):
        raise RequestError("'tools' must be an array", param="tools")
    return model, input_items, declared


def _base(body: Mapping[str, Any], registry: ToolRegistry, resolved: Resolved) -> dict[str, Any]:
    """The Response fields a request sets (echoed in every snapshot and the final Response)."""
    base = {
        key: body[key]
        for key in ("instructions", "metadata", "temperature", "top_p", "tool_choice", "parallel_tool_calls", "max_output_tokens", "text", "reasoning", "store", "user")
        if key in body
    }
    base["tools"] = registry.public_tools
    base["store"] = resolved.store
    if resolved.background:
        base["background"] = True
    if resolved.conversation is not None:
        base["conversation"] = {"id": resolved.conversation}
    return base


class _NoSink:
    """A sink for a relay used only for its snapshots."""

    async def send(self, data: bytes) -> None:
        raise RuntimeError("this relay sends nothing")

    async def aclose(self) -> None:
        pass


def final_response(body: dict[str, Any]) -> Response:
    """The Response of a whole request; an upstream field it cannot hold is a typed error."""
    try:
        return Response.model_validate(body)
    except ValidationError as exc:
        raise unstorable(exc, list(range(len(body.get("output") or [])))) from None


class Gateway:
    """Runs requests against one upstream, with the embedding application's tools."""

    def __init__(
        self,
        upstream: str,
        *,
        tools: Sequence[GatewayTool] = (),
        client: Upstream | None = None,
        limits: Limits | None = None,
        placement: Placement = "worker",
        max_rounds: int = 10,
        tool_concurrency: int = 5,
        tool_timeout: float = 60.0,
        keepalive_interval: float = 15.0,
        client_stall_timeout: float = 60.0,
        customize: Callable[[Graph], Graph] | None = None,
        max_streams: int = 1024,
        hosted_tools: Sequence[HostedTool] = (),
        hosted: HostedPolicy = "drop",
        unknown_events: str = "forward",
        store: Store | None = None,
        store_ttl: float | None = None,
        max_history_items: int = 10_000,
        max_history_bytes: int = 32 << 20,
        background_retention: float = 3600.0,
        background_lease: float = 15.0,
        background_max_log_bytes: int = 64 << 20,
        metrics: Metrics | None = None,
    ) -> None:
        """Args:
            upstream: the upstream's base URL (``http://host:port/v1``).
            tools: the application's own tools, run between rounds.
            hosted_tools: executors for hosted tool types (web_search, file_search,
                code_interpreter, image_generation): a request that declares the type gets
                it, its calls shown in the type's own item shape.
            hosted: a hosted type a request declares that has no executor here is dropped
                (``"drop"``, the default: not offered to the model, echoed in
                ``response.tools``, named once in the log) or refused (``"reject"``: HTTP 400).
            unknown_events: upstream events of a well-formed type the protocol catalogue
                does not know are forwarded (``"forward"``) or dropped (``"drop"``); see `Relay`.
            store: where responses and conversations are kept (opened by the app's lifespan,
                or by the caller); None keeps nothing. ``store_ttl``: seconds a row is kept.
            max_history_items, max_history_bytes: the most a continued turn may carry (400
                past it).
            background_retention: seconds a background response's event log is kept after
                it ended (resumable that long). ``background_lease``: seconds a replica's
                claim on a background run lasts unrenewed (it renews every third of it); a
                run whose lease ran out is ended ``failed`` by another replica.
                ``background_max_log_bytes``: the most one background response's event log
                holds; past it the run ends ``failed`` (``log_bytes``).
            client: the upstream client; its pool must hold ``max_streams`` connections.
            customize: called with each round's fresh `Graph` (splice operators, add
                ``on_finish`` functions; the latter are applied to the final Response).
            max_streams: responses served at once; one more is refused at once (HTTP 503
                with ``Retry-After``) — admission control, never a queue that times out.
        """
        if max_rounds < 1 or tool_concurrency < 1 or tool_timeout <= 0:
            raise ValueError("max_rounds and tool_concurrency must be ≥ 1 and tool_timeout > 0")
        if max_streams < 1:
            raise ValueError("max_streams must be at least 1")
        self.upstream = upstream
        self.tools = list(tools)
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError("two gateway tools share a name")
        self.max_streams = max_streams
        self.client = client or default_client(max_connections=max_streams)
        if self.client.max_connections < max_streams:
            raise ValueError(
                f"the upstream client's pool ({self.client.max_connections} connections) is below "
                f"max_streams ({max_streams}): streams past it would wait for a connection"
            )
        self.active = 0
        """Responses being served now (admission control counts these)."""
        self.rejected = 0
        """Requests refused since start because ``max_streams`` were in flight."""
        self._executors: dict[str, Executor] = {t.name: gateway_tool_executor(t) for t in self.tools}
        self._declarations = [t.declaration() for t in self.tools]
        if hosted not in ("drop", "reject"):
            raise ValueError(f"hosted must be 'drop' or 'reject', not {hosted!r}")
        self.hosted = hosted
        if unknown_events not in ("forward", "drop"):
            raise ValueError(f"unknown_events must be 'forward' or 'drop', not {unknown_events!r}")
        self.unknown_events = unknown_events
        self.store = store
        self.state = State(store, ttl=store_ttl, max_history_items=max_history_items, max_history_bytes=max_history_bytes)
        self.hosted_tools: dict[str, HostedTool] = {h.type: h for h in hosted_tools}
        if len(self.hosted_tools) != len(hosted_tools):
            raise ValueError("two hosted tools share a type")
        self._hosted_types = {kind for kind, fn in GATEWAY_BUILTINS.items() if fn in {h.function for h in hosted_tools}}
        """Declared types an executor serves (web_search serves web_search_preview too)."""
        self._dropped_logged: set[str] = set()
        self.limits = limits or Limits()
        self.placement = placement
        self.max_rounds = max_rounds
        self.tool_concurrency = tool_concurrency
        self.tool_timeout = tool_timeout
        self.keepalive_interval = keepalive_interval
        self.client_stall_timeout = client_stall_timeout
        self.customize = customize
        if background_retention <= 0 or background_lease <= 0:
            raise ValueError("background_retention and background_lease must be positive")
        self.background_retention = background_retention
        self.background_lease = background_lease
        if background_max_log_bytes < 1:
            raise ValueError("background_max_log_bytes must be positive")
        self.background_max_log_bytes = background_max_log_bytes
        self.metrics = metrics or Metrics()
        """Prometheus metrics (`respflow.flows.gateway._metrics`); the app serves ``/metrics``."""
        if store is not None:
            self.metrics.instrument_store(store)

    async def aclose(self) -> None:
        await self.client.aclose()
        if self.store is not None:
            await self.store.aclose()

    def _hosted_wanted(self, declared: list[Any]) -> list[HostedTool]:
        """The hosted executors a request's tools ask for (each once)."""
        wanted: dict[str, HostedTool] = {}
        for decl in declared:
            kind = decl.get("type") if isinstance(decl, dict) else None
            if kind in self._hosted_types:
                tool = self.hosted_tools.get(GATEWAY_BUILTINS[kind]) or self.hosted_tools.get(kind)
                if tool is not None:
                    wanted[tool.function] = tool
        return list(wanted.values())

    def _registry(self, declared: list[Any], functions: list[dict[str, Any]]) -> ToolRegistry:
        try:
            return ToolRegistry(declared, gateway_functions=functions, hosted=self._hosted_types, hosted_policy=self.hosted)
        except RespflowError as exc:
            raise RequestError(exc.message, param="tools", code=exc.code) from None

    def queued(self, body: Mapping[str, Any], resolved: Resolved, response_id: str) -> dict[str, Any]:
        """The Response of a background request as it waits to run: the request's checks (model,
        input, tools) run first, so a bad request is refused before it is queued."""
        model, _, declared = _checked(body)
        registry = self._registry(declared, self._declarations)
        relay = Relay(_NoSink(), response_id=response_id, model=model, previous_response_id=body.get("previous_response_id"))
        return relay.snapshot(_base(body, registry, resolved), status="queued", output=[])

    async def run(
        self,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        sink: Sink | None,
        *,
        response_id: str | None = None,
        tenant: str = ANONYMOUS,
        resolved: Resolved | None = None,
        turn_input: list[dict[str, Any]] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> tuple[Response, int]:
        """Serve one request; stream to ``sink`` when given. Returns the Response and rounds.

        ``tenant`` owns what the request continues and what it stores (a hash of the caller's
        credential; `respflow.sinks.store.tenant_of`). ``resolved`` and ``turn_input``: the
        request's state and stored input, when the caller resolved them already (background
        runs). ``cancelled``: when the run is cancelled and this says True, the stream ends
        with a cancelled terminal (`Relay.cancel`) before the cancellation goes on.

        Raises a `RespflowError`. When the stream had started, the sink already got an
        ``error`` event (after every frame produced before the error).
        """
        model, input_items, declared = _checked(body)
        if resolved is None:
            resolved = await self.state.resolve(body, tenant)
        if turn_input is None:
            turn_input = [stored_item(i) for i in input_items] if resolved.store else []
        response_id = response_id or new_response_id()
        async with AsyncExitStack() as stack:
            mcp_servers = [McpServer(t) for t in declared if isinstance(t, dict) and t.get("type") == "mcp"]
            for server in mcp_servers:
                await server.connect(stack, self.tool_timeout)
            executors = self._executors
            functions = self._declarations
            wanted = self._hosted_wanted(declared)
            if mcp_servers or wanted:
                executors, functions = dict(executors), list(functions)
                for server in mcp_servers:
                    executors.update(server.executors(self.tool_timeout))
                    functions += server.declarations()
                for tool in wanted:
                    executors[tool.function] = tool.executor(self.tool_timeout)
                    functions.append(tool.declaration())
            registry = self._registry(declared, functions)
            for kind in registry.dropped:
                if kind not in self._dropped_logged:
                    self._dropped_logged.add(kind)
                    log.info(
                        "requests declare the hosted tool %r, which has no executor here: it is not offered to the "
                        "model and a call to it is a failed tool output (hosted=drop; register a HostedTool to run it)",
                        kind,
                    )
            base = _base(body, registry, resolved)
            input_items = registry.upstream_input(resolved.history + input_items)
            relay = None
            if sink is not None:
                relay = Relay(
                    sink,
                    response_id=response_id,
                    model=model,
                    previous_response_id=body.get("previous_response_id"),
                    limits=self.limits,
                    base=base,
                    unknown_events=self.unknown_events,
                )
            public: list[dict[str, Any]] = []
            graphs: list[Graph] = []
            try:
                turn = _Turn(body, headers, model, response_id, registry, executors, mcp_servers, relay, base, tenant, resolved, turn_input)
                return await self._rounds(turn, input_items, public, graphs)
            except RelayError:
                raise
            except asyncio.CancelledError:
                if cancelled is not None and cancelled() and relay is not None and not relay.finished:
                    with contextlib.suppress(RespflowError, OSError):
                        await relay.cancel(output=public + _round_items(graphs, registry))
                raise
            except Exception as exc:
                # a bug (not a RespflowError) still ends the stream: an error event, then a
                # response.failed holding what the response had so far
                if relay is not None and relay.sequence > 0 and not relay.finished:
                    with contextlib.suppress(RespflowError, OSError):
                        partial = exc.partial if isinstance(exc, RespflowError) else []
                        if partial:
                            await relay.emit_upstream(Translation(partial, None))
                        status = getattr(exc, "status", None)
                        default = 502 if isinstance(exc, RespflowError) else 500
                        output = public + _round_items(graphs, registry)
                        await relay.fail(exc, status=status if isinstance(status, int) else default, output=output)
                raise

    async def _rounds(
        self, turn: _Turn, input_items: list[Any], public: list[dict[str, Any]], graphs: list[Graph]
    ) -> tuple[Response, int]:
        """The rounds; ``public`` collects the client's items, ``graphs`` holds the graph of a
        round whose items are not in ``public`` yet (so a failure can say what the response had)."""
        body, headers, model, response_id = turn.body, turn.headers, turn.model, turn.response_id
        registry, executors, mcp_servers, relay, base = turn.registry, turn.executors, turn.mcp_servers, turn.relay, turn.base
        if mcp_servers:
            events: list[dict[str, Any]] = []
            for server in mcp_servers:
                item = server.list_item()
                events += list_tools_events(item, len(public))
                public.append(item)
            if relay is not None:
                await relay.emit_local(events)
        usage: dict[str, Any] | None = None
        status, error, incomplete = "completed", None, None
        upstream_tools = registry.upstream_tools()
        rounds = 0
        while True:
            rounds += 1
            request = {k: v for k, v in body.items() if k not in _NOT_UPSTREAM}
            request.update(input=input_items, stream=True, store=False)
            if upstream_tools or "tools" in body:
                request["tools"] = upstream_tools
            if rounds > 1:
                request["tool_choice"] = "auto"
            elif "tool_choice" in body:
                request["tool_choice"] = registry.upstream_tool_choice(body["tool_choice"])
            offset = len(public)
            graph = Graph(validation=Validation.LENIENT, response_id=response_id, model=model, tools=registry, limits=self.limits)
            if self.customize is not None:
                graph = self.customize(graph)
            graphs.append(graph)
            if relay is not None:
                relay.start_round(offset)
            with start_span("upstream round", attributes={"respflow.round": rounds}) as span:
                summary = await self._round(graph, request, headers, relay)
                span.set_attribute("respflow.round.status", str(summary["status"]))
            usage = _sum_usage(usage, summary.get("usage"))
            status, error, incomplete = summary["status"], summary.get("error"), summary.get("incomplete_details")
            items = graph.pipeline.folder.output_indexed()
            gateway_calls: list[tuple[int, dict[str, Any]]] = []
            round_public: dict[int, dict[str, Any]] = {}
            for index, item in items:
                route = registry.route(str(item.get("name", ""))) if item.get("type") == "function_call" else None
                if route is not None and route.kind is ToolKind.GATEWAY:
                    gateway_calls.append((index, item))
                    continue
                restored = registry.restore_item(item)
                if restored is not None:
                    round_public[index] = restored
            client_action = any(i.get("type") in _CALLS for i in round_public.values())
            run_tools = bool(gateway_calls) and not client_action and status == "completed"
            tool_events: dict[int, list[dict[str, Any]]] = {}
            outcomes = []
            if run_tools:
                calls = [
                    (executors.get(str(item["name"])) or unavailable_executor(str(item["name"])), str(item["name"]), str(item.get("arguments") or ""))
                    for _, item in gateway_calls
                ]
                outcomes = await self._run_tools(calls, relay)
                for (index, item), outcome, (executor, _, arguments) in zip(gateway_calls, outcomes, calls, strict=True):
                    public_item = executor.public_item(str(item.get("call_id") or item.get("id") or index), arguments, outcome)
                    round_public[index] = public_item
                    tool_events[offset + index] = executor.public_events(public_item, offset + index)
            if relay is not None:
                await relay.drain(tool_events)
            public += [round_public[i] for i in sorted(round_public)]
            graphs.clear()  # this round's items are in ``public`` now
            if not run_tools:
                break
            if rounds >= self.max_rounds:
                status, incomplete = "incomplete", {"reason": "max_tool_rounds"}
                break
            input_items = input_items + [item for _, item in items]
            for (_, item), outcome in zip(gateway_calls, outcomes, strict=True):
                output = outcome.output if outcome.error is None else f"ERROR: {outcome.error}"
                input_items.append({"type": "function_call_output", "call_id": item.get("call_id", ""), "output": output or ""})
        final = {
            **base,
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "status": status,
            "output": public,
            "usage": usage,
            "error": error,
            "incomplete_details": incomplete,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": registry.public_tools,
        }
        if body.get("previous_response_id") is not None:
            final["previous_response_id"] = body["previous_response_id"]
        if turn.resolved.conversation is not None:
            final["conversation"] = {"id": turn.resolved.conversation}
        response = graph.finish_response(final_response(final))
        # kept BEFORE the terminal is sent: a client that sees it completed can chain at once
        await self.state.persist(turn.tenant, turn.resolved, response.to_dict(), turn.turn_input)
        if relay is not None:
            await relay.complete(response)
        return response, rounds

    async def _round(self, graph: Graph, request: Mapping[str, Any], headers: Mapping[str, str], relay: Relay | None) -> dict[str, Any]:
        """Stream one upstream round through the graph (and the relay); its outcome."""
        carrier = dict(headers)
        if tracing():
            propagate.inject(carrier)  # traceparent, when a span is being recorded
        http = await self.client.open(self.upstream, request, headers=carrier)
        reads = batches(
            http,
            GraphRun(graph),
            placement=self.placement,
            read_timeout=self.limits.read_timeout,
        )
        if relay is not None:
            # the relay sink's raw async generator: aiostream's Stream wrappers would add two
            # more layers per read; `relayed` itself closes ``reads`` on any exit
            relaying = cast(AsyncGenerator[int, None], relayed.raw(reads, relay))
            async with contextlib.aclosing(relaying):
                async for _ in relaying:
                    pass
        else:
            async with contextlib.aclosing(reads) as translations:
                async for _ in translations:
                    pass
        return graph.pipeline.outcome()

    def _tool_label(self, name: str) -> str:
        """A bounded label: a configured tool's name; ``mcp`` for a request-declared server's."""
        if name in self._executors or any(tool.function == name for tool in self.hosted_tools.values()):
            return name
        return "mcp"

    async def _run_tools(self, calls: list[tuple[Executor, str, str]], relay: Relay | None) -> list[Any]:
        work = asyncio.ensure_future(
            run_calls(calls, concurrency=self.tool_concurrency, timeout=self.tool_timeout, label=self._tool_label, observe=self.metrics.tool_call)
        )
        if relay is None or self.keepalive_interval <= 0:
            return await work
        try:
            while True:
                done, _ = await asyncio.wait({work}, timeout=self.keepalive_interval)
                if done:
                    return work.result()
                await relay.comment("keep-alive: gateway tools running")
        finally:
            if not work.done():
                work.cancel()
