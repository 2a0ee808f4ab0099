"""`dirmq publish` and `dirmq subscribe`, run as the real console script in subprocesses."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dirmq.cli import exits

from .test_cli import BINARY, one_error_line

_SCRIPT = Path(sys.executable).parent / "dirmq"
DIRMQ = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "dirmq"]


class PubSubRun:
    """`dirmq` against one root, in the foreground (`__call__`) or the background (`start`)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def command(self, *args: str) -> list[str]:
        return [*DIRMQ, args[0], "--root", str(self.root), *args[1:]]

    def __call__(
        self, *args: str, stdin: bytes = b"", timeout_s: float = 60
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            self.command(*args), input=stdin, capture_output=True, timeout=timeout_s, check=False
        )

    def ok(self, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        result = self(*args, stdin=stdin)
        assert result.returncode == 0, result.stderr.decode()
        return result

    def publish(self, channel: str, body: bytes, *options: str) -> str:
        return self.ok("publish", channel, *options, stdin=body).stdout.decode().strip()

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait_attached(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        """Until subscription `name` is attached (its presence file exists)."""
        present = self.root / "@pubsub" / "present" / name
        deadline = time.monotonic() + 30
        while not present.exists():
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, f"{name} did not attach"
            time.sleep(0.02)

    def outcomes(self, queue: str = "out") -> list[tuple[str, str]]:
        """(message id, outcome) of every report waiting in `queue`, oldest first."""
        found: list[tuple[str, str]] = []
        while True:
            got = self("get", queue, "--ack")
            if got.returncode == exits.EMPTY:
                return found
            assert got.returncode == 0, got.stderr.decode()
            report = json.loads(got.stdout)
            found.append((report["id"], report["outcome"]))


@pytest.fixture
def ps(tmp_path: Path) -> PubSubRun:
    return PubSubRun(tmp_path / "root")


def finish(proc: subprocess.Popen[bytes], timeout_s: float = 30) -> tuple[int, bytes, bytes]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running after {timeout_s}s: {err.decode()}") from None
    return proc.returncode, out, err


def json_lines(data: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in data.splitlines()]


# -- the three modes -----------------------------------------------------------------------------
def test_anyone_round_trip_is_byte_exact(ps: PubSubRun) -> None:
    message_id = ps.publish("orders", BINARY, "--subject", "eu.new", "--header", "X-Tenant: 7")
    got = json_lines(ps.ok("subscribe", "--count", "1", "--wait", "5", "--json").stdout)
    assert len(got) == 1
    message = got[0]
    assert message["id"] == message_id
    assert (message["channel"], message["subject"]) == ("orders", "eu.new")
    assert (message["mode"], message["seq"], message["headers"]) == (
        "anyone",
        None,
        {"X-Tenant": "7"},
    )
    assert message["body_encoding"] == "base64"
    assert base64.b64decode(str(message["body"])) == BINARY
    # Reported done: nobody gets it again.
    assert ps("subscribe", "--wait", "0.2").returncode == exits.EMPTY


def test_anyone_goes_to_exactly_one_subscriber(ps: PubSubRun) -> None:
    ps.publish("jobs", b"one job")
    first = ps.ok("subscribe", "--count", "1", "--wait", "5")
    assert first.stdout == b"one job\n"
    second = ps("subscribe", "--wait", "0.3")
    assert second.returncode == exits.EMPTY and second.stdout == b""
    assert "no message within 0.3s" in one_error_line(second)


def test_everyone_reaches_every_attached_subscriber(ps: PubSubRun) -> None:
    subs = {name: ps.start("subscribe", "--name", name, "--count", "1") for name in ("a", "b")}
    for name, proc in subs.items():
        ps.wait_attached(name, proc)
    message_id = ps.publish("news", b"to all", "--mode", "everyone", "--content-type", "text/x")
    for proc in subs.values():
        code, out, err = finish(proc)
        assert (code, out) == (0, b"to all\n"), err.decode()
    # A subscription attached after the publish does not get it.
    late = ps("subscribe", "--name", "late", "--wait", "0.3")
    assert late.returncode == exits.EMPTY
    assert message_id


def test_everyone_without_subscribers_warns(ps: PubSubRun) -> None:
    result = ps.ok("publish", "news", "--mode", "everyone", "--body", "lost")
    assert "no attached subscriber matched" in result.stderr.decode()


def test_future_is_retained_and_replayable(ps: PubSubRun) -> None:
    printed = [ps.publish("log", f"entry {n}".encode(), "--mode", "future") for n in (1, 2, 3)]
    ids, seqs = zip(*(line.split() for line in printed), strict=True)
    assert seqs == ("1", "2", "3")
    everything = json_lines(ps.ok("subscribe", "--name", "r", "--json", "--wait", "0.5").stdout)
    assert [m["seq"] for m in everything] == [1, 2, 3]
    assert [m["id"] for m in everything] == list(ids)
    assert all(m["mode"] == "future" for m in everything)
    # The named subscription's cursor moved on; --from replays from a sequence number.
    assert ps("subscribe", "--name", "r", "--wait", "0.2").returncode == exits.EMPTY
    again = ps.ok("subscribe", "--name", "r", "--from", "2", "--wait", "0.5")
    assert again.stdout == b"entry 2\nentry 3\n"


# -- filters, --count and --wait -----------------------------------------------------------------
def test_channel_and_subject_filters(ps: PubSubRun) -> None:
    ps.publish("orders", b"eu order", "--subject", "eu.new")
    ps.publish("orders", b"us order", "--subject", "us.new")
    ps.publish("billing", b"eu bill", "--subject", "eu.paid")
    ps.publish("orders-archive", b"old eu order", "--subject", "eu.old")
    got = ps.ok("subscribe", "--channel", "orders", "--subject", "eu.", "--wait", "0.5", "--json")
    assert [m["body"] for m in json_lines(got.stdout)] == ["eu order", "old eu order"]
    rest = ps.ok("subscribe", "--subject", "us.", "--subject", "eu.p", "--wait", "0.5")
    assert rest.stdout == b"us order\neu bill\n"


def test_count_stops_early_and_leaves_the_rest(ps: PubSubRun) -> None:
    for n in range(3):
        ps.publish("q", f"m{n}".encode())
    assert ps.ok("subscribe", "--count", "2").stdout == b"m0\nm1\n"
    assert ps.ok("subscribe", "--count", "5", "--wait", "0.3").stdout == b"m2\n"


def test_wait_is_an_idle_timeout(ps: PubSubRun) -> None:
    started = time.monotonic()
    result = ps("subscribe", "--wait", "500ms")
    elapsed = time.monotonic() - started
    assert result.returncode == exits.EMPTY
    assert 0.5 <= elapsed < 10
    assert list((ps.root / "@pubsub" / "subs").iterdir()) == []  # the anonymous one is gone


def test_subscriber_started_first_is_woken_by_the_publisher(ps: PubSubRun) -> None:
    proc = ps.start("subscribe", "--name", "early", "--count", "1", "--wait", "30")
    ps.wait_attached("early", proc)
    time.sleep(0.5)  # it is waiting now, not polling its way past the publish
    published = time.monotonic()
    ps.publish("alerts", b"wake up", "--mode", "everyone")
    code, out, err = finish(proc)
    assert (code, out) == (0, b"wake up\n"), err.decode()
    assert time.monotonic() - published < 5  # woken, not timed out


# -- --exec ----------------------------------------------------------------------------------------
EXEC = (
    'body=$(cat); echo "$DIRMQ_ID $DIRMQ_CHANNEL $body"; '
    "case $body in ok*) exit 0;; one*) exit 1;; *) exit 2;; esac"
)


def test_exec_outcomes(ps: PubSubRun) -> None:
    acks = ("--ack", "done,dismissed,aborted", "--reply-to", "out")
    ok = ps.publish("work", b"ok", *acks)
    one = ps.publish("work", b"one", *acks)
    two = ps.publish("work", b"two", *acks)
    result = ps("subscribe", "--count", "3", "--dismiss-on-error", "--exec", EXEC)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().splitlines() == [
        f"{ok} work ok",
        f"{one} work one",
        f"{two} work two",
    ]
    assert "exited 2" in result.stderr.decode()
    assert ps.outcomes() == [(ok, "done"), (one, "dismissed"), (two, "aborted")]
    # The aborted one was given back; exit 1 without --dismiss-on-error aborts too.
    again = ps("subscribe", "--count", "1", "--exec", "cat >/dev/null; exit 1")
    assert again.returncode == 0
    assert ps.outcomes() == [(two, "aborted")]
    assert ps.ok("subscribe", "--count", "1").stdout == b"two\n"
    assert ps.outcomes() == [(two, "done")]


def test_exec_heartbeats_past_the_process_timeout(ps: PubSubRun) -> None:
    acks = ("--ack", "done,aborted", "--reply-to", "out")
    message_id = ps.publish("slow", b"x", "--process-timeout", "400ms", *acks)
    result = ps("subscribe", "--count", "1", "--exec", "cat >/dev/null; sleep 1.5")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""
    assert ps.outcomes() == [(message_id, "done")]


# -- stopping --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGTERM, exits.OK), (signal.SIGINT, exits.INTERRUPTED)]
)
def test_signal_detaches_and_gives_back_the_held_message(
    ps: PubSubRun, tmp_path: Path, signum: int, code: int
) -> None:
    message_id = ps.publish("work", b"held", "--ack", "aborted", "--reply-to", "out")
    started = tmp_path / "started"
    proc = ps.start(
        "subscribe", "--name", "w", "--exec", f"cat >/dev/null; touch {started}; sleep 30"
    )
    deadline = time.monotonic() + 30
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signum)
    returned, _out, err = finish(proc, timeout_s=15)
    assert returned == code, err.decode()
    assert ps.outcomes() == [(message_id, "aborted")]
    # Detached: the name is free again, and the message is there for the next one.
    assert ps.ok("subscribe", "--name", "w", "--count", "1", "--wait", "5").stdout == b"held\n"


def test_idle_subscriber_stops_on_sigterm(ps: PubSubRun) -> None:
    proc = ps.start("subscribe", "--name", "idle")
    ps.wait_attached("idle", proc)
    proc.send_signal(signal.SIGTERM)
    code, _out, err = finish(proc, timeout_s=15)
    assert code == 0, err.decode()
    assert not (ps.root / "@pubsub" / "present" / "idle").exists()


# -- errors ----------------------------------------------------------------------------------------
def test_duplicate_id(ps: PubSubRun) -> None:
    assert ps.publish("c", b"first", "--id", "order-42") == "order-42"
    again = ps("publish", "c", "--id", "order-42", "--body", "second")
    assert again.returncode == exits.DUPLICATE
    assert "already published" in one_error_line(again)


def test_busy_subscription_name(ps: PubSubRun) -> None:
    holder = ps.start("subscribe", "--name", "only-one")
    try:
        ps.wait_attached("only-one", holder)
        busy = ps("subscribe", "--name", "only-one", "--wait", "0")
        assert busy.returncode == exits.BUSY
        assert "attached elsewhere" in one_error_line(busy)
    finally:
        holder.send_signal(signal.SIGTERM)
        finish(holder)


@pytest.mark.parametrize(
    "args",
    [
        ("publish", "c", "--accept-timeout", "soon"),
        ("publish", "c", "--process-timeout", "-1s"),
        ("publish", "c", "--mode", "someone"),
        ("publish", "c", "--ack", "done,maybe", "--reply-to", "out"),
        ("publish", "c", "--ack", "done"),
        ("publish", "c", "--id", "has space"),
        ("publish", "c", "--reply-to", "../escape", "--ack", "done"),
        ("publish", "c", "--persistence", "sometimes"),
        ("publish", "c", "--header", "no colon"),
        ("publish", "c", "--header", "Dirmq-Id: 1"),
        ("subscribe", "--dismiss-on-error"),
        ("subscribe", "--json", "--exec", "cat"),
        ("subscribe", "--count", "0"),
        ("subscribe", "--from", "0"),
        ("subscribe", "--name", "a/b"),
        ("subscribe", "--wait", "1 minute"),
    ],
)
def test_bad_input_is_a_usage_error(ps: PubSubRun, args: tuple[str, ...]) -> None:
    result = ps(*args, stdin=b"body")
    assert result.returncode == exits.USAGE, result.stderr.decode()
    one_error_line(result)


def test_fsck_checks_and_repairs_pubsub(ps: PubSubRun) -> None:
    ps.publish("c", b"x")
    checked = ps.ok("fsck")
    assert b"pub/sub:" in checked.stdout
    garbage = ps.root / "@pubsub" / "anyone" / "garbage"
    garbage.write_bytes(b"x")
    found = ps("fsck")
    assert found.returncode == exits.FSCK_UNREPAIRED
    assert b"foreign" in found.stdout
    repaired = ps.ok("fsck", "--repair")
    assert b"repaired" in repaired.stdout
    assert not garbage.exists()
    assert json.loads(ps.ok("fsck", "--json").stdout)["pubsub"]["ok"] is True
