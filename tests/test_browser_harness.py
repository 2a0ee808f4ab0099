"""The browser harness (tests/support/browser.py) sees what the console's browser tests rely on
it to see.

Pages come from a throwaway `http.server` on 127.0.0.1:0 that sends a strict
Content-Security-Policy, as the console does: an inline script must be blocked and reported, a
page that keeps to the policy must report nothing, and dialogs and errors must be recorded.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page

from .support.browser import FLAGS, PageLog, Session, static_site

CSP = "default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'"

PAGES: dict[str, tuple[str, bytes]] = {
    "/clean": (
        "text/html",
        b'<!doctype html><html><head><title>clean</title><script src="/mark.js" defer></script>'
        b"</head><body><p>kept to the policy</p></body></html>",
    ),
    "/inline": (
        "text/html",
        b"<!doctype html><html><head><title>inline</title></head><body>"
        b'<script>document.title = "inline ran";</script>'
        b'<script src="/mark.js"></script></body></html>',
    ),
    "/late": (
        "text/html",
        b'<!doctype html><html><head><script src="/late.js"></script></head><body></body></html>',
    ),
    "/alert": (
        "text/html",
        b'<!doctype html><html><head><script src="/alert.js"></script></head><body></body></html>',
    ),
    "/errors": (
        "text/html",
        b'<!doctype html><html><head><script src="/errors.js"></script></head><body></body></html>',
    ),
    # Chromium asks every site for one; a 404 would be a console error (the console serves one).
    "/favicon.ico": ("image/svg+xml", b'<svg xmlns="http://www.w3.org/2000/svg"/>'),
    "/mark.js": ("text/javascript", b'document.documentElement.dataset.mark = "external ran";'),
    "/late.js": (
        "text/javascript",
        b'setTimeout(() => { document.documentElement.dataset.mark = "late"; }, 100);',
    ),
    "/alert.js": ("text/javascript", b'alert("from a script");'),
    "/errors.js": (
        "text/javascript",
        b'console.error("logged on purpose"); throw new Error("thrown on purpose");',
    ),
}


@dataclass
class Site:
    url: str


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with static_site(PAGES.get, CSP) as url:
        yield Site(url)


def test_a_page_within_its_policy_loads_and_reports_nothing(
    site: Site, page: Page, page_log: PageLog
) -> None:
    response = page.goto(f"{site.url}/clean")
    assert response is not None and response.status == 200
    assert response.headers["content-security-policy"] == CSP
    assert page.title() == "clean"
    page.wait_for_function("() => document.documentElement.dataset.mark === 'external ran'")
    assert page_log.document_violations() == []
    assert page_log.problems() == {}
    page_log.assert_clean()  # and teardown checks it again


def test_an_inline_script_is_blocked_and_reported(
    site: Site, page: Page, page_log: PageLog
) -> None:
    page_log.expect_problems()
    page.goto(f"{site.url}/inline")
    page.wait_for_function("() => document.documentElement.dataset.mark === 'external ran'")
    assert page.title() == "inline", "the inline script ran under script-src 'self'"
    page.wait_for_function("() => window.__cspViolations.length > 0")
    (violation,) = page_log.document_violations()
    assert violation["directive"] == "script-src-elem"
    assert violation["blocked"] == "inline"
    assert violation["url"] == f"{site.url}/inline"
    assert page_log.csp_violations() == [violation]
    assert any("Content Security Policy" in error for error in page_log.console_errors)
    with pytest.raises(AssertionError, match="csp_violations"):
        page_log.assert_clean()


def test_violations_of_earlier_documents_are_kept(
    site: Site, page: Page, page_log: PageLog
) -> None:
    page_log.expect_problems()
    page.goto(f"{site.url}/inline")
    page.wait_for_function("() => window.__cspViolations.length > 0")
    page.goto(f"{site.url}/clean")
    assert page_log.document_violations() == []  # the new document's own list
    assert [v["url"] for v in page_log.csp_violations()] == [f"{site.url}/inline"]


def test_waiting_on_a_strict_csp_page_reports_nothing(
    site: Site, page: Page, page_log: PageLog
) -> None:
    """wait_for_function with a function polls without the page's eval (see
    tests/support/browser.py)."""
    page.goto(f"{site.url}/late")
    assert page.evaluate("() => document.documentElement.dataset.mark") is None
    page.wait_for_function("() => document.documentElement.dataset.mark === 'late'")
    page_log.assert_clean()


def test_a_dialog_is_recorded_and_dismissed(site: Site, page: Page, page_log: PageLog) -> None:
    page_log.expect_problems()
    page.goto(f"{site.url}/alert")
    assert page_log.dialogs == ["alert: from a script"]
    with pytest.raises(AssertionError, match="a dialog opened"):
        page_log.assert_no_dialog()


def test_console_errors_and_uncaught_exceptions_are_recorded(
    site: Site, page: Page, page_log: PageLog
) -> None:
    page_log.expect_problems()
    page.goto(f"{site.url}/errors")
    page.wait_for_function("() => true")  # one more round trip: the page's events have arrived
    assert [e.split(" (")[0] for e in page_log.console_errors] == ["logged on purpose"]
    assert page_log.page_errors == ["thrown on purpose"]
    assert set(page_log.problems()) == {"console_errors", "page_errors"}


def test_each_test_gets_a_new_context(browser_session: Session, page: Page, site: Site) -> None:
    page.goto(f"{site.url}/clean")
    assert page.context.cookies() == []
    assert len(browser_session.browser.contexts) == 1, "an earlier test's context is still open"


def descendants(pid: int) -> list[int]:
    """The processes under `pid` (Playwright's driver, and the chromium it launched)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # gone meanwhile
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def test_chromium_runs_with_the_flags_and_a_fresh_profile(browser_session: Session) -> None:
    command_lines = []
    for pid in descendants(os.getpid()):
        try:
            command_lines.append(Path(f"/proc/{pid}/cmdline").read_text().split("\0"))
        except OSError:
            continue
    (arguments,) = [
        line
        for line in command_lines
        if "--remote-debugging-pipe" in line and "--type" not in " ".join(line)
    ]
    assert os.path.realpath(arguments[0]).startswith("/usr/lib/chromium/"), arguments[0]
    for flag in FLAGS:
        assert flag in arguments, f"{flag} is not on chromium's command line: {arguments}"
    (profile,) = [a.split("=", 1)[1] for a in arguments if a.startswith("--user-data-dir=")]
    assert profile.startswith(tempfile.gettempdir()), profile  # Playwright's, for this launch


def test_one_browser_starts_for_the_session_in_seconds(
    browser_session: Session, record_property: pytest.RecordProperty
) -> None:
    """Playwright's driver and chromium's launch are paid once per run."""
    record_property("browser_start_s", round(browser_session.start_s, 3))
    print(f"chromium {browser_session.browser.version} started in {browser_session.start_s:.2f} s")
    assert browser_session.browser.is_connected()
    assert browser_session.start_s < 20, f"chromium took {browser_session.start_s:.1f} s to start"


# The order matters below (pytest keeps a file's order): a browser test, then one without the
# browser that runs asyncio, then a browser context of module scope used across both kinds.
def test_a_browser_test_comes_first(
    browser_session: Session,
) -> None:
    assert browser_session.browser.is_connected()  # the session has started: the loop is marked


def test_asyncio_run_works_without_the_browser() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert asyncio.run(answer()) == 42


@pytest.fixture(scope="module")
def shared_context(browser: Browser) -> Iterator[BrowserContext]:
    """A context for several tests (a signed-in console, say): closed after tests without it."""
    context = browser.new_context()
    try:
        yield context
    finally:
        context.close()


def test_a_module_context_serves_one_test(shared_context: BrowserContext, site: Site) -> None:
    page = shared_context.new_page()
    page.goto(f"{site.url}/clean")
    assert page.title() == "clean"


def test_asyncio_still_runs_between_tests_of_a_module_context() -> None:
    test_asyncio_run_works_without_the_browser()


def test_a_module_context_serves_another(shared_context: BrowserContext, site: Site) -> None:
    assert [p.url for p in shared_context.pages] == [f"{site.url}/clean"]
    shared_context.pages[0].goto(f"{site.url}/late")
