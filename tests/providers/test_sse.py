"""The incremental SSE parser: fields, line endings, and every split of the input."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from service.providers.sse import SSEParser, iter_sse

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
