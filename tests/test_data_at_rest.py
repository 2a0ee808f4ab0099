"""Data at rest: a new root is private (files 0600, directories 0700) whoever writes to it (the
library, the CLI, a server's every door), under the usual umask 022; no acknowledged body is
left readable anywhere in the root; a group root (`dirmq init --group`) is shared by the users
of its group and nobody else; an older root keeps working as it was until `dirmq init`; and
`dirmq fsck` checks and repairs all of it."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dirmq.client import RemoteStore
from dirmq.client.pubsub import RemotePubSub
from dirmq.errors import CorruptConfig, DuplicateMessage
from dirmq.pubsub import PubSub
from dirmq.pubsub.check import check_pubsub
from dirmq.store import QueueConfig, Store, layout
from dirmq.store.filemodes import GROUP, LEGACY, PRIVATE, Access, process_umask
from dirmq.store.fsck import Kind, fsck

from .support.servers import REPO, sqs_client, start_server
from .support.waiting import wait_until

SRC = str(REPO / "src")
ACCOUNT = "000000000000"


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The umask most hosts run with: without explicit modes every file would be 0644."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def entries(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every entry under `root`, and `root`, with its lstat."""
    yield root, os.lstat(root)
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            yield path, os.lstat(path)


def modes(root: Path) -> dict[str, set[str]]:
    """{"file" | "dir": the set of modes found}, symlinks left out (they have none of their own:
    capacity slots and dedup records hold message ids)."""
    found: dict[str, set[str]] = {"file": set(), "dir": set()}
    for _path, st in entries(root):
        if stat.S_ISDIR(st.st_mode):
            found["dir"].add(f"{stat.S_IMODE(st.st_mode):04o}")
        elif stat.S_ISREG(st.st_mode):
            found["file"].add(f"{stat.S_IMODE(st.st_mode):04o}")
    return found


def holding(root: Path, token: str) -> list[str]:
    """Every file under `root` whose bytes contain `token`."""
    needle = token.encode()
    return [
        str(path.relative_to(root))
        for path, st in entries(root)
        if stat.S_ISREG(st.st_mode) and needle in path.read_bytes()
    ]


def dirmq_cli(*args: str, stdin: bytes = b"", **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run(
        [sys.executable, "-m", "dirmq", *args],
        input=stdin,
        capture_output=True,
        env=env,
        check=False,
        timeout=60,
        **kwargs,
    )


# -- a new root, through every door -------------------------------------------------------------
def _library(root: Path, gone: str, kept: str) -> None:
    """Every way the library removes a message for good, and pub/sub's, on a new root."""
    with Store(root) as store:
        dlq = store.create_queue("lib/dlq")
        q = store.create_queue(
            "lib/orders",
            QueueConfig(capacity=50, dead_letter_queue="lib/dlq", max_receives=1),
        )
        secret = {"X-Card": f"{gone}-header"}
        q.put(f"{gone} acked".encode(), secret, dedup_id="d1")
        (message,) = q.get()
        q.ack(message.receipt or "")
        q.put(f"{gone} dead-lettered, then acked".encode())
        (message,) = q.get()
        q.nack(message.receipt or "")  # past max_receives: into lib/dlq
        (dead,) = dlq.get()
        dlq.ack(dead.receipt or "")
        q.delete(q.put(f"{gone} deleted by id".encode()))
        q.put_many([f"{gone} purged {i}".encode() for i in range(5)])
        q.put(f"{gone} delayed, purged".encode(), delay_s=60)
        assert q.purge() == 6

        expiring = store.create_queue("lib/expiring", QueueConfig(retention_s=0.2, max_receives=1))
        expiring.put(f"{gone} dead, deleted".encode())
        (message,) = expiring.get()
        expiring.nack(message.receipt or "")  # no dead-letter queue: kept in @dead
        expiring.put(f"{gone} past retention".encode())
        time.sleep(0.3)
        assert expiring.sweep().expired_removed == 1
        assert expiring.stats().dead == 1 and expiring.delete(message.id)  # purge keeps @dead

        store.create_queue("lib/doomed").put(f"{gone} in a deleted queue".encode())
        store.delete_queue("lib/doomed")
        store.create_queue("lib/keep").put(f"{kept} never acked".encode())

        hub = PubSub(store)
        hub.prune_grace_ms = 0
        with hub.subscribe("worker", channels=["jobs"]) as sub:
            hub.publish("jobs", f"{gone} anyone".encode(), acks="done", reply_to="lib/outcomes")
            hub.publish("jobs", f"{gone} everyone".encode(), mode="everyone", accept_timeout_s=0.1)
            got = [wait_until(lambda: sub.receive(wait_s=1)) for _ in range(2)]
            for delivery in got:
                sub.done(delivery)
        time.sleep(0.15)
        hub.sweep()  # the broadcast entry is past its accept time: pruned, its file emptied
        outcomes = store.queue("lib/outcomes")
        for report_message in outcomes.get(10):
            outcomes.ack(report_message.receipt or "")


def _server(root: Path, gone: str) -> None:
    """The native API, SQS (standard and FIFO, attempt ids, purge, queue deletion, dead letters
    redriven by a move task) and pub/sub, on a real server over the same root."""
    server = start_server(root, "--sqs-delay-recently-deleted")
    try:
        with RemoteStore(server.url) as remote:
            remote.create_queue("srv/dlq")
            q = remote.create_queue(
                "srv/native", QueueConfig(dead_letter_queue="srv/dlq", max_receives=1)
            )
            q.put(f"{gone} native".encode())
            (message,) = q.get()
            q.ack(message.receipt or "")
            q.put(f"{gone} native dead".encode())
            (message,) = q.get()
            q.nack(message.receipt or "")
            (dead,) = remote.queue("srv/dlq").get()
            remote.queue("srv/dlq").ack(dead.receipt or "")

        sqs = sqs_client(server.url)
        url = sqs.create_queue(QueueName="plain")["QueueUrl"]
        attributes = {"Card": {"DataType": "String", "StringValue": f"{gone} attribute"}}
        sqs.send_message(QueueUrl=url, MessageBody=f"{gone} sqs", MessageAttributes=attributes)
        (got,) = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
        sqs.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])
        sqs.send_message(QueueUrl=url, MessageBody=f"{gone} sqs purged")
        sqs.purge_queue(QueueUrl=url)

        fifo = sqs.create_queue(
            QueueName="orders.fifo",
            Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
        )["QueueUrl"]
        sqs.send_message(QueueUrl=fifo, MessageBody=f"{gone} fifo", MessageGroupId="g")
        receive = {"QueueUrl": fifo, "ReceiveRequestAttemptId": "attempt-1"}
        (first,) = sqs.receive_message(**receive)["Messages"]
        (again,) = sqs.receive_message(**receive)["Messages"]  # the attempt, read back
        assert again["Body"] == first["Body"] == f"{gone} fifo"
        assert again["ReceiptHandle"] == first["ReceiptHandle"]
        assert list(root.glob("@sqs/attempts/*/*.json")), "the attempt was recorded"
        sqs.delete_message(QueueUrl=fifo, ReceiptHandle=first["ReceiptHandle"])

        doomed = sqs.create_queue(QueueName="doomed")["QueueUrl"]
        sqs.send_message(QueueUrl=doomed, MessageBody=f"{gone} deleted queue")
        sqs.delete_queue(QueueUrl=doomed)

        dlq_url = sqs.create_queue(QueueName="redrive-dlq")["QueueUrl"]
        source = sqs.create_queue(
            QueueName="redrive",
            Attributes={
                "RedrivePolicy": json.dumps(
                    {
                        "deadLetterTargetArn": f"arn:aws:sqs:us-east-1:{ACCOUNT}:redrive-dlq",
                        "maxReceiveCount": 1,
                    }
                )
            },
        )["QueueUrl"]
        sqs.send_message(QueueUrl=source, MessageBody=f"{gone} redriven")
        sqs.receive_message(QueueUrl=source, VisibilityTimeout=0)  # received once: dead next

        def dead_letters() -> int:
            sqs.receive_message(QueueUrl=source, VisibilityTimeout=0)  # moves the dead lease
            names = ["ApproximateNumberOfMessages"]
            found = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=names)
            return int(found["Attributes"]["ApproximateNumberOfMessages"])

        wait_until(lambda: dead_letters() == 1)
        sqs.start_message_move_task(SourceArn=f"arn:aws:sqs:us-east-1:{ACCOUNT}:redrive-dlq")
        back = wait_until(lambda: sqs.receive_message(QueueUrl=source).get("Messages"))
        sqs.delete_message(QueueUrl=source, ReceiptHandle=back[0]["ReceiptHandle"])

        with RemotePubSub(server.url, timeout_s=10) as hub, hub.subscribe("remote") as sub:
            hub.publish("c", f"{gone} pubsub over http".encode())
            delivery = wait_until(lambda: sub.receive(wait_s=1))
            sub.done(delivery)
    finally:
        assert server.stop() == 0


def test_a_new_root_is_private_and_keeps_no_acknowledged_body(tmp_path: Path) -> None:
    root = tmp_path / "root"
    gone, kept = f"gone-{uuid.uuid4().hex}", f"kept-{uuid.uuid4().hex}"
    _library(root, gone, kept)
    put = dirmq_cli("--root", str(root), "put", "--create", "cli/q", stdin=f"{gone} cli".encode())
    assert put.returncode == 0, put.stderr
    got = dirmq_cli("--root", str(root), "get", "--ack", "cli/q")
    assert got.returncode == 0 and got.stdout == f"{gone} cli".encode(), got.stderr
    _server(root, gone)

    assert modes(root) == {"file": {"0600"}, "dir": {"0700"}}
    assert json.loads((root / layout.ROOT_MARKER).read_text()) == {
        "format": 6,  # a journal was written (FORMAT.md, "The commit journal")
        "access": "private",
    }
    assert holding(root, kept) == ["lib/keep/@ready/" + os.listdir(root / "lib/keep/@ready")[0]]
    assert holding(root, gone) == []
    recycled = [p for p, st in entries(root) if "@free" in p.parts and stat.S_ISREG(st.st_mode)]
    assert recycled, "acked files were kept for reuse (blanked), not only unlinked"
    assert list(root.glob("@pubsub/messages/*.end")), "finished pub/sub messages are kept, empty"
    assert list(root.glob("@redrive/*/runner.*")), "the move task took its hold"

    fsck_run = dirmq_cli("--root", str(root), "fsck")
    assert fsck_run.returncode == 0, fsck_run.stdout + fsck_run.stderr
    assert b"PROBLEM" not in fsck_run.stdout


# -- a group root ------------------------------------------------------------------------------
_AS_USER = """
import sys
import dirmq
root, role, body = sys.argv[1], sys.argv[2], sys.argv[3].encode()
store = dirmq.Store(root, create=False)
if role == "publish":
    store.create_queue("shared").put_many([body + b" %d" % i for i in range(3)])
elif role == "consume":
    q = store.queue("shared")
    for message in q.get(3):
        assert message.body.startswith(body), message.body
        q.ack(message.receipt)
    q.put(b"from the second user")  # into a file the first user created, recycled
    print(q.get_one().body.decode())
"""


def _python_for(uid: int) -> str | None:
    """A Python 3.11+ that user `uid` may run (ours may live in root's home): the store needs
    the standard library only."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if not os.path.exists(candidate):
            continue
        try:
            check = subprocess.run(
                [candidate, "-c", "import sys; assert sys.version_info >= (3, 11)"],
                user=uid,
                capture_output=True,
                check=False,
                timeout=30,
            )
        except PermissionError:
            continue
        if check.returncode == 0:
            return candidate
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_a_group_root_is_shared_by_its_group_and_closed_to_others() -> None:
    group, alice, bob, mallory = 4242, 4201, 4202, 4203
    python = _python_for(alice)
    if python is None:
        pytest.skip("no Python 3.11 that another user may run")
    base = Path(tempfile.mkdtemp(prefix="dirmq-group-"))
    try:
        base.chmod(0o711)  # other users may pass through to the root, nothing more
        root = base / "root"
        init = dirmq_cli("--root", str(root), "init", "--group", str(group))
        assert init.returncode == 0, init.stderr
        gone = f"gone-{uuid.uuid4().hex}"

        def as_user(uid: int, gid: int, role: str) -> subprocess.CompletedProcess[bytes]:
            return subprocess.run(
                [python, "-c", _AS_USER, str(root), role, gone],
                capture_output=True,
                env={**os.environ, "PYTHONPATH": SRC, "HOME": str(base)},
                user=uid,
                group=gid,
                extra_groups=[gid],
                check=False,
                timeout=60,
            )

        published = as_user(alice, group, "publish")
        assert published.returncode == 0, published.stderr
        consumed = as_user(bob, group, "consume")
        assert consumed.returncode == 0, consumed.stderr
        assert consumed.stdout.strip() == b"from the second user"
        outsider = as_user(mallory, mallory, "consume")
        assert outsider.returncode != 0 and b"Permission denied" in outsider.stderr

        assert modes(root) == {"file": {"0660"}, "dir": {"2770"}}
        assert alice in {st.st_uid for _p, st in entries(root)}  # (bob wrote into her files)
        assert {st.st_gid for _p, st in entries(root)} == {group}
        assert holding(root, gone) == []
        assert fsck(root, repair=False).problems == ()
    finally:
        shutil.rmtree(base)


def test_init_refuses_an_unknown_group(tmp_path: Path) -> None:
    result = dirmq_cli("--root", str(tmp_path / "root"), "init", "--group", "no-such-group-x")
    assert result.returncode == 2
    assert b"no group named 'no-such-group-x'" in result.stderr
    assert not (tmp_path / "root").exists()


# -- roots made before the setting ------------------------------------------------------------
def test_an_older_root_keeps_its_modes_until_init_makes_it_private(tmp_path: Path) -> None:
    root = tmp_path / "old"
    root.mkdir()
    (root / layout.ROOT_MARKER).write_text('{"format": 1}\n')  # as earlier versions wrote it
    with Store(root) as store:
        message_id = store.create_queue("q").put(b"still here")
    assert modes(root) == {"file": {"0644"}, "dir": {"0755"}}  # as before: 0644, 0777 - umask
    assert fsck(root, repair=False).problems == ()  # nothing to say about an older root's modes

    init = dirmq_cli("--root", str(root), "init")
    assert init.returncode == 0, init.stderr
    assert b"private" in init.stdout and b"entries changed" in init.stdout
    assert modes(root) == {"file": {"0600"}, "dir": {"0700"}}
    assert json.loads((root / layout.ROOT_MARKER).read_text())["access"] == "private"
    assert fsck(root, repair=False).problems == ()
    with Store(root, create=False) as store:
        assert store.queue("q").peek(message_id).body == b"still here"
        store.queue("q").put(b"new")
    assert modes(root) == {"file": {"0600"}, "dir": {"0700"}}


def test_an_unknown_access_is_refused_and_fsck_rewrites_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    Store(root).close()
    (root / layout.ROOT_MARKER).write_text('{"format": 1, "access": "public"}')
    with pytest.raises(CorruptConfig, match="unknown access 'public'"):
        Store(root)
    report = fsck(root, repair=True)
    assert [(p.kind, p.repaired) for p in report.problems] == [(Kind.ROOT_MARKER, True)]
    assert json.loads((root / layout.ROOT_MARKER).read_text())["access"] == "private"
    Store(root).close()


# -- fsck --------------------------------------------------------------------------------------
def test_fsck_finds_loose_modes_and_unblanked_recycled_files(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with Store(root) as store:
        q = store.create_queue("q")
        message_id = q.put(b"a message")
    ready = root / "q" / layout.READY / message_id
    ready.chmod(0o644)
    (root / "q" / layout.DEAD).chmod(0o755)
    old = root / "q" / layout.FREE / "1716000000000000-0123456789ab"
    old.write_bytes(b"a body an earlier version retired")  # written under umask 022: 0644 too
    report = fsck(root, repair=False)
    found = sorted((p.kind, p.path) for p in report.problems)
    assert found == sorted(
        [
            (Kind.ACCESS, str(ready)),
            (Kind.ACCESS, str(root / "q" / layout.DEAD)),
            (Kind.ACCESS, str(old)),
            (Kind.READABLE_FREE, str(old)),
        ]
    )
    assert not report.ok
    assert fsck(root, repair=True).ok
    assert modes(root) == {"file": {"0600"}, "dir": {"0700"}} and not old.exists()
    assert fsck(root, repair=False).problems == ()


def test_finished_pubsub_messages_are_emptied_and_fsck_accepts_them(tmp_path: Path) -> None:
    with Store(tmp_path / "root") as store:
        hub = PubSub(store)
        with hub.subscribe("s") as sub:
            hub.publish("c", b"secret", message_id="m1")
            delivery = wait_until(lambda: sub.receive(wait_s=1))
            sub.done(delivery)
        end = Path(hub.paths.canonical("m1", "end"))
        assert end.exists() and end.stat().st_size == 0  # at once, not at the next sweep
        with pytest.raises(DuplicateMessage):
            hub.publish("c", b"again", message_id="m1")  # the name still dedups
    report = check_pubsub(str(tmp_path / "root"))
    assert report is not None and report.ok, report.findings


def test_a_file_costs_a_chmod_only_where_the_umask_takes_bits_the_access_grants() -> None:
    cases = {
        0o022: (False, True),
        0o002: (False, False),
        0o007: (False, False),
        0o077: (False, True),
    }
    for umask, (private, group) in cases.items():
        os.umask(umask)
        assert process_umask() == umask
        assert Access.named(PRIVATE).chmod_after is private
        assert Access.named(GROUP).chmod_after is group
    assert Access.named(LEGACY).chmod_after is False  # an older root: the umask applies, as before


def test_fsck_says_nothing_of_modes_in_a_directory_that_is_no_root(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")  # 0644 under the umask
    report = fsck(tmp_path, repair=True)
    # "not a root?" (never stamped), and a stray file: nothing about its mode
    assert sorted(p.kind for p in report.problems) == [Kind.ROOT_MARKER, Kind.STRAY]
    assert stat.S_IMODE((tmp_path / "notes.txt").stat().st_mode) == 0o644
