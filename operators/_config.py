"""Limits: every bound respflow enforces, in one validated, immutable value."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Limits(BaseModel):
    """Configurable bounds. Each has a safe default; every one can be raised."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_line_bytes: int = Field(default=1 << 20, gt=0)
    """Longest upstream SSE line (split)."""
    max_event_bytes: int = Field(default=1 << 20, gt=0)
    """Largest single client-bound frame, serialized (relay)."""
    max_retained_bytes: int = Field(default=8 << 20, gt=0)
    """Bytes of deltas and items one response may retain (fold)."""
    max_deferred_entries: int = Field(default=1024, gt=0)
    """Frames the relay's defer window may hold."""
    max_deferred_bytes: int = Field(default=256 << 10, gt=0)
    """Serialized bytes the relay's defer window may hold."""
    max_pending_unnamed_bytes: int = Field(default=256 << 10, gt=0)
    """Bytes buffered for tool calls that have no name yet (translate)."""
    max_argument_bytes: int = Field(default=256 << 10, gt=0)
    """Argument bytes of one custom tool call (translate)."""
    read_timeout: float = Field(default=30.0, ge=0)
    """Seconds one upstream read may take; 0 disables. Time parked on backpressure never counts."""
