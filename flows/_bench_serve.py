"""``respflow bench --serve``: the serving path against a bare byte pipe, in the same run.

Every part runs in its own process on 127.0.0.1 (`respflow.flows._loadgen`): a paced upstream,
the baseline byte pipe (stdlib asyncio, parses nothing), ``respflow serve`` in front of the same
upstream, and a client swarm. For each stream count and round, the swarm runs straight at the
upstream (the direct latency), then through each proxy; the proxy's CPU time (user + system,
its whole process tree, from ``/proc``) is read before and after.

Proxies: the baseline byte pipe (stdlib asyncio), the same pipe on uvloop, ``respflow serve``,
and the serving stack alone (uvicorn + aiohttp on uvloop forwarding the body chunk by chunk: no
parsing, no graph, no relay) — what respflow pays beyond the last is its pipeline.

* CPU per event = proxy CPU seconds / events the swarm received;
* added p50/p99 = the proxy's latency quantile minus the direct one of the same round;
* figures are medians over rounds; the ratios are to the pipe of the same run.

``--capacity`` instead finds, for 1 and 2 workers, the most streams held with added p99 ≤ 50 ms
and no error.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of ``root`` and every live descendant."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry)
        parents[pid] = int(fields[1])
        times[pid] = (int(fields[11]) + int(fields[12])) / _TICKS
    total = 0.0
    for pid, cpu in times.items():
        p = pid
        while p and p != root:
            p = parents.get(p, 0)
        if p == root:
            total += cpu
    return total


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on {port} after {timeout:g} s")
        time.sleep(0.05)


@dataclass
class Target:
    name: str
    url: str
    proc: subprocess.Popen[bytes] | None = None
    runs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


def _spawn(args: Sequence[str]) -> subprocess.Popen[bytes]:
    """A part of the harness in its own process; its log goes to ``$RESPFLOW_BENCH_LOGS/<n>.log``
    when that directory is set (else nowhere)."""
    logs = os.environ.get("RESPFLOW_BENCH_LOGS")
    if logs:
        os.makedirs(logs, exist_ok=True)
        path = os.path.join(logs, f"{int(time.time() * 1000)}-{os.path.basename(str(args[1]))}.log")
        with open(path, "wb") as err:
            return subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    return subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def _swarm(url: str, streams: int, rate: float, events: int, options: Sequence[str] = ()) -> dict[str, Any]:
    """The client swarm's statistics (``options``: ``background=1``, ``resume=K``)."""
    out = subprocess.run(
        [sys.executable, "-m", "respflow.flows._loadgen", "swarm", url, str(streams), str(rate), str(events), *options],
        capture_output=True,
        check=True,
        timeout=600,
    )
    result: dict[str, Any] = json.loads(out.stdout.decode().strip().splitlines()[-1])
    return result


@contextlib.contextmanager
def _processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, 9)
                p.wait()


def _serve_args(upstream_port: int, port: int, workers: int, extra: Sequence[str]) -> list[str]:
    return [
        "-m",
        "respflow",
        "serve",
        "--upstream",
        f"http://127.0.0.1:{upstream_port}/v1",
        "--port",
        str(port),
        *(["--workers", str(workers)] if workers != 1 else []),
        # the serving path alone; what the store adds per request is `respflow bench --store`
        *(["--store", "none"] if "--store" not in extra else []),
        *extra,
    ]


def _measure(target: Target, streams: int, rate: float, events: int) -> dict[str, Any]:
    cpu0 = tree_cpu(target.proc.pid) if target.proc is not None else 0.0
    stats = _swarm(target.url, streams, rate, events)
    cpu1 = tree_cpu(target.proc.pid) if target.proc is not None else 0.0
    stats["cpu_s"] = cpu1 - cpu0
    stats["cpu_us_per_event"] = 1e6 * (cpu1 - cpu0) / stats["events"] if stats["events"] else None
    return stats


def run_serve_bench(
    *,
    streams: Sequence[int] = (100, 200, 500),
    rate: float = 20.0,
    events: int = 100,
    rounds: int = 3,
    serve_extra: Sequence[str] = (),
    progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> list[dict[str, Any]]:
    """Rows: per stream count and proxy, medians over rounds and ratios to the pipe."""
    up_port, pipe_port, gw_port = free_port(), free_port(), free_port()
    with _processes() as procs:
        upstream = _spawn(["-m", "respflow.flows._loadgen", "upstream", str(up_port)])
        procs.append(upstream)
        wait_port(up_port, upstream)
        pipe = _spawn(["-m", "respflow.flows._loadgen", "pipe", str(up_port), str(pipe_port)])
        procs.append(pipe)
        uvpipe_port, fwd_port = free_port(), free_port()
        uvpipe = _spawn(["-m", "respflow.flows._loadgen", "pipe-uvloop", str(up_port), str(uvpipe_port)])
        procs.append(uvpipe)
        forward = _spawn(["-m", "respflow.flows._loadgen", "forward", str(up_port), str(fwd_port)])
        procs.append(forward)
        gateway = _spawn(_serve_args(up_port, gw_port, 1, serve_extra))
        procs.append(gateway)
        wait_port(pipe_port, pipe)
        wait_port(uvpipe_port, uvpipe)
        wait_port(fwd_port, forward)
        wait_port(gw_port, gateway)
        targets = [
            Target("direct (no proxy)", f"http://127.0.0.1:{up_port}/v1/responses"),
            Target("byte pipe (asyncio)", f"http://127.0.0.1:{pipe_port}/v1/responses", pipe),
            Target("respflow serve", f"http://127.0.0.1:{gw_port}/v1/responses", gateway),
            Target("byte pipe (uvloop)", f"http://127.0.0.1:{uvpipe_port}/v1/responses", uvpipe),
            Target("uvicorn+aiohttp forward", f"http://127.0.0.1:{fwd_port}/v1/responses", forward),
        ]
        progress("warming up")
        for t in targets:
            _swarm(t.url, 20, 50.0, 20)
        for n in streams:
            for r in range(rounds):
                for t in targets:
                    progress(f"  {n} streams, round {r + 1}/{rounds}: {t.name}")
                    t.runs.setdefault(n, []).append(_measure(t, n, rate, events))
    return _rows(targets, streams, rounds)


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 2) if present else None


def _rows(targets: list[Target], streams: Sequence[int], rounds: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    direct = targets[0]
    for n in streams:
        base_cpu = _median([run["cpu_us_per_event"] for run in targets[1].runs[n]])
        base_added = _median([p["p99_ms"] - d["p99_ms"] for p, d in zip(targets[1].runs[n], direct.runs[n], strict=True) if p["p99_ms"] is not None and d["p99_ms"] is not None])
        for t in targets:
            runs = t.runs[n]
            added50 = [p["p50_ms"] - d["p50_ms"] for p, d in zip(runs, direct.runs[n], strict=True) if p["p50_ms"] is not None and d["p50_ms"] is not None]
            added99 = [p["p99_ms"] - d["p99_ms"] for p, d in zip(runs, direct.runs[n], strict=True) if p["p99_ms"] is not None and d["p99_ms"] is not None]
            cpu = _median([run["cpu_us_per_event"] for run in runs])
            row: dict[str, Any] = {
                "streams": n,
                "target": t.name,
                "events": sum(run["events"] for run in runs),
                "errors": sum(run["errors"] for run in runs),
                "first_error": next((run["first_error"] for run in runs if run["first_error"]), None),
                "p50_ms": _median([run["p50_ms"] for run in runs]),
                "p99_ms": _median([run["p99_ms"] for run in runs]),
                "cpu_us_per_event": cpu,
                "added_p50_ms": _median(list(added50)) if t is not direct else None,
                "added_p99_ms": _median(list(added99)) if t is not direct else None,
                "cpu_x_pipe": round(cpu / base_cpu, 2) if cpu is not None and base_cpu and t is not direct else None,
                "p99_bar_ms": round(2 * base_added + 5, 1) if base_added is not None and t is not direct else None,
                "rounds": rounds,
            }
            rows.append(row)
    return rows


def format_serve(rows: list[dict[str, Any]]) -> str:
    head = f"{'streams':>7} {'target':22} {'events':>7} {'err':>4} {'CPU µs/ev':>10} {'x pipe':>7} {'p50 ms':>7} {'p99 ms':>7} {'+p50':>7} {'+p99':>7} {'bar +p99':>8}"
    out = [head]

    def f(v: Any, fmt: str = ".2f") -> str:
        return "-" if v is None else format(v, fmt)

    for r in rows:
        out.append(
            f"{r['streams']:>7} {r['target']:22} {r['events']:>7} {r['errors']:>4} {f(r['cpu_us_per_event'], '.1f'):>10} "
            f"{f(r['cpu_x_pipe']):>7} {f(r['p50_ms']):>7} {f(r['p99_ms']):>7} {f(r['added_p50_ms']):>7} "
            f"{f(r['added_p99_ms']):>7} {f(r['p99_bar_ms'], '.1f'):>8}"
        )
    return "\n".join(out)


def run_capacity(
    *,
    workers: Sequence[int] = (1, 2),
    steps: Sequence[int] = (100, 200, 300, 400, 500, 600, 800, 1000),
    rate: float = 20.0,
    events: int = 100,
    bar_ms: float = 50.0,
    repeats: int = 3,
    serve_extra: Sequence[str] = (),
    progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> list[dict[str, Any]]:
    """For each worker count: the most streams held with added p99 ≤ ``bar_ms`` (the median of
    ``repeats`` runs) and no error."""
    out: list[dict[str, Any]] = []
    for w in workers:
        up_port, gw_port = free_port(), free_port()
        with _processes() as procs:
            upstream = _spawn(["-m", "respflow.flows._loadgen", "upstream", str(up_port)])
            procs.append(upstream)
            wait_port(up_port, upstream)
            gateway = _spawn(_serve_args(up_port, gw_port, w, serve_extra))
            procs.append(gateway)
            wait_port(gw_port, gateway)
            direct = f"http://127.0.0.1:{up_port}/v1/responses"
            url = f"http://127.0.0.1:{gw_port}/v1/responses"
            _swarm(url, 20, 50.0, 20)
            held = 0
            tried: list[dict[str, Any]] = []
            for n in steps:
                progress(f"  {w} worker(s): {n} streams ({repeats} runs)")
                added_runs, errors, cpu = [], 0, []
                for _ in range(repeats):
                    d = _swarm(direct, n, rate, events)
                    g = _measure(Target("respflow", url, gateway), n, rate, events)
                    added_runs.append((g["p99_ms"] or 0) - (d["p99_ms"] or 0))
                    errors += g["errors"]
                    cpu.append(g["cpu_us_per_event"] or 0)
                added = statistics.median(added_runs)
                tried.append({"streams": n, "added_p99_ms": round(added, 2), "errors": errors, "cpu_us_per_event": round(statistics.median(cpu), 1)})
                if errors or added > bar_ms:
                    break
                held = n
            out.append({"workers": w, "held_streams": held, "bar_ms": bar_ms, "steps": tried})
    return out


def format_capacity(rows: list[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        steps = ", ".join(f"{s['streams']}: +{s['added_p99_ms']} ms{' ERR' if s['errors'] else ''}" for s in r["steps"])
        out.append(f"{r['workers']} worker(s): held {r['held_streams']} streams at added p99 ≤ {r['bar_ms']:g} ms  ({steps})")
    return "\n".join(out)


def process_resources(pid: int) -> dict[str, float]:
    """Threads, open file descriptors and resident memory (MiB) of a process."""
    status = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            status[key] = value.strip()
    return {
        "threads": int(status["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "rss_mib": round(int(status["VmRSS"].split()[0]) / 1024, 1),
    }


async def _soak_clients(url: str, total: int, concurrency: int, rate: float, events: int) -> dict[str, int]:
    import asyncio

    from respflow.flows._loadgen import soak_stream

    hostport, _, path = url.removeprefix("http://").partition("/")
    host, _, port = hostport.partition(":")
    gate = asyncio.Semaphore(concurrency)
    seen: dict[str, int] = {}

    async def one(i: int) -> None:
        # a fifth abandon mid-stream, a tenth (others) meet an upstream that cuts
        abandon = events // 2 if i % 5 == 0 else None
        cut = events // 3 if i % 10 == 3 else None
        # an abandoned stream asks for ten times the events: its upstream is still sending
        # long after the client left, so an upstream connection left open would show
        length = events * 10 if abandon is not None else events
        async with gate:
            try:
                outcome = await soak_stream(host, int(port), "/" + path, rate=rate, events=length, cut=cut, abandon_after=abandon)
            except Exception as exc:  # counted: a soak must not lose a stream silently
                outcome = f"error: {type(exc).__name__}"
        expected = "abandoned" if abandon is not None else ("failed" if cut is not None else "completed")
        key = outcome if outcome == expected else f"unexpected {outcome} (wanted {expected})"
        seen[key] = seen.get(key, 0) + 1

    await asyncio.gather(*(one(i) for i in range(total)))
    return seen


def run_soak(
    *,
    total: int = 2000,
    concurrency: int = 200,
    rate: float = 50.0,
    events: int = 40,
    serve_extra: Sequence[str] = (),
    progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """``total`` streams through one ``respflow serve``, ``concurrency`` at a time (a fifth
    abandoned by their client mid-stream, a tenth against an upstream that cuts): what the
    clients saw, and the server's threads, fds and RSS before and after."""
    import asyncio

    up_port, gw_port = free_port(), free_port()
    with _processes() as procs:
        upstream = _spawn(["-m", "respflow.flows._loadgen", "upstream", str(up_port)])
        procs.append(upstream)
        wait_port(up_port, upstream)
        gateway = _spawn(_serve_args(up_port, gw_port, 1, serve_extra))
        procs.append(gateway)
        wait_port(gw_port, gateway)
        url = f"http://127.0.0.1:{gw_port}/v1/responses"
        progress("  warming up (a first round the size of one wave)")
        warm = asyncio.run(_soak_clients(url, concurrency, concurrency, rate, events))
        time.sleep(0.5)
        before = process_resources(gateway.pid)
        progress(f"  {total} streams, {concurrency} at a time")
        started = time.monotonic()
        seen = asyncio.run(_soak_clients(url, total, concurrency, rate, events))
        elapsed = time.monotonic() - started
        time.sleep(0.5)  # the server's side of closed streams settles
        after = process_resources(gateway.pid)
    return {"total": total, "concurrency": concurrency, "seen": seen, "warmup_seen": warm, "before": before, "after": after, "seconds": round(elapsed, 1)}


def format_soak(result: dict[str, Any]) -> str:
    b, a = result["before"], result["after"]
    seen = ", ".join(f"{k}: {v}" for k, v in sorted(result["seen"].items()))
    return (
        f"{result['total']} streams, {result['concurrency']} at a time, {result['seconds']} s — {seen}\n"
        f"threads {b['threads']} → {a['threads']}, fds {b['fds']} → {a['fds']}, RSS {b['rss_mib']} → {a['rss_mib']} MiB"
    )


# -- background streams (--background) -----------------------------------------------------------


def postgres_cpu() -> float:
    """CPU seconds of every ``postgres`` process here (the benchmark's throwaway cluster is the
    only PostgreSQL this machine runs)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        if stat[stat.index("(") + 1 : stat.rindex(")")] != "postgres":
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) / _TICKS
    return total


@contextlib.contextmanager
def _background_stores(pg: str | None, progress: Callable[[str], None]) -> Iterator[list[tuple[str, str]]]:
    import tempfile

    from respflow.flows._pgcluster import ClusterUnavailable, cluster

    with tempfile.TemporaryDirectory() as d:
        stores = [("sqlite", f"sqlite:///{d}/bench.db")]
        if pg is not None:
            yield [*stores, ("postgresql", pg)]
            return
        try:
            with cluster(durable=True) as dsn:
                progress("started a throwaway PostgreSQL cluster (default, durable commit settings)")
                yield [*stores, ("postgresql", dsn)]
        except ClusterUnavailable as exc:
            progress(f"PostgreSQL skipped: {exc}")
            yield stores


def run_background_bench(
    *,
    streams: int = 100,
    rate: float = 20.0,
    events: int = 100,
    rounds: int = 3,
    resume_after: int = 20,
    pg: str | None = None,
    progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> list[dict[str, Any]]:
    """Background streams vs plain ones through one ``respflow serve`` per store, same run.

    Per store and round: the swarm straight at the upstream (direct latency), then plain
    streams (``store`` on), then background streams (every frame logged), then background
    streams cut after ``resume_after`` deltas and resumed 0.3 s later with ``starting_after``
    (resume latency: reconnect → the first replayed event). CPU per event
    is the gateway's process tree (and, on PostgreSQL, the server's processes, apart)."""
    rows: list[dict[str, Any]] = []
    with _background_stores(pg, progress) as stores:
        for backend, url in stores:
            up_port, gw_port = free_port(), free_port()
            with _processes() as procs:
                upstream = _spawn(["-m", "respflow.flows._loadgen", "upstream", str(up_port)])
                procs.append(upstream)
                wait_port(up_port, upstream)
                gateway = _spawn(_serve_args(up_port, gw_port, 1, ["--store", url]))
                procs.append(gateway)
                wait_port(gw_port, gateway)
                direct = f"http://127.0.0.1:{up_port}/v1/responses"
                target = f"http://127.0.0.1:{gw_port}/v1/responses"
                modes = {"plain": [], "background": ["background=1"], "background, cut + resumed": ["background=1", f"resume={resume_after}"]}
                runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
                directs: list[dict[str, Any]] = []
                _swarm(target, 20, 50.0, 20, ["background=1"])  # warm up
                for r in range(rounds):
                    directs.append(_swarm(direct, streams, rate, events))
                    for mode, options in modes.items():
                        progress(f"  {backend}: {streams} streams, round {r + 1}/{rounds}: {mode}")
                        cpu0, db0 = tree_cpu(gateway.pid), postgres_cpu()
                        stats = _swarm(target, streams, rate, events, options)
                        cpu1, db1 = tree_cpu(gateway.pid), postgres_cpu()
                        received = stats["events"] or 1
                        stats["cpu_us_per_event"] = 1e6 * (cpu1 - cpu0) / received
                        stats["db_us_per_event"] = 1e6 * (db1 - db0) / received if backend == "postgresql" else None
                        runs[mode].append(stats)
                plain_cpu = _median([s["cpu_us_per_event"] for s in runs["plain"]])
                for mode, mode_runs in runs.items():
                    cpu = _median([s["cpu_us_per_event"] for s in mode_runs])
                    added99 = [s["p99_ms"] - d["p99_ms"] for s, d in zip(mode_runs, directs, strict=True) if s["p99_ms"] is not None and d["p99_ms"] is not None]
                    added50 = [s["p50_ms"] - d["p50_ms"] for s, d in zip(mode_runs, directs, strict=True) if s["p50_ms"] is not None and d["p50_ms"] is not None]
                    rows.append(
                        {
                            "store": backend,
                            "mode": mode,
                            "streams": streams,
                            "events": sum(s["events"] for s in mode_runs),
                            "errors": sum(s["errors"] for s in mode_runs),
                            "first_error": next((s["first_error"] for s in mode_runs if s["first_error"]), None),
                            "cpu_us_per_event": cpu,
                            "cpu_x_plain": round(cpu / plain_cpu, 2) if cpu is not None and plain_cpu else None,
                            "db_us_per_event": _median([s["db_us_per_event"] for s in mode_runs]),
                            "added_p50_ms": _median(list(added50)),
                            "added_p99_ms": _median(list(added99)),
                            "resume_p50_ms": _median([s.get("resume_p50_ms") for s in mode_runs]),
                            "resume_p99_ms": _median([s.get("resume_p99_ms") for s in mode_runs]),
                            "rounds": rounds,
                        }
                    )
    return rows


def format_background(rows: list[dict[str, Any]]) -> str:
    def f(v: Any, fmt: str = ".2f") -> str:
        return "-" if v is None else format(v, fmt)

    out = [
        f"{'store':10} {'mode':26} {'events':>7} {'err':>4} {'CPU µs/ev':>10} {'x plain':>8} {'db µs/ev':>9} "
        f"{'+p50 ms':>8} {'+p99 ms':>8} {'resume p50':>10} {'resume p99':>10}"
    ]
    for r in rows:
        out.append(
            f"{r['store']:10} {r['mode']:26} {r['events']:>7} {r['errors']:>4} {f(r['cpu_us_per_event'], '.1f'):>10} "
            f"{f(r['cpu_x_plain']):>8} {f(r['db_us_per_event'], '.1f'):>9} {f(r['added_p50_ms']):>8} {f(r['added_p99_ms']):>8} "
            f"{f(r['resume_p50_ms']):>10} {f(r['resume_p99_ms']):>10}"
        )
    return "\n".join(out)


# -- what metrics cost (--metrics-cost) ----------------------------------------------------------


def run_metrics_cost(
    *,
    streams: int = 100,
    rate: float = 20.0,
    events: int = 100,
    rounds: int = 5,
    progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> list[dict[str, Any]]:
    """``respflow serve`` with metrics on and with ``--no-metrics``, in front of one upstream,
    rounds alternating: CPU per event of each (medians) and the difference per event."""
    up_port = free_port()
    ports = {"metrics on": free_port(), "--no-metrics": free_port()}
    with _processes() as procs:
        upstream = _spawn(["-m", "respflow.flows._loadgen", "upstream", str(up_port)])
        procs.append(upstream)
        wait_port(up_port, upstream)
        targets: list[Target] = []
        for name, port in ports.items():
            extra = [] if name == "metrics on" else ["--no-metrics"]
            proc = _spawn(_serve_args(up_port, port, 1, extra))
            procs.append(proc)
            wait_port(port, proc)
            targets.append(Target(name, f"http://127.0.0.1:{port}/v1/responses", proc))
        direct = f"http://127.0.0.1:{up_port}/v1/responses"
        for t in targets:
            _swarm(t.url, 20, 50.0, 20)
        directs = []
        for r in range(rounds):
            directs.append(_swarm(direct, streams, rate, events))
            for t in targets if r % 2 == 0 else reversed(targets):
                progress(f"  {streams} streams, round {r + 1}/{rounds}: {t.name}")
                t.runs.setdefault(streams, []).append(_measure(t, streams, rate, events))
    rows = []
    for t in targets:
        runs = t.runs[streams]
        added = [s["p99_ms"] - d["p99_ms"] for s, d in zip(runs, directs, strict=True) if s["p99_ms"] is not None and d["p99_ms"] is not None]
        rows.append(
            {
                "target": t.name,
                "streams": streams,
                "events": sum(s["events"] for s in runs),
                "errors": sum(s["errors"] for s in runs),
                "cpu_us_per_event": _median([s["cpu_us_per_event"] for s in runs]),
                "added_p99_ms": _median(list(added)),
                "rounds": rounds,
            }
        )
    on, off = rows[0]["cpu_us_per_event"], rows[1]["cpu_us_per_event"]
    rows[0]["metrics_us_per_event"] = round(on - off, 2) if on is not None and off is not None else None
    # the per-round differences too: the spread says how far the median can be trusted
    diffs = [a["cpu_us_per_event"] - b["cpu_us_per_event"] for a, b in zip(targets[0].runs[streams], targets[1].runs[streams], strict=True)]
    rows[0]["per_round_us"] = [round(d, 1) for d in diffs]
    rows[0]["in_process_us_per_event"] = meter_cost(events)["us_per_event"]
    return rows


def meter_cost(events: int = 100, streams: int = 2000) -> dict[str, float]:
    """In process, no noise from other processes: what recording costs per relayed event — a
    `StreamMeter.record` per one-event batch, and per stream its flush into the metrics plus
    the request's counters, spread over ``events`` events."""
    from respflow.flows.gateway._metrics import Metrics

    metrics = Metrics()
    frame = (
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"<1796085687.901070>",'
        b'"item_id":"msg_1","output_index":0,"content_index":0,"logprobs":[],"sequence_number":12}\n\n'
    )
    started = time.perf_counter()
    for _ in range(streams):
        meter = metrics.meter(time.monotonic())
        assert meter is not None
        for _ in range(events):
            meter.record(frame)
        metrics.stream_ended(meter)
        metrics.request(True, "completed", 1)
        metrics.active.set(1)
    total = (time.perf_counter() - started) / (streams * events)
    return {"us_per_event": round(1e6 * total, 3)}


def format_metrics_cost(rows: list[dict[str, Any]]) -> str:
    out = [f"{'target':14} {'events':>7} {'err':>4} {'CPU µs/ev':>10} {'+p99 ms':>8}"]
    for r in rows:
        out.append(f"{r['target']:14} {r['events']:>7} {r['errors']:>4} {r['cpu_us_per_event']:>10.1f} {r['added_p99_ms']:>8.2f}")
    first = rows[0]
    out.append(f"metrics cost {first['metrics_us_per_event']} µs per event (median; per round: {first['per_round_us']})")
    if "in_process_us_per_event" in first:
        out.append(f"in process (record per event + flush per stream of 100 events): {first['in_process_us_per_event']} µs per event")
    return "\n".join(out)
