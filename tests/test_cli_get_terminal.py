"""`dirmq get`: on a terminal the body ends with a newline, so the id on stderr does not run
into it; piped or redirected, the body's bytes are exact."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from .support.servers import REPO


def dirmq(root: Path, *args: str, **popen: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "dirmq", "--root", str(root), *args],
        cwd=REPO,
        **popen,  # type: ignore[call-overload]
    )


def put(root: Path, queue: str, body: bytes) -> None:
    proc = dirmq(root, "put", "--create", queue, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.communicate(body, timeout=60)
    assert proc.returncode == 0


def read_terminal(fd: int, proc: subprocess.Popen[bytes]) -> bytes:
    """All the process wrote to the terminal whose controller is `fd`, until it exits."""
    seen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        readable, _, _ = select.select([fd], [], [], 0.5)
        if readable:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the terminal's last writer closed it
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    return seen


def test_get_on_a_terminal_ends_the_body_with_a_newline(tmp_path: Path) -> None:
    root = tmp_path / "root"
    put(root, "jobs", b"hello")  # no final newline
    controller, terminal = pty.openpty()
    try:
        proc = dirmq(root, "get", "--ack", "jobs", stdout=terminal, stderr=terminal)
        os.close(terminal)
        terminal = -1
        seen = read_terminal(controller, proc)
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(controller)
        if terminal != -1:
            os.close(terminal)
    lines = seen.replace(b"\r\n", b"\n").split(b"\n")
    assert lines[0] == b"hello", seen
    assert lines[1].strip(), seen  # the message id, on a line of its own


def test_get_piped_keeps_the_body_exact(tmp_path: Path) -> None:
    root = tmp_path / "root"
    put(root, "jobs", b"hello")
    proc = dirmq(root, "get", "--ack", "jobs", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out == b"hello"
    assert err.strip()
