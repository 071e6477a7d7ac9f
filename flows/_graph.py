"""The standard graph — split → normalize → validate → fold → translate — as reactive operators.

`Graph` is one stream's graph: it owns that stream's `AgentPipeline` (the stage instances),
lifts each stage with the one adapter (`operators.lift`) and pipes them in order. A user can
splice their own operator anywhere by name (`Graph.splice`); names are unique and appear in
errors. `GraphRun` drives a graph synchronously: one upstream read in, the frames it produced
out — the unit that crosses threads in the live driver.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reactivex import Observable, abc
from reactivex.disposable import Disposable

from respflow.operators import (
    AgentPipeline,
    Frame,
    Limits,
    LineSplitter,
    Operator,
    RespflowError,
    Response,
    ToolRegistry,
    Translation,
    Validation,
    lift,
    pipe,
)

STANDARD_STEPS = ("split", "normalize", "validate", "fold", "translate")


class Graph:
    """One stream's reactive graph over one AgentPipeline. Build one per stream."""

    def __init__(
        self,
        *,
        validation: Validation = Validation.LENIENT,
        response_id: str | None = None,
        model: str | None = None,
        tools: ToolRegistry | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.limits = limits or Limits()
        self.pipeline = AgentPipeline(
            validation=validation, response_id=response_id, model=model, tools=tools, limits=self.limits
        )
        self.splitter = LineSplitter(max_line_bytes=self.limits.max_line_bytes)
        p = self.pipeline
        self._steps: list[tuple[str, Operator[Any, Any]]] = [
            ("split", lift(lambda: self.splitter, name="split")),
            ("normalize", lift(lambda: p.normalizer, name="normalize")),
            ("validate", lift(lambda: p.validator, name="validate")),
            ("fold", lift(lambda: p.folder, name="fold")),
            ("translate", lift(lambda: p.translator, name="translate")),
        ]
        self._used = False
        self._finishers: list[Callable[[Response], Response]] = []

    @property
    def names(self) -> list[str]:
        """The step names, in order."""
        return [name for name, _ in self._steps]

    @property
    def response_id(self) -> str:
        """The public response id (fixed from the first read)."""
        return self.pipeline.folder.response_id

    def splice(
        self,
        name: str,
        operator: Operator[Any, Any],
        *,
        after: str | None = None,
        before: str | None = None,
    ) -> Graph:
        """Insert a user operator after (or before) a named step; returns self.

        Items are batches (lists, one upstream read's worth): lift a per-item stage with
        `operators.lift` or a plain function with `operators.each`. Between ``translate`` and
        the relay the items are public `Frame`s; between ``split`` and ``normalize``
        `SseLine`s, then `Frame`s. Errors raised in the operator reach the client as an
        ``error`` event, like ours.
        """
        if name in self.names:
            raise ValueError(f"a step named {name!r} exists already")
        if (after is None) == (before is None):
            raise ValueError("give exactly one of after= or before=")
        anchor = after if after is not None else before
        if anchor not in self.names:
            raise ValueError(f"no step named {anchor!r}; steps: {', '.join(self.names)}")
        at = self.names.index(anchor) + (1 if after is not None else 0)
        self._steps.insert(at, (name, operator))
        return self

    def on_finish(self, fn: Callable[[Response], Response]) -> Graph:
        """Apply ``fn`` to the final Response (after the standard finish); returns self.

        The place for the Response half of a user operator (e.g. the redaction that the
        spliced operator applied to the frames).
        """
        self._finishers.append(fn)
        return self

    def finish_response(self, response: Response) -> Response:
        """``response`` through the ``on_finish`` functions, in order."""
        for fn in self._finishers:
            response = fn(response)
        return response

    def operator(self) -> Operator[list[bytes], list[Frame]]:
        """The whole graph as one operator: reads in, batches of public frames out."""
        return pipe(*(op for _, op in self._steps))

    def subscribe_to(self, source: Observable[list[bytes]]) -> Observable[list[Frame]]:
        """The graph applied to ``source``; a graph carries one stream, so once only."""
        if self._used:
            raise RuntimeError("a Graph carries one stream: build a new Graph for another")
        self._used = True
        return self.operator()(source)

    def finish(self) -> Response:
        """The final Response (after the graph completed), through ``on_finish`` functions."""
        return self.finish_response(self.pipeline.finish())


class _Entry:
    """The graph's entry: an observable with one subscriber, pushed into directly. (A
    `Subject` would take a lock and copy its observer list on every read; a graph carries one
    stream and one subscriber, pushed from one lane at a time.)"""

    def __init__(self) -> None:
        self.observer: abc.ObserverBase[list[bytes]] | None = None

    def subscribe(self, observer: abc.ObserverBase[list[bytes]], scheduler: abc.SchedulerBase | None = None) -> abc.DisposableBase:
        self.observer = observer
        return Disposable()


class GraphRun:
    """Drive a Graph synchronously, one read at a time (never concurrently)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._out: list[Frame] = []
        self._error: Exception | None = None
        self._completed = False
        entry = _Entry()
        graph.subscribe_to(Observable(entry.subscribe)).subscribe(self._collect, self._on_error, self._on_completed)
        assert entry.observer is not None
        self._entry = entry.observer
        self._translator = graph.pipeline.translator
        self._splitter = graph.splitter

    def _collect(self, batch: list[Frame]) -> None:
        self._out.extend(batch)

    def _on_error(self, error: Exception) -> None:
        self._error = error

    def _on_completed(self) -> None:
        self._completed = True

    @property
    def done(self) -> bool:
        """True once ``[DONE]`` was read (stop reading upstream) or the run ended."""
        return self._splitter.done or self._completed or self._error is not None

    def process(self, chunk: bytes) -> Translation:
        """One upstream read in; its frames and the defer boundary out.

        Raises:
            RespflowError: with ``partial`` = the frames produced before the error.
        """
        if self._error is None and not self._completed:
            self._entry.on_next([chunk])
            if self._error is None:  # `_take`'s common case, inline: one call less per read
                out, self._out = self._out, []
                return Translation(out, self._translator.defer_from)
        return self._take()

    def close(self) -> Translation:
        """End of input: flush every stage; the last frames out."""
        if self._error is None and not self._completed:
            self._entry.on_completed()
        return self._take()

    def _take(self) -> Translation:
        out, self._out = self._out, []
        error = self._error
        if error is not None:
            if not isinstance(error, RespflowError):
                wrapped = RespflowError(
                    f"a stage failed: {type(error).__name__}: {str(error)[:200]}", code="internal_error"
                )
                wrapped.__cause__ = error
                error = self._error = wrapped
            assert isinstance(error, RespflowError)
            error.partial = out
            raise error
        return Translation(out, self._translator.defer_from)
