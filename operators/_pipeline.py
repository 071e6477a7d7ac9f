"""AgentPipeline: normalize → validate → fold → translate, exactly once per line, in that order.

Every driver (live, collect, decode, the CLI) pushes lines through this one object, so nothing
that could drift between drivers lives outside it. ``push(line)`` returns the `Translation` of
that line: the client-bound frames and the defer boundary. ``finish()`` ends the stream (strict
requires a terminal by then) and returns the final `Response`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from respflow.operators._config import Limits
from respflow.operators._errors import RespflowError
from respflow.operators._fold import Folder
from respflow.operators._frames import Frame, Validation
from respflow.operators._normalize import Normalizer
from respflow.operators._response import Response
from respflow.operators._split import SseLine
from respflow.operators._tools import ToolRegistry
from respflow.operators._translate import Translator
from respflow.operators._validate import Validator


@dataclass(slots=True)
class Translation:
    """What one pushed line produced for the client."""

    frames: list[Frame] = field(default_factory=list)
    defer_from: int | None = None
    """Frames at or beyond this output_index (and index-less ones) must wait: a gateway-owned
    or still-unnamed call sits there."""


class AgentPipeline:
    """The synchronous ingest core of one response."""

    def __init__(
        self,
        *,
        validation: Validation = Validation.LENIENT,
        response_id: str | None = None,
        model: str | None = None,
        tools: ToolRegistry | None = None,
        limits: Limits | None = None,
    ) -> None:
        limits = limits or Limits()
        self.validation = validation
        self.limits = limits
        self.normalizer = Normalizer()
        self.validator = Validator(validation)
        self.folder = Folder(
            response_id=response_id, model=model, max_retained_bytes=limits.max_retained_bytes
        )
        self.translator = Translator(tools, self.folder, limits)
        self._feeds: tuple[Callable[[list[Any]], list[Any]], ...] = (
            self.normalizer.feed_all,
            self.validator.feed_all,
            self.folder.feed_all,
            self.translator.feed_all,
        )
        self._finished = False

    def push(self, line: SseLine) -> Translation:
        """One SSE payload in; the frames it yields for the client out."""
        return self.push_all((line,))

    def push_all(self, lines: Iterable[SseLine]) -> Translation:
        """A batch of payloads (one upstream read) in; their frames, in order, out.

        Each stage takes the whole batch (``feed_all``), as in the reactive graph. If a stage
        fails, the items it produced before the failure still go through the later stages;
        then the error is raised with ``partial`` = the frames they produced, so a driver
        delivers every frame before the error.
        """
        batch: list[Any] = lines if isinstance(lines, list) else list(lines)
        error: RespflowError | None = None
        for feed_all in self._feeds:
            try:
                batch = feed_all(batch)
            except RespflowError as exc:
                # a later stage's error concerns an earlier line: it wins, as in the graph
                batch, exc.partial = exc.partial, []
                error = exc
        if error is not None:
            error.partial = batch
            raise error
        return Translation(batch, self.translator.defer_from)

    def flush(self) -> Translation:
        """End of stream, before `finish`: frames translate still held (unnamed calls)."""
        return Translation(self.translator.flush(), None)

    def outcome(self) -> dict[str, Any]:
        """End of stream, when no Response is built here (a gateway round): the EOF policy
        (strict refuses a stream without a terminal), then ``status``, ``error``,
        ``incomplete_details`` and ``usage`` as the Response would carry them."""
        self.validator.flush()
        return self.folder.outcome()

    def finish(self) -> Response:
        """End of stream: apply the EOF policy and return the final Response."""
        if self._finished:
            raise RuntimeError("AgentPipeline.finish() was already called")
        self._finished = True
        self.validator.flush()
        return self.translator.restore_response(self.folder.finish())
