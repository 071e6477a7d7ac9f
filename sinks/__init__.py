"""Where frames go: the relay (the one emit funnel to a client, and `relayed`, its aiostream
operator), and simple sinks."""

from respflow.sinks._basic import CallbackSink, ChannelSink, CollectSink, NullSink, StreamSink
from respflow.sinks._relay import Relay, Sink, defer_order, keepalive, relayed, sse_frame

__all__ = [
    "CallbackSink",
    "ChannelSink",
    "CollectSink",
    "NullSink",
    "Relay",
    "Sink",
    "StreamSink",
    "defer_order",
    "keepalive",
    "relayed",
    "sse_frame",
]
