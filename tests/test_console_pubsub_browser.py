"""The console's pub/sub pages in a real browser (tests/support/browser.py: chromium driven by
Playwright): they render, from the nav's link on, with no CSP violation, console error,
uncaught exception or dialog (the `page_log` fixture fails the test at teardown otherwise)."""

from __future__ import annotations

import pytest

import dirmq
from dirmq.pubsub.hub import PubSub

from .support.fixtures import serve
from .support.servers import ServerProcess

try:
    from playwright.sync_api import expect

    from .support.browser import PageLog
except ImportError as missing:
    pytest.skip(f"no browser harness: {missing}", allow_module_level=True)

XSS = "<img src=x onerror=alert(1)>"


server = serve()


def test_the_pubsub_pages_keep_to_the_policy(server: ServerProcess, page_log: PageLog) -> None:
    with dirmq.Store(server.root, create=False) as store:
        store.create_queue("billing-dlq")
        hub = PubSub(store)
        hub.subscribe("billing", channels=["orders"], dead_letter="billing-dlq").close()
        hub.publish("orders", b'{"order": 1}', mode="future", headers={"X-Note": XSS})
        hub.publish("orders", XSS.encode(), subject="created", mode="future")
        hub.publish("orders", bytes(range(40)), mode="future")
    page = page_log.page
    page.goto(f"{server.url}/ui/")
    page.get_by_role("link", name="pub/sub", exact=True).click()
    expect(page.locator('#subscriptions tr[data-subscription="billing"] td').nth(5)).to_have_text(
        "3"
    )
    expect(page.locator('#channels tr[data-channel="orders"]')).to_be_visible()
    page.locator("#log-link").click()
    expect(page.locator("#log tbody tr[data-seq]")).to_have_count(3)
    expect(page.get_by_text(XSS).first).to_be_visible()
    assert page.locator("main img").count() == 0
    page.wait_for_load_state("networkidle")
    page_log.assert_no_dialog()
