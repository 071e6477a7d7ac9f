"""Where the graph runs: the event loop owns all I/O and buffers; a small shared pool runs reads.

``batches(source, run)`` is the runner of ``reference/reactive.md`` §4 (E-hybrid), with one
refinement measured on the serving path (``respflow bench --serve``): no task hop while the
upstream trickles.

* **Pull, while the upstream trickles.** A real LLM stream arrives about one event per read.
  While the relay keeps up, the relay's own task reads upstream, runs the graph inline on the
  read and relays its frames: ONE task wake-up per read (a pump task plus a queue cost a
  second wake-up and a second stack resumed per event). The bounded buffer is then empty —
  nothing waits between the core and the relay.
* **Pump, once the upstream got ahead.** A read over ``inline_max_bytes`` means bytes piled up
  upstream (a burst, or a relay that was slow): from then on a pump task reads ahead into a
  `BatchQueue` bounded in batches AND bytes (a full queue parks the pump's awaited ``put``,
  so a slow consumer stops the upstream reads), while the relay drains it. In the ``worker``
  placement a big read goes to the stream's `Strand` — a serial lane on the small shared
  `CorePool` — with at most two reads in flight; a small one with nothing in flight runs
  inline. The core thread never blocks and never waits for the loop.
* The read timeout times ONLY a read in progress (time parked on backpressure never counts),
  with one timer per stream (`_Watchdog`), not one per read.
* The consumer's exit (done, error, cancel) cancels the pump and closes the source.

``placement="inline"`` never uses a thread (the pump, when it runs, processes on the loop).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable
from typing import Any, Literal, Protocol, TypeVar

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
    """An asyncio queue bounded in entries AND bytes, for one producer and one consumer.

    ``put`` waits while it is full (an item larger than the byte bound still goes in alone, so
    nothing deadlocks); ``get`` waits while it is empty. A waiting side is woken only when the
    other side changed what it waits for — one future set, no lock, no ``notify_all``.
    """

    def __init__(self, *, max_entries: int, max_bytes: int) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("queue bounds must be positive")
        self._items: collections.deque[tuple[object, int]] = collections.deque()
        self._bytes = 0
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._getter: asyncio.Future[None] | None = None
        self._putter: asyncio.Future[None] | None = None
        self.peak_entries = 0
        self.peak_bytes = 0
        self.parked = 0.0
        """Seconds ``put`` spent waiting on a full queue (backpressure)."""

    def __len__(self) -> int:
        return len(self._items)

    def _full(self, size: int) -> bool:
        items = self._items
        return bool(items) and (len(items) >= self._max_entries or self._bytes + size > self._max_bytes)

    async def put(self, item: object, size: int) -> None:
        if self._full(size):
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                while self._full(size):
                    self._putter = loop.create_future()
                    await self._putter
            finally:
                self._putter = None
                self.parked += loop.time() - started
        items = self._items
        items.append((item, size))
        self._bytes += size
        if len(items) > self.peak_entries:
            self.peak_entries = len(items)
        if self._bytes > self.peak_bytes:
            self.peak_bytes = self._bytes
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)

    async def get(self) -> object:
        items = self._items
        if not items:
            try:
                while not items:
                    self._getter = asyncio.get_running_loop().create_future()
                    await self._getter
            finally:
                self._getter = None
        item, size = items.popleft()
        self._bytes -= size
        putter = self._putter
        if putter is not None and not putter.done():
            putter.set_result(None)
        return item


class ChunkSource(Protocol):
    """An upstream body read one arrival at a time: ``read()`` is ``b""`` at the end."""

    async def read(self) -> bytes: ...

    async def aclose(self) -> None: ...


class _IterSource:
    """Any async (or sync) iterable of chunks as a `ChunkSource`."""

    def __init__(self, chunks: AsyncIterable[bytes]) -> None:
        self._iterator = aiter(chunks)

    async def read(self) -> bytes:
        try:
            while not (chunk := await anext(self._iterator)):
                pass
        except StopAsyncIteration:
            return b""
        return chunk

    async def aclose(self) -> None:
        closer = getattr(self._iterator, "aclose", None)
        if closer is not None:
            await closer()


def chunk_source(source: AsyncIterable[bytes] | ChunkSource) -> ChunkSource:
    """``source`` as a `ChunkSource` (one that already is one is used as it is)."""
    if callable(getattr(source, "read", None)) and callable(getattr(source, "aclose", None)):
        return source  # type: ignore[return-value]
    return _IterSource(source)  # type: ignore[arg-type]


class _Watchdog:
    """One timer per stream for the read timeout: a read in progress for ``timeout`` seconds
    cancels the task that is reading. A reader only writes ``since`` (the loop time its read
    started; None while it is not reading): time parked on backpressure never counts, and
    there is no timer per read."""

    __slots__ = ("_handle", "_loop", "_task", "_timeout", "fired", "since")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._loop = loop
        self._timeout = timeout
        self._task: asyncio.Task[Any] | None = None
        self.since: float | None = None
        self.fired = False
        self._handle = loop.call_at(loop.time() + timeout, self._check)

    def reading(self, task: asyncio.Task[Any]) -> None:
        """``task`` starts a read now."""
        self._task = task
        self.since = self._loop.time()

    def _check(self) -> None:
        now = self._loop.time()
        since = self.since
        if since is not None and now - since >= self._timeout and self._task is not None:
            self.fired = True
            self._task.cancel()
            return
        self._handle = self._loop.call_at((since if since is not None else now) + self._timeout, self._check)

    def stop(self) -> None:
        self._handle.cancel()


_END = object()


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _read_timeout_error(read_timeout: float) -> UpstreamError:
    return UpstreamError(
        f"upstream sent nothing for {read_timeout:g} s (read timeout); raise read_timeout "
        "or set it to 0 if the model legitimately pauses longer",
        code="upstream_timeout",
        status=504,
        stage="transport",
    )


_parked = [0.0]


def parked_seconds() -> float:
    """Seconds every ended stream's pump spent parked on a full buffer, in this process."""
    return _parked[0]


async def batches(
    source: AsyncIterable[bytes] | ChunkSource,
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
    reader = chunk_source(source)
    loop = asyncio.get_running_loop()
    watchdog = _Watchdog(loop, read_timeout) if read_timeout > 0 else None
    read = reader.read
    process = run.process
    pump: _Pump | None = None
    now = loop.time
    # the task that iterates this generator reads (the relay's: one task per stream); looked
    # up once, not per read (`current_task` costs a loop lookup with a getpid call in 3.11)
    task = asyncio.current_task()
    assert task is not None
    if watchdog is not None:
        watchdog._task = task
    try:
        while True:  # pull: this task reads, runs the graph and yields
            if watchdog is None:
                chunk = await read()
            else:  # `_timed_read`, inline: one coroutine less per read
                watchdog.since = now()
                try:
                    chunk = await read()
                except asyncio.CancelledError:
                    if not watchdog.fired:
                        raise
                    task.uncancel()
                    raise _read_timeout_error(read_timeout) from None
                finally:
                    watchdog.since = None
            if not chunk:
                yield run.close()
                return
            if len(chunk) > inline_max_bytes:
                break  # the upstream got ahead: read ahead from now on
            yield process(chunk)
            if run.done:
                yield run.close()
                return
        pump = _Pump(reader, run, watchdog, read_timeout, placement, out_max, out_max_bytes, inline_max_bytes)
        pump.start(chunk)
        get = pump.queue.get
        while True:
            item = await get()
            if item is _END:
                return
            if type(item) is _Failed:
                raise item.error
            yield item  # type: ignore[misc]
    finally:
        if watchdog is not None:
            watchdog.stop()
        if pump is not None:
            await pump.stop()
            _parked[0] += pump.queue.parked
            if stats is not None:
                stats["peak_batches"] = pump.queue.peak_entries
                stats["peak_bytes"] = pump.queue.peak_bytes
                stats["parked_s"] = pump.queue.parked
        await reader.aclose()


async def _timed_read(read: Callable[[], Awaitable[bytes]], watchdog: _Watchdog | None, read_timeout: float) -> bytes:
    """One read, timed by the stream's watchdog (never the time between reads)."""
    if watchdog is None:
        return await read()
    task = asyncio.current_task()
    assert task is not None
    watchdog.reading(task)
    try:
        return await read()
    except asyncio.CancelledError:
        if not watchdog.fired:
            raise
        task.uncancel()
        raise _read_timeout_error(read_timeout) from None
    finally:
        watchdog.since = None


class _Pump:
    """The read-ahead task of a stream whose upstream got ahead of the relay."""

    def __init__(
        self,
        reader: ChunkSource,
        run: GraphRun,
        watchdog: _Watchdog | None,
        read_timeout: float,
        placement: Placement,
        out_max: int,
        out_max_bytes: int,
        inline_max_bytes: int,
    ) -> None:
        self.queue = BatchQueue(max_entries=out_max, max_bytes=out_max_bytes)
        self._reader = reader
        self._run = run
        self._watchdog = watchdog
        self._read_timeout = read_timeout
        self._inline_max = inline_max_bytes
        self._executor = CorePool.acquire() if placement == "worker" else None
        self._strand = Strand(self._executor) if self._executor is not None else None
        self._task: asyncio.Task[None] | None = None

    def start(self, first: bytes) -> None:
        self._task = asyncio.get_running_loop().create_task(self._pump(first), name="respflow-pump")

    async def _pump(self, chunk: bytes) -> None:
        loop = asyncio.get_running_loop()
        inflight: collections.deque[tuple[asyncio.Future[Translation], int]] = collections.deque()
        run, strand, put = self._run, self._strand, self.queue.put
        try:
            try:
                while chunk:
                    size = len(chunk)
                    if strand is None or (not inflight and size <= self._inline_max):
                        await put(run.process(chunk), size)
                    else:
                        inflight.append((asyncio.wrap_future(strand.submit(run.process, chunk), loop=loop), size))
                        if len(inflight) >= INFLIGHT:
                            future, n = inflight.popleft()
                            await put(await future, n)
                    if run.done:
                        break
                    chunk = await _timed_read(self._reader.read, self._watchdog, self._read_timeout)
            except Exception as exc:
                error: BaseException = exc
            else:
                while inflight:
                    future, n = inflight.popleft()
                    await put(await future, n)
                await put(run.close(), 0)
                await put(_END, 0)
                return
            # every read already in the core is delivered before the error
            while inflight:
                future, n = inflight.popleft()
                await put(await future, n)
            raise error
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            await put(_Failed(exc), 0)
        finally:
            if strand is not None:
                strand.cancel_pending()
            for future, _ in inflight:
                future.cancel()

    async def stop(self) -> None:
        task = self._task
        if task is not None:
            if not task.done():
                task.cancel()
            await asyncio.shield(asyncio.gather(task, return_exceptions=True))
        if self._executor is not None:
            self._executor = None
            CorePool.release()
