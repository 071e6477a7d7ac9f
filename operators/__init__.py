"""respflow's stages: pure, synchronous, incremental; their types and errors.

``split → normalize → validate → fold → translate``, each a small class with ``feed`` and
``flush`` (no I/O, no threads, no clocks), composed by `AgentPipeline`.
"""

from respflow.operators._config import Limits
from respflow.operators._errors import (
    FramingError,
    LimitExceededError,
    ProtocolError,
    RelayError,
    RequestError,
    RespflowError,
    TranslateError,
    UpstreamError,
)
from respflow.operators._fold import Folder, Slot
from respflow.operators._frames import Action, EventSpec, Frame, Validation
from respflow.operators._items import KINDS, KindSpec, OutputItem
from respflow.operators._normalize import Normalizer
from respflow.operators._pipeline import AgentPipeline, Translation
from respflow.operators._response import Response, Usage
from respflow.operators._rx import Operator, Stage, each, lift, pipe
from respflow.operators._split import LineSplitter, SseLine
from respflow.operators._tools import ToolKind, ToolRegistry, ToolRoute
from respflow.operators._translate import InputDecoder, Translator
from respflow.operators._validate import Validator

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
