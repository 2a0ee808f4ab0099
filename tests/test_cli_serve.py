"""`dirmq serve` refusing what it cannot listen on, as a real process: a busy or foreign
address is named with the OS's reason (exit 11) before the root is created; a malformed
`--listen`, `--yaq-listen` or `--sqs-listen` is a usage error (exit 2) that says what is wrong."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dirmq.cli import exits
from dirmq.server.addresses import parse_address

LISTEN_FLAGS = ["--listen", "--yaq-listen", "--sqs-listen"]


def _serve(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "dirmq", "serve", "--root", str(root), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def _error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dirmq: error: "), lines
    return lines[0]


def _with_flag(flag: str, address: str) -> list[str]:
    """`flag address`; the native API on a free port when `flag` is another one."""
    return [flag, address] if flag == "--listen" else ["--listen", "127.0.0.1:0", flag, address]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port on 127.0.0.1 that another socket listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize("flag", LISTEN_FLAGS)
def test_a_busy_port_is_named_and_nothing_is_created(
    tmp_path: Path, busy_port: int, flag: str
) -> None:
    root = tmp_path / "root"
    address = f"127.0.0.1:{busy_port}"
    result = _serve(root, *_with_flag(flag, address))
    assert result.returncode == exits.CANNOT_LISTEN
    line = _error_line(result)
    api = {"--listen": "native", "--yaq-listen": "yaq", "--sqs-listen": "sqs"}[flag]
    assert f"cannot listen on {address} ({api} API)" in line
    assert "Address already in use" in line
    assert not root.exists()


def test_an_address_of_another_host_is_refused_with_the_reason(tmp_path: Path) -> None:
    # TEST-NET-1: not ours (--allow-anonymous: past protected mode, to the bind itself)
    result = _serve(tmp_path / "root", "--listen", "192.0.2.1:0", "--allow-anonymous")
    assert result.returncode == exits.CANNOT_LISTEN
    assert "cannot listen on 192.0.2.1:0 (native API): Cannot assign requested address" in (
        _error_line(result)
    )
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("flag", LISTEN_FLAGS)
@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("127.0.0.1:99999", "port 99999 is out of range (1-65535, or 0 for any free port)"),
        ("127.0.0.1:http", "port 'http' is not a number"),
        ("8080", "must be HOST:PORT"),
        ("127.0.0.1:", "must be HOST:PORT"),
        ("300.1.1.1:80", "'300.1.1.1' is not an IP address or a host name"),
        ("bad_host!:80", "'bad_host!' is not an IP address or a host name"),
        ("[not-v6]:80", "[not-v6] is not an IPv6 address"),
    ],
)
def test_a_malformed_address_is_a_usage_error_saying_what_is_wrong(
    tmp_path: Path, flag: str, address: str, says: str
) -> None:
    result = _serve(tmp_path / "root", *_with_flag(flag, address))
    assert result.returncode == exits.USAGE
    line = _error_line(result)
    assert f"error: {flag}: listen address {address!r}" in line and says in line
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize(
    ("address", "parsed"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        (":1337", ("0.0.0.0", 1337)),
        ("[::1]:0", ("::1", 0)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_good_addresses_parse(address: str, parsed: tuple[str, int]) -> None:
    assert parse_address(address) == parsed
