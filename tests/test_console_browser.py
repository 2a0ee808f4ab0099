"""The web console in a real browser (issue 33; tests/support/browser.py: Debian's chromium driven
by
Playwright, one for the session). Each test's page fails it at teardown on any CSP violation,
console error, uncaught exception or dialog (`page_log`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

import dirmq
from dirmq.client import RemoteStore
from dirmq.schedules import Schedules, schedule
from dirmq.server.credentials import new_token, token_digest
from dirmq.store import QueueConfig

from .support.fixtures import serve
from .support.metrics_helpers import matching
from .support.servers import ServerProcess, fresh, start_server

try:
    from playwright.sync_api import Browser, Page, expect

    from .support.browser import PageLog
except ImportError as missing:  # the harness lands with the vendored assets (issue 33)
    pytest.skip(f"no browser harness: {missing}", allow_module_level=True)

XSS = "<img src=x onerror=alert(1)>"
SHOTS = Path(__file__).parent.parent / "docs"


server = serve("--sample-interval", "1s")


@pytest.fixture(scope="module")
def lib(server: ServerProcess) -> Iterator[dirmq.Store]:
    with dirmq.Store(server.root, create=False) as store:
        yield store


def in_another_process(root: Path, code: str) -> None:
    """Run `code` with `store` (a Store on `root`) in a process of its own."""
    script = f"import dirmq\nwith dirmq.Store({str(root)!r}, create=False) as store:\n"
    script += "".join(f"    {line}\n" for line in code.splitlines())
    subprocess.run([sys.executable, "-c", script], check=True, env=os.environ.copy())


def names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory)) if directory.exists() else []


def url(server: ServerProcess, queue: str, *rest: str) -> str:
    return "/".join([server.url, "ui/q", quote(queue, safe=""), *rest])


def test_the_overview_shows_another_process_publish_without_a_reload(
    server: ServerProcess, page: Page
) -> None:
    name = fresh("live")
    in_another_process(server.root, f"store.create_queue({name!r})")
    page.goto(f"{server.url}/ui/?prefix={name}")
    row = page.locator(f'tr[data-queue="{name}"]')
    expect(row).to_be_visible()
    expect(row.locator("td").nth(1)).to_have_text("0")
    in_another_process(server.root, f"store.queue({name!r}).put(b'news')")
    started = time.monotonic()
    expect(row.locator("td").nth(1)).to_have_text("1", timeout=3000)
    assert time.monotonic() - started <= 3
    # the refresh interval is the user's, kept by the browser
    page.select_option("#refresh", "0")
    page.reload()
    expect(page.locator("#refresh")).to_have_value("0")


def test_browsing_ready_and_in_flight_leases_nothing(
    server: ServerProcess, lib: dirmq.Store, page: Page
) -> None:
    name = fresh("look")
    queue = lib.create_queue(name)
    queue.put_many([b"first", b"second", b"third"])
    [held] = queue.get(visibility_s=600)
    directory = Path(queue.path)
    before = {s: names(directory / s) for s in ("@ready", "@leased")}
    for state in ("ready", "leased"):
        page.goto(url(server, name, "browse") + f"?state={state}")
        expect(page.locator("table.messages tbody tr").first).to_be_visible()
    page.goto(url(server, name, "m", held.id))
    expect(page.locator("#state")).to_have_text("leased")
    expect(page.locator("#receive-count")).to_have_text("1 times")
    after = {s: names(directory / s) for s in ("@ready", "@leased")}
    assert after == before
    assert [m.receive_count for m in queue.browse(state="leased")] == [1]


def test_purge_with_confirmation_empties_the_queue_on_disk(
    server: ServerProcess, lib: dirmq.Store, page: Page
) -> None:
    name = fresh("purge")
    queue = lib.create_queue(name)
    queue.put_many([b"a", b"b"])
    page.goto(url(server, name))
    expect(page.locator("#purge")).to_have_text("Purge 2 messages")
    page.locator("#purge-form input[name=confirm]").fill(name)
    page.locator("#purge").click()
    expect(page.locator(".note")).to_have_text("purged 2 messages")
    assert names(Path(queue.path) / "@ready") == []


def test_redrive_selected_and_all_that_match(
    server: ServerProcess, lib: dirmq.Store, page: Page
) -> None:
    name = fresh("redrive")
    queue = lib.create_queue(name)
    queue.put_many([b"d1", b"d2", b"d3"])
    for message in queue.get(3, max_per_group=None):
        queue.dead_letter(message.receipt or "", "no")
    dead = [m.id for m in queue.browse(state="dead")]
    page.goto(url(server, name, "browse") + "?state=dead")
    page.locator(f'input.pick[value="{dead[0]}"]').check()
    page.locator("#redrive-selected").click()
    expect(page.locator("#task-status")).to_have_text("COMPLETED")
    assert [m.id for m in queue.browse()] == [dead[0]]
    page.goto(url(server, name, "browse") + "?state=dead")
    expect(page.locator("table.messages tbody tr")).to_have_count(2)
    in_another_process(  # a message dies after the page was drawn
        server.root,
        f"q = store.queue({name!r})\nq.put(b'late')\n"
        "for m in q.get(10, max_per_group=None):\n"
        "    q.dead_letter(m.receipt, 'late') if m.body == b'late' else q.nack(m.receipt)",
    )
    page.locator("#redrive-all").click()
    expect(page.locator("#task-status")).to_have_text("COMPLETED")
    left = list(queue.browse(state="dead"))
    assert [m.body for m in left] == [b"late"]
    assert queue.stats().ready == 3


def test_hostile_text_is_shown_and_runs_nothing(
    server: ServerProcess, lib: dirmq.Store, page_log: PageLog
) -> None:
    page = page_log.page
    name = fresh("xss")
    queue = lib.create_queue(name, QueueConfig(metadata={"note": XSS}))
    [message_id] = queue.put_many([dirmq.OutgoingMessage(XSS.encode(), {"X-Attr-Evil": XSS})])
    for path in (
        url(server, name),
        url(server, name, "browse"),
        url(server, name, "m", message_id),
    ):
        page.goto(path)
        expect(page.get_by_text(XSS).first).to_be_visible()
        assert page.locator("img").count() == 0, path
    page.wait_for_timeout(200)  # an onerror would have fired by now
    page_log.assert_no_dialog()


def test_every_page_keeps_to_the_policy(
    server: ServerProcess, lib: dirmq.Store, page_log: PageLog
) -> None:
    """Each page, with htmx, uPlot and our script loaded, raises no CSP violation or console
    error (the fixture checks at teardown); and takes the screenshots docs/console.md shows."""
    page = page_log.page
    page.set_viewport_size({"width": 1280, "height": 800})
    name = fresh("orders")
    settings = QueueConfig(
        max_receives=3, priority_levels=3, delivery_rate_per_s=200, message_ttl_s=86400
    )
    queue = lib.create_queue(name, settings)
    ids = queue.put_many(
        [
            dirmq.OutgoingMessage(
                b'{"order": 1, "items": ["tea", "cups"]}',
                {"Content-Type": "application/json"},
                priority=2,
            ),
            dirmq.OutgoingMessage(b"plain text body", priority=1),
            dirmq.OutgoingMessage(bytes(range(40))),
        ]
    )
    lib.create_queue(fresh("held"), QueueConfig(paused=True, priority_levels=2)).put(b"held")
    report = fresh("nightly-report")
    Schedules(lib).put(
        schedule(report, name, cron="30 2 * * *", timezone="Europe/Berlin", body='{"report": 1}')
    )
    shots = os.environ.get("DIRMQ_SCREENSHOTS") == "1"
    for path, shot in (
        (f"{server.url}/ui/", "console-overview.png"),
        (url(server, name), "console-queue.png"),
        (url(server, name, "browse"), None),
        (url(server, name, "browse") + "?state=dead", None),
        (url(server, name, "browse") + "?state=corrupt", None),
        (url(server, name, "m", ids[0]), "console-message.png"),
        (f"{server.url}/ui/schedules", "console-schedules.png"),
    ):
        page.goto(path)
        page.wait_for_load_state("networkidle")
        if shot and shots:
            if shot == "console-queue.png":  # a few samples for its charts (a picture only)
                page.wait_for_timeout(4000)
            page.screenshot(path=str(SHOTS / shot), full_page=False)
    page.locator("#theme").click()
    assert page.evaluate("document.documentElement.dataset.theme") in ("dark", "light")
    Schedules(lib).delete(report)


def test_pause_with_the_button_then_resume_and_see_the_schedules_tick(
    server: ServerProcess, lib: dirmq.Store, page: Page
) -> None:
    """An admin pauses a queue with its button: the badge shows on its page and the overview,
    a publish is accepted while no get delivers; resumed, the message is delivered. The
    schedules page, reached from the nav, shows a schedule's last tick and its next moving on."""
    name, target = fresh("held"), fresh("beats")
    lib.create_queue(name)
    lib.create_queue(target)
    beat = fresh("beat")
    Schedules(lib).put(schedule(beat, target, every_s=1, body="beat"))
    page.goto(url(server, name))
    expect(page.locator("#queue-state .badge")).to_have_text("delivering")
    page.locator("#pause-resume").click()
    expect(page.locator(".note")).to_contain_text("paused: nothing is delivered")
    expect(page.locator("#queue-state .badge.paused")).to_be_visible()
    with httpx.Client(base_url=server.url, timeout=30) as api:
        assert api.post(f"/{name}/messages", content=b"waits").status_code == 201
        assert api.get(f"/{name}/messages", params={"wait": "1s"}).status_code == 204
        page.goto(f"{server.url}/ui/?prefix={name}")
        expect(page.locator(f'tr[data-queue="{name}"] .badge.paused')).to_be_visible()
        expect(page.locator("#paused-queues")).to_have_text("1 paused")
        page.locator(f'tr[data-queue="{name}"] a').first.click()
        expect(page.locator("#pause-resume")).to_have_text("Resume deliveries")
        page.locator("#pause-resume").click()
        expect(page.locator("#queue-state .badge")).to_have_text("delivering")
        delivered = api.get(f"/{name}/messages", params={"wait": "5s"})
        assert delivered.status_code == 200 and delivered.content == b"waits"
    page.locator("header.top a[href='/ui/schedules']").click()
    row = page.locator(f'tr[data-schedule="{beat}"]')
    expect(row.locator("td.state")).to_have_text("running")
    expect(row.locator("td.last")).to_contain_text("published", timeout=10_000)
    expect(row.locator("td.next")).to_contain_text("UTC")
    first_next = row.locator("td.next .tick").inner_text()
    # the live table moves on by itself: the next tick is another one a refresh later
    expect(row.locator("td.next .tick")).not_to_have_text(first_next, timeout=8000)
    Schedules(lib).delete(beat)


def test_sign_in_and_what_a_browse_principal_may_do(tmp_path: Path, page: Page) -> None:
    """Without a session the browser is sent to sign in; a `browse` principal's console has no
    purge button, and a purge forged in that browser (its cookie, its CSRF token) is 403, as
    is one without the token; the cookie opens nothing of the API (`GET /` is 401)."""
    token = new_token()
    credentials = tmp_path / "credentials.toml"
    credentials.write_text(
        f'[principals.viewer]\ntoken_sha256 = "{token_digest(token)}"\nbrowse = ["*"]\n'
    )
    credentials.chmod(0o600)
    running = start_server(tmp_path / "root", "--credentials", str(credentials))
    try:
        with dirmq.Store(running.root, create=False) as store:
            store.create_queue("kept").put(b"stays")
        page.goto(f"{running.url}/ui/q/kept")
        expect(page).to_have_url(f"{running.url}/ui/sign-in")
        page.locator("input[name=token]").fill(token)
        page.locator("button[type=submit]").click()
        expect(page).to_have_url(f"{running.url}/ui/")
        expect(page.locator(".who")).to_have_text("viewer")
        page.goto(f"{running.url}/ui/q/kept")
        expect(page.locator("#count-ready")).to_have_text("1")
        expect(page.locator("#purge")).to_have_count(0)
        csrf = page.locator("body").get_attribute("data-csrf") or ""
        purge = f"{running.url}/ui/q/kept/purge"
        forged = page.request.post(purge, form={"csrf": csrf, "confirm": "kept"})
        assert forged.status == 403
        assert page.request.post(purge, form={"confirm": "kept"}).status == 403
        assert page.request.get(f"{running.url}/").status == 401
        with dirmq.Store(running.root, create=False) as store:
            assert store.queue("kept").stats().ready == 1
    finally:
        assert running.stop() == 0


def test_the_queue_page_counts_follow_the_queue(
    server: ServerProcess, lib: dirmq.Store, page: Page
) -> None:
    name = fresh("counts")
    queue = lib.create_queue(name)
    page.goto(url(server, name))
    expect(page.locator("#count-ready")).to_have_text("0")
    queue.put_many([b"a", b"b"])
    expect(page.locator("#count-ready")).to_have_text("2", timeout=3000)


def test_the_depth_chart_draws_points_and_the_overview_rates(tmp_path: Path, page: Page) -> None:
    """Once the server samples (`/ui/api/samples`, mounted by the console), the queue page's
    depth chart has pixels drawn on its canvas, not just an element."""
    from dirmq.service import ServeOptions

    if "sample_interval_s" not in ServeOptions.__dataclass_fields__:
        pytest.skip("this server takes no samples yet (--sample-interval)")
    running = start_server(tmp_path / "root", "--sample-interval", "1s")
    try:
        with dirmq.Store(running.root, create=False) as store:
            store.create_queue("charted").put_many([b"a", b"b", b"c"])
        page.goto(f"{running.url}/ui/q/charted")
        if page.locator(".charts").count() == 0:
            pytest.skip("the console does not mount the samples API here")
        canvas = page.locator("#chart-depth canvas")
        expect(canvas).to_be_visible(timeout=8000)
        # pixels of the first series' colour (#0b57d0, the light theme's): the line itself,
        # not the axes and grid that an empty chart draws too
        series_pixels = """() => {
            const canvas = document.querySelector("#chart-depth canvas");
            const context = canvas.getContext("2d");
            const data = context.getImageData(0, 0, canvas.width, canvas.height).data;
            let found = 0;
            for (let i = 0; i < data.length; i += 4) {
                const [r, g, b] = [data[i], data[i + 1], data[i + 2]];
                if (Math.abs(r - 11) < 40 && Math.abs(g - 87) < 40 && Math.abs(b - 208) < 40) {
                    found++;
                }
            }
            return found;
        }"""
        page.wait_for_function(f"() => ({series_pixels})() > 20", timeout=8000)
        # and the overview shows the queue's rates from the same samples
        page.goto(f"{running.url}/ui/")
        rate = page.locator('td.rate[data-rate="published"][data-queue="charted"]')
        expect(rate).to_have_text(re.compile(r"^\d+\.\d$"), timeout=8000)
    finally:
        assert running.stop() == 0


def test_with_two_workers_every_page_shows_the_same_rates_and_charts(
    tmp_path: Path, browser: Browser
) -> None:
    """`--workers 2`: pages opened on fresh connections (so both workers answer them) chart the
    same points and show the same rates, whichever worker drew them."""
    running = start_server(tmp_path / "root", "--workers", "2", "--sample-interval", "1s")
    try:
        with RemoteStore(running.url) as remote:  # through the server: its workers count it
            queue = remote.create_queue("shared")
            queue.put_many([b"m"] * 30)
            assert queue.ack_many([m.receipt for m in queue.get(10)]) == {}
        with httpx.Client(base_url=running.url, timeout=10) as api:

            def settled() -> bool:  # a sample that counts all of it, and one before it
                shared = api.get("/ui/api/rates").json()["queues"].get("shared")
                return bool(shared) and shared["counts"][:3] == [30, 10, 10]

            deadline = time.monotonic() + 15
            while not settled():
                assert time.monotonic() < deadline, "no sample counted the work"
                time.sleep(0.2)
            before = answered_by_worker(api)
            views = [view_in_a_fresh_context(browser, running.url) for _ in range(8)]
            time.sleep(1.5)  # each worker publishes its answered count every second
            after = answered_by_worker(api)
        assert len(after) == 2 and all(after[pid] > before.get(pid, 0) for pid in after), (
            "both workers answered pages"
        )
        # The chart's points: the same value at every grid time any two pages both show.
        first = views[0].samples
        for view in views[1:]:
            common = set(first["t"]) & set(view.samples["t"])
            assert len(common) >= 3
            for column in ("ready", "published_per_s", "acked_per_s"):
                mine = dict(zip(view.samples["t"], view.samples[column], strict=True))
                theirs = dict(zip(first["t"], first[column], strict=True))
                assert {t: mine[t] for t in common} == {t: theirs[t] for t in common}, column
        # The overview's rates: pages drawn from the same sample show the same numbers, and
        # each page shows what its answer said.
        by_sample: dict[int, set[tuple[str, str]]] = {}
        for view in views:
            by_sample.setdefault(view.rates["t"], set()).add(view.shown_rates)
            shared = view.rates["queues"]["shared"]
            assert view.shown_rates == tuple(
                f"{shared[f'{kind}_per_s']:.1f}" for kind in ("published", "acked")
            )
        assert all(len(shown) == 1 for shown in by_sample.values()), by_sample
    finally:
        assert running.stop() == 0


@dataclass
class WorkerView:
    samples: dict[str, Any]  # what the queue page's charts drew
    rates: dict[str, Any]  # what the overview's rates came from
    shown_rates: tuple[str, str]  # the overview's publish and ack rate cells


def view_in_a_fresh_context(browser: Browser, base: str) -> WorkerView:
    """The queue page's chart data and the overview's rates, on new connections."""
    context = browser.new_context()
    try:
        log = PageLog(context.new_page())
        log.attach()
        page = log.page
        with page.expect_response(lambda r: "/ui/api/samples" in r.url) as charted:
            page.goto(f"{base}/ui/q/shared")
        expect(page.locator("#chart-depth canvas")).to_be_visible(timeout=8000)
        samples = charted.value.json()  # before the next navigation drops its body
        with page.expect_response(lambda r: "/ui/api/rates" in r.url) as rated:
            page.goto(f"{base}/ui/")
        cells = [
            page.locator(f'td.rate[data-rate="{kind}"][data-queue="shared"]')
            for kind in ("published", "acked")
        ]
        for cell in cells:
            expect(cell).to_have_text(re.compile(r"^\d+\.\d$"), timeout=8000)
        log.assert_clean()
        shown = (cells[0].inner_text(), cells[1].inner_text())
        return WorkerView(samples, rated.value.json(), shown)
    finally:
        context.close()


def answered_by_worker(api: httpx.Client) -> dict[str, float]:
    """Live workers' pid -> requests answered (each worker's own gauge)."""
    text = api.get("/metrics").text
    return {
        dict(labels)["pid"]: n
        for labels, n in matching(text, "dirmq_worker_requests_answered").items()
    }
