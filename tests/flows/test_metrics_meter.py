"""`StreamMeter`: for any batching of a stream, its counts say what was sent."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from respflow.flows.gateway._metrics import GAP_BUCKETS, Metrics, StreamMeter
from respflow.sinks import keepalive, sse_frame


def _batch(kinds: list[str]) -> bytes:
    return b"".join(sse_frame({"type": kind, "sequence_number": i}) for i, kind in enumerate(kinds))


kinds = st.sampled_from(["response.created", "response.output_text.delta", "response.function_call_arguments.delta", "response.output_item.done"])


@given(st.lists(st.one_of(st.lists(kinds, min_size=1, max_size=6), st.just([])), max_size=30))
def test_counts_match_what_was_sent(batches: list[list[str]]) -> None:
    meter = StreamMeter(time.monotonic())
    for batch in batches:
        meter.record(_batch(batch) if batch else keepalive())  # an empty one: a keep-alive comment
    events = sum(len(b) for b in batches)
    assert meter.events == events
    assert meter.gaps == max(0, events - 1) == sum(meter.counts)  # one gap fewer than events
    assert len(meter.counts) == len(GAP_BUCKETS) + 1
    flat = [kind for batch in batches for kind in batch]
    first_token = next((i for i, k in enumerate(flat) if k.endswith(".delta")), None)
    assert (meter.first_token is None) == (first_token is None)
    assert (meter.first_event is None) == (events == 0)
    metrics = Metrics()
    metrics.stream_ended(meter)
    assert metrics.events._value.get() == events  # the counter got them in one step
    assert sum(b.get() for b in metrics.inter_event._buckets) == meter.gaps
