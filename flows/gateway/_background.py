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
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from respflow.flows.gateway._rounds import Gateway, new_response_id
from respflow.flows.gateway._rounds import _checked as checked_request
from respflow.flows.gateway._state import StateError, stored_item
from respflow.operators import RespflowError
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


class Wakeups:
    """Per response, an event its readers wait on; ``notify`` wakes them (and arms a new one)."""

    def __init__(self) -> None:
        self._events: dict[str, tuple[asyncio.Event, int]] = {}

    @contextlib.contextmanager
    def watching(self, response_id: str) -> Any:
        event, count = self._events.get(response_id) or (asyncio.Event(), 0)
        self._events[response_id] = (event, count + 1)
        try:
            yield
        finally:
            event, count = self._events[response_id]
            if count <= 1:
                del self._events[response_id]
            else:
                self._events[response_id] = (event, count - 1)

    def current(self, response_id: str) -> asyncio.Event:
        return self._events[response_id][0]

    def notify(self, response_id: str) -> None:
        entry = self._events.get(response_id)
        if entry is not None:
            entry[0].set()
            self._events[response_id] = (asyncio.Event(), entry[1])


class LogSink:
    """A background run's relay sink: each batch is logged (one write), then readers are woken.

    Keep-alive comments are not logged (readers make their own). A batch that ends the
    response other than ``completed`` (failed, incomplete, cancelled: the run did not persist
    it) first updates the stored Response, so a reader that sees the terminal finds the row
    ended. Raises `LeaseLost` when this replica no longer owns the run.
    """

    def __init__(self, store: Store, tenant: str, response_id: str, owner: str, live: _Live, wakeups: Wakeups) -> None:
        self.store, self.tenant, self.response_id, self.owner = store, tenant, response_id, owner
        self.live, self.wakeups = live, wakeups
        self.next = 0
        """The sequence number of the next frame."""
        self.ended: str | None = None
        self.final: dict[str, Any] | None = None

    async def send(self, data: bytes) -> None:
        if data[:1] == b":":
            return
        count = data.count(_END)
        if not count:
            return
        first, last = self.next, self.next + count - 1
        ended = _terminal(data)
        if ended is not None and ended != "completed":
            final = _last_response(data)
            if final is not None:
                self.final = final
                await self.store.update_body(self.tenant, self.response_id, self.owner, final)
        await self.append(first, last, data)
        self.ended = ended or self.ended

    async def append(self, first: int, last: int, data: bytes) -> None:
        # a write that was sent finishes even when the run is cancelled meanwhile: the next
        # write (the cancelled terminal) must know whether these numbers were taken
        write = asyncio.ensure_future(self.store.append_events(self.tenant, self.response_id, self.owner, first, last, data.decode()))
        try:
            logged = await asyncio.shield(write)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                if await write:
                    self._logged(first, last, data)
            raise
        if not logged:
            raise LeaseLost(f"this replica no longer runs {self.response_id}")
        self._logged(first, last, data)

    def _logged(self, first: int, last: int, data: bytes) -> None:
        self.next = last + 1
        self.live.batches.append((first, last, data))
        self.wakeups.notify(self.response_id)

    async def aclose(self) -> None:
        pass


@dataclass
class _Run:
    tenant: str
    task: asyncio.Task[None] | None = None
    reason: str | None = None
    """Why it was cancelled: ``"cancelled"`` (a client asked), ``"lost"`` (lease lost)."""
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
        self.wakeups = Wakeups()
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
        sink = LogSink(self.store, tenant, response_id, self.owner, live, self.wakeups)
        self.runs[response_id] = run
        run.task = asyncio.get_running_loop().create_task(
            self._run(run, sink, body, headers, snapshot, resolved=resolved, turn_input=turn_input)
        )
        return snapshot

    async def _run(
        self, run: _Run, sink: LogSink, body: Mapping[str, Any], headers: Mapping[str, str], snapshot: dict[str, Any], **state: Any
    ) -> None:
        gateway, rid = self.gateway, sink.response_id
        started = time.monotonic()
        outcome = "completed"
        error: dict[str, Any] | None = None
        try:
            try:
                response, _ = await gateway.run(
                    body,
                    headers,
                    sink,
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
            except Exception as exc:
                outcome = f"error: internal_error ({type(exc).__name__})"
                error = {"code": "server_error", "message": f"the gateway failed: {type(exc).__name__}"}
                log.exception("a background run failed")
            if sink.ended is None and run.reason != "lost":
                # the relay did not end the stream (nothing had started, or the store failed)
                status = "cancelled" if run.reason == "cancelled" else "failed"
                if status == "failed" and error is None:
                    error = {"code": "server_error", "message": "the response ended without a terminal"}
                so_far = {**snapshot, "output": done_items(sink.live.batches)}
                frames, final = ending_frames(so_far, sink.next, status=status, error=None if status == "cancelled" else error)
                with contextlib.suppress(RespflowError, StoreError):
                    await self.store.update_body(run.tenant, rid, self.owner, final)
                    await sink.append(sink.next, sink.next + frames.count(_END) - 1, frames)
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
            log.info("background id=%s outcome=%s %.3fs", rid, outcome, time.monotonic() - started)

    # -- reading -----------------------------------------------------------------------------

    async def _batches(self, tenant: str, response_id: str, cursor: int) -> list[tuple[int, int, bytes]]:
        live = self.live.get(response_id)
        if live is not None and self.runs.get(response_id) is not None and self.runs[response_id].tenant == tenant:
            return live.after(cursor)
        rows = await self.store.events_after(tenant, response_id, cursor)
        return [(first, last, frames.encode()) for first, last, frames in rows]

    async def follow(self, tenant: str, response_id: str, after: int) -> AsyncIterator[bytes]:
        """The frames after sequence number ``after``, then the live ones, until the terminal;
        keep-alive comments while nothing comes. Ends when the response has ended and its log
        holds nothing more."""
        cursor = after
        quiet = 0.0
        with self.wakeups.watching(response_id):
            while True:
                wake = self.wakeups.current(response_id)
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
                waited = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.poll)
                if wake.is_set():
                    continue
                quiet += time.monotonic() - waited
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
        with self.wakeups.watching(response_id):
            while time.monotonic() < deadline:
                wake = self.wakeups.current(response_id)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), 0.1)
                current = await self.store.get_response(tenant, response_id)
                if current is None or not current.running:
                    return current
        return await self.store.get_response(tenant, response_id)

    # -- the replica's upkeep ----------------------------------------------------------------

    def _on_cancel(self, response_id: str) -> None:
        self.cancel_local(response_id)

    async def listen(self) -> None:
        try:
            self.listening = await self.store.listen(self.wakeups.notify, self._on_cancel)
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
                    if not self.listening:
                        await self.listen()
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
