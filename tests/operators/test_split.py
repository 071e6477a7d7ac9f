"""split: literal bytes in, exact SseLines (or errors) out."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from respflow.operators import FramingError, LineSplitter, SseLine


def split_all(*chunks: bytes, max_line_bytes: int = 1 << 20) -> tuple[list[SseLine], bool]:
    s = LineSplitter(max_line_bytes=max_line_bytes)
    out: list[SseLine] = []
    for c in chunks:
        out += s.feed(c)
    done_before_eof = s.done
    out += s.flush()
    return out, done_before_eof


def datas(out: list[SseLine]) -> list[str]:
    return [line[0].decode() for line in out]


def test_data_with_and_without_space() -> None:
    out, _ = split_all(b"data:{\"a\":1}\n\ndata: {\"b\":2}\n\n")
    assert datas(out) == ['{"a":1}', '{"b":2}']
    assert [line[1] for line in out] == [1, 3]


def test_only_one_space_is_stripped_and_inner_whitespace_kept() -> None:
    out, _ = split_all(b"data:  {\"t\":\"  x  \"} \n\ndata:\t{}\n\n")
    assert datas(out) == [' {"t":"  x  "} ', "\t{}"]


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending(ending: bytes) -> None:
    body = ending.join([b"event: x", b"data: one", b"", b"data: two", b"", b""])
    out, _ = split_all(body)
    assert datas(out) == ["one", "two"]


def test_cr_and_lf_in_different_chunks_are_one_line_end() -> None:
    out, _ = split_all(b"data: one\r", b"\n\r", b"\ndata: two\r\n\r\n")
    assert datas(out) == ["one", "two"]
    assert [line[1] for line in out] == [1, 3]


def test_multiline_data_is_joined_with_newline() -> None:
    out, _ = split_all(b"data: {\"a\":\ndata: 1}\n\n")
    assert datas(out) == ['{"a":\n1}']


def test_fields_without_payload_are_ignored() -> None:
    body = (
        b": heartbeat\nevent: response.completed\nid: 7\nretry: 100\nData: x\n"
        b"database: y\n data: z\ndata:\ndata: \t\n\ndata: real\n\n"
    )
    out, _ = split_all(body)
    assert datas(out) == ["real"]


@pytest.mark.parametrize("done", [b"data:[DONE]", b"data: [DONE]", b"data: [DONE]\r", b"data:  [DONE] "])
def test_done_ends_the_stream_at_once(done: bytes) -> None:
    s = LineSplitter()
    out = s.feed(b"data: before\n\n" + done + b"\n\ndata: after\n\n")
    assert datas(out) == ["before"]
    assert s.done
    assert s.feed(b"data: later\n\n") == []
    assert s.flush() == []


def test_done_without_blank_line_still_dispatches_pending_data() -> None:
    out, done = split_all(b"data: pending\ndata: [DONE]\n")
    assert datas(out) == ["pending"]
    assert done


def test_multibyte_character_split_across_chunks() -> None:
    body = "data: {\"t\":\"héllo 😀\"}\n\n".encode()
    cut = body.index("😀".encode()) + 2
    out, _ = split_all(body[:cut], body[cut:])
    assert datas(out) == ['{"t":"héllo 😀"}']


def test_invalid_utf8_is_passed_on_as_bytes_for_the_policy_to_judge() -> None:
    out, _ = split_all(b"data: ok\n\ndata: \xff\xfe\n\ndata: fine\n\n")
    assert [line[0] for line in out] == [b"ok", b"\xff\xfe", b"fine"]
    assert out[1][1] == 3


def test_line_over_the_limit_is_an_error_after_earlier_lines() -> None:
    s = LineSplitter(max_line_bytes=16)
    out = s.feed(b"data: short\n\ndata: " + b"x" * 40 + b"\n\n")
    assert datas(out) == ["short"]
    with pytest.raises(FramingError) as info:
        s.feed(b"more")
    assert info.value.code == "line_too_long"
    assert info.value.line == 3


def test_unterminated_tail_over_the_limit_is_an_error() -> None:
    s = LineSplitter(max_line_bytes=16)
    with pytest.raises(FramingError) as info:
        s.feed(b"data: " + b"y" * 40)
    assert info.value.code == "line_too_long"
    assert "max_line_bytes" in info.value.message


def test_unterminated_last_line_and_pending_event_dispatch_at_eof() -> None:
    out, _ = split_all(b"data: a\n\ndata: b")
    assert datas(out) == ["a", "b"]


def test_bad_limit_is_refused_when_built() -> None:
    with pytest.raises(ValueError):
        LineSplitter(max_line_bytes=0)


# ---- the bulk path (whole same-shaped events at once) against the line loop --------------------

_PIECES = [
    b'data: {"a":1}\n\n',  # bare data events (vLLM)
    b'event: x\ndata: {"b":2}\n\n',  # event line + data (OpenAI)
    b": keep-alive\n\n",
    b'data: {"c":\n',  # a multi-line event, then its end
    b'data: 3}\n\n',
    b'id: 7\ndata: {"d":4}\n\n',
    b"data: not json\n\n",
    b"data:{}\n\n",
    b"\n",
    b"event: y\n",
    b'event: z\n\ndata: {"e":5}\n\n',
    b'data: {"f":6}\nevent: late\n\n',
    b'data: {"g":1}\ndata: {"h":2}\n\n',  # two JSON data lines in one event
    b'data: {"i":1}\nid: 1\n',  # repeated: one long event whose lines look like the two shapes
    b'event: q\ndata: {"j":1}\nid: 2\n',
    b"data: [DONE]\n\n",
]


def _one_byte_at_a_time(body: bytes) -> tuple[list[SseLine], bool]:
    """Only the line loop runs: no feed ever holds two whole events."""
    splitter = LineSplitter()
    out: list[SseLine] = []
    for i in range(len(body)):
        out += splitter.feed(body[i : i + 1])
    done_before_eof = splitter.done
    return out + splitter.flush(), done_before_eof


@settings(max_examples=300, deadline=None)
@given(
    runs=st.lists(st.tuples(st.integers(0, len(_PIECES) - 1), st.integers(1, 12)), max_size=8),
    ending=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    cut=st.integers(0, 1 << 12),
)
def test_bulk_events_equal_the_line_loop(runs: list[tuple[int, int]], ending: bytes, cut: int) -> None:
    # runs of one shape are what the bulk path takes; the other shapes interrupt them
    body = b"".join(_PIECES[which] * times for which, times in runs).replace(b"\n", ending)
    expected = _one_byte_at_a_time(body)
    point = cut % (len(body) + 1)
    assert split_all(body) == expected
    assert split_all(body[:point], body[point:]) == expected


def test_bulk_events_keep_their_line_numbers() -> None:
    body = b'event: a\ndata: {"n":1}\n\nevent: a\ndata: {"n":2}\n\nevent: a\ndata: {"n":3}\n\n'
    out, _ = split_all(body)
    assert out == [(b'{"n":1}', 2), (b'{"n":2}', 5), (b'{"n":3}', 8)]
    out, _ = split_all(b'data: {"n":1}\n\ndata: {"n":2}\n\ndata: {"n":3}\n\n')
    assert out == [(b'{"n":1}', 1), (b'{"n":2}', 3), (b'{"n":3}', 5)]


@settings(max_examples=200, deadline=None)
@given(
    runs=st.lists(st.tuples(st.integers(0, len(_PIECES) - 1), st.integers(1, 6)), max_size=6),
    cuts=st.lists(st.integers(0, 1 << 12), max_size=6),
)
def test_feed_all_of_a_batch_equals_feeding_its_chunks_one_by_one(runs: list[tuple[int, int]], cuts: list[int]) -> None:
    body = b"".join(_PIECES[which] * times for which, times in runs)
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    chunks = [body[a:b] for a, b in itertools.pairwise(points)]
    expected = _one_byte_at_a_time(body)[0]
    batched = LineSplitter()
    assert batched.feed_all(chunks) + batched.flush() == expected
    one = LineSplitter()  # a batch of one chunk: the per-read case
    assert one.feed_all([body]) + one.flush() == expected


def test_feed_all_error_carries_the_events_before_it() -> None:
    s = LineSplitter(max_line_bytes=16)
    with pytest.raises(FramingError) as info:
        s.feed_all([b"data: a\n\n", b"data: b\n\ndata: " + b"x" * 40 + b"\n\n", b"data: c\n\n"])
    assert info.value.code == "line_too_long"
    # "a" and "b" came first: they travel on the error, so the later stages still get them
    assert datas(info.value.partial) == ["a", "b"]
