"""The `dirmq` command, run as a real process (`python -m dirmq`)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dirmq.cli import exits, main
from dirmq.store import layout

BINARY = bytes(range(256)) + b"\r\n\x00 tail without newline"


class Run:
    """`dirmq` against one root: run(args, stdin=b"") -> CompletedProcess (bytes)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(
        self, *args: str, stdin: bytes = b"", env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        command = [sys.executable, "-m", "dirmq", *args]
        if args and args[0] != "--version" and env is None:
            command[3:4] = [args[0], "--root", str(self.root)]
        return subprocess.run(
            command, input=stdin, capture_output=True, env=env, timeout=60, check=False
        )

    def ok(self, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        result = self(*args, stdin=stdin)
        assert result.returncode == 0, result.stderr.decode()
        return result


@pytest.fixture
def run(tmp_path: Path) -> Run:
    return Run(tmp_path / "root")


def one_error_line(result: subprocess.CompletedProcess[bytes]) -> str:
    """The stderr of a failed run: exactly one `dirmq: error:` line, no traceback."""
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("dirmq: error: ")
    return lines[0]


def test_put_then_get_is_byte_exact(run: Run) -> None:
    message_id = run.ok("put", "q", "--create", stdin=BINARY).stdout.decode().strip()
    got = run.ok("get", "q")
    assert got.stdout == BINARY
    receipt = got.stderr.decode().strip()
    assert receipt == f"{message_id}.1"
    run.ok("ack", "q", receipt)
    assert run("get", "q").returncode == exits.EMPTY


def test_get_ack_and_empty_queue(run: Run) -> None:
    run.ok("create", "q")
    empty = run("get", "q")
    assert empty.returncode == exits.EMPTY and empty.stdout == b""
    assert "empty" in one_error_line(empty)
    message_id = run.ok("put", "q", stdin=b"once").stdout.decode().strip()
    got = run.ok("get", "q", "--ack")
    assert (got.stdout, got.stderr.decode().strip()) == (b"once", message_id)
    assert run("get", "q", "--wait", "0.1").returncode == exits.EMPTY


def test_get_json_headers_and_binary_body(run: Run) -> None:
    run.ok(
        "put",
        "q",
        "--create",
        "--header",
        "X-Colour: blue",
        "--content-type",
        "text/plain",
        stdin=b"text body",
    )
    run.ok("put", "q", stdin=BINARY)
    first = json.loads(run.ok("get", "q", "--json", "--visibility", "60").stdout)
    assert first["headers"] == {"X-Colour": "blue", "Content-Type": "text/plain"}
    assert (first["body"], first["body_encoding"]) == ("text body", "utf-8")
    assert first["receive_count"] == 1 and first["receipt"] == f"{first['id']}.1"
    second = json.loads(run.ok("get", "q", "--json", "--ack").stdout)
    assert second["body_encoding"] == "base64"
    assert base64.b64decode(second["body"]) == BINARY


def test_unknown_queue_and_unknown_root(run: Run) -> None:
    missing_root = run("get", "q")
    assert missing_root.returncode == exits.NO_QUEUE
    assert "not a dirmq root" in one_error_line(missing_root)
    assert not run.root.exists(), "a read-only command must not create a root"
    run.ok("create", "other")
    for args in (("get", "q"), ("stats", "q"), ("rm", "q"), ("purge", "q")):
        result = run(*args)
        assert result.returncode == exits.NO_QUEUE, args
        assert "'q' does not exist" in one_error_line(result)
    put = run("put", "q", stdin=b"x")
    assert put.returncode == exits.NO_QUEUE


@pytest.mark.parametrize("name", ["../x", "/abs", "a//b", "@ready"])
def test_bad_queue_name_is_a_usage_error(run: Run, name: str) -> None:
    result = run("put", "--create", "--", name, stdin=b"x")
    assert result.returncode == exits.USAGE
    assert "queue name" in one_error_line(result)
    assert not run.root.exists()


def test_usage_errors(run: Run) -> None:
    for args in (
        (),
        ("frobnicate",),
        ("get",),
        ("get", "q", "--wait", "-1"),
        ("put", "q", "--header", "nocolon"),
    ):
        result = run(*args)
        assert result.returncode == exits.USAGE, args
        one_error_line(result)
    assert run("--version").stdout.decode().startswith("dirmq ")
    assert b"put" in run("--help").stdout


def test_stats_and_ls(run: Run) -> None:
    run.ok("create", "shop/orders")
    run.ok("create", "mail")
    for body in (b"a", b"b", b"c"):
        run.ok("put", "shop/orders", stdin=body)
    run.ok("put", "shop/orders", "--delay", "60", stdin=b"later")
    run.ok("get", "shop/orders")
    listing = run.ok("ls").stdout.decode().splitlines()
    assert listing[0].split() == ["QUEUE", "READY", "IN_FLIGHT", "DELAYED", "DEAD"]
    assert [line.split() for line in listing[1:]] == [
        ["mail", "0", "0", "0", "0"],
        ["shop/orders", "2", "1", "1", "0"],
    ]
    assert len(run.ok("ls", "shop").stdout.decode().splitlines()) == 2
    stats = json.loads(run.ok("stats", "shop/orders", "--json").stdout)
    assert stats["queue"] == "shop/orders"
    assert (stats["ready"], stats["in_flight"], stats["delayed"], stats["total"]) == (2, 1, 1, 4)
    text = run.ok("stats", "shop/orders").stdout.decode()
    assert "in_flight            1" in text
    every = json.loads(run.ok("stats", "--json").stdout)
    assert [s["queue"] for s in every] == ["mail", "shop/orders"]
    assert "shop/orders" in run.ok("stats").stdout.decode()


def test_nack_delete_and_peek(run: Run) -> None:
    first = run.ok("put", "q", "--create", stdin=b"first").stdout.decode().strip()
    second = run.ok("put", "q", stdin=b"second").stdout.decode().strip()
    receipt = run.ok("get", "q").stderr.decode().strip()
    run.ok("nack", "q", receipt)
    again = run.ok("get", "q", "--json")
    message = json.loads(again.stdout)
    assert (message["id"], message["receive_count"]) == (first, 2), "back in its FIFO place"
    stale = run("ack", "q", receipt)
    assert stale.returncode == exits.STALE
    assert "stale" in one_error_line(stale)
    run.ok("nack", "q", message["receipt"], "--delay", "60")

    assert run.ok("peek", "q", first).stdout == b"first"
    peeked = json.loads(run.ok("peek", "q", first, "--json").stdout)
    assert (peeked["state"], peeked["receipt"]) == ("delayed", None)
    browse = run.ok("peek", "q").stdout.decode().splitlines()
    assert browse[0].split()[:2] == ["ID", "RECEIVES"]
    assert [line.split()[0] for line in browse[1:]] == [second]
    assert browse[1].endswith("second")
    lines = run.ok("peek", "q", "--json", "--limit", "5").stdout.decode().splitlines()
    assert [json.loads(line)["id"] for line in lines] == [second]

    run.ok("delete", "q", first)
    gone = run("peek", "q", first)
    assert gone.returncode == exits.EMPTY
    assert run("delete", "q", first).returncode == exits.EMPTY
    bad = run("delete", "q", "not-an-id")
    assert bad.returncode == exits.USAGE
    one_error_line(bad)


def test_purge_sweep_and_rm(run: Run) -> None:
    run.ok("create", "q", "--visibility", "0")
    for i in range(5):
        run.ok("put", "q", stdin=b"%d" % i)
    run.ok("get", "q")  # its lease expires at once: the sweep requeues it
    sweep = run.ok("sweep", "q").stdout.decode()
    assert sweep.startswith("q: ") and "leases_requeued=" in sweep
    assert json.loads(run.ok("stats", "q", "--json").stdout)["ready"] == 5
    assert "q: " in run.ok("sweep").stdout.decode()
    assert run.ok("purge", "q").stdout.decode().strip() == "purged 5 message(s)"
    assert run("get", "q").returncode == exits.EMPTY
    run.ok("rm", "q")
    assert run("stats", "q").returncode == exits.NO_QUEUE


def test_create_and_configure_write_the_queue_config(run: Run) -> None:
    run.ok("create", "dlq")
    run.ok(
        "create",
        "q",
        "--visibility",
        "12.5",
        "--delay",
        "2",
        "--max-receives",
        "3",
        "--dead-letter",
        "dlq",
        "--capacity",
        "100",
        "--retention",
        "86400",
        "--max-bytes",
        "1024",
        "--durability",
        "writeback",
        "--peers",
        "4",
    )
    config_path = run.root / "q" / layout.CONFIG_FILE
    config = json.loads(config_path.read_text())
    assert (
        config
        | {
            "visibility_timeout_s": 12.5,
            "delay_s": 2.0,
            "max_receives": 3,
            "dead_letter_queue": "dlq",
            "capacity": 100,
            "retention_s": 86400.0,
            "max_message_bytes": 1024,
            "durability": "writeback",
            "peers": 4,
        }
        == config
    )
    exists = run("create", "q")
    assert exists.returncode == exits.USAGE and "exists" in one_error_line(exists)
    run.ok("create", "q", "--exist-ok")

    run.ok("configure", "q", "--capacity", "none", "--dead-letter", "none", "--delay", "0")
    config = json.loads(config_path.read_text())
    assert (config["capacity"], config["dead_letter_queue"], config["delay_s"]) == (None, None, 0)
    assert config["peers"] == 4, "settings not given are kept"
    assert json.loads(run.ok("configure", "q").stdout) == config
    invalid = run("configure", "q", "--writeback-delay", "0")
    assert invalid.returncode == exits.USAGE
    one_error_line(invalid)


def test_full_queue_times_out(run: Run) -> None:
    run.ok("create", "q", "--capacity", "1")
    run.ok("put", "q", stdin=b"fills it")
    full = run("put", "q", "--timeout", "0", stdin=b"one too many")
    assert full.returncode == exits.FULL
    assert "capacity" in one_error_line(full)


def test_default_root_comes_from_the_environment(run: Run, tmp_path: Path) -> None:
    env = {**os.environ, "DIRMQ_ROOT": str(tmp_path / "env-root")}
    result = run("put", "q", "--create", stdin=b"x", env=env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "env-root" / "q" / layout.CONFIG_FILE).exists()


def test_fsck(run: Run) -> None:
    run.ok("put", "q", "--create", stdin=b"healthy")
    healthy = run.ok("fsck")
    assert "0 problem(s)" in healthy.stdout.decode()
    assert json.loads(run.ok("fsck", "--json").stdout)["ok"] is True
    os.rmdir(run.root / "q" / layout.DELAYED)
    damaged = run("fsck")
    assert damaged.returncode == exits.FSCK_UNREPAIRED
    assert "PROBLEM" in damaged.stdout.decode() and "missing-dir" in damaged.stdout.decode()
    repaired = run.ok("fsck", "--repair")
    assert "repaired" in repaired.stdout.decode()
    run.ok("fsck")


def test_import_vsqs(run: Run, tmp_path: Path) -> None:
    source = tmp_path / "vsqs"
    source.mkdir()
    (source / "1716000000000000").write_bytes(b"first")
    (source / "1716000000100000").write_bytes(b"second")
    result = run.ok("import-vsqs", str(source), "imported", "--remove")
    assert "imported             2" in result.stdout.decode()
    assert run.ok("get", "imported", "--ack").stdout == b"first"
    assert os.listdir(source) == []


def test_main_in_process_returns_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path / "root")
    assert main(["create", "--root", root, "q"]) == exits.OK
    assert main(["stats", "--root", root, "nope"]) == exits.NO_QUEUE
    assert main(["get", "--root", root, "q"]) == exits.EMPTY
    assert main(["bogus"]) == exits.USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err
