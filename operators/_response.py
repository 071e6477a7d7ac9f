"""The final Response object (the shape of OpenAI's Response), built once by fold's finish()."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, JsonValue

from respflow.operators._items import OutputItem


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class InputTokensDetails(_Open):
    cached_tokens: int = 0


class OutputTokensDetails(_Open):
    reasoning_tokens: int = 0


class Usage(_Open):
    """Token usage; provider extras (vLLM per-turn counts) survive as extra fields."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    input_tokens_details: InputTokensDetails | None = None
    output_tokens_details: OutputTokensDetails | None = None


class ResponseError(_Open):
    code: str | None = None
    message: str = ""


class IncompleteDetails(_Open):
    reason: str | None = None


class Response(_Open):
    """The folded Response. ``output`` is sorted by ``output_index``."""

    id: str
    object: str = "response"
    created_at: int | float
    model: str
    status: str
    output: list[OutputItem]
    usage: Usage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    parallel_tool_calls: bool = True
    tool_choice: JsonValue = "auto"
    tools: list[JsonValue] = []

    def to_json(self) -> bytes:
        """The Response as compact JSON bytes (fields that were never set are left out)."""
        return orjson.dumps(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The Response as plain JSON-compatible data."""
        return self.model_dump(mode="json", exclude_unset=True)
