"""Who holds a lease (docs/FORMAT.md, "Lease holders"): the token in a lease's name, the record
it names in @holders, and every door that shows it. The server's parts run a real
`dirmq serve --credentials` and real boto3."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest

import dirmq
from dirmq.server.credentials import token_digest
from dirmq.store import layout
from dirmq.store.fsck import fsck
from dirmq.store.holders import Holders
from dirmq.store.layout import parse_entry
from dirmq.store.marker import BASE_FORMAT
from dirmq.store.message import LeaseHolder

from .support.servers import REPO, ServerProcess, fresh, start_server

ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789"
ALICE_KEY, ALICE_SECRET = "AKIDALICE", "alice-secret"
CREDENTIALS = f"""
[principals.alice]
token_sha256 = "{token_digest(ALICE)}"
aws_keys = [{{ id = "{ALICE_KEY}", secret = "{ALICE_SECRET}" }}]
read = ["*"]
write = ["*"]
admin = ["*"]

[principals.bob]
token_sha256 = "{token_digest(BOB)}"
read = ["*"]
write = ["*"]
"""


def leases(queue: dirmq.Queue) -> list[str]:
    return os.listdir(Path(queue.path) / layout.LEASED)


def records(root: Path) -> list[str]:
    try:
        return sorted(os.listdir(root / layout.HOLDERS_DIR))
    except FileNotFoundError:
        return []


# -- the library ----------------------------------------------------------------------------------
def test_a_library_get_names_this_process_in_browse(store: dirmq.Store, root: Path) -> None:
    q = store.create_queue("lib")
    q.put_many([b"one", b"two"])
    (message,) = q.get(visibility_s=60)
    (lease,) = leases(q)
    entry = parse_entry(lease)
    assert entry is not None and entry.holder is not None
    assert records(root) == [f"{entry.holder}.json"]
    (browsed,) = q.browse(state="leased")
    holder = browsed.holder
    assert holder is not None and holder.known and holder.token == entry.holder
    assert (holder.host, holder.pid, holder.label) == (socket.gethostname(), os.getpid(), None)
    assert holder.program
    assert q.peek(message.id).holder == holder
    # Ready messages have no holder.
    assert [m.holder for m in q.browse()] == [None]


def test_a_consumer_label_is_its_own_record_written_once(store: dirmq.Store, root: Path) -> None:
    q = store.create_queue("labels")
    q.put_many([b"%d" % i for i in range(4)])
    q.get(visibility_s=60, consumer="worker-a")
    q.get(visibility_s=60, consumer="worker-a")
    q.get(visibility_s=60)
    assert len(records(root)) == 2  # one per label: worker-a, and none
    labels = Counter(m.holder.label for m in q.browse(state="leased") if m.holder)
    assert labels == {"worker-a": 2, None: 1}
    with pytest.raises(dirmq.InvalidArgument, match="consumer must be text"):
        q.get(consumer="bad\nlabel")


def test_extend_keeps_the_holder_and_nack_drops_it(store: dirmq.Store) -> None:
    q = store.create_queue("settle")
    q.put_many([b"a", b"b"])
    first, second = q.get(2, visibility_s=60, consumer="keeper")
    (before,) = {parse_entry(n).holder for n in leases(q)}  # type: ignore[union-attr]
    q.extend(first.receipt or "", 120)
    after = {n: parse_entry(n) for n in leases(q)}
    assert {e.holder for e in after.values() if e} == {before}
    assert q.nack(second.receipt or "") == "returned"
    (ready,) = os.listdir(Path(q.path) / layout.READY)
    assert ready == f"{second.id}.1", "a message given back is held by nobody"
    again = q.get(visibility_s=60)  # re-leased by another label: the new holder's token
    (browsed,) = [m for m in q.browse(state="leased") if m.id == again[0].id]
    assert browsed.holder is not None and browsed.holder.label is None


def test_expiry_and_a_group_s_delayed_nack(store: dirmq.Store) -> None:
    q = store.create_queue("expiry")
    q.put_many([dirmq.OutgoingMessage(b"g", group="g")])
    (message,) = q.get(visibility_s=60, consumer="first")
    # A group's nack with a delay stays in flight (FORMAT.md "Message groups"): still held.
    assert q.nack(message.receipt or "", delay_s=0.05) == "delayed"
    (lease,) = leases(q)
    entry = parse_entry(lease)
    assert entry is not None and entry.holder is not None and entry.group is not None
    # It expires (the wait wakes then), comes back held by nobody, and the next get's
    # holder takes it.
    again = q.get_one(wait_s=5, visibility_s=60, consumer="second")
    assert again is not None and again.id == message.id and again.receive_count == 2
    (browsed,) = q.browse(state="leased")
    assert browsed.holder is not None and browsed.holder.label == "second"


def test_a_lease_without_a_holder_is_read_and_settled(store: dirmq.Store, root: Path) -> None:
    """As an older version names it, or a holder whose record is gone: unknown, never an
    error; fsck is content."""
    q = store.create_queue("old")
    q.put_many([b"x", b"y"])
    older, current = q.get(2, visibility_s=60)
    leased = Path(q.path) / layout.LEASED
    for name in os.listdir(leased):
        if name.startswith(older.id):
            entry = parse_entry(name)
            assert entry is not None and entry.at_ms is not None
            os.rename(leased / name, leased / layout.timed_name(older.id, 1, entry.at_ms))
    for record in records(root):
        os.unlink(root / layout.HOLDERS_DIR / record)
    reopened = dirmq.Store(root)
    try:
        q2 = reopened.queue("old")
        shown = {m.id: m.holder for m in q2.browse(state="leased")}
        assert shown[older.id] == LeaseHolder(None)
        gone = shown[current.id]
        assert gone is not None and not gone.known and gone.token is not None
        report = fsck(root, repair=False)
        assert report.ok and report.problems == (), report.problems
        q2.ack(older.receipt or "")
        q2.extend(current.receipt or "", 30)
        q2.ack(current.receipt or "")
        assert q2.stats().total == 0
    finally:
        reopened.close()


def test_a_dead_holder_s_record_is_swept(root: Path) -> None:
    script = "import sys, dirmq; q = dirmq.Store(sys.argv[1]).queue('swept'); q.get(consumer='x')"
    with dirmq.Store(root) as store:
        q = store.create_queue("swept")
        q.put(b"held by a process that exits")
        mine = q.get(visibility_s=60)  # this process's record: alive, kept
        q.put(b"the other one")
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        subprocess.run([sys.executable, "-c", script, str(root)], check=True, env=env)
        assert len(records(root)) == 2
        with dirmq.Store(root) as another:  # a process opening a queue sweeps them once
            another.queue("swept").stats()
        assert len(records(root)) == 1
        q.sweep()  # and so does every sweep (here: nothing left to remove)
        (kept,) = records(root)
        (browsed,) = [m for m in q.browse(state="leased") if m.id == mine[0].id]
        assert browsed.holder is not None and f"{browsed.holder.token}.json" == kept
        others = [m.holder for m in q.browse(state="leased") if m.id != mine[0].id]
        assert [h.known for h in others if h] == [False]  # its record is gone: unknown


def test_fsck_leaves_a_lease_s_holder_alone_and_reports_strays(
    store: dirmq.Store, root: Path
) -> None:
    q = store.create_queue("checked")
    q.put(b"m")
    q.get(visibility_s=60, consumer="kept")
    stray = root / layout.HOLDERS_DIR / "not-a-record"
    stray.write_text("x")
    stray.chmod(0o600)  # the root's access: only what is asked is reported
    report = fsck(root, repair=True)
    assert [(p.kind.value, p.repaired) for p in report.problems] == [("stray", False)]
    assert len(leases(q)) == 1 and parse_entry(leases(q)[0]).holder  # type: ignore[union-attr]
    # Another host's record that no lease names, an hour old: a notice, removed by a repair.
    foreign = root / layout.HOLDERS_DIR / "0123456789ab.json"
    foreign.write_text(
        json.dumps({"host": "far", "host_tag": "00000000", "pidns": 1, "pid": 1, "start": 1})
    )
    foreign.chmod(0o600)
    os.utime(foreign, (1, 1))
    report = fsck(root, repair=True)
    found = [p for p in report.problems if p.kind.value == "orphan-holder"]
    assert [p.repaired for p in found] == [True] and report.ok
    assert not foreign.exists()


@pytest.mark.parametrize("earlier", [1, 2, 3])
def test_a_root_of_an_earlier_format_is_marked_current(root: Path, earlier: int) -> None:
    root.mkdir(exist_ok=True)
    (root / layout.ROOT_MARKER).write_text(f'{{"format": {earlier}, "access": "private"}}\n')
    dirmq.Store(root).close()
    # 5: an open marks no journal's format (6) before it writes one (test_journal.py)
    assert json.loads((root / layout.ROOT_MARKER).read_text())["format"] == BASE_FORMAT


_GETS_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import dirmq
    root, n = sys.argv[1], int(sys.argv[2])
    q = dirmq.Store(root).create_queue("counted")
    q.put_many([b"x"] * (n + 1))
    q.get(visibility_s=600, consumer="c")  # the record is written here, once
    os.path.exists("/dirmq-mark-start")
    for _ in range(n):
        q.get(visibility_s=600, consumer="c")
    os.path.exists("/dirmq-mark-end")
    """
)


@pytest.mark.skipif(shutil.which("strace") is None, reason="no strace")
def test_a_get_is_still_one_rename(tmp_path: Path) -> None:
    n = 100
    script = tmp_path / "gets.py"
    script.write_text(_GETS_SCRIPT)
    out, root = tmp_path / "strace.txt", tmp_path / "r"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    traced = subprocess.run(
        [
            "strace",
            "-f",
            "-qq",
            "-o",
            str(out),
            sys.executable,
            str(script),
            str(tmp_path / "r"),
            str(n),
        ],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if traced.returncode != 0 and "ptrace" in traced.stderr:
        pytest.skip(f"strace cannot trace here: {traced.stderr.strip()[:200]}")
    assert traced.returncode == 0, traced.stderr
    calls: Counter[str] = Counter()
    window = False
    for line in out.read_text().splitlines():
        marker = "stat" in line.split("(", 1)[0]  # the marks, not the script being read
        if marker and "/dirmq-mark-start" in line:
            window = True
        elif marker and "/dirmq-mark-end" in line:
            break
        elif window:
            parts = line.split(None, 1)
            if len(parts) == 2 and "(" in parts[1]:
                calls[parts[1].split("(", 1)[0]] += 1
                assert layout.HOLDERS_DIR not in line, line
    assert sum(calls[c] for c in ("rename", "renameat", "renameat2")) == n, calls
    assert calls["openat"] == n, calls  # the read of each message, nothing more
    leased = os.listdir(root / "counted" / layout.LEASED)
    assert len({parse_entry(n).holder for n in leased}) == 1  # type: ignore[union-attr]


# -- the server -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("holders")
    path = base / "credentials.toml"
    path.write_text(CREDENTIALS)
    path.chmod(0o600)
    server = start_server(base / "root", "--credentials", str(path), yaq=True)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _leased_holders(http: httpx.Client, queue: str) -> dict[str, dict[str, object]]:
    answer = http.get(
        f"/{queue}/messages", params={"peek": "1", "state": "leased"}, headers=bearer(ALICE)
    )
    assert answer.status_code == 200, answer.text
    return {m["id"]: m["holder"] for m in answer.json()["messages"]}


def test_a_server_get_names_the_principal(server: ServerProcess, http: httpx.Client) -> None:
    assert http.put("/srv", headers=bearer(ALICE)).status_code in (200, 201)
    for body in (b"one", b"two"):
        assert http.post("/srv/messages", content=body, headers=bearer(ALICE)).status_code == 201
    # The plain receive (the server's fast path) and one with parameters (the general one).
    first = http.get("/srv/messages", headers=bearer(ALICE))
    second = http.get("/srv/messages", params={"visibility": "60s"}, headers=bearer(BOB))
    assert first.status_code == second.status_code == 200
    shown = _leased_holders(http, "srv")
    alice = shown[first.headers["X-Message-Id"]]
    bob = shown[second.headers["X-Message-Id"]]
    assert alice["known"] is True and alice["label"] == "alice"
    assert bob["label"] == "bob" and bob["token"] != alice["token"]
    assert alice["host"] == socket.gethostname() and alice["pid"] != os.getpid()
    assert str(alice["program"]).startswith("dirmq serve worker")

    receipt = first.headers["X-Receipt"]
    extended = http.post(
        f"/srv/messages/{receipt}/extend", params={"visibility": "2m"}, headers=bearer(ALICE)
    )
    assert extended.status_code == 204
    assert _leased_holders(http, "srv")[first.headers["X-Message-Id"]] == alice
    nacked = http.post(f"/srv/messages/{receipt}/nack", headers=bearer(ALICE))
    assert nacked.status_code == 204
    assert first.headers["X-Message-Id"] not in _leased_holders(http, "srv")
    # The library reads the same from the files.
    with dirmq.Store(server.root, create=False) as store:
        held = {m.id: m.holder for m in store.queue("srv").browse(state="leased")}
        assert held[second.headers["X-Message-Id"]] is not None
        assert held[second.headers["X-Message-Id"]].label == "bob"  # type: ignore[union-attr]


def test_an_sqs_receive_names_the_key_s_principal(
    server: ServerProcess, http: httpx.Client
) -> None:
    client = boto3.client(
        "sqs",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id=ALICE_KEY,
        aws_secret_access_key=ALICE_SECRET,
    )
    url = client.create_queue(QueueName="sqsheld")["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="hello")
    got = client.receive_message(QueueUrl=url, VisibilityTimeout=60)["Messages"]
    assert len(got) == 1
    (holder,) = _leased_holders(http, "sqsheld").values()
    assert holder["label"] == "alice"


def test_a_library_holder_in_a_server_s_root_shows_over_http(
    server: ServerProcess, http: httpx.Client
) -> None:
    with dirmq.Store(server.root, create=False) as store:
        q = store.create_queue("mixed")
        q.put(b"leased by a library process")
        (message,) = q.get(visibility_s=60, consumer="batch-job")
        holder = _leased_holders(http, "mixed")[message.id]
        assert holder == {
            "known": True,
            "token": holder["token"],
            "label": "batch-job",
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "program": holder["program"],
            "since": holder["since"],
        }
        assert Holders(str(server.root), store.access).describe(str(holder["token"])).known


# -- the console ----------------------------------------------------------------------------------
def test_the_console_shows_who_holds_each_lease(
    module_server: ServerProcess, module_lib: dirmq.Store
) -> None:
    name = fresh("held")
    queue = module_lib.create_queue(name)
    queue.put_many([b"labelled", b"older"])
    labelled, older = queue.get(2, visibility_s=600, consumer="nightly <report>")
    leased = Path(queue.path) / layout.LEASED
    for lease in os.listdir(leased):  # as a version before holders named it
        entry = parse_entry(lease)
        if entry is not None and entry.message_id == older.id and entry.at_ms is not None:
            os.rename(leased / lease, leased / layout.timed_name(older.id, 1, entry.at_ms))
    with httpx.Client(base_url=module_server.url, timeout=30) as ui:
        page = ui.get(f"/ui/q/{name}/browse", params={"state": "leased"})
        assert page.status_code == 200
        assert "held by" in page.text and "nightly &lt;report&gt;" in page.text
        assert f"pid {os.getpid()} on {socket.gethostname()}" in page.text
        assert page.text.count(">unknown<") == 1  # the lease whose name names nobody
        one = ui.get(f"/ui/q/{name}/m/{labelled.id}")
        assert one.status_code == 200 and "nightly &lt;report&gt;" in one.text
        assert f"{labelled.id}.1." in one.text  # the file's path, found with its holder's token
        other = ui.get(f"/ui/q/{name}/m/{older.id}").text
        assert 'id="holder"><span class="holder unknown">unknown' in other


def test_peek_in_flight_has_a_holder_column(store: dirmq.Store, root: Path) -> None:
    q = store.create_queue("cli")
    q.put_many([b"held"])
    (message,) = q.get(visibility_s=600, consumer="cli-check")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [sys.executable, "-m", "dirmq", "--root", str(root), "peek", "--state", "in_flight"]
    shown = subprocess.run([*command, "cli"], env=env, capture_output=True, text=True, check=True)
    head, row = shown.stdout.splitlines()
    assert head.split() == ["ID", "RECEIVES", "BYTES", "AGE_S", "HOLDER", "BODY"]
    assert row.split()[0] == message.id
    assert row.split()[4] == f"cli-check/{os.getpid()}@{socket.gethostname()}"
    as_json = subprocess.run(
        [*command, "--json", "cli"], env=env, capture_output=True, text=True, check=True
    )
    holder = json.loads(as_json.stdout)["holder"]
    assert (holder["known"], holder["label"], holder["pid"]) == (True, "cli-check", os.getpid())


def test_spark_s_leases_name_its_consumer(store: dirmq.Store) -> None:
    """The streaming reader's two ways to lease (path mode: named claims, or a quota of gets)
    pass the query's consumer name as the holder's label (the whole query: tests/test_spark.py)."""
    leasing = pytest.importorskip("dirmq.spark.leasing")
    q = store.create_queue("spark")
    q.put_many([b"planned", b"quota"])
    planned = leasing.lease_named(q, q.ready_names(1), 60, "orders-etl")
    got = leasing.lease(q, 1, 60, consumer="orders-etl")
    assert len(planned) == len(got) == 1
    labels = [m.holder.label for m in q.browse(state="leased") if m.holder]
    assert labels == ["orders-etl", "orders-etl"]
