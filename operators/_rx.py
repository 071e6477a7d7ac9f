"""The one adapter that lifts a stage into a reactive operator (reactivex).

A stage is any object with ``feed(item) -> Iterable[out]`` and ``flush() -> Iterable[out]``
(and, optionally, a faster ``feed_all(items) -> list[out]``). `lift` turns a factory of stages
into an ``Operator[list[A], list[B]]`` — reactivex's own operator type,
``Callable[[Observable[X]], Observable[Y]]``.

The items that flow through the graph are **batches**: one upstream read's worth of lines or
frames, in order. Rx's per-item machinery (an AutoDetachObserver call per hop) then costs per
read, not per token, while each stage still sees every item in order. A stage never sees a
batch boundary: the same items in any batching give the same output.

Per subscription the factory is called once (state lives on the stage instance, never in the
module). On completion ``flush`` runs before ``on_completed`` is forwarded. An exception from
the stage becomes ``on_error`` carrying the stage's unique name — after the part of the batch
produced before it was passed on, so nothing valid is lost. Downstream ``on_next`` is called
outside our ``try``: a downstream failure is that operator's own (RxPY's ``map`` idiom). No
scheduler is used: the graph runs synchronously on the thread that pushes into it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from reactivex import Observable, abc

from respflow.operators._errors import RespflowError

A = TypeVar("A")
B = TypeVar("B")
A_contra = TypeVar("A_contra", contravariant=True)
B_co = TypeVar("B_co", covariant=True)

Operator = Callable[[Observable[A]], Observable[B]]
"""A reactive operator: reactivex's own operator type."""


class Stage(Protocol[A_contra, B_co]):
    """The shape of every stage: incremental, synchronous, no I/O."""

    def feed(self, item: A_contra, /) -> Iterable[B_co]: ...

    def flush(self) -> Iterable[B_co]: ...


def lift(factory: Callable[[], Stage[A, B]], *, name: str) -> Operator[list[A], list[B]]:
    """Lift a stage factory into a reactive operator named ``name`` (the name errors carry)."""

    def operator(source: Observable[list[A]]) -> Observable[list[B]]:
        def subscribe(
            observer: abc.ObserverBase[list[B]], scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            stage = factory()
            feed_all: Callable[[list[A]], list[B]] | None = getattr(stage, "feed_all", None)

            def on_next(batch: list[A]) -> None:
                out: list[B] = []
                try:
                    if feed_all is not None:
                        out = feed_all(batch)
                    else:
                        feed = stage.feed
                        for item in batch:
                            out.extend(feed(item))
                except Exception as exc:
                    partial: list[B] = getattr(exc, "partial", None) or out
                    if partial:
                        observer.on_next(partial)
                    if isinstance(exc, RespflowError):
                        exc.partial = []
                    observer.on_error(_named(exc, name))
                    return
                if out:
                    observer.on_next(out)

            def on_completed() -> None:
                try:
                    out = list(stage.flush())
                except Exception as exc:
                    observer.on_error(_named(exc, name))
                    return
                if out:
                    observer.on_next(out)
                observer.on_completed()

            return source.subscribe(on_next, observer.on_error, on_completed, scheduler=scheduler)

        return Observable(subscribe)

    return operator


def _named(exc: Exception, name: str) -> RespflowError:
    """The error as a RespflowError that names the stage (a bug in a stage is wrapped)."""
    if isinstance(exc, RespflowError):
        return exc.at(stage=name)
    wrapped = RespflowError(
        f"step {name!r} failed: {type(exc).__name__}: {str(exc)[:200]}", code="internal_error", stage=name
    )
    wrapped.__cause__ = exc
    return wrapped


def each(fn: Callable[[A], B | None], *, name: str) -> Operator[list[A], list[B]]:
    """Lift a plain per-item function (``None`` drops the item) — e.g. a metrics tap."""

    class _Each:
        def feed(self, item: A) -> list[B]:
            value = fn(item)
            return [] if value is None else [value]

        def flush(self) -> list[B]:
            return []

    return lift(_Each, name=name)


def pipe(*operators: Operator[Any, Any]) -> Operator[Any, Any]:
    """Compose operators left to right (no 7-operator overload limit)."""

    def composed(source: Observable[Any]) -> Observable[Any]:
        for op in operators:
            source = op(source)
        return source

    return composed
