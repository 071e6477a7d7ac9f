"""split: literal bytes in, exact SseLines (or errors) out."""

from __future__ import annotations

import pytest

from operators import FramingError, LineSplitter, SseLine


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
