"""The incremental SSE parser: fields, line endings, and every split of the input."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from service.providers.sse import SSELimitExceeded, SSEParser, iter_sse

SAMPLE = (
    b": keep-alive\n\n"
    b'data: {"a": 1}\n\n'
    b"event: message\nid: 7\nretry: 1500\ndata: line one\ndata:line two\n\n"
    b"data: caf\xc3\xa9 \xe2\x9c\x93\r\n\r\n"
    b"data: cr\r\rdata: [DONE]\n\n"
)
EXPECTED = ['{"a": 1}', "line one\nline two", "café ✓", "cr", "[DONE]"]


def parse_all(*chunks: bytes) -> list[str]:
    parser = SSEParser()
    out: list[str] = []
    for chunk in chunks:
        out += parser.feed(chunk)
    return out + parser.flush()


def test_sample_in_one_piece() -> None:
    parser = SSEParser()
    assert parser.feed(SAMPLE) == EXPECTED
    assert parser.last_event_id == "7"
    assert parser.retry_ms == 1500
    assert parser.flush() == []


@pytest.mark.parametrize("cut", range(1, len(SAMPLE)))
def test_every_split_point(cut: int) -> None:
    assert parse_all(SAMPLE[:cut], SAMPLE[cut:]) == EXPECTED


def test_byte_by_byte() -> None:
    assert parse_all(*(SAMPLE[i : i + 1] for i in range(len(SAMPLE)))) == EXPECTED


def test_every_pair_of_split_points_on_crlf_stream() -> None:
    stream = b"data: a\r\n\r\ndata: b\r\ndata: c\r\n\r\n"
    for i in range(1, len(stream)):
        for j in range(i, len(stream)):
            assert parse_all(stream[:i], stream[i:j], stream[j:]) == ["a", "b\nc"], (i, j)


def test_chunks_of_whole_events_give_the_same_events_as_any_split() -> None:
    # Whole one-line `data: ` events per chunk (the usual provider chunk), mixed with
    # chunks that need the full parser: a pending event type, a multi-line event,
    # extra blank lines, a comment, an event split across two chunks.
    chunks = [
        b": open\n\n",
        b"data: one\n\n",
        b"data: two\n\ndata: three\n\n",
        b"event: note\n",
        b"data: four\n\n",
        b"data: five\ndata: six\n\n",
        b"data: seven\n\n\n\n",
        b"data:eight\n\n",
        b"data: ni",
        b"ne\n\n",
        b"data: ten\n\n",
    ]
    expected = ["one", "two", "three", "four", "five\nsix", "seven", "eight", "nine", "ten"]
    parser = SSEParser()
    got = [data for chunk in chunks for data in parser.feed(chunk)] + parser.flush()
    assert got == expected
    assert parser.event_type == ""
    stream = b"".join(chunks)
    assert parse_all(*(stream[i : i + 1] for i in range(len(stream)))) == expected
    assert parse_all(stream) == expected


def test_a_whole_event_chunk_over_a_limit_still_fails() -> None:
    parser = SSEParser(max_line_bytes=64, max_event_bytes=16)
    assert parser.feed(b"data: " + b"x" * 10 + b"\n\n") == ["x" * 10]
    assert parser.feed(b"data: " + b"y" * 17 + b"\n\n") == []
    assert isinstance(parser.error, SSELimitExceeded) and parser.error.limit == "event"


def test_crlf_split_across_reads_dispatches_without_waiting() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: x\r\n\r") == ["x"]  # the lone CR already ends the blank line
    assert parser.feed(b"\ndata: y\r") == []  # the LF of the CRLF is not a second blank line
    assert parser.feed(b"\n\r\n") == ["y"]


def test_cr_only_line_endings() -> None:
    assert parse_all(b"data: a\rdata: b\r\rdata: c\r\r") == ["a\nb", "c"]


def test_comments_and_unknown_fields_are_ignored() -> None:
    stream = b":ping\n: another\nfoo: bar\ndata: x\n:mid\n\n:\n\n"
    assert parse_all(stream) == ["x"]


def test_data_field_spacing() -> None:
    # Exactly one leading space is stripped; a line "data" without colon is an empty value.
    assert parse_all(b"data:  two\n\ndata:none\n\ndata\n\ndata:\ndata: x\n\n") == [
        " two",
        "none",
        "",
        "\nx",
    ]


def test_event_and_id_fields() -> None:
    parser = SSEParser()
    assert parser.feed(b"event: error\ndata: boom\n") == []
    assert parser.event_type == "error"
    assert parser.feed(b"\n") == ["boom"]
    assert parser.event_type == ""
    parser.feed(b"id: a\x00b\nretry: soon\n\n")
    assert parser.last_event_id == ""
    assert parser.retry_ms is None


def test_blank_line_without_data_dispatches_nothing() -> None:
    assert parse_all(b"\n\n\r\n: c\n\nevent: x\n\n") == []


def test_no_trailing_blank_line_is_flushed_at_end() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\n\ndata: [DONE]\n") == ["a"]
    assert parser.flush() == ["[DONE]"]
    parser = SSEParser()
    assert parser.feed(b"data: [DONE]") == []
    assert parser.flush() == ["[DONE]"]


def test_utf8_split_inside_a_character() -> None:
    data = "data: 你好\n\n".encode()
    for cut in range(1, len(data)):
        assert parse_all(data[:cut], data[cut:]) == ["你好"]


def test_bom_is_stripped_once() -> None:
    assert parse_all(b"\xef\xbb", b"\xbfdata: a\n\n") == ["a"]
    assert parse_all(b"\xef\xbb\xbfdata: a\n\n\xef\xbb\xbfdata: b\n\n") == ["a"]


def test_long_line_in_many_pieces() -> None:
    payload = b"x" * 100_000
    chunks = [b"data: "] + [payload[i : i + 7] for i in range(0, len(payload), 7)] + [b"\n\n"]
    assert parse_all(*chunks) == [payload.decode()]


async def test_iter_sse() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(SAMPLE), 5):
            yield SAMPLE[i : i + 5]

    assert [d async for d in iter_sse(chunks())] == EXPECTED


# -- size limits ------------------------------------------------------------------------


def test_a_line_of_exactly_the_limit_is_accepted_in_any_split() -> None:
    line = b"data: " + b"x" * 94  # 100 bytes
    for cut in range(1, len(line)):
        parser = SSEParser(max_line_bytes=100, max_event_bytes=100)
        assert parser.feed(line[:cut]) == []
        assert parser.feed(line[cut:] + b"\n\n") == ["x" * 94]
        assert parser.error is None


@pytest.mark.parametrize("cut", [0, 1, 50, 100, 101])
def test_a_line_over_the_limit_is_an_error_in_any_split(cut: int) -> None:
    line = b"data: " + b"x" * 95  # 101 bytes
    parser = SSEParser(max_line_bytes=100)
    assert parser.feed(line[:cut]) == []
    if parser.error is None:
        assert parser.feed(line[cut:] + b"\n\n") == []
    assert parser.error is not None
    assert (parser.error.limit, parser.error.max_bytes) == ("line", 100)
    assert str(parser.error) == "a line exceeded 100 bytes"
    with pytest.raises(SSELimitExceeded):
        parser.feed(b"data: more\n\n")
    with pytest.raises(SSELimitExceeded):
        parser.flush()


def test_an_unterminated_line_fails_as_soon_as_it_passes_the_limit() -> None:
    parser = SSEParser(max_line_bytes=1000)
    for _ in range(10):
        assert parser.feed(b"y" * 100) == []  # 1000 bytes held, no more
    assert parser.error is None
    assert parser.feed(b"y") == []
    assert parser.error is not None and parser.error.limit == "line"


def test_events_before_a_breach_are_returned() -> None:
    parser = SSEParser(max_line_bytes=10)
    assert parser.feed(b"data: a\n\n" + b"z" * 11) == ["a"]  # a long unterminated tail
    assert parser.error is not None
    parser = SSEParser(max_line_bytes=10)
    assert parser.feed(b"data: b\n\n" + b"z" * 11 + b"\ndata: c\n\n") == ["b"]  # a long line
    assert parser.error is not None


def test_event_data_limit_counts_the_joined_lines() -> None:
    # Three data lines of 4 bytes joined by LF: 14 bytes.
    stream = b"data: abcd\ndata: efgh\ndata: ijkl\n\n"
    parser = SSEParser(max_event_bytes=14)
    assert parser.feed(stream) == ["abcd\nefgh\nijkl"]
    assert parser.error is None
    parser = SSEParser(max_event_bytes=13)
    assert parser.feed(b"data: x\n\n" + stream) == ["x"]
    assert parser.error is not None
    assert (parser.error.limit, str(parser.error)) == (
        "event",
        "the data of an event exceeded 13 bytes",
    )


def test_the_event_size_starts_again_after_each_event() -> None:
    parser = SSEParser(max_event_bytes=9)
    stream = b"data: abcd\ndata: efgh\n\n" * 5 + b"data\n\n"
    assert parser.feed(stream) + parser.flush() == ["abcd\nefgh"] * 5 + [""]
    assert parser.error is None


async def test_iter_sse_raises_after_the_events_before_a_breach() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: a\n\ndata: " + b"x" * 20

    got: list[str] = []
    with pytest.raises(SSELimitExceeded):
        async for data in iter_sse(chunks(), max_line_bytes=16):
            got.append(data)
    assert got == ["a"]
