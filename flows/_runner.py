"""Where the graph runs: the event loop owns all I/O and buffers; a small shared pool runs reads.

``batches(source, run)`` is the recommended runner of ``reference/reactive.md`` §4 (E-hybrid):

* a pump task on the loop reads upstream (the read timeout times ONLY the read itself: time
  parked on backpressure never counts);
* a read under ``inline_max_bytes`` is processed inline when the stream has nothing in flight
  (a thread hop would cost more than the work); a bigger read (a burst) goes to the stream's
  `Strand` — a serial lane on the small shared `CorePool` — with at most two reads in flight;
* results go, in order, into a `BatchQueue` bounded in batches AND bytes; a full queue parks
  the pump's awaited ``put``, so a slow consumer stops the upstream reads. The core thread
  never blocks and never waits for the loop;
* the consumer's exit (done, error, cancel) cancels the pump, which closes the source.

``placement="inline"`` runs everything on the loop (no thread at all).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from collections.abc import AsyncGenerator, AsyncIterable, Callable
from typing import Any, Literal, TypeVar

from respflow.flows._graph import GraphRun
from respflow.operators import Translation, UpstreamError

Placement = Literal["worker", "inline"]
T = TypeVar("T")

INFLIGHT = 2


class CorePool:
    """The process-wide core pool: small, shared by every stream, gone when nothing uses it."""

    _lock = threading.Lock()
    _executor: concurrent.futures.ThreadPoolExecutor | None = None
    _users = 0
    max_workers = 2

    @classmethod
    def acquire(cls) -> concurrent.futures.ThreadPoolExecutor:
        with cls._lock:
            if cls._executor is None:
                cls._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=cls.max_workers, thread_name_prefix="respflow-core"
                )
            cls._users += 1
            return cls._executor

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls._users -= 1
            if cls._users == 0 and cls._executor is not None:
                # idle threads exit; a read still running finishes first
                cls._executor.shutdown(wait=False, cancel_futures=True)
                cls._executor = None

    @classmethod
    def threads(cls) -> list[threading.Thread]:
        """The core threads alive now (for tests and the benchmark)."""
        return [t for t in threading.enumerate() if t.name.startswith("respflow-core")]


class Strand:
    """A serial lane on a shared pool: one stream's reads run one at a time, in order."""

    def __init__(self, executor: concurrent.futures.Executor) -> None:
        self._executor = executor
        self._lock = threading.Lock()
        self._queue: collections.deque[tuple[Callable[[Any], Any], Any, concurrent.futures.Future[Any]]] = (
            collections.deque()
        )
        self._running = False

    def submit(self, fn: Callable[[Any], T], arg: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            self._queue.append((fn, arg, future))
            if self._running:
                return future
            self._running = True
        self._executor.submit(self._drain)
        return future

    def _drain(self) -> None:
        for _ in range(4):  # a short burst, then yield the thread to other streams
            with self._lock:
                if not self._queue:
                    self._running = False
                    return
                fn, arg, future = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(arg))
            except BaseException as exc:
                future.set_exception(exc)
        with self._lock:
            if not self._queue:
                self._running = False
                return
        try:
            self._executor.submit(self._drain)
        except RuntimeError:  # the pool is shutting down: finish here
            self._drain()

    def cancel_pending(self) -> None:
        """Cancel reads not started yet (the one running finishes)."""
        with self._lock:
            pending = list(self._queue)
            self._queue.clear()
        for _, _, future in pending:
            future.cancel()


class BatchQueue:
    """An asyncio queue bounded in entries AND bytes. ``put`` waits while it is full."""

    def __init__(self, *, max_entries: int, max_bytes: int) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("queue bounds must be positive")
        self._items: collections.deque[tuple[object, int]] = collections.deque()
        self._bytes = 0
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._changed = asyncio.Condition()
        self.peak_entries = 0
        self.peak_bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, item: object, size: int) -> None:
        async with self._changed:
            # an item larger than the byte bound still goes in alone, so nothing deadlocks
            await self._changed.wait_for(
                lambda: not self._items
                or (len(self._items) < self._max_entries and self._bytes + size <= self._max_bytes)
            )
            self._items.append((item, size))
            self._bytes += size
            self.peak_entries = max(self.peak_entries, len(self._items))
            self.peak_bytes = max(self.peak_bytes, self._bytes)
            self._changed.notify_all()

    async def get(self) -> object:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
            item, size = self._items.popleft()
            self._bytes -= size
            self._changed.notify_all()
            return item


class _End:
    pass


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


async def _timed_reads(source: AsyncIterable[bytes], read_timeout: float) -> AsyncGenerator[bytes, None]:
    iterator = aiter(source)
    while True:
        try:
            if read_timeout > 0:
                async with asyncio.timeout(read_timeout):
                    chunk = await anext(iterator)
            else:
                chunk = await anext(iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise UpstreamError(
                f"upstream sent nothing for {read_timeout:g} s (read timeout); raise read_timeout "
                "or set it to 0 if the model legitimately pauses longer",
                code="upstream_timeout",
                status=504,
                stage="transport",
            ) from None
        yield chunk


async def batches(
    source: AsyncIterable[bytes],
    run: GraphRun,
    *,
    placement: Placement = "worker",
    out_max: int = 8,
    out_max_bytes: int = 1 << 20,
    inline_max_bytes: int = 4096,
    read_timeout: float = 30.0,
    stats: dict[str, Any] | None = None,
) -> AsyncGenerator[Translation, None]:
    """Run ``run`` over ``source``; yield one `Translation` per upstream read, in order.

    The last item is the flush at end of input. An upstream or core error is raised after
    every batch produced before it (a core error's own partial batch travels on the error).
    """
    if placement not in ("worker", "inline"):
        raise ValueError(f"placement must be 'worker' or 'inline', not {placement!r}")
    queue = BatchQueue(max_entries=out_max, max_bytes=out_max_bytes)
    executor = CorePool.acquire() if placement == "worker" else None
    strand = Strand(executor) if executor is not None else None
    loop = asyncio.get_running_loop()

    async def pump() -> None:
        inflight: collections.deque[tuple[asyncio.Future[Translation], int]] = collections.deque()
        reads = _timed_reads(source, read_timeout)
        try:
            try:
                async for chunk in reads:
                    size = len(chunk)
                    if strand is None or (not inflight and size <= inline_max_bytes):
                        await queue.put(run.process(chunk), size)
                    else:
                        inflight.append((asyncio.wrap_future(strand.submit(run.process, chunk), loop=loop), size))
                        if len(inflight) >= INFLIGHT:
                            future, n = inflight.popleft()
                            await queue.put(await future, n)
                    if run.done:
                        break
            except Exception as exc:
                # every read already in the core is delivered before the error
                while inflight:
                    future, n = inflight.popleft()
                    await queue.put(await future, n)
                raise exc
            while inflight:
                future, n = inflight.popleft()
                await queue.put(await future, n)
            await queue.put(run.close(), 0)
            await queue.put(_End(), 0)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            await queue.put(_Failed(exc), 0)
        finally:
            if strand is not None:
                strand.cancel_pending()
            for future, _ in inflight:
                future.cancel()
            await reads.aclose()
            closer = getattr(source, "aclose", None)
            if closer is not None:
                await closer()

    task = asyncio.create_task(pump(), name="respflow-pump")
    try:
        while True:
            item = await queue.get()
            if isinstance(item, _End):
                return
            if isinstance(item, _Failed):
                raise item.error
            assert isinstance(item, Translation)
            yield item
    finally:
        if not task.done():
            task.cancel()
        try:
            await asyncio.shield(asyncio.gather(task, return_exceptions=True))
        finally:
            if executor is not None:
                CorePool.release()
            if stats is not None:
                stats["peak_batches"] = queue.peak_entries
                stats["peak_bytes"] = queue.peak_bytes
