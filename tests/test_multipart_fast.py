"""The server's multipart answer (`multipart_messages`), and the client's fast split of it, which
gives what the `email` parser gives and hands anything it was not written for to that parser."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dirmq.errors import InvalidArgument
from dirmq.store import Message
from dirmq.store.message import DeadLetter
from dirmq.wire import framing
from dirmq.wire import messages as wire
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


def test_a_batch_answer_is_byte_for_byte_the_parts_it_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`multipart_messages` writes the usual part's head in one format string: the same bytes
    as `multipart_body` of `delivery_headers`, for that part and every other kind."""
    plain = replace(_message(2, b"body", {"Content-Type": "text/plain"}), group=None)
    dead = DeadLetter(reason="expired", source="q", receive_count=3, at_s=1700000000.5)
    kinds = [
        plain,
        replace(plain, headers={}, body=b""),
        replace(plain, headers={"X-Attr-Who": "caf\u00e9", "Content-Encoding": "gzip"}),
        _message(3, b"grouped", {}),
        replace(plain, priority=4),
        replace(plain, dead=dead),
        replace(plain, receipt=None, lease_deadline_s=None, state="ready"),
    ]
    monkeypatch.setattr(framing, "new_boundary", lambda: "dirmq-0123")
    _content_type, body = multipart_messages(kinds)
    parts = ((wire.delivery_headers(m), m.body) for m in kinds)
    assert body == framing.multipart_body("dirmq-0123", parts)
