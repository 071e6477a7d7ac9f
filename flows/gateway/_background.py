"""Background responses (``background: true``): runs detached from the client's connection.

A background run is owned by the replica that took the request (its ``owner`` id, a lease it
renews). Every client-bound frame the run's relay produces — numbered by the relay — is
appended to the store's event log, one write per relayed batch (`LogSink`), before any client
sees it; local readers then read it from memory, readers on other replicas from the store,
woken by ``LISTEN/NOTIFY`` on PostgreSQL (a notification that is lost costs a poll interval,
never an event). So a stream can be picked up again from any replica, after any sequence
number, with the numbers the first stream had.

| who | what |
|---|---|
| `Background.start` | checks and queues the request (the row, its input), then runs it in a task of its own |
| `LogSink` | the run's relay sink: logs each batch (only while this replica still owns the run) |
| `Background.follow` | a reader: the logged frames after a cursor, then the live ones, until the terminal |
| `Background.so_far` | a running response as polling sees it: status and the items done so far |
| `Background.cancel` | asks the owner (wherever it runs) to stop; it ends the response ``cancelled`` |
| `Background.maintain` | renews this replica's leases, runs cancel requests, ends runs whose owner died |

A run whose owner stopped renewing its lease (the process was killed) is claimed by another
replica, which ends it ``failed`` (``server_error``, "the gateway running this response
stopped") with a terminal every follower gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from respflow.flows.gateway._metrics import MeteredSink
from respflow.flows.gateway._rounds import Gateway, new_response_id
from respflow.flows.gateway._rounds import _checked as checked_request
from respflow.flows.gateway._state import StateError, stored_item
from respflow.operators import LimitExceededError, RespflowError, UpstreamError
from respflow.sinks import keepalive, sse_frame
from respflow.sinks.store import Store, StoredResponse, StoreError

log = logging.getLogger("respflow")

_END = b"\n\n"
_TERMINAL_HEADS = {
    b"event: response.completed\n": "completed",
    b"event: response.failed\n": "failed",
    b"event: response.incomplete\n": "incomplete",
}
_DONE_HEAD = b"event: response.output_item.done\ndata: "
STOPPED = "the gateway running this response stopped"


class LeaseLost(RespflowError):
    """This replica no longer owns the background run (another one took it over)."""

    code = "lease_lost"


def _frames(data: bytes) -> list[bytes]:
    """The SSE frames of a batch (each with its blank line)."""
    return [part + _END for part in data.split(_END)[:-1]]


def _terminal(data: bytes) -> str | None:
    """The status a batch's terminal frame ends the response with (None: no terminal)."""
    for head, status in _TERMINAL_HEADS.items():
        if head in data:
            return status
    return None


def _last_response(data: bytes) -> dict[str, Any] | None:
    """The Response of the terminal frame ending ``data``."""
    frame = _frames(data)[-1]
    start = frame.find(b"data: ")
    try:
        event = orjson.loads(frame[start + 6 :])
    except orjson.JSONDecodeError:
        return None
    response = event.get("response") if isinstance(event, dict) else None
    return response if isinstance(response, dict) else None


def done_items(batches: list[tuple[int, int, bytes]]) -> list[dict[str, Any]]:
    """The output items a log says are done, by output index."""
    found: dict[int, dict[str, Any]] = {}
    for _, _, data in batches:
        if _DONE_HEAD not in data:
            continue
        for frame in _frames(data):
            if frame.startswith(_DONE_HEAD):
                event = orjson.loads(frame[len(_DONE_HEAD) :])
                item, index = event.get("item"), event.get("output_index")
                if isinstance(item, dict) and isinstance(index, int):
                    found[index] = item
    return [found[i] for i in sorted(found)]


def ending_frames(snapshot: Mapping[str, Any], first: int, *, status: str, error: dict[str, Any] | None) -> tuple[bytes, dict[str, Any]]:
    """The frames that end a run the relay could not end (nothing started, or the owner died),
    numbered from ``first``: ``response.created``/``in_progress`` when nothing was sent yet,
    an ``error`` event for a failure, then ``response.failed`` (also for ``cancelled``: the
    protocol has no cancelled event). Returns them and the final Response."""
    events: list[dict[str, Any]] = []
    if first == 0:
        started = {**snapshot, "status": "in_progress", "output": []}
        events += [{"type": "response.created", "response": started}, {"type": "response.in_progress", "response": started}]
    final = {**snapshot, "status": status, "error": error, "incomplete_details": None}
    if error is not None:
        events.append(
            {
                "type": "error",
                "code": error["code"],
                "message": error["message"],
                "param": None,
                "status": 500,
                "error": {"message": error["message"], "type": "server_error", "code": error["code"]},
            }
        )
    events.append({"type": "response.failed", "response": final})
    out = []
    for seq, event in enumerate(events, start=first):
        event["sequence_number"] = seq
        out.append(sse_frame(event))
    return b"".join(out), final


@dataclass
class _Live:
    """A run's logged batches in this process, for local readers (dropped when it ends)."""

    batches: list[tuple[int, int, bytes]] = field(default_factory=list)

    def after(self, cursor: int) -> list[tuple[int, int, bytes]]:
        batches = self.batches
        lo, hi = 0, len(batches)
        while lo < hi:  # the first batch holding a frame after ``cursor``
            mid = (lo + hi) // 2
            if batches[mid][1] <= cursor:
                lo = mid + 1
            else:
                hi = mid
        return batches[lo:]


class _Watch:
    __slots__ = ("count", "event", "notified")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.count = 0
        self.notified = 0
        """Notifications so far (a wake-up without one is the periodic tick)."""


class Wakeups:
    """Per response, an event its readers wait on: ``notify`` wakes them when its log grew;
    every ``tick`` seconds one timer wakes every reader (to check on a run that may have ended
    elsewhere, or send a keep-alive) — no timer per reader and wait."""

    def __init__(self, tick: float = 1.0) -> None:
        self._watches: dict[str, _Watch] = {}
        self.tick = tick
        self._ticker: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def watching(self, response_id: str) -> Iterator[_Watch]:
        watch = self._watches.get(response_id)
        if watch is None:
            watch = self._watches[response_id] = _Watch()
        watch.count += 1
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
        try:
            yield watch
        finally:
            watch.count -= 1
            if not watch.count:
                del self._watches[response_id]

    async def _tick(self) -> None:
        while self._watches:
            await asyncio.sleep(self.tick)
            for watch in list(self._watches.values()):
                event, watch.event = watch.event, asyncio.Event()
                event.set()

    def notify(self, response_id: str) -> None:
        watch = self._watches.get(response_id)
        if watch is not None:
            watch.notified += 1
            event, watch.event = watch.event, asyncio.Event()
            event.set()


class LogWriter:
    """Appends to the event log for every run of a replica, coalesced: batches that arrive
    within ``linger`` seconds of each other, or while a write is in flight, go together in the
    next write (one statement, one trip to the database, whatever the number of streams). A
    run's batches are written in the order they were submitted; a run whose write failed or
    that lost its lease has nothing more written."""

    MAX_ENTRIES = 256

    def __init__(self, store: Store, owner: str, *, linger: float = 0.02) -> None:
        self.store, self.owner, self.linger = store, owner, linger
        self._pending: list[tuple[LogSink, int, int, bytes]] = []
        self._kick: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.writes = 0
        """Writes so far (each holds one or more batches)."""

    def submit(self, sink: LogSink, first: int, last: int, data: bytes) -> None:
        if self._task is None or self._task.done():
            self._kick = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._write())
        sink.pending += 1
        self._pending.append((sink, first, last, data))
        assert self._kick is not None
        self._kick.set()

    async def _write(self) -> None:
        assert self._kick is not None
        while True:
            await self._kick.wait()
            self._kick.clear()
            if self.linger > 0:  # before every write: at most one write per linger
                await asyncio.sleep(self.linger)
            self._kick.clear()
            todo, self._pending = self._pending, []  # what arrives meanwhile waits a linger
            for start in range(0, len(todo), self.MAX_ENTRIES):
                batch = todo[start : start + self.MAX_ENTRIES]
                entries = [(sink.tenant, sink.response_id, first, last, data.decode()) for sink, first, last, data in batch if sink.ok]
                logged: set[tuple[str, str, int]] = set()
                error: StoreError | None = None
                if entries:
                    try:
                        logged = await self.store.append_many(self.owner, entries)
                        self.writes += 1
                    except Exception as exc:  # its runs hear of it; the other runs go on
                        error = exc if isinstance(exc, StoreError) else StoreError(f"{type(exc).__name__}: {exc}")
                for sink, first, last, data in batch:
                    sink.pending -= 1
                    if not sink.ok:
                        pass
                    elif (sink.tenant, sink.response_id, first) in logged:
                        sink.logged(first, last, data)
                    elif error is not None:
                        sink.error = error
                    else:
                        sink.lost = True
                    sink.settle()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class LogSink:
    """A background run's relay sink: each batch goes to the `LogWriter` (the run does not wait
    for the write, up to ``max_pending`` batches); readers see a batch once it was logged.

    Keep-alive comments are not logged (readers make their own). A batch holding the terminal
    is waited for (the run ends after its log does); one that ends the response other than
    ``completed`` (failed, incomplete, cancelled: the run did not persist it) first updates
    the stored Response, so a reader that sees the terminal finds the row ended. Raises
    `LeaseLost` once this replica no longer owns the run, `StoreError` once a write failed.
    """

    def __init__(
        self,
        writer: LogWriter,
        tenant: str,
        response_id: str,
        live: _Live,
        wakeups: Wakeups,
        *,
        max_pending: int = 64,
        max_bytes: int = 64 << 20,
    ) -> None:
        self.writer, self.store, self.owner = writer, writer.store, writer.owner
        self.tenant, self.response_id = tenant, response_id
        self.live, self.wakeups = live, wakeups
        self.max_pending = max_pending
        self.max_bytes = max_bytes
        """The most a response's log holds (its terminal may go past it)."""
        self.bytes = 0
        self.next = 0
        """The sequence number of the next frame sent."""
        self.logged_next = 0
        """The sequence number after the last frame logged."""
        self.pending = 0
        self.lost = False
        self.error: StoreError | None = None
        self.ended: str | None = None
        self._drained: asyncio.Future[None] | None = None

    @property
    def ok(self) -> bool:
        return not self.lost and self.error is None

    def _check(self) -> None:
        if self.lost:
            raise LeaseLost(f"this replica no longer runs {self.response_id}")
        if self.error is not None:
            raise self.error

    async def send(self, data: bytes) -> None:
        self._check()
        if data[:1] == b":":
            return
        count = data.count(_END)
        if not count:
            return
        ended = _terminal(data)
        if ended is None and self.bytes + len(data) > self.max_bytes:
            raise LimitExceededError(
                f"the background response's event log reached {self.max_bytes} bytes; raise background_max_log_bytes "
                "if this is expected",
                code="log_bytes",
                stage="relay",
            )
        self.bytes += len(data)
        if ended is not None and ended != "completed":
            final = _last_response(data)
            if final is not None:
                await self.drain()
                await self.store.update_body(self.tenant, self.response_id, self.owner, final)
        await self.append(data, count, wait=ended is not None)
        self.ended = ended or self.ended

    async def append(self, data: bytes, count: int, *, wait: bool = True) -> None:
        first = self.next
        self.next += count
        self.writer.submit(self, first, first + count - 1, data)
        if wait or self.pending > self.max_pending:
            await self.drain()

    async def drain(self) -> None:
        """Wait until every batch sent was logged (raises as `send` does)."""
        while self.pending and self.ok:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
        self._check()

    def settle(self) -> None:
        if self._drained is not None and not self._drained.done() and (not self.pending or not self.ok):
            self._drained.set_result(None)

    def logged(self, first: int, last: int, data: bytes) -> None:
        self.logged_next = last + 1
        self.live.batches.append((first, last, data))
        self.wakeups.notify(self.response_id)

    async def aclose(self) -> None:
        pass


@dataclass
class _Run:
    tenant: str
    task: asyncio.Task[None] | None = None
    reason: str | None = None
    """Why it was cancelled: ``"cancelled"`` (a client asked), ``"lost"`` (another replica took
    it over), ``"shutdown"`` (this replica stops: it ends ``failed``)."""
    finishing: bool = False


class Background:
    """This replica's background runs (see the module)."""

    def __init__(
        self,
        gateway: Gateway,
        store: Store,
        *,
        retention: float = 3600.0,
        lease: float = 15.0,
        poll: float = 1.0,
        keepalive_interval: float = 15.0,
    ) -> None:
        if lease <= 0 or retention <= 0:
            raise ValueError("lease and retention must be positive")
        self.gateway, self.store = gateway, store
        self.owner = "gw_" + uuid.uuid4().hex
        self.retention, self.lease, self.poll = retention, lease, poll
        self.keepalive_interval = keepalive_interval
        self.wakeups = Wakeups(poll)
        self.writer = LogWriter(store, self.owner)
        self.runs: dict[str, _Run] = {}
        self.live: dict[str, _Live] = {}
        self.listening = False

    # -- starting a run ----------------------------------------------------------------------

    async def start(self, body: Mapping[str, Any], headers: Mapping[str, str], tenant: str) -> dict[str, Any]:
        """Check and queue a ``background: true`` request and start running it; the queued
        Response. The caller's admission slot passes to the run (released when it ends).

        Raises a `RespflowError` for a bad request (nothing queued).
        """
        gateway = self.gateway
        _, input_items, _ = checked_request(body)
        resolved = await gateway.state.resolve(body, tenant)
        response_id = new_response_id()
        snapshot = gateway.queued(body, resolved, response_id)
        turn_input = [stored_item(i) for i in input_items]
        input_ids = [str(i["id"]) for i in turn_input]
        record = StoredResponse(
            response_id,
            snapshot,
            input_ids,
            resolved.context + input_ids,
            background=True,
            created_at=int(snapshot["created_at"]),
            status="queued",
            running=True,
        )
        try:
            await self.store.start_background(
                tenant, record, turn_input, owner=self.owner, lease_until=time.time() + self.lease, ttl=gateway.state.ttl
            )
        except StoreError as exc:
            raise StateError(f"the response could not be queued: {exc}") from None
        run = _Run(tenant)
        live = self.live[response_id] = _Live()
        sink = LogSink(self.writer, tenant, response_id, live, self.wakeups, max_bytes=gateway.background_max_log_bytes)
        self.runs[response_id] = run
        run.task = asyncio.get_running_loop().create_task(
            self._run(run, sink, body, headers, snapshot, resolved=resolved, turn_input=turn_input)
        )
        gateway.metrics.active.set(gateway.active)
        return snapshot

    async def _run(
        self, run: _Run, sink: LogSink, body: Mapping[str, Any], headers: Mapping[str, str], snapshot: dict[str, Any], **state: Any
    ) -> None:
        gateway, rid = self.gateway, sink.response_id
        started = time.monotonic()
        meter = gateway.metrics.meter(started)
        outcome = "completed"
        rounds = 0
        error: dict[str, Any] | None = None
        try:
            try:
                response, rounds = await gateway.run(
                    body,
                    headers,
                    MeteredSink(sink, meter) if meter is not None else sink,
                    response_id=rid,
                    tenant=run.tenant,
                    cancelled=lambda: run.reason == "cancelled",
                    **state,
                )
                outcome = response.status or "completed"
            except asyncio.CancelledError:
                if run.reason is None:
                    raise
                outcome = f"cancelled ({run.reason})"
                if run.reason == "shutdown":
                    error = {"code": "server_error", "message": STOPPED}
            except LeaseLost:
                outcome = "lease lost"
            except RespflowError as exc:
                outcome = f"error: {exc.code}"
                error = {"code": "server_error", "message": exc.message}
                if isinstance(exc, UpstreamError):
                    gateway.metrics.upstream_errors.labels(exc.code).inc()
            except Exception as exc:
                outcome = f"error: internal_error ({type(exc).__name__})"
                error = {"code": "server_error", "message": f"the gateway failed: {type(exc).__name__}"}
                log.exception("a background run failed")
            with contextlib.suppress(RespflowError, StoreError):
                await sink.drain()  # every frame sent is logged before the run lets go
            if sink.ended is None and run.reason != "lost" and not sink.lost:
                # the relay did not end the stream (nothing had started, or the store failed):
                # the end goes after the last frame that was logged
                status = "cancelled" if run.reason == "cancelled" else "failed"
                if status == "failed" and error is None:
                    error = {"code": "server_error", "message": "the response ended without a terminal"}
                so_far = {**snapshot, "output": done_items(sink.live.batches)}
                frames, final = ending_frames(so_far, sink.logged_next, status=status, error=None if status == "cancelled" else error)
                with contextlib.suppress(RespflowError, StoreError):
                    await self.store.update_body(run.tenant, rid, self.owner, final)
                    await self.store.append_events(run.tenant, rid, self.owner, sink.logged_next, sink.logged_next + frames.count(_END) - 1, frames.decode())
                    sink.logged(sink.logged_next, sink.logged_next + frames.count(_END) - 1, frames)
        finally:
            run.finishing = True
            if run.reason != "lost":
                try:
                    await self.store.finish_background(run.tenant, rid, self.owner, self.retention)
                except StoreError as exc:
                    log.warning("background %s: could not be marked ended (%s); its lease will run out", rid, exc)
            self.runs.pop(rid, None)
            self.live.pop(rid, None)
            self.wakeups.notify(rid)
            gateway.active -= 1
            metrics = gateway.metrics
            metrics.active.set(gateway.active)
            metrics.stream_ended(meter)
            metrics.request(body.get("stream") is True, outcome, rounds)
            log.info("background id=%s outcome=%s %.3fs", rid, outcome, time.monotonic() - started)

    # -- reading -----------------------------------------------------------------------------

    async def _batches(self, tenant: str, response_id: str, cursor: int) -> list[tuple[int, int, bytes]]:
        live = self.live.get(response_id)
        if live is not None and self.runs.get(response_id) is not None and self.runs[response_id].tenant == tenant:
            return live.after(cursor)
        rows = await self.store.events_after(tenant, response_id, cursor)
        return [(first, last, frames.encode()) for first, last, frames in rows]

    async def follow(self, tenant: str, response_id: str, after: int) -> AsyncGenerator[bytes, None]:
        """The frames after sequence number ``after``, then the live ones, until the terminal;
        keep-alive comments while nothing comes. Ends when the response has ended and its log
        holds nothing more."""
        cursor = after
        quiet = 0.0
        with self.wakeups.watching(response_id) as watch:
            while True:
                wake, notified = watch.event, watch.notified
                batches = await self._batches(tenant, response_id, cursor)
                for first, last, data in batches:
                    if first <= cursor:
                        data = b"".join(_frames(data)[cursor - first + 1 :])
                    cursor = last
                    yield data
                    if _terminal(data) is not None:
                        return
                if batches:
                    quiet = 0.0
                    continue
                await wake.wait()
                if watch.notified != notified:
                    continue
                quiet += self.wakeups.tick  # the periodic tick: nothing was logged meanwhile
                if response_id not in self.runs:
                    stored = await self.store.get_response(tenant, response_id)
                    if stored is None or not stored.running:
                        if not await self._batches(tenant, response_id, cursor):
                            return  # ended, and nothing more was logged
                        continue
                if quiet >= self.keepalive_interval:
                    quiet = 0.0
                    yield keepalive("keep-alive: response running")

    async def logged(self, tenant: str, response_id: str) -> list[tuple[int, int, bytes]]:
        return await self._batches(tenant, response_id, -1)

    async def so_far(self, tenant: str, stored: StoredResponse) -> dict[str, Any]:
        """A response as polling sees it: while it runs, ``in_progress`` once it produced
        events, with the output items that are done."""
        if not stored.running or stored.body.get("status") not in ("queued", "in_progress"):
            return stored.body  # ended (its row says so before its log does)
        batches = await self.logged(tenant, stored.id)
        if not batches:
            return stored.body
        return {**stored.body, "status": "in_progress", "output": done_items(batches)}

    # -- cancel ------------------------------------------------------------------------------

    def cancel_local(self, response_id: str, reason: str = "cancelled") -> bool:
        run = self.runs.get(response_id)
        if run is None or run.task is None or run.finishing or run.reason is not None:
            return run is not None
        run.reason = reason
        run.task.cancel()
        return True

    async def cancel(self, tenant: str, response_id: str, wait: float = 10.0) -> StoredResponse | None:
        """Stop a running background response wherever it runs; the Response once it ended
        (or as it is after ``wait`` seconds). None: no such response."""
        stored = await self.store.request_cancel(tenant, response_id)
        if stored is None or not stored.running:
            return stored
        run = self.runs.get(response_id)
        if run is not None and run.tenant == tenant:
            self.cancel_local(response_id)
        deadline = time.monotonic() + wait
        with self.wakeups.watching(response_id) as watch:
            while time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.1):
                        await watch.event.wait()
                current = await self.store.get_response(tenant, response_id)
                if current is None or not current.running:
                    return current
        return await self.store.get_response(tenant, response_id)

    # -- the replica's upkeep ----------------------------------------------------------------

    def _on_cancel(self, response_id: str) -> None:
        self.cancel_local(response_id)

    def _on_events(self, payload: str) -> None:
        """Another process logged events of these responses (ids, comma-separated)."""
        for rid in payload.split(","):
            if rid and rid not in self.runs:  # this replica's own runs wake their readers already
                self.wakeups.notify(rid)

    async def listen(self) -> None:
        try:
            self.listening = await self.store.listen(self._on_events, self._on_cancel)
        except StoreError as exc:
            self.listening = False
            log.warning("background: %s (readers on other replicas poll meanwhile)", exc)

    async def maintain(self, tick: float = 0.5) -> None:
        """Forever: cancel requests (every ``tick``), lease renewal (every third of the lease),
        abandoned runs ended (as often), LISTEN re-established after it was lost."""
        await self.listen()
        every = max(tick, self.lease / 3)
        last_renew = last_sweep = 0.0
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            try:
                if self.runs:
                    for rid in await self.store.cancel_requests(self.owner):
                        self.cancel_local(rid)
                if now - last_renew >= every:
                    last_renew = now
                    await self._renew()
                if now - last_sweep >= every:
                    last_sweep = now
                    await self.sweep()
                    await self.listen()  # a LISTEN connection that was lost is made again
            except StoreError as exc:
                log.warning("background upkeep: the store failed (%s); trying again", exc)
            except Exception:
                log.exception("background upkeep failed; trying again")

    async def _renew(self) -> None:
        if not self.runs:
            return
        held = set(await self.store.renew_leases(self.owner, time.time() + self.lease))
        for rid, run in list(self.runs.items()):
            if rid not in held and not run.finishing and run.task is not None:
                log.warning("background %s: another replica took it over; stopping here", rid)
                self.cancel_local(rid, "lost")

    async def sweep(self) -> int:
        """End every run whose owner stopped renewing its lease: ``failed``, with a terminal
        every follower gets. The number ended here."""
        ended = 0
        for tenant, rid in await self.store.abandoned(time.time()):
            if rid in self.runs or not await self.store.claim(tenant, rid, self.owner, time.time(), time.time() + self.lease):
                continue
            try:
                await self._end_abandoned(tenant, rid)
                ended += 1
            finally:
                await self.store.finish_background(tenant, rid, self.owner, self.retention)
                self.wakeups.notify(rid)
        return ended

    async def _end_abandoned(self, tenant: str, rid: str) -> None:
        stored = await self.store.get_response(tenant, rid)
        if stored is None:
            return
        rows = await self.store.events_after(tenant, rid, -1)
        batches = [(a, b, f.encode()) for a, b, f in rows]
        if batches and _terminal(batches[-1][2]) is not None:
            return  # it ended; only its owner's last write was lost
        first = batches[-1][1] + 1 if batches else 0
        snapshot = {**stored.body, "output": done_items(batches)}
        error = {"code": "server_error", "message": STOPPED}
        frames, final = ending_frames(snapshot, first, status="failed", error=error)
        await self.store.update_body(tenant, rid, self.owner, final)
        await self.store.append_events(tenant, rid, self.owner, first, first + frames.count(_END) - 1, frames.decode())
        log.warning("background %s: its gateway stopped renewing its lease; ended failed", rid)

    async def aclose(self) -> None:
        """Shutting down: the runs here end ``failed`` (the gateway running them stopped)."""
        tasks = []
        for run in self.runs.values():
            if run.task is not None and not run.finishing:
                run.reason = run.reason or "shutdown"
                run.task.cancel()
                tasks.append(run.task)
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.writer.aclose()
