"""Recurring schedules (issue 36): tick arithmetic (daylight-saving changes by a fixed clock),
missed ticks (`skip`, `once`), a runner killed between its claim and its publish, and every
door: the library, the CLI, the native API with its permissions, fsck."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from dirmq.cli import main as cli
from dirmq.errors import (
    CorruptConfig,
    InvalidArgument,
    InvalidName,
    QueueNotFound,
    ScheduleNotFound,
)
from dirmq.schedules import Scheduler, Schedules, schedule
from dirmq.schedules.check import check_schedules
from dirmq.schedules.model import MAX_TICKS_PER_STEP, Schedule, iso_utc
from dirmq.schedules.records import ScheduleFiles, read_record
from dirmq.schedules.runner import KEEP_TICKS, STALE_CLAIM_S
from dirmq.server.credentials import new_token
from dirmq.store import Store
from dirmq.store.processes import ProcessIdentity, host_tag

from .support.fixtures import serve
from .support.principals import everything, principal
from .support.procs import spawn
from .support.servers import ServerProcess
from .support.waiting import wait_until


def ms(text: str) -> int:
    """`2026-03-29T01:00:00Z` as UTC milliseconds."""
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "root", create=True) as opened:
        opened.create_queue("q")
        yield opened


def stored(store: Store, spec: Schedule, at_s: float) -> Schedule:
    """`spec` stored as if put at `at_s` (a fixed clock's time)."""
    spec = replace(spec, created_s=at_s, updated_s=at_s)
    ScheduleFiles(store.root).write(spec)
    return spec


def ticks_in(store: Store, queue: str = "q") -> list[tuple[str, str | None]]:
    """The (X-Schedule-Tick, X-Schedule-Missed) of every message of `queue`, oldest first."""
    found = store.queue(queue).browse(limit=1000)
    return [(m.headers["X-Schedule-Tick"], m.headers.get("X-Schedule-Missed")) for m in found]


# -- when ticks fall ----------------------------------------------------------------------------


def test_a_fixed_local_time_across_both_berlin_changes() -> None:
    spec = schedule("daily", "q", cron="30 2 * * *", timezone="Europe/Berlin")
    spring, _ = spec.ticks_through(ms("2026-03-27T12:00:00Z"), ms("2026-03-30T12:00:00Z"))
    # 02:30 does not exist on 29 March (02:00 CET -> 03:00 CEST): it fires once, at 03:00 CEST.
    assert [iso_utc(t) for t in spring] == [
        "2026-03-28T01:30:00.000Z",  # 02:30 CET
        "2026-03-29T01:00:00.000Z",  # 03:00 CEST
        "2026-03-30T00:30:00.000Z",  # 02:30 CEST
    ]
    autumn, _ = spec.ticks_through(ms("2026-10-23T12:00:00Z"), ms("2026-10-26T12:00:00Z"))
    # 02:30 happens twice on 25 October (03:00 CEST -> 02:00 CET): it fires once, the first.
    assert [iso_utc(t) for t in autumn] == [
        "2026-10-24T00:30:00.000Z",
        "2026-10-25T00:30:00.000Z",
        "2026-10-26T01:30:00.000Z",
    ]


def test_an_interval_expression_ticks_through_the_repeated_hour() -> None:
    spec = schedule("half", "q", cron="*/30 * * * *", timezone="Europe/Berlin")
    ticks, count = spec.ticks_through(ms("2026-10-24T23:45:00Z"), ms("2026-10-25T02:00:00Z"))
    assert count == 5
    # 02:00 and 02:30 local, each twice: real time goes on, so does the schedule.
    assert [iso_utc(t)[11:16] for t in ticks] == ["00:00", "00:30", "01:00", "01:30", "02:00"]


def test_every_s_ticks_on_whole_multiples_since_the_epoch() -> None:
    spec = schedule("beat", "q", every_s=15)
    assert spec.next_tick_ms(ms("2026-01-01T00:00:07Z")) == ms("2026-01-01T00:00:15Z")
    ticks, count = spec.ticks_through(ms("2026-01-01T00:00:00Z"), ms("2026-01-01T00:01:00Z"))
    assert count == 4 and ticks[-1] == ms("2026-01-01T00:01:00Z")


def test_a_fixed_clock_runner_publishes_berlin_ticks_at_their_instants(store: Store) -> None:
    now = [0.0]
    spec = schedule("daily", "q", cron="30 2 * * *", timezone="Europe/Berlin", body="wake")
    stored(store, spec, ms("2026-03-27T12:00:00Z") / 1000)
    runner = Scheduler(store, clock=lambda: now[0])
    for instant in ("2026-03-28T01:29:59Z", "2026-03-28T01:30:00Z", "2026-03-29T00:59:59Z"):
        now[0] = ms(instant) / 1000
        runner.step()
    now[0] = ms("2026-03-29T01:00:01Z") / 1000
    runner.step()
    assert ticks_in(store) == [
        ("2026-03-28T01:30:00.000Z", None),
        ("2026-03-29T01:00:00.000Z", None),
    ]
    message = store.queue("q").get_one()
    assert message is not None and message.body == b"wake"
    assert message.headers["X-Schedule"] == "daily"


def test_a_long_idle_cron_schedule_costs_a_bounded_look_back() -> None:
    spec = schedule("secondly", "q", cron="* * * * * *")  # six fields: seconds last
    until = ms("2026-06-01T00:00:00Z")
    ticks, count = spec.ticks_through(until - 365 * 86_400_000, until)
    assert count == len(ticks) == MAX_TICKS_PER_STEP and ticks[-1] == until


def test_old_tick_records_are_removed_and_never_claimed_again(store: Store) -> None:
    t0 = ms("2026-05-01T10:00:00Z") / 1000
    now = [t0]
    stored(store, schedule("beat", "q", every_s=1), t0)
    runner = Scheduler(store, clock=lambda: now[0])
    for second in range(1, 101):
        now[0] = t0 + second
        runner.step()
    files = ScheduleFiles(store.root)
    records = files.ticks("beat")
    assert len(records) <= 2 * KEEP_TICKS  # bounded: the oldest finished ones went
    floor = files.floor("beat")
    assert floor >= round((t0 + 100) * 1000) - 2 * KEEP_TICKS * 1000
    assert min(records) > floor
    # A runner with a stale view (it listed before the clean-up) claims a removed tick: no.
    assert not runner._claim("beat", floor, 0, "tick", 0)
    assert not os.path.exists(files.claim_path("beat", floor, 0))
    published = [t for t, _ in ticks_in(store)]
    assert len(published) == 100 == len(set(published))


# -- missed ticks -------------------------------------------------------------------------------


@pytest.mark.parametrize("missed", ["skip", "once"])
def test_missed_ticks_follow_the_policy(store: Store, missed: str) -> None:
    t0 = ms("2026-05-01T10:00:00Z") / 1000
    now = [t0]
    stored(store, schedule("beat", "q", every_s=10, missed=missed), t0)
    runner = Scheduler(store, clock=lambda: now[0], late_s=5)
    now[0] = t0 + 10.5
    runner.step()
    now[0] = t0 + 65  # no runner for a while: ticks 20..50 are over 5 s late, 60 is not
    runner.step()
    now[0] = t0 + 70.2
    runner.step()
    got = [(ms(t) / 1000 - t0, n) for t, n in ticks_in(store)]
    if missed == "skip":
        assert got == [(10, None), (60, None), (70, None)]
    else:  # one message for the four missed, stamped with the latest of them
        assert got == [(10, None), (50, "4"), (60, None), (70, None)]
    status = Schedules(store).status("beat", now_s=now[0])
    assert status.last_tick_ms == round((t0 + 70) * 1000)
    assert status.next_tick_ms == round((t0 + 80) * 1000)


def test_a_paused_schedule_publishes_nothing_and_resumes_at_the_next_tick(store: Store) -> None:
    schedules = Schedules(store)
    schedules.put(schedule("beat", "q", every_s=1, paused=True))
    assert schedules.status("beat").next_tick_ms is None
    with schedules.scheduler():
        schedules.resume("beat")
        wait_until(lambda: len(ticks_in(store)) >= 2, what="two ticks after the resume")
        schedules.pause("beat")
    published = len(ticks_in(store))
    Scheduler(store).step()  # paused: no runner publishes anything more
    assert len(ticks_in(store)) == published


# -- a runner killed at the worst instant -------------------------------------------------------


@pytest.mark.parametrize("event", ["claimed", "published"])
def test_a_tick_claimed_by_a_killed_runner_is_published_once(store: Store, event: str) -> None:
    Schedules(store).put(schedule("beat", "q", every_s=1, body="b"))
    worker = spawn(store.root, event, module="tests.support.schedule_workers")
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == -9, out
    _name, tick_text = out.split()
    tick = int(tick_text)
    files = ScheduleFiles(store.root)
    records = files.ticks("beat")[tick]
    assert records.done is None and list(records.claims) == [0]  # claimed, never finished
    before = [t for t, _ in ticks_in(store)]
    assert before.count(iso_utc(tick)) == (1 if event == "published" else 0)
    Scheduler(store).step()  # another runner: the claimer is dead, so it takes the tick over
    records = files.ticks("beat")[tick]
    assert records.done is not None and 1 in records.claims
    published = [t for t, _ in ticks_in(store)]
    assert published.count(iso_utc(tick)) == 1
    assert len(published) == len(set(published))


def test_a_claim_from_another_host_is_taken_over_once_stale(store: Store) -> None:
    t0 = ms("2026-05-01T10:00:00Z") / 1000
    now = [t0 + 1.2]
    stored(store, schedule("beat", "q", every_s=1), t0)
    files = ScheduleFiles(store.root)
    tick = round((t0 + 1) * 1000)
    elsewhere = ProcessIdentity(host_tag("another-host"), 4026531836, 4242, 77)
    claim = files.claim_path("beat", tick, 0)
    assert files.create(claim, {"by": elsewhere.token(), "kind": "tick", "missed": 0})
    os.utime(claim, (t0 + 1, t0 + 1))
    runner = Scheduler(store, clock=lambda: now[0])
    runner.step()  # its liveness cannot be seen from here: it is given time
    assert files.ticks("beat")[tick].done is None and ticks_in(store) == []
    now[0] = t0 + 1 + STALE_CLAIM_S + 1
    runner.step()
    assert files.ticks("beat")[tick].done is not None
    assert [t for t, _ in ticks_in(store)].count(iso_utc(tick)) == 1


def test_a_tick_that_can_never_be_published_is_recorded_not_retried(store: Store) -> None:
    t0 = ms("2026-05-01T10:00:00Z") / 1000
    now = [t0 + 1.1]
    stored(store, schedule("big", "q", every_s=1, body="x" * 2000), t0)
    store.configure("q", max_message_bytes=1024)  # the queue no longer takes its body
    runner = Scheduler(store, clock=lambda: now[0])
    runner.step()
    files = ScheduleFiles(store.root)
    done = read_record(files.ticks("big")[round((t0 + 1) * 1000)].done)
    assert "1024" in str(done["error"]) and "message_id" not in done
    status = Schedules(store).status("big", now_s=now[0])
    assert status.last_tick_ms == round((t0 + 1) * 1000) and status.last_message_id is None
    assert ticks_in(store) == []


# -- the library and the CLI --------------------------------------------------------------------


def test_library_crud_and_refusals(store: Store) -> None:
    schedules = Schedules(store)
    spec = schedules.put(schedule("nightly", "q", cron="0 3 * * *", timezone="Europe/Berlin"))
    assert schedules.get("nightly").cron == "0 3 * * *" and spec.created_s > 0
    assert [s.name for s in schedules.list()] == ["nightly"]
    assert schedules.pause("nightly").paused and not schedules.resume("nightly").paused
    with pytest.raises(QueueNotFound):
        schedules.put(schedule("x", "absent", every_s=5))
    with pytest.raises(InvalidName):
        schedule("a.json", "q", every_s=5)
    with pytest.raises(InvalidArgument, match="cron expression"):
        schedule("x", "q", cron="61 * * * *")
    with pytest.raises(InvalidArgument, match="time zone"):
        schedule("x", "q", cron="0 * * * *", timezone="Mars/Olympus")
    with pytest.raises(InvalidArgument, match="exactly one"):
        schedule("x", "q", cron="0 * * * *", every_s=5)
    with pytest.raises(InvalidArgument, match="set by the scheduler"):
        schedule("x", "q", every_s=5, headers={"X-Schedule-Tick": "now"})
    Path(ScheduleFiles(store.root).spec_path("nightly")).write_text('{"queue": 3}')
    with pytest.raises(CorruptConfig, match="fsck"):
        schedules.get("nightly")
    assert schedules.list() == []  # left out (fsck reports it), never fatal to a runner
    Scheduler(store).step()
    schedules.put(schedule("nightly", "q", cron="0 3 * * *"))  # a put replaces a damaged one
    schedules.delete("nightly")
    with pytest.raises(ScheduleNotFound):
        schedules.get("nightly")
    assert not os.path.exists(ScheduleFiles(store.root).ticks_dir("nightly"))


def test_cli_schedule_commands(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    root = ["--root", store.root]
    args = ["--every", "1m", "--body", "hi", "--header", "X-Attr-Kind: beat", "--missed", "once"]
    assert cli(["schedule", "put", *root, "beat", "q", *args]) == 0
    assert "beat queue=q every=60s missed=once active" in capsys.readouterr().out
    assert cli(["schedule", "pause", *root, "beat"]) == 0
    assert "paused" in capsys.readouterr().out
    assert cli(["schedule", "list", *root, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["paused"] is True and listed["headers"] == {"X-Attr-Kind": "beat"}
    assert cli(["schedule", "resume", *root, "beat"]) == 0
    capsys.readouterr()
    assert cli(["schedule", "show", *root, "beat"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["next_tick"] is not None and shown["body"] == "hi"
    assert cli(["schedule", "delete", *root, "beat"]) == 0
    assert cli(["schedule", "show", *root, "beat"]) == 3  # not found
    assert cli(["schedule", "put", *root, "x", "q", "--cron", "bad"]) == 2


# -- fsck ---------------------------------------------------------------------------------------


def test_fsck_clean_then_dirty_then_repaired(store: Store) -> None:
    assert check_schedules(store.root) is None  # no @schedules yet
    schedules = Schedules(store)
    schedules.put(schedule("beat", "q", every_s=1))
    Scheduler(store, clock=lambda: 2e9).step()
    report = check_schedules(store.root)
    assert report is not None and report.ok and report.findings == []
    files = ScheduleFiles(store.root)
    for path, text in (
        (Path(files.base, "broken.json"), "{not json"),
        (Path(files.base, "stray.txt"), "?"),
        (Path(files.ticks_dir("beat"), "000000000000001.done"), ""),
        (Path(files.ticks_dir("beat"), "notes"), "?"),
    ):
        path.write_text(text)
        path.chmod(0o600)  # the root's access: only what fsck of @schedules finds is found
    orphan = Path(files.base, "gone")
    orphan.mkdir(mode=0o700)
    os.utime(orphan, (1e9, 1e9))
    report = check_schedules(store.root)
    assert report is not None and not report.ok
    assert sorted(f.kind for f in report.findings) == [
        "bad-record",
        "bad-schedule",
        "foreign",
        "foreign",
        "orphan",
    ]
    assert cli(["fsck", "--root", store.root]) == 8  # problems left
    repaired = check_schedules(store.root, repair=True)
    assert repaired is not None and repaired.ok
    again = check_schedules(store.root)
    assert again is not None and again.ok and again.findings == []
    assert cli(["fsck", "--root", store.root]) == 0


# -- the native API -----------------------------------------------------------------------------

OPS, KEEPER, VIEWER, OTHER = (new_token() for _ in range(4))
CREDENTIALS = (
    everything("ops", OPS)
    + principal("keeper", KEEPER, admin=["orders*"])
    + principal("viewer", VIEWER, browse=["orders*"])
    + principal("other", OTHER, admin=["billing*"])
)
server = serve(credentials=CREDENTIALS)


def as_(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_http_crud_with_permissions(server: ServerProcess) -> None:
    url = server.url
    with httpx.Client(base_url=url, timeout=30) as http:
        for queue in ("orders-1", "billing-1"):
            assert http.put(f"/{queue}", headers=as_(OPS)).status_code in (200, 201)
        spec = {"queue": "orders-1", "every_s": 1, "body": "tick", "headers": {"X-Attr-A": "1"}}
        assert http.put("/@schedules/beat", json=spec).status_code == 401
        for token in (VIEWER, OTHER):
            answer = http.put("/@schedules/beat", json=spec, headers=as_(token))
            assert answer.status_code == 403, answer.text
        made = http.put("/@schedules/beat", json=spec, headers=as_(KEEPER))
        assert made.status_code == 201, made.text
        assert made.json()["next_tick"].endswith("Z")
        assert http.put("/@schedules/beat", json=spec, headers=as_(KEEPER)).status_code == 200
        moved = {**spec, "queue": "billing-1"}  # admin on both queues needed
        assert http.put("/@schedules/beat", json=moved, headers=as_(KEEPER)).status_code == 403
        assert http.put("/@schedules/beat", json=moved, headers=as_(OTHER)).status_code == 403
        bad = http.put("/@schedules/beat", json={**spec, "missed": "twice"}, headers=as_(KEEPER))
        assert bad.status_code == 400 and "missed" in bad.json()["message"]
        assert http.put("/@schedules/a.b", json=spec, headers=as_(OPS)).status_code == 400
        # Seeing takes browse on the queue: the list shows only those.
        assert [
            s["name"] for s in http.get("/@schedules", headers=as_(VIEWER)).json()["schedules"]
        ] == ["beat"]
        assert http.get("/@schedules", headers=as_(OTHER)).json() == {"schedules": []}
        assert http.get("/@schedules/beat", headers=as_(OTHER)).status_code == 403

        # The server runs it: a message arrives with the tick's headers.
        def delivered() -> httpx.Response | None:
            got = http.get("/orders-1/messages", headers=as_(OPS))
            return got if got.status_code == 200 else None

        message = wait_until(delivered, what="a scheduled message")
        assert (
            message is not None
            and message.content == b"tick"
            and message.headers["X-Schedule"] == "beat"
        )
        assert message.headers["X-Schedule-Tick"].endswith(".000Z")
        assert message.headers["X-Attr-A"] == "1"
        shown = wait_until(
            lambda: (
                (s := http.get("/@schedules/beat", headers=as_(VIEWER)).json())["last_tick"] and s
            ),
            what="a last tick",
        )
        assert shown["last_message_id"] and shown["queue"] == "orders-1"
        assert http.delete("/@schedules/beat", headers=as_(VIEWER)).status_code == 403
        assert http.delete("/@schedules/beat", headers=as_(KEEPER)).status_code == 204
        assert http.get("/@schedules/beat", headers=as_(OPS)).status_code == 404
        assert http.post("/@schedules", headers=as_(OPS)).status_code == 405
        assert http.get("/@schedules?x=1", headers=as_(OPS)).status_code == 400


def test_cli_runner_is_a_library_process(store: Store) -> None:
    """`dirmq schedule run` runs the root's schedules until SIGTERM."""
    Schedules(store).put(schedule("beat", "q", every_s=1))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dirmq", "schedule", "run", "--root", store.root],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: len(ticks_in(store)) >= 1, what="a tick from `dirmq schedule run`")
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert proc.returncode == 0


@pytest.mark.parametrize("encoded", ["not base64!", "\u0080", "é=="])
def test_a_body_base64_that_is_not_base64_is_a_clear_error(encoded: str) -> None:
    """Found by the OpenAPI fuzz: a character beyond ASCII made the decoder raise ValueError,
    which the server answered 500."""
    from dirmq.schedules.model import schedule_from_json

    with pytest.raises(InvalidArgument, match="not valid base64"):
        schedule_from_json("s", {"queue": "q", "every_s": 60, "body_base64": encoded})
