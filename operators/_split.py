"""split: an SSE byte stream → data payloads (`SseLine`).

In: ``bytes`` chunks, cut anywhere (mid-line, mid-character, between a CR and its LF).
Out: one `SseLine` per dispatched SSE event that carries data: the ``data:`` field values of
the event joined with ``\\n`` (SSE spec), and the line number of its first ``data:`` line.

Rules:
* Line ends are LF, CRLF or a bare CR — also when a CR and its LF arrive in different chunks.
* ``data:`` with or without one space; whitespace-only values carry nothing.
* ``data: [DONE]`` / ``data:[DONE]`` ends the stream at once: `done` turns true and every
  later byte is ignored.
* Comments (``:``), ``event:``, ``id:``, ``retry:`` and unknown fields carry no payload.
* Payloads stay bytes of complete lines, so a character split across chunks survives; the
  JSON parser in normalize decodes them once. A payload that is not UTF-8 becomes a malformed
  frame there, which the validate stage (the one place the policy lives) rejects (strict,
  ``invalid_utf8``) or counts and skips (lenient).
* At end of input, an unterminated last line and a pending event are still dispatched.

State: the unterminated tail, whether the previous chunk ended in CR, the pending event's data
lines, the line counter. Raises `FramingError` for a line longer than ``max_line_bytes``.
The output is identical for every chunking of the same bytes.
"""

from __future__ import annotations

import operator
import re

from respflow.operators._errors import FramingError

_LINE_END = re.compile(rb"\r\n|\r|\n")
_DONE = b"[DONE]"
_PAYLOAD = operator.itemgetter(slice(6, None))  # b"data: {…}" → b"{…}", called from C


SseLine = tuple[bytes, int]
"""``(data, line)``: the data of one SSE event — raw UTF-8 bytes, decoded once by the JSON
parser — and the 1-based line its first ``data:`` line was on. A plain tuple: one is made per
token, and a tuple subclass costs twice as much to build."""


class LineSplitter:
    """Split an SSE byte stream into data payloads at CR, LF or CRLF, across chunk boundaries."""

    __slots__ = (
        "_data",
        "_data_line",
        "_error",
        "_line_no",
        "_max",
        "_skip_lf",
        "_tail",
        "done",
    )

    def __init__(self, *, max_line_bytes: int = 1 << 20) -> None:
        if max_line_bytes <= 0:
            raise ValueError("max_line_bytes must be positive")
        self._max = max_line_bytes
        self._tail = b""
        self._skip_lf = False
        self._line_no = 0
        self._data: list[bytes] = []
        self._data_line = 0
        self.done = False
        """True once ``[DONE]`` was seen: the stream is over, stop reading. (An attribute: it
        is read after every read.)"""
        self._error: FramingError | None = None

    def feed(self, chunk: bytes) -> list[SseLine]:
        """Take the next chunk; return the events it completed.

        An error found after some events were completed is raised on the next call, so
        every event before the bad line is delivered first, whatever the chunking.
        """
        if self._error is not None:
            raise self._error
        if self.done or not chunk:
            return []
        if not self._tail and not self._data and not self._skip_lf and chunk[-2:] == b"\n\n":
            # the trickle: one read is one whole event, as vLLM and OpenAI write it —
            # ``data: {…}`` or one payload-less line (``event: …``) before it, then a blank line
            one = self._one_event(chunk)
            if one is not None:
                return one
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
                if not chunk:
                    return []
        size = len(self._tail) + len(chunk)
        if b"\r" in chunk:
            buf = self._tail + chunk  # the tail holds no line end: it cannot hold a CR
            parts = _LINE_END.split(buf)
            if buf[-1:] == b"\r":
                self._skip_lf = True
        else:
            parts = chunk.split(b"\n")
            if self._tail:  # the unterminated line goes on in this chunk: join only that line
                parts[0] = self._tail + parts[0]
        tail = parts.pop()
        out: list[SseLine] = []
        if size <= self._max:
            self._fast(parts, out)
        else:
            for raw in parts:
                self._line(raw, out)
                if self.done or self._error is not None:
                    break
        if self.done or self._error is not None:
            tail = b""
        elif len(tail) > self._max:
            self._error = self._too_long(self._line_no + 1)
            tail = b""
        self._tail = tail
        if self._error is not None and not out:
            raise self._error
        return out

    def feed_all(self, chunks: list[bytes]) -> list[SseLine]:
        """Every chunk of a batch in turn; the events they completed, in order (``partial``:
        the events completed before an error). A batch is one read: no per-item wrapper."""
        if len(chunks) == 1:
            return self.feed(chunks[0])
        out: list[SseLine] = []
        try:
            for chunk in chunks:
                out += self.feed(chunk)
        except Exception as exc:
            if not getattr(exc, "partial", None):
                exc.partial = out  # type: ignore[attr-defined]
            raise
        return out

    def _one_event(self, chunk: bytes) -> list[SseLine] | None:
        """``chunk`` as one event if it is exactly one, in the common shape; else None."""
        if len(chunk) > self._max or b"\r" in chunk:
            return None
        end = len(chunk) - 2
        first = chunk.find(b"\n")
        if first == end:
            if chunk.startswith(b"data: {"):
                self._line_no += 2
                return [(chunk[6:end], self._line_no - 1)]
            return None
        # a first line that carries no payload (event:, a comment, id:, or blank: nothing is
        # pending), then exactly one JSON data line
        if chunk.startswith(b"data:") or chunk.find(b"\n", first + 1) != end or not chunk.startswith(b"data: {", first + 1):
            return None
        self._line_no += 3
        return [(chunk[first + 7 : end], self._line_no - 1)]

    def _fast(self, parts: list[bytes], out: list[SseLine]) -> None:
        """No line can be over the limit: whole events in bulk where the stream keeps one shape.

        The lines up to the first blank line may finish the previous chunk's event, so they
        go through the line loop; then `_events` takes the run of same-shaped events at C
        speed; whatever it leaves goes through the line loop again.
        """
        try:
            cut = parts.index(b"") + 1
        except ValueError:
            cut = len(parts)
        self._lines(parts[:cut] if cut < len(parts) else parts, out)
        if cut == len(parts) or self.done:
            return
        used = self._events(parts, cut, out)
        if cut + used < len(parts):
            self._lines(parts[cut + used :], out)

    def _events(self, parts: list[bytes], start: int, out: list[SseLine]) -> int:
        """Events in bulk from ``parts[start]`` on (an event boundary); the lines it took.

        It takes whole events only while every event has ONE shape — ``data: {…}`` then a
        blank line, or one payload-less line (``event: …``) before them — which is how vLLM
        and OpenAI write. The checks run over whole slices of lines at C speed (`any`, `min`
        and `max`, a `find` in the joined lines, exact because no line contains LF). Anything
        else (a comment, ``[DONE]``, a multi-line event) makes it take nothing, and the line
        loop handles the rest of the chunk.
        """
        head = parts[start]
        if head.startswith(b"data: {"):
            size = 2
        elif head and not head.startswith(b"data:"):
            size = 3
        else:
            return 0
        count = (len(parts) - start) // size
        if count < 2:
            return 0
        end = start + count * size
        if any(parts[start + size - 1 : end : size]):
            return 0  # a line where a blank line should be
        datas = parts[start + size - 2 : end : size]
        # every data line starts with b"data: {" <=> all sort in [b"data: {", b"data: |")
        if min(datas) < b"data: {" or max(datas) >= b"data: |":
            return 0
        if size == 3:
            others = parts[start:end:3]
            # the head is known not to be a data line; no line contains LF, so a "\ndata:"
            # in the joined lines is a data line where a payload-less line should be
            if b"\n".join(others).find(b"\ndata:") != -1 or others.count(b""):
                return 0
        first = self._line_no + size - 1  # the line number of the first data line
        out.extend(zip(map(_PAYLOAD, datas), range(first, first + count * size, size), strict=True))
        self._line_no += count * size
        return count * size

    def _lines(self, parts: list[bytes], out: list[SseLine]) -> None:
        """The line loop; JSON ``data:`` lines take no detour.

        The pending event lives in locals (its first data line, and a list only when it has
        more than one); it goes back to ``self._data`` when the loop ends or leaves.
        """
        data = self._data
        first: bytes | None = data[0] if data else None
        more: list[bytes] | None = data[1:] if len(data) > 1 else None
        first_line = self._data_line
        start = self._line_no
        append = out.append
        for line_no, raw in enumerate(parts, start + 1):
            if not raw:
                if first is not None:
                    append((first if more is None else b"\n".join([first, *more]), first_line))
                    first = more = None
            elif raw[0] == 100:  # ord("d"): maybe a data line
                if raw.startswith(b"data: {"):  # a JSON object: neither blank nor [DONE]
                    if first is None:
                        first, first_line = raw[6:], line_no
                    elif more is None:
                        more = [raw[6:]]
                    else:
                        more.append(raw[6:])
                elif raw.startswith(b"data:"):
                    self._data = [] if first is None else [first, *(more or ())]
                    self._data_line, self._line_no = first_line, line_no - 1
                    self._line(raw, out)
                    if self.done:
                        return
                    data = self._data
                    first = data[0] if data else None
                    more = data[1:] if len(data) > 1 else None
                    first_line = self._data_line
        self._data = [] if first is None else [first, *(more or ())]
        self._data_line = first_line
        self._line_no = start + len(parts)

    def flush(self) -> list[SseLine]:
        """End of input: dispatch the unterminated last line and any pending event."""
        if self._error is not None:
            raise self._error
        out: list[SseLine] = []
        if self.done:
            return out
        if self._tail:
            tail, self._tail = self._tail, b""
            self._line(tail, out)
        if self._error is not None:
            raise self._error
        if not self.done:
            self._dispatch(out)
        self.done = True
        return out

    def _too_long(self, line: int) -> FramingError:
        return FramingError(
            f"upstream SSE line exceeded {self._max} bytes; raise max_line_bytes if this is expected",
            code="line_too_long",
            stage="split",
            line=line,
        )

    def _line(self, raw: bytes, out: list[SseLine]) -> None:
        self._line_no += 1
        if len(raw) > self._max:
            self._error = self._too_long(self._line_no)
            return
        if not raw:
            self._dispatch(out)
            return
        if raw[:5] != b"data:":
            return  # comment, event:, id:, retry:, unknown field: no payload
        value = raw[6:] if raw[5:6] == b" " else raw[5:]
        stripped = value.strip()
        if not stripped:
            return
        if stripped == _DONE:
            self._dispatch(out)
            self.done = True
            return
        if not self._data:
            self._data_line = self._line_no
        self._data.append(value)

    def _dispatch(self, out: list[SseLine]) -> None:
        data = self._data
        if not data:
            return
        out.append((data[0] if len(data) == 1 else b"\n".join(data), self._data_line))
        data.clear()
