"""The store's one facility for small files (`dirmq.store.smallfiles`): all or nothing under a
crash, exactly one creator of a name among racing threads and processes, one temp-name scheme
that sweeps and `dirmq fsck` recognise."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dirmq.pubsub.check import check_pubsub
from dirmq.pubsub.layout import PubSubPaths
from dirmq.store import Store, layout, smallfiles
from dirmq.store.filemodes import PRIVATE, Access
from dirmq.store.fsck import Kind, fsck

ACCESS = Access.named(PRIVATE)

HOUR_AGO = time.time() - 7200
pytestmark = pytest.mark.usefixtures("private_umask")  # see conftest.py


def _age(path: Path | str) -> None:
    os.utime(path, (HOUR_AGO, HOUR_AGO))


def test_replace_create_and_read(tmp_path: Path) -> None:
    path = str(tmp_path / "record")
    assert smallfiles.read_file(path) is None
    assert smallfiles.create_file(path, b"first", durable=True, access=ACCESS)
    assert not smallfiles.create_file(
        path, b"second", durable=True, access=ACCESS
    )  # the name exists
    assert smallfiles.read_file(path) == b"first"
    smallfiles.replace_file(path, b"third", durable=False, access=ACCESS)
    assert smallfiles.read_file(path) == b"third"
    assert os.listdir(tmp_path) == ["record"]  # no temp file left behind


def test_missing_parents_are_made_only_when_asked(tmp_path: Path) -> None:
    path = str(tmp_path / "a" / "b" / "record")
    with pytest.raises(FileNotFoundError):
        smallfiles.replace_file(path, b"x", durable=False, access=ACCESS)
    with pytest.raises(FileNotFoundError):
        smallfiles.create_file(path, b"x", durable=False, access=ACCESS)
    assert not (tmp_path / "a").exists()
    assert smallfiles.create_file(path, b"x", durable=True, access=ACCESS, make_parents=True)
    smallfiles.replace_file(
        str(tmp_path / "c" / "r"), b"y", durable=True, access=ACCESS, make_parents=True
    )
    assert smallfiles.read_file(path) == b"x" and (tmp_path / "c" / "r").read_bytes() == b"y"


def test_the_temp_name_scheme() -> None:
    temp = smallfiles.temp_path("/x/@queue.json")
    assert os.path.dirname(temp) == "/x"
    assert smallfiles.temp_target(os.path.basename(temp)) == "@queue.json"
    assert smallfiles.temp_path("/x/a") != smallfiles.temp_path("/x/a")
    for other in ("a.tmp", "a.123.tmp", f"a.{'A' * 32}.tmp", f"a.{'0' * 32}.tmp.x", "a"):
        assert smallfiles.temp_target(other) is None


def test_durable_flushes_the_file_and_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushed: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: flushed.append("file") or real_fsync(fd))
    monkeypatch.setattr(smallfiles, "fsync_dir", lambda path: flushed.append(f"dir {path}"))
    path = str(tmp_path / "r")
    smallfiles.replace_file(path, b"1", durable=False, access=ACCESS)
    assert smallfiles.create_file(path + "2", b"1", durable=False, access=ACCESS)
    assert flushed == []
    smallfiles.replace_file(path, b"2", durable=True, access=ACCESS)
    assert flushed == ["file", f"dir {tmp_path}"]
    flushed.clear()
    assert smallfiles.create_file(path + "3", b"1", durable=True, access=ACCESS)
    assert flushed == ["file", f"dir {tmp_path}"]
    flushed.clear()
    assert not smallfiles.create_file(path + "3", b"1", durable=True, access=ACCESS)
    assert flushed == ["file"]  # nothing was created: no directory to flush


def test_a_crash_before_the_rename_keeps_the_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "record"
    smallfiles.replace_file(str(path), b"old", durable=True, access=ACCESS)

    def crash(*_args: object) -> None:
        raise KeyboardInterrupt  # stands for the process dying between write and rename

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        smallfiles.replace_file(str(path), b"new", durable=True, access=ACCESS)
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["record"]  # an error (not a crash) removes its temp file


def test_a_failed_link_removes_its_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_args: object) -> None:
        raise PermissionError(1, "refused")

    monkeypatch.setattr(os, "link", refuse)
    with pytest.raises(PermissionError):
        smallfiles.create_file(str(tmp_path / "r"), b"x", durable=True, access=ACCESS)
    assert os.listdir(tmp_path) == []


_REWRITER = """
import sys
from dirmq.store import smallfiles
from dirmq.store.filemodes import Access
ACCESS = Access.named("private")
path, durable = sys.argv[1], sys.argv[2] == "1"
print("ready", flush=True)
n = 0
while True:
    n += 1
    body = b"%d:" % n + bytes([n % 251]) * (20000 + n % 5000)
    smallfiles.replace_file(path, body, durable=durable, access=ACCESS)
"""


def _whole(content: bytes) -> bool:
    """A version the rewriter wrote, complete: its number, then its byte repeated."""
    head, _, body = content.partition(b":")
    n = int(head)
    return body == bytes([n % 251]) * (20000 + n % 5000)


@pytest.mark.parametrize("durable", [False, True])
def test_a_writer_killed_at_any_moment_leaves_the_old_content_or_the_new(
    tmp_path: Path, durable: bool
) -> None:
    """SIGKILL a process rewriting one file in a loop, at random moments: the file always
    holds one whole version, and what the kills left are temp files of the scheme only."""
    path = tmp_path / "record"
    smallfiles.replace_file(str(path), b"0:", durable=True, access=ACCESS)
    for round_ in range(6):
        writer = subprocess.Popen(
            [sys.executable, "-c", _REWRITER, str(path), "1" if durable else "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(0.02 + 0.017 * round_)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        writer.stdout.close()
        assert _whole(path.read_bytes())
    leftovers = [n for n in os.listdir(tmp_path) if n != "record"]
    assert all(smallfiles.temp_target(n) == "record" for n in leftovers)
    assert smallfiles.remove_stale_temps(str(tmp_path)) == 0  # young: may be in progress
    for name in leftovers:
        _age(tmp_path / name)
    assert smallfiles.remove_stale_temps(str(tmp_path)) == len(leftovers)
    assert os.listdir(tmp_path) == ["record"]


def test_of_threads_creating_one_name_exactly_one_wins(tmp_path: Path) -> None:
    path = str(tmp_path / "name")
    barrier = threading.Barrier(16)
    won: list[int] = []

    def create(n: int) -> None:
        barrier.wait()
        if smallfiles.create_file(path, b"%d" % n, durable=n % 2 == 0, access=ACCESS):
            won.append(n)

    threads = [threading.Thread(target=create, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    assert smallfiles.read_file(path) == b"%d" % won[0]
    assert os.listdir(tmp_path) == ["name"]


_CREATOR = """
import sys, time
from dirmq.store import smallfiles
from dirmq.store.filemodes import Access
ACCESS = Access.named("private")
path, me, at = sys.argv[1], sys.argv[2], float(sys.argv[3])
time.sleep(max(0.0, at - time.time()))
print(smallfiles.create_file(path, me.encode(), durable=True, access=ACCESS), flush=True)
"""


def test_of_processes_creating_one_name_exactly_one_wins(tmp_path: Path) -> None:
    path = str(tmp_path / "name")
    for attempt in range(3):
        target = f"{path}{attempt}"
        at = time.time() + 1.5  # every process started and waiting by then
        creators = [
            subprocess.Popen(
                [sys.executable, "-c", _CREATOR, target, str(n), str(at)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for n in range(6)
        ]
        answers = [c.communicate(timeout=60)[0].strip() for c in creators]
        assert sorted(answers) == ["False"] * 5 + ["True"]
        assert smallfiles.read_file(target) == str(answers.index("True")).encode()
    assert sorted(os.listdir(tmp_path)) == [f"name{n}" for n in range(3)]


# -- recovery and fsck -----------------------------------------------------------------------------
def _plant_temp(final: Path, age: bool) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(smallfiles.temp_path(str(final)))
    temp.write_bytes(b"half")
    if age:
        _age(temp)
    return temp


def test_fsck_reports_and_removes_stale_temps_wherever_small_files_live(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with Store(root) as store:
        queue_dir = Path(store.create_queue("fish/salt").path)
    old = [
        _plant_temp(root / layout.ROOT_MARKER, age=True),
        _plant_temp(queue_dir / layout.CONFIG_FILE, age=True),
        _plant_temp(root / layout.REDRIVE_DIR / "dlq" / "t.json", age=True),
        _plant_temp(root / layout.SQS_DIR / "attempts" / "q" / "a.json", age=True),
        _plant_temp(root / layout.SPARK_DIR / "consumers" / "q" / "@c" / "acked", age=True),
        _plant_temp(root / layout.SPARK_DIR / "sinks" / "q" / "@query", age=True),
    ]
    young = [
        _plant_temp(queue_dir / layout.CONFIG_FILE, age=False),
        _plant_temp(root / layout.REDRIVE_DIR / "dlq" / "u.json", age=False),
    ]
    report = fsck(root, repair=False)
    assert sorted(p.path for p in report.problems) == sorted(map(str, old))
    assert {p.kind for p in report.problems} == {Kind.ORPHAN_TMP} and not report.ok
    assert all(t.exists() for t in old + young)  # a check changes nothing
    report = fsck(root, repair=True)
    assert len(report.repaired) == len(old) and report.ok
    assert not any(t.exists() for t in old) and all(t.exists() for t in young)
    assert fsck(root, repair=False).problems == ()


def test_a_sweep_removes_stale_temps_of_the_queue_configuration(tmp_path: Path) -> None:
    with Store(tmp_path / "root") as store:
        queue = store.create_queue("q")
        old = _plant_temp(Path(queue.path) / layout.CONFIG_FILE, age=True)
        young = _plant_temp(Path(queue.path) / layout.CONFIG_FILE, age=False)
        assert queue.sweep().orphans_removed == 1
    assert not old.exists() and young.exists()


def test_pubsub_fsck_and_sweep_handle_stale_temps_of_cursors_and_the_floor(
    tmp_path: Path,
) -> None:
    from dirmq.pubsub.hub import PubSub

    root = tmp_path / "root"
    with Store(root) as store:
        hub = PubSub(store)
        with hub.subscribe("s", channels=["c"]):
            pass
        paths = PubSubPaths.under(str(root))
        cursor_temp = _plant_temp(Path(paths.cursor("s")), age=True)
        floor_temp = _plant_temp(Path(paths.broadcast + ".floor"), age=True)
        young = _plant_temp(Path(paths.cursor("s")), age=False)
        report = check_pubsub(str(root))
        assert report is not None
        found = sorted(f.path for f in report.findings if f.kind == "orphan-tmp")
        assert found == sorted([str(cursor_temp), str(floor_temp)]) and not report.ok
        repaired = check_pubsub(str(root), repair=True)
        assert repaired is not None and repaired.ok
        assert not cursor_temp.exists() and not floor_temp.exists() and young.exists()
        again = _plant_temp(Path(paths.subscription_file("s")), age=True)
        hub.sweep()
        assert not again.exists() and young.exists()
        hub.close()
