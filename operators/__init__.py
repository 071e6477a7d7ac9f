"""respflow's stages: pure, synchronous, incremental; their types and errors.

``split → normalize → validate → fold → translate``, each a small class with ``feed`` and
``flush`` (no I/O, no threads, no clocks), composed by `AgentPipeline`.
"""

from operators._config import Limits
from operators._errors import (
    FramingError,
    LimitExceededError,
    ProtocolError,
    RelayError,
    RequestError,
    RespflowError,
    TranslateError,
    UpstreamError,
)
from operators._fold import Folder, Slot
from operators._frames import Action, EventSpec, Frame, Validation
from operators._items import KINDS, KindSpec, OutputItem
from operators._normalize import Normalizer
from operators._pipeline import AgentPipeline, Translation
from operators._response import Response, Usage
from operators._rx import Operator, Stage, each, lift, pipe
from operators._split import LineSplitter, SseLine
from operators._tools import ToolKind, ToolRegistry, ToolRoute
from operators._translate import InputDecoder, Translator
from operators._validate import Validator

__all__ = [
    "KINDS",
    "Action",
    "AgentPipeline",
    "EventSpec",
    "Folder",
    "Frame",
    "FramingError",
    "InputDecoder",
    "KindSpec",
    "LimitExceededError",
    "Limits",
    "LineSplitter",
    "Normalizer",
    "Operator",
    "OutputItem",
    "ProtocolError",
    "RelayError",
    "RequestError",
    "RespflowError",
    "Response",
    "Slot",
    "SseLine",
    "Stage",
    "ToolKind",
    "ToolRegistry",
    "ToolRoute",
    "TranslateError",
    "Translation",
    "Translator",
    "UpstreamError",
    "Usage",
    "Validation",
    "Validator",
    "each",
    "lift",
    "pipe",
]
