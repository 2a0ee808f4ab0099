"""The stream's incoming WebSocket frames, cut apart: deliveries read here, the rest by wsproto.

A streaming consumer receives one binary message per delivery, each an unfragmented frame the
server sends unmasked (`server/websocket.py` builds them so). Taking every one through wsproto's
frame parser cost the client about half its CPU a message (a profile of 8 consumers draining
100,000 messages: `parse_header`, `process_buffer` and `events` 0.92 s of 1.8 s). So the splitter
reads the frame header itself (RFC 6455 §5.2: 2-14 bytes) and hands out such a frame's payload
directly. Every other frame, and anything unusual (a text report, ping, close, a fragment or a
continuation, reserved bits, a mask, a length not in its shortest form), goes to wsproto whole,
one frame at a time, so wsproto's buffer is empty between frames and it judges that frame
exactly as if it had parsed every byte of the stream: what it refuses, it still refuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

BINARY_FINAL = 0x82  # FIN set, no reserved bits, opcode 2 (binary)
_CONTINUATION, _TEXT, _BINARY, _CLOSE = 0x0, 0x1, 0x2, 0x8
_OPCODES = frozenset({_CONTINUATION, _TEXT, _BINARY, _CLOSE, 0x9, 0xA})  # 0x9 ping, 0xA pong
_MASKED = 0x80


class _Receiver(Protocol):
    """What the splitter needs of wsproto's `WSConnection` (or `Connection`)."""

    def receive_data(self, data: bytes | None) -> None: ...


class FrameSplitter:
    """Cuts the bytes a stream's socket brings into frames (any split: a frame may arrive over
    several reads, several frames in one). `feed` yields a delivery's payload (bytes) for each
    plain binary frame, and None after passing anything else to `ws`, whose events the caller
    then takes: the order of the stream is kept."""

    __slots__ = ("_buffer", "_fragmented", "raw", "ws")

    def __init__(self, ws: _Receiver) -> None:
        self.ws = ws
        self._buffer = bytearray()
        self._fragmented = False  # a fragmented message is under way: its frames are wsproto's
        self.raw = False  # every byte is wsproto's (it refused a header, or the handshake)

    def feed(self, data: bytes) -> Iterator[bytes | None]:
        if self.raw:
            self.ws.receive_data(data)
            yield None
            return
        buffer = self._buffer
        buffer += data
        while len(buffer) >= 2:
            frame = self._next(buffer)
            if frame is None:
                return  # the rest of the frame is still to come
            start, end = frame
            if start < 0:  # refused by its header alone: wsproto says how
                self.raw = True
                rest = bytes(buffer)
                buffer.clear()
                self.ws.receive_data(rest)
                yield None
                return
            first = buffer[0]
            if first == BINARY_FINAL and not self._fragmented:
                payload = bytes(buffer[start:end])
                del buffer[:end]
                yield payload
                continue
            self._track(first)
            whole = bytes(buffer[:end])
            del buffer[:end]
            self.ws.receive_data(whole)
            yield None

    @staticmethod
    def _next(buffer: bytearray) -> tuple[int, int] | None:
        """(payload start, frame end) of the frame at the head of `buffer`; None if it is not
        all there yet; a negative start if its header is one wsproto refuses at once (reserved
        bits or opcode, a control frame fragmented or over 125 bytes, masked by the server, a
        length not in its shortest form): no frame is awaited on a header that is refused."""
        size = len(buffer)
        first, second = buffer[0], buffer[1]
        length = second & 0x7F
        opcode = first & 0x0F
        if first & 0x70 or opcode not in _OPCODES:
            return -1, 0
        if opcode >= _CLOSE and (length > 125 or not first & 0x80):
            return -1, 0
        start = 2
        if length == 126:
            if size < 4:
                return None
            length = int.from_bytes(buffer[2:4], "big")
            start = 4
            if length < 126:
                return -1, 0
        elif length == 127:
            if size < 10:
                return None
            length = int.from_bytes(buffer[2:10], "big")
            start = 10
            if not 0xFFFF < length < 1 << 63:
                return -1, 0
        if second & _MASKED:
            return -1, 0
        end = start + length
        return (start, end) if end <= size else None

    def _track(self, first: int) -> None:
        """Whether a fragmented message is under way after this frame (control frames may come
        between its fragments and change nothing)."""
        opcode = first & 0x0F
        final = bool(first & 0x80)
        if opcode in (_TEXT, _BINARY):
            self._fragmented = not final
        elif opcode == _CONTINUATION and final:
            self._fragmented = False
