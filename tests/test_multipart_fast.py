"""The client's fast split of a server's multipart answer gives what the `email` parser gives,
and hands anything it was not written for to that parser."""

from __future__ import annotations

import pytest

from dirmq.errors import InvalidArgument
from dirmq.store import Message
from dirmq.wire import framing
from dirmq.wire.messages import multipart_messages


def _message(n: int, body: bytes, headers: dict[str, str]) -> Message:
    return Message(
        id=f"0000000000000000{n:04d}-ab12cd34",
        body=body,
        headers=headers,
        receive_count=n,
        published_at_s=1700000000.25 + n,
        receipt=f"0000000000000000{n:04d}-ab12cd34.{n}",
        lease_deadline_s=1700000100.5,
        state="leased",
        group="g" if n % 2 else None,
    )


def test_fast_split_equals_the_email_parser_on_server_answers() -> None:
    messages = [
        _message(1, b"", {}),
        _message(2, b"line\r\n--not the boundary\r\n\r\nmore\r\n", {"Content-Type": "text/x"}),
        _message(3, bytes(range(256)) * 4, {"X-Attr-Who": "caf\u00e9 \u2603", "X-Attr-E": ""}),
        _message(4, b"\r\n", {"Content-Encoding": "gzip"}),
    ]
    content_type, body = multipart_messages(messages)
    fast = framing.parse_multipart_fast(content_type, body)
    slow = framing.parse_multipart(content_type, body)
    assert [b for _h, b in fast] == [m.body for m in messages]
    assert [b for _h, b in fast] == [b for _h, b in slow]
    assert fast[2][0]["X-Attr-Who"] == "caf\u00e9 \u2603"  # UTF-8, as the server wrote it
    assert fast[1][0]["Content-Type"] == "text/x"
    assert fast[3][0]["X-Receipt"] == messages[3].receipt
    assert [list(h) for h, _b in fast] == [list(h) for h, _b in slow]


def test_what_it_was_not_written_for_goes_to_the_email_parser() -> None:
    boundary = "b1"
    encoded = (
        b"preamble\r\n--b1\r\nContent-Transfer-Encoding: base64\r\nX-Message-Id: a\r\n\r\n"
        b"aGVsbG8=\r\n--b1--\r\n"
    )
    parts = framing.parse_multipart_fast(f'multipart/mixed; boundary="{boundary}"', encoded)
    assert parts == [({"X-Message-Id": "a"}, b"hello")]
    with pytest.raises(InvalidArgument):
        framing.parse_multipart_fast("multipart/mixed", b"--x\r\n\r\nbody\r\n--x--\r\n")
