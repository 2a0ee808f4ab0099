"""dirmq under systemd: the unit in docs/operations.md passes `systemd-analyze verify`, stops
later than the server drains, and `Type=notify` works: READY=1 once the server listens,
STOPPING=1 at SIGTERM, from the main process only, on a real datagram socket (a path or an
abstract name); and the server serves under the kernel's MemoryDenyWriteExecute."""

from __future__ import annotations

import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dirmq.server.notify import notify
from dirmq.wire.durations import parse_duration

from .support.servers import REPO, sqs_client, start_server
from .test_docs import blocks

OPERATIONS = REPO / "docs" / "operations.md"


def _documented(language: str, file: str = "") -> str:
    """The ```language block of docs/operations.md (the one written to `file`)."""
    (block,) = [b for b in blocks(OPERATIONS) if b.lang == language and b.file == file]
    return block.text


def _unit() -> str:
    unit = _documented("ini")
    assert unit.startswith("# /etc/systemd/system/dirmq.service\n")
    return unit


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)
def test_the_documented_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    dirmq = Path(sys.executable).parent / "dirmq"  # the unit's /usr/local/bin/dirmq, here
    assert dirmq.is_file()
    unit = tmp_path / "dirmq.service"
    unit.write_text(_unit().replace("/usr/local/bin/dirmq", str(dirmq)))
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    # The check can fail: a misspelt key and a bad value are reported.
    unit.write_text(
        unit.read_text().replace("TimeoutStopSec=30", "TimeoutStopSec=soon\nProtectSytem=yes")
    )
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Failed to parse" in done.stderr and "Unknown key 'ProtectSytem'" in done.stderr


def test_the_unit_waits_longer_than_the_server_drains() -> None:
    """systemd's SIGKILL must come after `drain-timeout` and the pub/sub streams' close (5 s):
    TimeoutStopSec >= drain-timeout + 10 s for the documented configuration."""
    unit = _unit()
    (stop_after,) = re.findall(r"^TimeoutStopSec=(\d+)$", unit, re.M)
    settings = tomllib.loads(_documented("toml", "dirmq.toml"))
    drain_s = parse_duration(str(settings["drain-timeout"]))  # "10s", as the flag takes it
    assert int(stop_after) >= drain_s + 10
    assert "Type=notify" in unit and "KillMode=mixed" in unit
    assert re.search(r"^ExecStart=/usr/local/bin/dirmq serve --config (\S+)$", unit, re.M)


# -- readiness notices on a real socket ------------------------------------------------------
@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # each notice says its sender
    sock.settimeout(30)
    yield sock
    sock.close()


def _notice(sock: socket.socket) -> tuple[dict[str, str], int]:
    """The next notice: its KEY=value lines, and the pid that sent it."""
    data, ancillary, _flags, _address = sock.recvmsg(4096, socket.CMSG_SPACE(12))
    pid = 0
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid = struct.unpack("iII", payload[:12])[0]
    fields = dict(line.split("=", 1) for line in data.decode().splitlines())
    return fields, pid


@pytest.mark.parametrize("workers", [1, 2])
def test_ready_at_start_and_stopping_at_sigterm_from_the_main_process(
    tmp_path: Path, notify_socket: socket.socket, workers: int
) -> None:
    server = start_server(
        tmp_path / "root",
        "--workers",
        str(workers),
        env={"NOTIFY_SOCKET": notify_socket.getsockname()},
    )
    try:
        ready, sender = _notice(notify_socket)
        assert sender == server.proc.pid
        assert ready["READY"] == "1" and ready["MAINPID"] == str(server.proc.pid)
        assert ready["STATUS"] == f"serving native {server.url} ({workers} worker" + (
            "s)" if workers > 1 else ")"
        )
        # Ready means serving (a request sent now is answered, not refused).
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    finally:
        assert server.stop() == 0
    stopping, sender = _notice(notify_socket)
    assert stopping == {"STOPPING": "1", "STATUS": "draining"} and sender == server.proc.pid
    notify_socket.settimeout(0.2)
    with pytest.raises(TimeoutError):  # nothing from the workers, nothing twice
        _notice(notify_socket)


def test_a_stop_right_after_ready_still_drains_every_worker(
    tmp_path: Path, notify_socket: socket.socket
) -> None:
    """SIGTERM the moment READY=1 arrives, before the workers' event loops listen for it:
    each worker still starts, drains and exits 0 (before, one killed by the signal made the
    server exit 1)."""
    for attempt in range(3):
        server = start_server(
            tmp_path / "root",
            "--workers",
            "2",
            "--log-format",
            "json",
            env={"NOTIFY_SOCKET": notify_socket.getsockname()},
        )
        assert _notice(notify_socket)[0]["READY"] == "1"
        code = server.stop()
        if code != 0:  # the whole log: which worker got how far (a repr would be cut short)
            pytest.fail(f"attempt {attempt}: exit {code}; the server's log:\n{server.output}")
        assert _notice(notify_socket)[0]["STOPPING"] == "1"
        assert server.output.count('"message":"drained"') == 2, server.output


def test_an_abstract_socket_and_no_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"dirmq-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("READY=1", "STATUS=x y")
        assert sock.recv(4096) == b"READY=1\nSTATUS=x y"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not notify("READY=1")  # not under systemd: nothing to do, no error
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)  # gone now: logged, not raised
    assert not notify("READY=1")


# -- MemoryDenyWriteExecute ------------------------------------------------------------------
# prctl(PR_SET_MDWE = 65, PR_MDWE_REFUSE_EXEC_GAIN = 1): Linux 6.3+; then exec the server.
_UNDER_MDWE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(65, 1, 0, 0, 0) != 0:
    sys.exit(f"prctl(PR_SET_MDWE): {os.strerror(ctypes.get_errno())}")
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def _mdwe_supported() -> bool:
    """Whether this kernel refuses writable-and-executable memory on request (in a child, as
    the setting cannot be undone)."""
    code = (
        "import ctypes, mmap, sys\n"
        "if ctypes.CDLL(None).prctl(65, 1, 0, 0, 0) != 0: sys.exit(1)\n"
        "try: mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "except OSError: sys.exit(0)\n"
        "sys.exit(1)\n"
    )
    return subprocess.run([sys.executable, "-c", code], check=False, timeout=30).returncode == 0


def test_the_server_serves_under_memory_deny_write_execute(tmp_path: Path) -> None:
    """What systemd's MemoryDenyWriteExecute=yes enforces, done by the kernel's own switch
    (prctl PR_SET_MDWE, inherited across exec and fork): every door still works."""
    if not sys.platform.startswith("linux") or not _mdwe_supported():
        pytest.skip("this kernel has no PR_SET_MDWE (Linux 6.3+)")
    wrapper = tmp_path / "mdwe.py"
    wrapper.write_text(_UNDER_MDWE)
    server = start_server(tmp_path / "root", "--workers", "2", yaq=True, launcher=[str(wrapper)])
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.put("/q").status_code == 201
            assert http.post("/q/messages", content=b"hello").status_code == 201
            assert http.get("/q/messages").content == b"hello"
            assert http.get("/metrics").status_code == 200
        assert server.yaq_url is not None
        assert httpx.post(server.yaq_url + "/q", content=b"x", timeout=30).status_code < 300
        sqs = sqs_client(server.url)
        assert sqs.get_queue_url(QueueName="q")["QueueUrl"].endswith("/q")
    finally:
        assert server.stop() == 0
    assert "Traceback" not in server.output
