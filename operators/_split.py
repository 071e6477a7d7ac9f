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
* UTF-8 is decoded per complete line, so a character split across chunks survives. A line
  that is not UTF-8 makes the event it belongs to *invalid*: it is still emitted, flagged, so
  the validate stage (the one place the policy lives) rejects it (strict) or counts and skips
  it (lenient).
* At end of input, an unterminated last line and a pending event are still dispatched.

State: the unterminated tail, whether the previous chunk ended in CR, the pending event's data
lines, the line counter. Raises `FramingError` for a line longer than ``max_line_bytes``.
The output is identical for every chunking of the same bytes.
"""

from __future__ import annotations

import re

from operators._errors import FramingError

_LINE_END = re.compile(rb"\r\n|\r|\n")
_DONE = "[DONE]"


class SseLine:
    """The data of one SSE event, as text, with the line it started on."""

    __slots__ = ("data", "invalid", "line")

    def __init__(self, data: str, line: int, invalid: bool = False) -> None:
        self.data = data
        self.line = line
        self.invalid = invalid

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, SseLine)
            and self.data == other.data
            and self.line == other.line
            and self.invalid == other.invalid
        )

    def __hash__(self) -> int:
        return hash((self.data, self.line, self.invalid))

    def __repr__(self) -> str:
        flag = ", invalid" if self.invalid else ""
        return f"SseLine(line={self.line}, {len(self.data)} chars{flag})"


class LineSplitter:
    """Split an SSE byte stream into data payloads at CR, LF or CRLF, across chunk boundaries."""

    __slots__ = (
        "_data",
        "_data_invalid",
        "_data_line",
        "_done",
        "_error",
        "_line_no",
        "_max",
        "_skip_lf",
        "_tail",
    )

    def __init__(self, *, max_line_bytes: int = 1 << 20) -> None:
        if max_line_bytes <= 0:
            raise ValueError("max_line_bytes must be positive")
        self._max = max_line_bytes
        self._tail = b""
        self._skip_lf = False
        self._line_no = 0
        self._data: list[str] = []
        self._data_line = 0
        self._data_invalid = False
        self._done = False
        self._error: FramingError | None = None

    @property
    def done(self) -> bool:
        """True once ``[DONE]`` was seen: the stream is over, stop reading."""
        return self._done

    @property
    def lines_read(self) -> int:
        """How many complete lines were read so far."""
        return self._line_no

    def feed(self, chunk: bytes) -> list[SseLine]:
        """Take the next chunk; return the events it completed.

        An error found after some events were completed is raised on the next call, so
        every event before the bad line is delivered first, whatever the chunking.
        """
        if self._error is not None:
            raise self._error
        if self._done or not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
                if not chunk:
                    return []
        buf = self._tail + chunk if self._tail else chunk
        if b"\r" in buf:
            parts = _LINE_END.split(buf)
            if buf[-1:] == b"\r":
                self._skip_lf = True
        else:
            parts = buf.split(b"\n")
        self._tail = parts.pop()
        out: list[SseLine] = []
        for raw in parts:
            self._line(raw, out)
            if self._done or self._error is not None:
                self._tail = b""
                break
        else:
            if len(self._tail) > self._max:
                self._error = self._too_long(self._line_no + 1)
                self._tail = b""
        if self._error is not None and not out:
            raise self._error
        return out

    def flush(self) -> list[SseLine]:
        """End of input: dispatch the unterminated last line and any pending event."""
        if self._error is not None:
            raise self._error
        out: list[SseLine] = []
        if self._done:
            return out
        if self._tail:
            tail, self._tail = self._tail, b""
            self._line(tail, out)
        if self._error is not None:
            raise self._error
        if not self._done:
            self._dispatch(out)
        self._done = True
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
        value_b = raw[6:] if raw[5:6] == b" " else raw[5:]
        try:
            value = value_b.decode("utf-8")
        except UnicodeDecodeError:
            if not self._data:
                self._data_line = self._line_no
            self._data_invalid = True
            self._data.append("")
            return
        if not value or value.isspace():
            return
        if value.strip() == _DONE:
            self._dispatch(out)
            self._done = True
            return
        if not self._data:
            self._data_line = self._line_no
        self._data.append(value)

    def _dispatch(self, out: list[SseLine]) -> None:
        data = self._data
        if not data:
            return
        text = data[0] if len(data) == 1 else "\n".join(data)
        out.append(SseLine(text, self._data_line, self._data_invalid))
        self._data = []
        self._data_invalid = False
