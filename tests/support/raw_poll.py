"""A long poll on a socket of its own, sent at once, whose answer is read later (or whose client
hangs up instead): a test can act while the server holds it."""

from __future__ import annotations

import socket

import httpx


class RawPoll:
    """`GET path` sent now (the request is in the server's hands when this returns)."""

    def __init__(self, url: str, path: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self._sock = socket.create_connection((host, int(port)), timeout=30)
        self._sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())

    def answer(self) -> httpx.Response:
        """The server's answer, once it has sent it and closed the connection."""
        data = b""
        with self._sock:
            while chunk := self._sock.recv(65536):
                data += chunk
        if not data:
            raise ConnectionError("the server closed the connection without an answer")
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines)
        return httpx.Response(int(status_line.split()[1]), headers=headers, content=body)

    def hang_up(self) -> None:
        """The client goes away without reading the answer."""
        self._sock.close()
