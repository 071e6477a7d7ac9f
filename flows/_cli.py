"""The ``respflow`` command: fold, relay, serve, bench."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

import orjson

from respflow.flows._drivers import decode
from respflow.flows._graph import Graph
from respflow.operators import RespflowError, ToolRegistry, Validation

_READ = 64 << 10


def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    while chunk := stream.read(_READ):
        yield chunk


def _open(path: str) -> BinaryIO:
    if path == "-":
        return sys.stdin.buffer
    return open(path, "rb")


def _load_tools(path: str | None) -> ToolRegistry | None:
    if path is None:
        return None
    with open(path, "rb") as fh:
        tools = orjson.loads(fh.read())
    if not isinstance(tools, list):
        raise RespflowError(
            "TOOLS.json must be the request's 'tools' array", code="bad_tools", stage="cli"
        )
    return ToolRegistry(tools)


def _add_stream_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE|-", help="an SSE recording, or - for standard input")
    p.add_argument("--strict", action="store_true", help="strict validation (default: lenient)")
    p.add_argument("--tools", metavar="TOOLS.json", help="the request's tools array")
    p.add_argument("--response-id", metavar="ID", help="the public response id to report")
    p.add_argument("--model", metavar="M", help="the model name to report")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="respflow", description="Streaming ingest for OpenAI-style Responses API streams."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fold = sub.add_parser("fold", help="fold an SSE stream into the final Response (JSON)")
    _add_stream_options(fold)
    relay = sub.add_parser("relay", help="relay an SSE stream as the client would receive it")
    _add_stream_options(relay)
    serve = sub.add_parser("serve", help="run the gateway (with a built-in upstream simulator by default)")
    serve.add_argument("--upstream", metavar="URL", help="base URL of a Responses upstream, e.g. http://localhost:8000/v1")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--placement", choices=("worker", "inline"), default="worker")
    serve.add_argument("--pace", type=float, default=0.02, help="simulator: seconds between tokens")
    serve.add_argument(
        "--max-streams",
        type=int,
        default=1024,
        metavar="N",
        help="responses served at once (per worker); one more gets an immediate 503 with Retry-After",
    )
    serve.add_argument(
        "--workers", type=int, default=1, metavar="N", help="N processes behind one port (SO_REUSEPORT)"
    )
    serve.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help="where responses and conversations are kept: sqlite:///PATH (default: a file in "
        "$XDG_DATA_HOME/respflow, printed at start), postgresql://user:pass@host/db, or none",
    )
    serve.add_argument("--store-ttl", type=float, default=None, metavar="SECONDS", help="how long stored rows are kept (default: forever)")
    serve.add_argument(
        "--background-retention",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="how long a background response's events stay resumable after it ended (default: 3600)",
    )
    serve.add_argument(
        "--background-lease",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="a replica running a background response renews its claim every third of this; a claim not renewed "
        "for this long (the replica died) lets another replica end the response failed (default: 15)",
    )
    serve.add_argument(
        "--metrics",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="record Prometheus metrics, served at GET /metrics (default: on)",
    )
    serve.add_argument(
        "--unknown-events",
        choices=("forward", "drop"),
        default="forward",
        help="upstream events of a well-formed type respflow does not know: forwarded (forward compatibility) or dropped",
    )
    serve.add_argument(
        "--hosted-tools",
        choices=("drop", "reject"),
        default="drop",
        help="a hosted tool (web_search, …) a request declares but this gateway cannot run: not offered to the "
        "model (drop) or refused with HTTP 400 (reject)",
    )
    serve.add_argument(
        "--demo-tools",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="offer the demo gateway tool add_numbers (default: on with the simulator only)",
    )
    bench = sub.add_parser("bench", help="print the benchmark table (ratios to a same-run floor)")
    bench.add_argument("--quick", action="store_true", help="a smaller, faster run")
    bench.add_argument("--json", action="store_true", help="print the rows as JSON")
    bench.add_argument(
        "--placement", action="store_true", help="also run the placement benchmark (inline vs worker)"
    )
    bench.add_argument(
        "--detail", action="store_true", help="also: per-stage ns, recorded-stream ratios, json vs orjson, gc.freeze, the trickle (one event per read)"
    )
    bench.add_argument(
        "--serve", action="store_true", help="the serving benchmark instead: respflow serve vs a byte pipe, same run"
    )
    bench.add_argument("--streams", default="100,200,500", help="--serve: concurrent stream counts (comma-separated)")
    bench.add_argument("--rounds", type=int, default=3, help="--serve: rounds per stream count (medians)")
    bench.add_argument("--rate", type=float, default=20.0, help="--serve: events per second per stream")
    bench.add_argument("--events", type=int, default=100, help="--serve: text deltas per stream")
    bench.add_argument(
        "--capacity", action="store_true", help="--serve: the most streams 1 and 2 workers hold at added p99 ≤ 50 ms"
    )
    bench.add_argument("--serve-arg", action="append", default=[], help="--serve: an extra argument for respflow serve")
    bench.add_argument(
        "--soak", action="store_true", help="--serve: 2,000 streams (200 at a time, some abandoned, some cut): leaks?"
    )
    bench.add_argument(
        "--metrics-cost",
        action="store_true",
        help="--serve: what recording metrics costs per event (respflow serve with and without --no-metrics)",
    )
    bench.add_argument(
        "--background",
        action="store_true",
        help="--serve: background streams (every event logged) vs plain ones at 100 streams on SQLite and PostgreSQL; resume latency",
    )
    bench.add_argument(
        "--store",
        action="store_true",
        help="the storage benchmark instead: persist + rehydrate on SQLite and PostgreSQL, and what storing adds",
    )
    bench.add_argument(
        "--request",
        action="store_true",
        help="the gateway's own cost instead: CPU per request and per further event, in process (no sockets)",
    )
    bench.add_argument("--sizes", default="1,101", help="--request: text deltas per request (comma-separated)")
    bench.add_argument("--requests", type=int, default=2000, help="--request: requests per size and round")
    bench.add_argument(
        "--pg", default=None, metavar="URL", help="--store, --serve --background: measure this PostgreSQL (default: a throwaway local cluster)"
    )
    return parser


def _fold(args: argparse.Namespace) -> int:
    tools = _load_tools(args.tools)
    validation = Validation.STRICT if args.strict else Validation.LENIENT
    graph = Graph(validation=validation, response_id=args.response_id, model=args.model, tools=tools)
    with _open(args.file) as stream:
        response = decode(_chunks(stream), graph=graph)
    sys.stdout.buffer.write(response.to_json() + b"\n")
    sys.stdout.buffer.flush()
    _warn_if_cut(graph)
    return 0


def _warn_if_cut(graph: Graph) -> None:
    """Lenient: a stream without a terminal event folds, as ``failed`` — say so on stderr."""
    if graph.pipeline.folder.cut:
        error = graph.pipeline.folder.outcome()["error"]
        print(
            f"warning[eof_without_terminal]: the stream ended without a terminal event; the Response "
            f"is failed ({error['code']}: {error['message']})",
            file=sys.stderr,
        )


def _relay(args: argparse.Namespace) -> int:
    import asyncio

    from respflow.flows._drivers import live
    from respflow.sinks import StreamSink

    tools = _load_tools(args.tools)
    validation = Validation.STRICT if args.strict else Validation.LENIENT
    graph = Graph(validation=validation, response_id=args.response_id, model=args.model, tools=tools)
    with _open(args.file) as stream:
        asyncio.run(live(_chunks(stream), StreamSink(sys.stdout.buffer), placement="inline", graph=graph, model=args.model))
    _warn_if_cut(graph)
    return 0


def _without_option(argv: list[str], name: str) -> list[str]:
    """``argv`` without ``name VALUE`` / ``name=VALUE``."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out


def _serve(args: argparse.Namespace, sys_argv: list[str] | None = None) -> int:
    import logging

    from respflow.flows._serve import default_store_url, run_loop, serve, supervise

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.max_streams < 1 or args.workers < 1:
        print("error[invalid_argument]: --max-streams and --workers must be at least 1", file=sys.stderr)
        return 2
    if args.background_retention <= 0 or args.background_lease <= 0:
        print("error[invalid_argument]: --background-retention and --background-lease must be positive", file=sys.stderr)
        return 2
    if args.workers > 1:
        argv = [a for a in (sys_argv or sys.argv[1:]) if a != "serve"]
        argv = _without_option(argv, "--workers")
        return supervise(argv, args.workers, host=args.host, port=args.port)
    demo = args.demo_tools if args.demo_tools is not None else args.upstream is None
    run_loop(
        serve(
            upstream=args.upstream,
            host=args.host,
            port=args.port,
            placement=args.placement,
            pace=args.pace,
            demo_tools=demo,
            max_streams=args.max_streams,
            reuse_port=args.reuse_port,
            hosted=args.hosted_tools,
            unknown_events=args.unknown_events,
            store=args.store if args.store is not None else default_store_url(),
            store_ttl=args.store_ttl,
            background_retention=args.background_retention,
            background_lease=args.background_lease,
            metrics=args.metrics,
        )
    )
    return 0


def _print_result(args: argparse.Namespace, result: object, text: Callable[[], str]) -> int:
    """A benchmark's result on stdout: as JSON with ``--json``, else its table."""
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(text())
    return 0


def _bench_serve(args: argparse.Namespace) -> int:
    from respflow.flows._bench_serve import (
        format_capacity,
        format_serve,
        run_capacity,
        run_serve_bench,
    )

    if args.soak:
        from respflow.flows._bench_serve import format_soak, run_soak

        print("respflow bench --serve --soak: threads, fds and RSS before and after", file=sys.stderr)
        soak = run_soak(total=400 if args.quick else 2000, serve_extra=args.serve_arg)
        return _print_result(args, {"soak": soak}, lambda: format_soak(soak))
    if args.metrics_cost:
        from respflow.flows._bench_serve import format_metrics_cost, run_metrics_cost

        rounds = 1 if args.quick else max(args.rounds, 5)
        print(f"respflow bench --serve --metrics-cost: respflow serve with metrics and without, {rounds} rounds", file=sys.stderr)
        cost = run_metrics_cost(rate=args.rate, events=40 if args.quick else args.events, rounds=rounds)
        return _print_result(args, {"metrics_cost": cost}, lambda: format_metrics_cost(cost))
    if args.background:
        from respflow.flows._bench_serve import format_background, run_background_bench

        count = int(args.streams.split(",")[0]) if args.streams != "100,200,500" else 100
        rounds, events = (1, 40) if args.quick else (args.rounds, args.events)
        print(
            f"respflow bench --serve --background: {count} streams, {args.rate:g} events/s x {events}, {rounds} round(s); "
            "background vs plain streams through one respflow serve per store",
            file=sys.stderr,
        )
        rows = run_background_bench(streams=count, rate=args.rate, events=events, rounds=rounds, pg=args.pg)
        return _print_result(args, {"background": rows}, lambda: format_background(rows))
    if args.capacity:
        print("respflow bench --serve --capacity: streams held at added p99 ≤ 50 ms", file=sys.stderr)
        capacity = run_capacity(rate=args.rate, events=args.events, serve_extra=args.serve_arg)
        return _print_result(args, {"capacity": capacity}, lambda: format_capacity(capacity))
    streams = [int(n) for n in args.streams.split(",") if n.strip()]
    if args.quick:
        streams, args.rounds, args.events = [min(streams)], 1, 40
    print(
        f"respflow bench --serve: {args.rate:g} events/s x {args.events} per stream, {args.rounds} round(s); "
        "CPU of the proxy process tree per event received",
        file=sys.stderr,
    )
    rows = run_serve_bench(streams=streams, rate=args.rate, events=args.events, rounds=args.rounds, serve_extra=args.serve_arg)
    return _print_result(args, {"serve": rows}, lambda: format_serve(rows))


def _bench_store(args: argparse.Namespace) -> int:
    from respflow.flows._bench_store import format_store, run_store_bench

    print("respflow bench --store: what keeping responses costs (medians; added = minus --store none)", file=sys.stderr)
    if args.quick:
        result = run_store_bench(requests=80, chain=10, rounds=1, pg=args.pg)
    else:
        result = run_store_bench(rounds=args.rounds, pg=args.pg)
    return _print_result(args, result, lambda: format_store(result))


def _bench_request(args: argparse.Namespace) -> int:
    from respflow.flows._bench_request import format_request, run_request_bench

    try:
        sizes = [int(n) for n in args.sizes.split(",") if n.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 0 or args.requests < 1:
        print("error[bad_bench]: --sizes needs counts >= 0 and --requests at least 1", file=sys.stderr)
        return 2
    print(
        f"respflow bench --request: the gateway in process, {args.requests} requests per size, "
        "100 at a time (CPU medians of 3 rounds)",
        file=sys.stderr,
    )
    rows = run_request_bench(sizes=sizes, requests=args.requests, rounds=1 if args.quick else 3)
    return _print_result(args, rows, lambda: format_request(rows))


def _bench(args: argparse.Namespace) -> int:
    if args.serve:
        return _bench_serve(args)
    if args.store:
        return _bench_store(args)
    if args.request:
        return _bench_request(args)
    from respflow.flows._bench import run_core_bench

    print("respflow bench: core throughput (medians; ratios to the floor of the same run)", file=sys.stderr)
    rows = run_core_bench(quick=args.quick)
    detail: dict[str, object] = {}
    if args.detail:
        from respflow.flows._bench import run_detail

        print("respflow bench: detail (stages, recordings, json, gc.freeze, the trickle)", file=sys.stderr)
        detail = run_detail(quick=args.quick)
    placement: list[dict[str, object]] = []
    if args.placement:
        from respflow.flows._placement import format_placement, run_placement_bench

        print("respflow bench: placement (this takes a minute or two)", file=sys.stderr)
        placement = run_placement_bench(quick=args.quick)
    if args.json:
        out = {"core": rows, "placement": placement, "detail": detail}
        sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    print(f"{'workload':42} {'events':>8} {'median s':>9} {'events/s':>10} {'MB/s in':>8} {'x floor':>8}")
    for row in rows:
        print(
            f"{row['name']:42} {row['events']:>8} {row['median_s']:>9.4f} "
            f"{row['events_per_s']:>10} {row['mb_in_per_s']:>8} {row['ratio_to_floor']:>8.3f}"
        )
    if detail:
        from respflow.flows._bench import format_detail

        print()
        print(format_detail(detail))
    if placement:
        print()
        print(format_placement(placement))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``respflow`` console script."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "fold":
            return _fold(args)
        if args.command == "serve":
            return _serve(args, list(argv) if argv is not None else None)
        if args.command == "relay":
            return _relay(args)
        if args.command == "bench":
            return _bench(args)
    except RespflowError as exc:
        print(exc.describe(), file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error[input]: {exc.strerror or exc}: {exc.filename or ''}", file=sys.stderr)
        return 1
    except orjson.JSONDecodeError as exc:
        print(f"error[bad_tools]: TOOLS.json is not valid JSON: {exc}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
