"""A real browser for tests: Playwright for Python driving Debian's chromium, headless.

A helper, not collected (as tests/support/servers.py). conftest.py imports its fixtures:
- `browser` (session): one chromium for the whole run, installed with apt-get when missing
  (never `playwright install`, which downloads a browser of its own and fails here); the tests
  that use it skip, saying why, only where it cannot be installed. `browser_session` has it with
  its start time;
- `page_log` (function): a new browser context and page, with what went wrong in it recorded:
  console errors, uncaught exceptions, dialogs (alert, confirm, prompt: each dismissed) and
  `securitypolicyviolation` events. At teardown it fails the test if any was recorded, unless
  the test said it expects some (`page_log.expect_problems()`);
- `page` (function): `page_log.page`, for tests that only drive the page;
- `playwright_loop` (autouse): hides Playwright's event loop from the tests that do not use
  the browser, so that their asyncio.run() works.

Under a strict CSP, give `page.wait_for_function` a function (`"() => ..."`), never a bare
expression: Playwright polls an expression with the page's own eval, which the policy blocks (and
reports, as a violation of the test's making).

In each document an init script keeps that document's violations in `window.__cspViolations`;
they also reach Python, so those of earlier documents of the page are kept across navigations.
"""

from __future__ import annotations

import asyncio
import http.server
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page

CHROMIUM = "/usr/bin/chromium"
# What this machine needs: root (no sandbox), no GPU, and nothing fetched from the network on
# its own (QUIC, background and component updates, sync). Playwright gives each launch a fresh
# temporary profile itself (and refuses a --user-data-dir argument): one per session here.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 10_000  # a default for every wait: a page of the console answers in far less

# Runs in every document before its own scripts; not subject to the page's CSP (it is injected
# by the browser), so it sees every violation the page's policy reports.
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  const violation = {
    directive: event.violatedDirective,
    blocked: event.blockedURI,
    source: event.sourceFile,
    line: event.lineNumber,
    sample: event.sample,
    url: document.URL,
  };
  window.__cspViolations.push(violation);
  window.__dirmqReportViolation(violation);
});
"""


class BrowserUnavailable(Exception):
    """Chromium is missing and cannot be installed here (the message says why)."""


def ensure_chromium() -> None:
    """Installs Debian's chromium with apt-get when /usr/bin/chromium is missing (as root), once
    more after an `apt-get update` when the package index is stale."""
    if os.access(CHROMIUM, os.X_OK):
        return
    if shutil.which("apt-get") is None:
        raise BrowserUnavailable(f"{CHROMIUM} is missing and there is no apt-get to install it")
    if os.geteuid() != 0:
        raise BrowserUnavailable(f"{CHROMIUM} is missing: run `apt-get install chromium` as root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")

    def apt_get(*args: str) -> subprocess.CompletedProcess[str]:
        # Another test process may be installing (make test runs several): wait for its lock.
        lock = ["-o", "DPkg::Lock::Timeout=600"]
        return subprocess.run(
            ["apt-get", *lock, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
            check=False,
        )

    result = apt_get("install", "-y", "-q", "chromium")
    if result.returncode != 0:
        apt_get("update", "-q")
        result = apt_get("install", "-y", "-q", "chromium")
    if result.returncode != 0 or not os.access(CHROMIUM, os.X_OK):
        raise BrowserUnavailable(
            f"apt-get could not install chromium: {result.stderr.strip()[-300:]}"
        )


@dataclass
class Session:
    """The session's one browser, and how long it took to have it: Playwright's driver and
    chromium's launch (an install by apt-get excluded)."""

    browser: Browser
    start_s: float
    loop: asyncio.AbstractEventLoop  # Playwright's (see `playwright_loop`)


PLAYWRIGHT_LOOPS: set[asyncio.AbstractEventLoop] = set()  # the session's, while it runs


@dataclass
class PageLog:
    """A page and what went wrong in it (see the module's docstring)."""

    page: Page
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    problems_expected: bool = False

    def attach(self) -> None:
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.page_errors.append(str(error)))
        self.page.on("dialog", self._dialog)
        self.page.expose_function("__dirmqReportViolation", self._violation)
        self.page.add_init_script(RECORD_VIOLATIONS)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.console_errors.append(f"{message.text} ({message.location.get('url', '')})")

    def _violation(self, violation: dict[str, Any]) -> None:
        self.violations.append(violation)

    def _dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def csp_violations(self) -> list[dict[str, Any]]:
        """Every violation so far, this document's and earlier ones'. It lets the page's queued
        tasks run first (a violation event is dispatched as a task after the blocked load)."""
        if not self.page.is_closed():
            self.page.evaluate("() => new Promise((done) => setTimeout(done, 0))")
        return list(self.violations)

    def document_violations(self) -> list[dict[str, Any]]:
        """The current document's violations, as the page itself recorded them."""
        found: list[dict[str, Any]] = self.page.evaluate(
            "() => new Promise((done) => setTimeout(() => done(window.__cspViolations ?? []), 0))"
        )
        return found

    def assert_no_dialog(self) -> None:
        assert not self.dialogs, f"a dialog opened: {self.dialogs}"

    def problems(self) -> dict[str, list[Any]]:
        found = {
            "csp_violations": self.csp_violations(),
            "console_errors": self.console_errors,
            "page_errors": self.page_errors,
            "dialogs": self.dialogs,
        }
        return {kind: items for kind, items in found.items() if items}

    def assert_clean(self) -> None:
        """No CSP violation, console error, uncaught exception or dialog so far."""
        assert not self.problems(), f"the browser reported: {self.problems()}"

    def expect_problems(self) -> None:
        """This test provokes some on purpose: teardown does not fail it for them."""
        self.problems_expected = True


@pytest.fixture(scope="session")
def browser_session() -> Iterator[Session]:
    try:
        ensure_chromium()
    except BrowserUnavailable as unavailable:
        pytest.skip(f"no browser for the browser tests: {unavailable}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[dev]'")
    began = time.monotonic()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        session = Session(browser, time.monotonic() - began, asyncio.get_running_loop())
        PLAYWRIGHT_LOOPS.add(session.loop)
        try:
            yield session
        finally:
            asyncio._set_running_loop(session.loop)  # a test's teardown may have unmarked it
            browser.close()
    asyncio._set_running_loop(None)  # Playwright's loop is closed: nothing runs any more
    PLAYWRIGHT_LOOPS.discard(session.loop)


@pytest.fixture(autouse=True)
def playwright_loop(request: pytest.FixtureRequest) -> Iterator[None]:
    """Playwright's sync API keeps its event loop marked as running in this thread from its
    start on (its dispatcher runs the loop in a greenlet), and so asyncio.run() would fail in
    every test after the first browser test. Each test that does not use the browser runs
    with the mark removed (and restored after it, for Playwright). Tests that use the browser,
    and fixtures of module or session scope set up after one, keep the mark: asyncio.run() is
    not available there (use a thread), while every Playwright call works."""
    marked = asyncio._get_running_loop()
    if "browser_session" in request.fixturenames or marked not in PLAYWRIGHT_LOOPS:
        yield
        return
    asyncio._set_running_loop(None)
    try:
        yield
    finally:
        asyncio._set_running_loop(marked)


@pytest.fixture(scope="session")
def browser(browser_session: Session) -> Browser:
    return browser_session.browser


@pytest.fixture
def page_log(browser: Browser) -> Iterator[PageLog]:
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    try:
        log = PageLog(context.new_page())
        log.attach()
        yield log
        if not log.problems_expected:
            log.assert_clean()
    finally:
        context.close()


@pytest.fixture
def page(page_log: PageLog) -> Page:
    return page_log.page


Found = tuple[str, bytes]  # a page's content type and body


@contextmanager
def static_site(find: Callable[[str], Found | None], csp: str) -> Iterator[str]:
    """A site of fixed pages on 127.0.0.1 for a browser test (its base URL): `find(path)` gives
    a page or None (404); every page is served under the Content-Security-Policy `csp`."""

    class Pages(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = find(self.path)
            if found is None:
                self.send_error(404)
                return
            content_type, body = found
            try:
                self.send_response(200)
                self.send_header("Content-Type", f"{content_type}; charset=utf-8")
                self.send_header("Content-Security-Policy", csp)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the test closed its page meanwhile (chromium's favicon request, say)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
