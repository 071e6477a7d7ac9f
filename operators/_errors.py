"""The one exception tree of respflow.

Every error carries a stable ``code`` (safe to match on), the ``stage`` that raised it, the
position it refers to (``line`` in the upstream stream, ``output_index``) and a message that
says what to do. Messages never echo secrets or whole payloads: at most a short, truncated
excerpt of the offending input.

    RespflowError
    ├── FramingError          bytes → lines: invalid UTF-8, over-long line
    ├── ProtocolError         a rule of the Responses stream protocol was broken
    ├── UpstreamError         the upstream: HTTP status, disconnect, timeout
    ├── LimitExceededError    a configured bound was reached (bytes, entries)
    ├── TranslateError        a tool call could not be given back its public shape
    ├── RelayError            the client side: send failed, client stalled
    └── RequestError          the client's request to the gateway is malformed (HTTP 400/413)
"""

from __future__ import annotations

from typing import Any

_EXCERPT = 80


def excerpt(value: str | bytes, limit: int = _EXCERPT) -> str:
    """A short, printable excerpt of untrusted input for an error message."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = value if len(value) <= limit else value[:limit] + "…"
    return repr(text)


class RespflowError(Exception):
    """Base class of every error respflow raises on purpose."""

    code: str = "respflow_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        stage: str | None = None,
        line: int | None = None,
        output_index: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.stage = stage
        self.line = line
        self.output_index = output_index
        self.partial: list[Any] = []
        """Frames produced in the same batch before this error, to deliver before it."""

    def at(self, *, line: int | None = None, stage: str | None = None) -> RespflowError:
        """Fill in the position and stage if they are not known yet; returns self."""
        if self.line is None and line is not None:
            self.line = line
        if self.stage is None and stage is not None:
            self.stage = stage
        return self

    def describe(self) -> str:
        """``error[<code>]: <message> (line N)`` — the one-line form the CLI prints."""
        where = f" (line {self.line})" if self.line is not None else ""
        return f"error[{self.code}]: {self.message}{where}"

    def __str__(self) -> str:
        return self.describe()


class FramingError(RespflowError):
    """The bytes could not be split into SSE lines (invalid UTF-8, a line over the limit)."""

    code = "framing"


class ProtocolError(RespflowError):
    """The stream broke a rule of the Responses streaming protocol."""

    code = "protocol"


class UpstreamError(RespflowError):
    """The upstream failed: an HTTP error status, a dropped connection or a timeout."""

    code = "upstream"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        body_excerpt: str | None = None,
        stage: str | None = None,
    ) -> None:
        super().__init__(message, code=code, stage=stage)
        self.status = status
        self.body_excerpt = body_excerpt


class LimitExceededError(RespflowError):
    """A configured bound (bytes, entries, rounds) was reached."""

    code = "limit_exceeded"


class TranslateError(RespflowError):
    """A tool call could not be restored to its public shape."""

    code = "translate"


class RelayError(RespflowError):
    """Delivery to the client failed: the send was rejected, or the client stalled."""

    code = "relay"


class RequestError(RespflowError):
    """The client's request is malformed: the gateway answers 400 (or 413 for a body too big)."""

    code = "invalid_request"

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message, code=code, stage="gateway")
        self.status = status
        self.param = param
