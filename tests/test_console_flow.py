"""The console shows issue 36's features, over HTTP on real `dirmq serve`s: the overview's
badges (paused, levels, rate, TTL) and its "paused only" filter; a queue's delivery card
(paused, rate limit, TTL, ready per priority level) and its Pause / Resume button; the
schedules page (last and next tick) with pause, resume and delete; a message's priority and
TTL deadline, and the `ttl-expired` dead letter. Who may do what is checked on a server with
credentials: a principal without `admin` sees no button, and its forged POST is refused."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

import dirmq
from dirmq.console.queue_flags import FlagsCache
from dirmq.schedules import Schedules, schedule
from dirmq.server.credentials import new_token
from dirmq.store import OutgoingMessage, QueueConfig

from .support.console import signed_in
from .support.fixtures import serve
from .support.principals import everything, principal
from .support.servers import ServerProcess, fresh
from .support.waiting import wait_until

XSS = "<img src=x onerror=alert(1)>"
OPS, VIEWER, WORKER = new_token(), new_token(), new_token()
CREDENTIALS = (
    everything("ops", OPS)
    + principal("viewer", VIEWER, browse=["shop*"])
    + principal("worker", WORKER, read=["shop*"], write=["shop*"])
)

guarded = serve(credentials=CREDENTIALS, name="guarded")


@pytest.fixture
def ui(module_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=module_server.url, timeout=30) as browser:
        yield browser


@pytest.fixture(scope="module")
def guarded_lib(guarded: ServerProcess) -> Iterator[dirmq.Store]:
    with dirmq.Store(guarded.root, create=False) as store:
        yield store


def csrf(ui: httpx.Client, path: str = "/ui/") -> str:
    text = ui.get(path).text
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', text) or re.search(
        r'data-csrf="([0-9a-f]+)"', text
    )
    assert found
    return found.group(1)


def row_of(page: str, name: str) -> str:
    found = re.search(rf'<tr data-queue="{re.escape(name)}">(.*?)</tr>', page, re.S)
    assert found, name
    return found.group(1)


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


# -- overview --------------------------------------------------------------------------------------
def test_the_overview_shows_flow_badges_and_finds_paused_queues(
    ui: httpx.Client, module_lib: dirmq.Store
) -> None:
    prefix = fresh("badge") + "-"
    held, plain = prefix + "held", prefix + "plain"
    module_lib.create_queue(
        held,
        QueueConfig(paused=True, priority_levels=3, delivery_rate_per_s=2.5, message_ttl_s=90),
    )
    module_lib.create_queue(plain)
    page = ui.get("/ui/", params={"prefix": prefix}).text
    badges = text_of(row_of(page, held))
    assert "paused" in badges and "3 levels" in badges and "≤ 2.5/s" in badges
    assert "TTL 90 s" in badges
    assert text_of(row_of(page, plain)) == plain + " 0 0 0 0 - - -"
    assert 'id="paused-queues"' in page and "1 paused" in page
    only = ui.get("/ui/", params={"prefix": prefix, "paused": "1"}).text
    assert re.findall(r'<tr data-queue="([^"]+)">', only) == [held]
    assert "1 paused queue · page 1 of 1" in only
    # the live table keeps the filter in its own link
    table = ui.get("/ui/", params={"prefix": prefix, "paused": "1", "part": "table"}).text
    assert re.findall(r'<tr data-queue="([^"]+)">', table) == [held]
    module_lib.configure(held, paused=False)
    assert "no paused queues" in ui.get("/ui/", params={"prefix": prefix, "paused": "1"}).text


def test_the_flags_are_read_again_only_when_the_configuration_changes(tmp_path: Path) -> None:
    with dirmq.Store(tmp_path / "root") as store:
        store.create_queue("q")
        cache = FlagsCache(store.root)
        assert not cache.flags("q").paused
        assert not cache.flags("q").paused
        assert cache.reads == 1  # a stat the second time, no read
        store.configure("q", paused=True, delivery_rate_per_s=4)
        flags = cache.flags("q")
        assert flags.paused and flags.delivery_rate_per_s == 4 and cache.reads == 2
        (Path(store.root) / "q" / "@queue.json").write_text("{not json")
        assert cache.flags("q").unreadable


# -- a queue ---------------------------------------------------------------------------------------
def test_the_queue_page_shows_levels_rate_and_ttl(
    ui: httpx.Client, module_lib: dirmq.Store
) -> None:
    name = fresh("levels")
    queue = module_lib.create_queue(
        name,
        QueueConfig(
            priority_levels=3, delivery_rate_per_s=10, message_ttl_s=3600, visibility_timeout_s=1
        ),
    )
    # 1,500 of level 1: past @ready's 1,000, so some are counted in the backlog's tree
    queue.put_many([OutgoingMessage(b"low")] * 3 + [OutgoingMessage(b"mid", priority=1)] * 1500)
    queue.put_many([OutgoingMessage(b"high", priority=2)] * 2)
    assert (Path(queue.path) / "@backlog" / "p1").is_dir()
    page = ui.get(f"/ui/q/{name}").text
    levels = dict(re.findall(r'<tr data-level="(\d)"><td>[^<]*</td><td class="n">(\d+)</td>', page))
    assert levels == {"2": "2", "1": "1500", "0": "3"}
    assert page.index('data-level="2"') < page.index('data-level="0"')  # first out on top
    assert "10 messages/s" in text_of(page)
    assert "60 min by default, then dead-lettered (ttl-expired)" in text_of(page)
    assert 'id="pause-resume"' in page and "Pause deliveries" in page
    # an expired lease is ready again, at its own level: the counts still sum to `stats`
    [taken] = queue.get(visibility_s=0.05)
    assert taken.priority == 2
    time.sleep(0.1)
    assert queue.ready_by_level() == {0: 3, 1: 1500, 2: 2}
    assert sum(queue.ready_by_level().values()) == queue.stats().ready
    plain = fresh("plain")
    module_lib.create_queue(plain)
    assert 'id="levels"' not in ui.get(f"/ui/q/{plain}").text


def test_pause_and_resume_from_the_queue_page(
    ui: httpx.Client, module_lib: dirmq.Store, module_server: ServerProcess
) -> None:
    name = fresh("pause")
    module_lib.create_queue(name)
    path = f"/ui/q/{name}"
    token = csrf(ui, path)
    paused = ui.post(f"{path}/pause", data={"csrf": token, "op": "pause"})
    assert paused.status_code == 303
    page = ui.get(paused.headers["location"]).text
    assert "paused: nothing is delivered until it is resumed" in page
    assert "Resume deliveries" in page and 'class="badge paused"' in page
    assert module_lib.queue(name).config.paused or _reloaded(module_lib, name).paused
    with httpx.Client(base_url=module_server.url, timeout=30) as api:
        assert api.post(f"/{name}/messages", content=b"held back").status_code == 201
        assert api.get(f"/{name}/messages").status_code == 204  # nothing delivered
        resumed = ui.post(f"{path}/pause", data={"csrf": token, "op": "resume"})
        assert resumed.status_code == 303 and not _reloaded(module_lib, name).paused
        delivered = api.get(f"/{name}/messages", params={"wait": "5s"})
        assert delivered.status_code == 200 and delivered.content == b"held back"
    assert ui.post(f"{path}/pause", data={"op": "pause"}).status_code == 403  # no CSRF token
    wrong = ui.post(f"{path}/pause", data={"csrf": token, "op": "stop"})
    assert wrong.status_code == 400 and "pause or resume" in wrong.text
    assert not _reloaded(module_lib, name).paused


def _reloaded(store: dirmq.Store, name: str) -> QueueConfig:
    queue = store.queue(name)
    queue.reload_config()
    return queue.config


# -- messages --------------------------------------------------------------------------------------
def test_messages_show_their_priority_and_ttl_and_a_ttl_expired_dead_letter(
    ui: httpx.Client, module_lib: dirmq.Store
) -> None:
    name = fresh("ttl")
    queue = module_lib.create_queue(name, QueueConfig(priority_levels=4))
    [urgent, later] = queue.put_many(
        [OutgoingMessage(b"urgent", priority=3, ttl_s=600), OutgoingMessage(b"later")]
    )
    browse = ui.get(f"/ui/q/{name}/browse", params={"state": "ready"}).text
    assert "<th" in browse and ">priority</th>" in browse and ">expires</th>" in browse
    assert re.search(rf"{urgent}.*?<td class=\"n priority\">3</td>", browse, re.S)
    assert re.search(rf"{later}.*?<td class=\"n priority\">0</td>", browse, re.S)
    message = ui.get(f"/ui/q/{name}/m/{urgent}").text
    assert re.search(r'id="priority">3 \(levels 0 to 3', message)
    expires = re.search(r'id="expires">([^<]*)<', message)
    assert expires and " UTC (in 10 min): not delivered after it" in expires.group(1)
    # a message past its TTL is dead-lettered by the get that reaches it, never delivered
    short = queue.put(b"too late", ttl_s=0.01)
    time.sleep(0.05)
    got = [m.id for m in queue.get(3, visibility_s=600)]
    assert short not in got
    dead = ui.get(f"/ui/q/{name}/browse", params={"state": "dead"}).text
    assert short in dead and "<td>ttl-expired</td>" in dead
    plain = fresh("plainmsg")
    module_lib.create_queue(plain).put(b"x")
    listing = ui.get(f"/ui/q/{plain}/browse").text
    assert ">priority</th>" not in listing and ">expires</th>" not in listing


# -- schedules -------------------------------------------------------------------------------------
def test_the_schedules_page_shows_last_and_next_tick_and_changes_them(
    ui: httpx.Client, module_lib: dirmq.Store
) -> None:
    target, other = fresh("ticks"), fresh("other")
    module_lib.create_queue(target)
    module_lib.create_queue(other)
    schedules = Schedules(module_lib)
    every = fresh("every")
    nightly = fresh("nightly")
    schedules.put(schedule(every, target, every_s=1, body=XSS, headers={"X-Attr-Kind": "beat"}))
    schedules.put(
        schedule(nightly, other, cron="30 2 * * *", timezone="Europe/Berlin", missed="once")
    )
    # the server runs schedules: wait for a tick it published
    wait_until(lambda: schedules.status(every).last_tick_ms is not None, 15, "a first tick")
    status = schedules.status(every)
    page = ui.get("/ui/schedules").text
    row = re.search(rf'<tr id="s-{every}" data-schedule="{every}">(.*?)</tr>', page, re.S)
    assert row
    shown = text_of(row.group(1))
    assert re.match(rf"{every} changed \d+ s ago {target} every 1 s - skip running ", shown)
    assert "published" in shown and " ago" in shown and " UTC" in shown
    assert status.last_message_id is not None
    assert f"/ui/q/{target}/m/" in row.group(1)  # a link to the message the tick published
    assert XSS not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "X-Attr-Kind" in row.group(1)
    night = re.search(rf'data-schedule="{nightly}">(.*?)</tr>', page, re.S)
    assert night
    assert f"{other} cron 30 2 * * * Europe/Berlin once running none yet" in text_of(night.group(1))
    # one queue's, and the queue's page lists them too
    one = ui.get("/ui/schedules", params={"queue": target}).text
    assert every in one and nightly not in one
    queue_page = ui.get(f"/ui/q/{target}").text
    assert f'data-schedule="{every}"' in queue_page and nightly not in queue_page
    # pause, resume, delete (its name typed)
    token = csrf(ui, "/ui/schedules")
    answer = ui.post(f"/ui/schedules/{every}/pause", data={"csrf": token})
    assert answer.status_code == 303 and answer.headers["location"].endswith(f"#s-{every}")
    assert schedules.get(every).paused
    paused_row = ui.get(answer.headers["location"]).text
    assert "Resume" in paused_row and f"paused schedule {every}" in paused_row
    assert ui.post(f"/ui/schedules/{every}/resume", data={"csrf": token}).status_code == 303
    assert not schedules.get(every).paused
    refused = ui.post(f"/ui/schedules/{every}/delete", data={"csrf": token, "confirm": "nope"})
    assert refused.status_code == 400 and "nothing was removed" in refused.text
    back = f"/ui/q/{quote(target, safe='')}"
    deleted = ui.post(
        f"/ui/schedules/{every}/delete", data={"csrf": token, "confirm": every, "back": back}
    )
    assert deleted.status_code == 303 and deleted.headers["location"].startswith(back + "?note=")
    assert every not in schedules.names()
    assert ui.post(f"/ui/schedules/{every}/pause", data={"csrf": token}).status_code == 404
    assert ui.post(f"/ui/schedules/{nightly}/stop", data={"csrf": token}).status_code == 400
    assert ui.post(f"/ui/schedules/{nightly}/pause", data={}).status_code == 403  # no CSRF
    foreign = {"Origin": "https://evil.example"}
    forged = ui.post(f"/ui/schedules/{nightly}/pause", data={"csrf": token}, headers=foreign)
    assert forged.status_code == 403 and not schedules.get(nightly).paused
    offsite = ui.post(
        f"/ui/schedules/{nightly}/pause", data={"csrf": token, "back": "//evil.example/"}
    )
    assert offsite.headers["location"].startswith("/ui/schedules?")
    schedules.delete(nightly)


def test_schedules_are_reachable_from_the_nav(ui: httpx.Client) -> None:
    assert 'href="/ui/schedules"' in ui.get("/ui/").text
    assert "no schedules" in ui.get("/ui/schedules", params={"queue": fresh("none")}).text
    assert ui.get("/ui/schedules", params={"queue": "bad//name"}).status_code == 400


# -- who may do what -------------------------------------------------------------------------------
def test_only_an_admin_sees_and_uses_pause(
    guarded: ServerProcess, guarded_lib: dirmq.Store
) -> None:
    name = fresh("shop")
    guarded_lib.create_queue(name)
    path = f"/ui/q/{name}"
    for token in (VIEWER, WORKER):
        with signed_in(guarded, token) as browser:
            page = browser.get(path)
            assert page.status_code == 200
            assert 'id="pause-resume"' not in page.text  # the card is there, the button not
            assert 'id="queue-state"' in page.text
            forged = browser.post(
                f"{path}/pause", data={"csrf": csrf(browser, path), "op": "pause"}
            )
            assert forged.status_code == 403
    assert not _reloaded(guarded_lib, name).paused
    with signed_in(guarded, OPS) as browser:
        assert 'id="pause-resume"' in browser.get(path).text
        answer = browser.post(f"{path}/pause", data={"csrf": csrf(browser, path), "op": "pause"})
        assert answer.status_code == 303
    assert _reloaded(guarded_lib, name).paused
    with signed_in(guarded, VIEWER) as browser:  # the paused state is no secret to a viewer
        assert "badge paused" in browser.get("/ui/", params={"prefix": name}).text


def test_schedules_are_shown_and_changed_as_the_api_allows(
    guarded: ServerProcess, guarded_lib: dirmq.Store
) -> None:
    shop, hidden = fresh("shop"), fresh("back")
    guarded_lib.create_queue(shop)
    guarded_lib.create_queue(hidden)
    schedules = Schedules(guarded_lib)
    mine, theirs = fresh("mine"), fresh("theirs")
    schedules.put(schedule(mine, shop, every_s=3600))
    schedules.put(schedule(theirs, hidden, every_s=3600))
    for token in (VIEWER, WORKER):
        with signed_in(guarded, token) as browser:
            page = browser.get("/ui/schedules").text
            assert f'data-schedule="{mine}"' in page and theirs not in page  # as GET /@schedules
            assert "pause-schedule" not in page and "delete-schedule" not in page
            token_ = csrf(browser, "/ui/schedules")
            for op in ("pause", "delete"):
                forged = browser.post(
                    f"/ui/schedules/{mine}/{op}", data={"csrf": token_, "confirm": mine}
                )
                assert forged.status_code == 403, op
            api = httpx.get(
                f"{guarded.url}/@schedules", headers={"Authorization": f"Bearer {token}"}
            )
            assert [s["name"] for s in api.json()["schedules"]] == [mine]
    assert not schedules.get(mine).paused and mine in schedules.names()
    with signed_in(guarded, OPS) as browser:
        page = browser.get("/ui/schedules").text
        assert "pause-schedule" in page and theirs in page
        answer = browser.post(
            f"/ui/schedules/{theirs}/pause", data={"csrf": csrf(browser, "/ui/schedules")}
        )
        assert answer.status_code == 303
    assert schedules.get(theirs).paused
    for name in (mine, theirs):
        schedules.delete(name)
