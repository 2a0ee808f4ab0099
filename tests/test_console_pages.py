"""The web console's pages and actions over HTTP on a real open `dirmq serve` (issue 33): the
overview (filter, sort, pages, an ETag'd live fragment), a queue, its messages in every state
browsed without leasing, one message and its raw file, and each action; the safe preview and
the overview's census that does not list a settled @ready again."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

import dirmq
from dirmq.console.preview import PREVIEW_BYTES, preview
from dirmq.store import QueueConfig, QueueStats
from dirmq.store.census import Census, census

from .support.servers import ServerProcess, fresh

XSS = "<img src=x onerror=alert(1)>"


@pytest.fixture
def ui(module_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=module_server.url, timeout=30) as browser:
        yield browser


def csrf(ui: httpx.Client, path: str = "/ui/") -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', ui.get(path).text)
    if found is None:  # the overview of an open server has no form: the body attribute has it
        found = re.search(r'data-csrf="([0-9a-f]+)"', ui.get(path).text)
    assert found
    return found.group(1)


def names_in(directory: Path) -> list[str]:
    return sorted(os.listdir(directory)) if directory.exists() else []


# -- overview --------------------------------------------------------------------------------------
def test_overview_filters_sorts_and_pages(ui: httpx.Client, module_lib: dirmq.Store) -> None:
    prefix = fresh("ov") + "-"
    for n in range(105):
        module_lib.create_queue(f"{prefix}{n:03d}")
    deep = module_lib.queue(f"{prefix}050")
    deep.put_many([b"x"] * 3)
    first = ui.get("/ui/", params={"prefix": prefix})
    assert first.status_code == 200
    assert "105 queues · page 1 of 2" in first.text
    assert f"{prefix}000" in first.text and f"{prefix}104" not in first.text
    second = ui.get("/ui/", params={"prefix": prefix, "page": "2"})
    assert f"{prefix}104" in second.text and f"{prefix}000<" not in second.text
    by_ready = ui.get("/ui/", params={"prefix": prefix, "sort": "ready", "desc": "1"})
    rows = re.findall(r'<tr data-queue="([^"]+)">', by_ready.text)
    assert rows[0] == f"{prefix}050"
    assert ui.get("/ui/", params={"sort": "bogus"}).status_code == 400


def test_overview_tells_the_server_facts(ui: httpx.Client, module_server: ServerProcess) -> None:
    page = ui.get("/ui/").text
    assert dirmq.__version__ in page
    assert str(module_server.root) in page
    assert "free disk" in page and "free inodes" in page


def test_the_live_table_has_an_etag_and_answers_304_unchanged(
    ui: httpx.Client, module_lib: dirmq.Store
) -> None:
    name = fresh("etag")
    queue = module_lib.create_queue(name)
    params = {"prefix": name, "part": "table"}
    answer = ui.get("/ui/", params=params)
    assert answer.status_code == 200
    assert "<html" not in answer.text and name in answer.text
    etag = answer.headers["etag"]
    again = ui.get("/ui/", params=params, headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert again.headers["content-security-policy"]
    queue.put(b"news")
    changed = ui.get("/ui/", params=params, headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag


def test_the_census_keeps_a_settled_ready_listing(tmp_path: Path) -> None:
    with dirmq.Store(tmp_path / "root") as store:
        queue = store.create_queue("deep")
        queue.put_many([b"x"] * 50)
        settled = time.time() - 10
        for directory in ("@ready", "@dead"):  # as if written long ago
            os.utime(Path(queue.path) / directory, (settled, settled))
        kept = Census(store.root, shared=False)
        [first] = list(kept.depths())
        listed = kept.listings
        [second] = list(kept.depths())
        counted = [census_of(d.stats) for d in (first, second, *census(store.root))]
        assert counted == [(50, 0, 0, 0)] * 3  # what `store.census` counts
        # @leased and @delayed again (small), but not @ready nor @dead
        assert kept.listings - listed == 2
        queue.put(b"one more")  # the directory changes: listed again
        [third] = list(kept.depths())
        assert third.stats.ready == 51
        shared = Census(store.root, shared=True)  # another host's renames may not touch an mtime
        for _ in range(2):
            before = shared.listings
            assert [d.stats.ready for d in shared.depths()] == [51]
            assert shared.listings - before == 4  # every state directory, every time


def census_of(stats: QueueStats) -> tuple[int, int, int, int]:
    return stats.ready, stats.in_flight, stats.delayed, stats.dead


# -- a queue ---------------------------------------------------------------------------------------
def test_queue_page_shows_counts_configuration_and_disk(
    ui: httpx.Client, module_lib: dirmq.Store
) -> None:
    name = fresh("q") + "/sub"
    queue = module_lib.create_queue(name, QueueConfig(metadata={"note": XSS}))
    queue.put_many([b"a", b"b"])
    page = ui.get(f"/ui/q/{quote(name, safe='')}")
    assert page.status_code == 200
    assert "@ready" in page.text and "@leased" in page.text
    assert '"visibility_timeout_s": 30.0' in page.text.replace("&#34;", '"')
    assert XSS not in page.text  # the metadata is escaped
    assert "&lt;img src=x onerror=alert(1)&gt;" in page.text
    assert ui.get("/ui/q/no-such-queue").status_code == 404


def test_configuration_is_saved_through_the_form(ui: httpx.Client, module_lib: dirmq.Store) -> None:
    name = fresh("conf")
    module_lib.create_queue(name)
    path = f"/ui/q/{name}"
    token = csrf(ui, path)
    answer = ui.post(
        f"{path}/configure", data={"csrf": token, "config": '{"visibility_timeout_s": 7}'}
    )
    assert answer.status_code == 303
    queue = module_lib.queue(name)
    queue.reload_config()
    assert queue.config.visibility_timeout_s == 7
    wrong = ui.post(f"{path}/configure", data={"csrf": token, "config": '{"nope": 1}'})
    assert wrong.status_code == 400 and "unknown configuration key" in wrong.text


# -- browsing --------------------------------------------------------------------------------------
def test_browsing_every_state_leases_nothing(ui: httpx.Client, module_lib: dirmq.Store) -> None:
    name = fresh("look")
    queue = module_lib.create_queue(name, QueueConfig(max_receives=5))
    queue.put_many([b"leased one", b"dead one", b"ready one"])
    queue.put(b"later", delay_s=600)
    leased = queue.get(2, visibility_s=600)
    queue.dead_letter(leased[1].receipt or "", "bad input")
    directory = Path(queue.path)
    corrupt = directory / "@corrupt"
    corrupt.mkdir(exist_ok=True)
    (corrupt / "broken-file").write_bytes(b"garbage")
    before = {s: names_in(directory / s) for s in ("@ready", "@leased", "@delayed", "@dead")}
    pages = {
        state: ui.get(f"/ui/q/{name}/browse", params={"state": state})
        for state in ("ready", "leased", "delayed", "dead", "corrupt")
    }
    for state, page in pages.items():
        assert page.status_code == 200, state
    assert "ready one" in pages["ready"].text
    assert "leased one" in pages["leased"].text and "lease ends" in pages["leased"].text
    assert "later" in pages["delayed"].text and " UTC" in pages["delayed"].text
    assert "rejected" in pages["dead"].text and "bad input" in pages["dead"].text
    assert "dead one" in pages["dead"].text
    assert "broken-file" in pages["corrupt"].text
    for message in leased[:1]:
        ui.get(f"/ui/q/{name}/m/{message.id}")
    after = {s: names_in(directory / s) for s in ("@ready", "@leased", "@delayed", "@dead")}
    assert after == before  # names carry receive counts and deadlines: nothing moved
    assert ui.get(f"/ui/q/{name}/browse", params={"state": "x"}).status_code == 400


def test_a_dead_letter_queue_shows_why_each_died_and_offers_their_redrive(
    ui: httpx.Client, module_lib: dirmq.Store
) -> None:
    dlq, jobs = fresh("dlq"), fresh("jobs")
    module_lib.create_queue(dlq)
    queue = module_lib.create_queue(jobs, QueueConfig(dead_letter_queue=dlq))
    queue.put(b"poison")
    (message,) = queue.get()
    queue.dead_letter(message.receipt or "", "no such sku")
    page = ui.get(f"/ui/q/{dlq}/browse", params={"state": "ready"}).text
    assert "<th>reason</th>" in page and "no such sku" in page and f"<td>{jobs}</td>" in page
    assert 'id="redrive-selected"' in page
    plain = ui.get(f"/ui/q/{jobs}/browse", params={"state": "ready"}).text
    assert "<th>reason</th>" not in plain and 'id="redrive-selected"' not in plain


def test_browsing_pages_by_cursor(ui: httpx.Client, module_lib: dirmq.Store) -> None:
    name = fresh("pages")
    queue = module_lib.create_queue(name)
    ids = queue.put_many([f"m{n}".encode() for n in range(105)])
    first = ui.get(f"/ui/q/{name}/browse").text
    assert ids[99] in first and ids[100] not in first
    cursor = re.search(r"after=([0-9a-f-]+)", first)
    assert cursor and cursor.group(1) == ids[99]
    second = ui.get(f"/ui/q/{name}/browse", params={"after": cursor.group(1)}).text
    assert ids[100] in second and ids[104] in second and ids[99] not in second


def test_a_hostile_body_and_header_are_shown_as_text(
    ui: httpx.Client, module_lib: dirmq.Store
) -> None:
    name = fresh("xss")
    queue = module_lib.create_queue(name)
    [message_id] = queue.put_many([dirmq.OutgoingMessage(XSS.encode(), {"X-Attr-Evil": XSS})])
    for path in (f"/ui/q/{name}/browse", f"/ui/q/{name}/m/{message_id}"):
        text = ui.get(path).text
        assert XSS not in text, path
        assert text.count("&lt;img src=x onerror=alert(1)&gt;") >= 2, path


def test_the_message_page_and_its_raw_file(ui: httpx.Client, module_lib: dirmq.Store) -> None:
    name = fresh("msg")
    queue = module_lib.create_queue(name)
    body = json.dumps({"a": [1, 2]}).encode()
    [message_id] = queue.put_many(
        [dirmq.OutgoingMessage(body, {"Content-Type": "application/json"})]
    )
    page = ui.get(f"/ui/q/{name}/m/{message_id}")
    assert page.status_code == 200
    on_disk = Path(queue.path) / "@ready" / message_id
    raw = on_disk.read_bytes()
    crc = re.search(rb"Body-CRC32: ([0-9a-f]{8})", raw)
    assert crc and crc.group(1).decode() in page.text
    assert f"{name}/@ready/{message_id}" in page.text
    assert '"a": [\n    1,' in page.text.replace("&#34;", '"')  # pretty-printed
    download = ui.get(f"/ui/q/{name}/m/{message_id}/raw")
    assert download.status_code == 200
    assert download.content == raw
    assert "attachment" in download.headers["content-disposition"]
    assert ui.get(f"/ui/q/{name}/m/0000000000000001-000000000000").status_code == 404


def test_preview_escapes_nothing_itself_and_cuts_what_is_long() -> None:
    assert preview(b'{"b":1}').kind == "json"
    assert preview(b'{"b":1}').text == '{\n  "b": 1\n}'
    assert preview(XSS.encode()) == preview(XSS.encode())
    assert preview(XSS.encode()).text == XSS  # the template escapes it
    binary = preview(bytes(range(256)))
    assert binary.kind == "binary" and binary.text.startswith("00000000  00 01 02")
    long = preview(b"a" * (PREVIEW_BYTES + 10))
    assert long.cut and len(long.text) == PREVIEW_BYTES and long.size == PREVIEW_BYTES + 10
    assert not preview(b"a" * (PREVIEW_BYTES + 10), None).cut
    assert preview("é".encode() * PREVIEW_BYTES).kind == "text"  # a character cut in two


# -- actions ---------------------------------------------------------------------------------------
def test_publish_a_test_message(ui: httpx.Client, module_lib: dirmq.Store) -> None:
    name = fresh("pub")
    queue = module_lib.create_queue(name)
    form = {
        "csrf": csrf(ui, f"/ui/q/{name}"),
        "body": "hello",
        "headers": "Content-Type: text/plain\nX-Attr-Who: console",
        "delay": "",
        "group": "g1",
    }
    answer = ui.post(f"/ui/q/{name}/publish", data=form)
    assert answer.status_code == 303 and "published" in answer.headers["location"]
    [got] = queue.get()
    assert got.body == b"hello" and got.group == "g1"
    assert got.headers["X-Attr-Who"] == "console"
    delayed = ui.post(f"/ui/q/{name}/publish", data={**form, "delay": "10m", "group": ""})
    assert delayed.status_code == 303
    assert queue.stats().delayed == 1
    bad = ui.post(f"/ui/q/{name}/publish", data={**form, "headers": "Host: x"})
    assert bad.status_code == 400


def test_purge_asks_for_the_queue_name(ui: httpx.Client, module_lib: dirmq.Store) -> None:
    name = fresh("purge")
    queue = module_lib.create_queue(name)
    queue.put_many([b"a", b"b", b"c"])
    page = ui.get(f"/ui/q/{name}")
    assert "Purge 3 messages" in page.text
    token = csrf(ui, f"/ui/q/{name}")
    wrong = ui.post(f"/ui/q/{name}/purge", data={"csrf": token, "confirm": "other"})
    assert wrong.status_code == 400
    assert queue.stats().ready == 3
    right = ui.post(f"/ui/q/{name}/purge", data={"csrf": token, "confirm": name})
    assert right.status_code == 303 and "purged+3" in right.headers["location"]
    assert names_in(Path(queue.path) / "@ready") == []


def test_delete_and_redrive_selected_dead_letters(
    ui: httpx.Client, module_lib: dirmq.Store
) -> None:
    name = fresh("dead")
    queue = module_lib.create_queue(name)
    queue.put_many([b"d1", b"d2", b"d3"])
    for message in queue.get(3, max_per_group=None):
        queue.dead_letter(message.receipt or "", "no")
    dead = [m.id for m in queue.browse(state="dead")]
    token = csrf(ui, f"/ui/q/{name}")
    deleted = ui.post(f"/ui/q/{name}/delete", data={"csrf": token, "id": dead[0]})
    assert deleted.status_code == 303
    answer = ui.post(f"/ui/q/{name}/redrive", data={"csrf": token, "id": [dead[1]]})
    assert answer.status_code == 303
    task_page = answer.headers["location"].split("?")[0]
    assert "/redrive/" in task_page
    deadline = time.monotonic() + 10
    while queue.stats().ready != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [m.id for m in queue.browse()] == [dead[1]]
    assert [m.id for m in queue.browse(state="dead")] == [dead[2]]
    shown = ui.get(task_page)
    assert shown.status_code == 200 and "COMPLETED" in shown.text


def test_redrive_all_that_match_leaves_what_came_after_the_page(
    ui: httpx.Client, module_lib: dirmq.Store
) -> None:
    name = fresh("all")
    queue = module_lib.create_queue(name)
    queue.put_many([b"d1", b"d2"])
    for message in queue.get(2, max_per_group=None):
        queue.dead_letter(message.receipt or "", "no")
    page = ui.get(f"/ui/q/{name}/browse", params={"state": "dead"}).text
    newest = re.search(r'name="newest" value="([^"]+)"', page)
    drawn = re.search(r'name="drawn" value="([^"]+)"', page)
    assert newest and drawn
    shown = [m.id for m in queue.browse(state="dead")]
    queue.redrive([shown[0]])  # one the page showed comes back and dies again since
    [again] = queue.get()
    queue.dead_letter(again.receipt or "", "again")
    queue.put(b"late")  # and a new one dies after the page was drawn
    [late] = queue.get()
    queue.dead_letter(late.receipt or "", "no")
    token = csrf(ui, f"/ui/q/{name}")
    form = {"csrf": token, "all": "1", "newest": newest.group(1), "drawn": drawn.group(1)}
    answer = ui.post(f"/ui/q/{name}/redrive", data=form)
    assert answer.status_code == 303, answer.text
    deadline = time.monotonic() + 10
    while queue.stats().ready != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [m.id for m in queue.browse()] == [shown[1]]
    assert sorted(m.id for m in queue.browse(state="dead")) == sorted([shown[0], late.id])


def test_extend_and_release_a_lease_by_id(ui: httpx.Client, module_lib: dirmq.Store) -> None:
    name = fresh("lease")
    queue = module_lib.create_queue(name)
    queue.put(b"held")
    [held] = queue.get(visibility_s=60)
    token = csrf(ui, f"/ui/q/{name}")
    before = held.lease_deadline_s or 0
    extended = ui.post(
        f"/ui/q/{name}/lease", data={"csrf": token, "lease": held.id, "seconds": "600"}
    )
    assert extended.status_code == 303
    [still] = queue.browse(state="leased")
    assert (still.lease_deadline_s or 0) > before + 500
    released = ui.post(f"/ui/q/{name}/lease", data={"csrf": token, "id": held.id, "op": "release"})
    assert released.status_code == 303
    assert queue.stats().ready == 1 and queue.stats().in_flight == 0


def test_overview_shows_subscriptions_and_their_lag(
    ui: httpx.Client, module_lib: dirmq.Store
) -> None:
    from dirmq.pubsub.hub import PubSub

    hub = PubSub(module_lib)
    name = fresh("sub")
    subscription = hub.subscribe(name, channels=[name])
    subscription.close()
    for _ in range(3):
        hub.publish(name, b"x", mode="future")
    page = ui.get("/ui/").text
    row = re.search(
        rf"<tr><td>{name}</td><td>no</td><td class=\"n\">0</td><td class=\"n\">(\d+)", page
    )
    assert row, page[-2000:]
    assert int(row.group(1)) >= 3


def test_bad_paths_and_forms_are_refused_in_words(ui: httpx.Client) -> None:
    assert ui.get("/ui/q/%ff").status_code == 400
    assert ui.get("/ui/q/%2E%2E").status_code == 400
    assert ui.get("/ui/q/x/nowhere").status_code == 404
    assert ui.get("/ui/nowhere").json()["error"] == "InvalidName"  # the API's: reserved
    assert ui.get("/ui/q/x/m/not-an-id").status_code == 404
    token = csrf(ui)
    assert ui.post("/ui/q/%ff/purge", data={"csrf": token}).status_code == 400
    answer = ui.post("/ui/q/x/purge", content=b"{}", headers={"Content-Type": "application/json"})
    assert answer.status_code == 400 and "forms" in answer.text


def test_a_redrive_can_be_paced_and_cancelled(ui: httpx.Client, module_lib: dirmq.Store) -> None:
    name = fresh("paced")
    queue = module_lib.create_queue(name)
    queue.put_many([f"d{n}".encode() for n in range(30)])
    for message in queue.get(30, max_per_group=None):
        queue.dead_letter(message.receipt or "", "no")
    dead = [m.id for m in queue.browse(state="dead")]
    token = csrf(ui, f"/ui/q/{name}")
    form = {"csrf": token, "id": dead, "rate": "4"}
    answer = ui.post(f"/ui/q/{name}/redrive", data=form)
    assert answer.status_code == 303, answer.text
    task_id = answer.headers["location"].split("?")[0].rsplit("/", 1)[1]
    cancelled = ui.post(f"/ui/q/{name}/cancel", data={"csrf": token, "task": task_id})
    assert cancelled.status_code == 303
    page = ui.get(f"/ui/q/{name}/redrive/{task_id}")
    assert re.search(r"CANCEL(LING|LED)", page.text), page.text[-1500:]
    assert queue.stats().dead > 0  # paced at 4 a second: far from all moved
    bad = ui.post(f"/ui/q/{name}/redrive", data={**form, "rate": "fast"})
    assert bad.status_code == 400
