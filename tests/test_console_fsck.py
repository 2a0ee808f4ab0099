"""The console's fsck panel (issue 33) on a real `dirmq serve --credentials FILE`: the root's
last check as `dirmq fsck` or the console recorded it (`@fsck/last.json`), and a read-only
"check now" for a principal with admin on every name, over HTTP and in a browser
(tests/support/browser.py); and the record itself (the store's fsckrecord.py), which fsck, the
census and the store's listing leave alone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote_plus

import httpx
import pytest
from playwright.sync_api import Page, expect

import dirmq
from dirmq.console import fsck_panel
from dirmq.console.fsck_panel import HOLD_PREFIX
from dirmq.server.credentials import new_token, token_digest
from dirmq.store import fsckrecord, holds, layout
from dirmq.store.census import census
from dirmq.store.filemodes import root_access
from dirmq.store.fsck import Kind, fsck

from .support.console import signed_in
from .support.fixtures import serve
from .support.servers import REPO, ServerProcess

OPS, SHOP_ADMIN, VIEWER = new_token(), new_token(), new_token()
CREDENTIALS = f"""
[principals.ops]
token_sha256 = "{token_digest(OPS)}"
admin = ["*"]

[principals.shopadmin]
token_sha256 = "{token_digest(SHOP_ADMIN)}"
admin = ["shop*"]

[principals.viewer]
token_sha256 = "{token_digest(VIEWER)}"
browse = ["shop*"]
"""
RECORD = Path(layout.FSCK_DIR) / fsckrecord.RECORD_FILE


# A server of its own: what the panel shows is the whole root's.
server = serve(credentials=CREDENTIALS, scope="function")


@pytest.fixture
def lib(server: ServerProcess) -> Iterator[dirmq.Store]:
    with dirmq.Store(server.root, create=False) as store:
        yield store


def csrf_of(browser: httpx.Client) -> str:
    found = re.search(r'data-csrf="([0-9a-f]+)"', browser.get("/ui/fsck").text)
    assert found
    return found.group(1)


def check_now(browser: httpx.Client) -> httpx.Response:
    return browser.post("/ui/fsck/check", data={"csrf": csrf_of(browser)})


def note_of(answer: httpx.Response) -> str:
    """What the redirect after a check tells (its `?note=`)."""
    assert answer.status_code == 303, answer.text
    location = answer.headers["location"]
    assert location.startswith("/ui/fsck?note=")
    return unquote_plus(location.partition("=")[2])


def damage(store: dirmq.Store, name: str) -> tuple[Path, Path]:
    """A queue `name` with a message whose body lost a byte (corrupt) and a temp file of a
    writer that died long ago (orphan-tmp); their paths."""
    queue = store.create_queue(name)
    queue.put(b"intact")
    message_id = queue.put(b"to be damaged")
    broken = Path(queue.path) / layout.READY / message_id
    broken.write_bytes(broken.read_bytes()[:-1])
    orphan = Path(queue.path) / layout.TMP / f"{message_id}.tmp"
    orphan.write_bytes(b"half written")
    orphan.chmod(0o600)  # the root's modes: the one damage is its age
    os.utime(orphan, (1_000_000_000, 1_000_000_000))
    return broken, orphan


def files_of(root: Path) -> dict[str, tuple[bytes, float]]:
    """Every file under `root` but the check's own (@fsck): content and mtime."""
    found = {}
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not (directory == str(root) and d == layout.FSCK_DIR)]
        for name in files:
            path = Path(directory) / name
            found[str(path.relative_to(root))] = (path.read_bytes(), path.stat().st_mtime)
    return found


def run_fsck(root: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "-m", "dirmq", "--root", str(root), "fsck", *flags],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


# -- the panel -------------------------------------------------------------------------------------
def test_never_checked_then_check_now_on_a_clean_root(
    server: ServerProcess, lib: dirmq.Store
) -> None:
    lib.create_queue("shop").put(b"fine")
    with signed_in(server, OPS) as browser:
        assert "never checked" in browser.get("/ui/").text
        page = browser.get("/ui/fsck")
        assert page.status_code == 200
        assert "Never checked" in page.text and 'id="check-now"' in page.text
        answer = check_now(browser)
        assert note_of(answer).endswith(": clean")
        shown = browser.get(answer.headers["location"]).text
        assert "Clean, checked" in shown and "(read-only)" in shown
        assert "console for ops" in shown and "1 queue(s), 1 message file(s)" in shown
        overview = browser.get("/ui/").text
        line = re.search(r'<dd id="fsck-line">(.*?)</dd>', overview, re.S)
        assert line and "clean" in line.group(1) and "ago" in line.group(1)
    record = json.loads((server.root / RECORD).read_text())
    assert record["clean"] is True and record["repair"] is False
    assert record["by"] == "console" and record["principal"] == "ops"


def test_a_problem_found_is_shown_and_nothing_on_disk_changes(
    server: ServerProcess, lib: dirmq.Store
) -> None:
    broken, orphan = damage(lib, "shop/orders")
    before = files_of(server.root)
    with signed_in(server, OPS) as browser:
        answer = check_now(browser)
        assert note_of(answer).endswith(": 2 problem(s) found")
        page = browser.get("/ui/fsck").text
    assert "2 problem(s), checked" in page
    assert "corrupt" in page and "orphan-tmp" in page
    assert str(broken.relative_to(server.root)) in page
    assert str(orphan.relative_to(server.root)) in page
    assert files_of(server.root) == before  # read-only: not a byte, not an mtime
    assert broken.exists() and orphan.exists()
    record = fsckrecord.load(str(server.root))
    assert record is not None
    kinds = {k.kind: k for k in record.kinds}
    assert kinds["corrupt"].count == 1 and kinds["corrupt"].repaired == 0


def test_a_principal_without_admin_on_every_name_sees_no_button_and_is_refused(
    server: ServerProcess, lib: dirmq.Store
) -> None:
    damage(lib, "other")
    with signed_in(server, OPS) as ops:
        assert check_now(ops).status_code == 303
    recorded = (server.root / RECORD).read_bytes()
    for token in (VIEWER, SHOP_ADMIN):
        with signed_in(server, token) as browser:
            page = browser.get("/ui/fsck")
            assert page.status_code == 200
            assert "2 problem(s), checked" in page.text  # the counts, for anyone signed in
            assert 'id="check-now"' not in page.text and "/ui/fsck/check" not in page.text
            # a path in a queue it may not see is not shown
            assert "other/@ready" not in page.text and "a path you may not see" in page.text
            assert "fsck" in browser.get("/ui/").text
            forged = check_now(browser)
            assert forged.status_code == 403
            assert "admin permission on every name" in forged.text
    assert (server.root / RECORD).read_bytes() == recorded  # nothing ran


def test_a_check_without_the_csrf_token_or_from_another_origin_is_refused(
    server: ServerProcess,
) -> None:
    with signed_in(server, OPS) as browser:
        assert browser.post("/ui/fsck/check", data={}).status_code == 403
        assert browser.post("/ui/fsck/check", data={"csrf": "0" * 64}).status_code == 403
        foreign = browser.post(
            "/ui/fsck/check",
            data={"csrf": csrf_of(browser)},
            headers={"Origin": "https://evil.example"},
        )
        assert foreign.status_code == 403
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        assert anonymous.post("/ui/fsck/check").status_code == 401
        assert anonymous.get("/ui/fsck").status_code == 303  # to sign-in
    assert not (server.root / RECORD).exists()


def test_dirmq_fsck_from_the_cli_updates_what_the_page_shows(
    server: ServerProcess, lib: dirmq.Store
) -> None:
    broken, _ = damage(lib, "shop")
    checked = run_fsck(server.root)
    assert checked.returncode == 8, checked.stderr
    assert "warning" not in checked.stderr
    with signed_in(server, VIEWER) as browser:
        page = browser.get("/ui/fsck").text
        assert "dirmq fsck (user" in page and "(read-only)" in page
        assert "2 problem(s), checked" in page
        assert str(broken.relative_to(server.root)) in page  # shop: the viewer may see it
        repaired = run_fsck(server.root, "--repair")
        assert repaired.returncode == 0, repaired.stdout
        page = browser.get("/ui/fsck").text
        assert "Clean, checked" in page and "(with repair)" in page
        assert "2 problem(s), 2 repaired, 0 left" in page
        assert "clean" in browser.get("/ui/").text


def test_one_check_at_a_time_per_root(server: ServerProcess) -> None:
    """Another process holding the root's check hold (as a console of another worker or
    server does while it checks): a check now says so and runs nothing."""
    root = str(server.root)
    hold = holds.take(fsckrecord.record_dir(root), HOLD_PREFIX, 30.0, access=root_access(root))
    assert isinstance(hold, holds.Hold)
    with signed_in(server, OPS) as browser:
        try:
            note = note_of(check_now(browser))
            assert note.startswith("a check is running already")
            assert f"pid {os.getpid()}" in note
            assert not (server.root / RECORD).exists()
        finally:
            hold.release()
        assert note_of(check_now(browser)).startswith("checked in")
    assert (server.root / RECORD).exists()


# -- the record --------------------------------------------------------------------------------
def test_fsck_census_and_listing_leave_the_record_alone(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with dirmq.Store(root) as store:
        store.create_queue("q").put(b"x")
        first = fsck(root, repair=False)
        record = fsckrecord.record_of(first, started_s=1.0, duration_s=0.5, by="test", repair=False)
        assert fsckrecord.save(str(root), record) is None
        assert fsck(root, repair=False).problems == ()  # no stray: fsck knows @fsck
        temp = root / layout.FSCK_DIR / f"{fsckrecord.RECORD_FILE}.{'0' * 32}.tmp"
        temp.write_text("{")  # a write that died an hour ago
        temp.chmod(0o600)
        os.utime(temp, (1_000_000_000, 1_000_000_000))
        [left] = fsck(root, repair=False).problems
        assert left.kind is Kind.ORPHAN_TMP and left.path == str(temp)
        assert [d.name for d in census(str(root))] == ["q"]
        assert store.list_queues() == ["q"]
        assert fsckrecord.load(str(root)) == record


def test_a_damaged_record_is_none_and_no_root_gets_no_record(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with dirmq.Store(root):
        pass
    assert fsckrecord.load(str(root)) is None
    (root / layout.FSCK_DIR).mkdir()
    (root / RECORD).write_text('{"format": 1, "at_s": "half')
    assert fsckrecord.load(str(root)) is None
    (root / RECORD).write_text('{"format": 99}')
    assert fsckrecord.load(str(root)) is None
    plain = tmp_path / "plain"
    plain.mkdir()
    record = fsckrecord.record_of(
        fsck(plain, repair=False), started_s=1.0, duration_s=0.1, by="test", repair=False
    )
    why = fsckrecord.save(str(plain), record)
    assert why is not None and "not recorded" in why
    assert os.listdir(plain) == []
    checked = run_fsck(plain)
    assert "warning" in checked.stderr and "not recorded" in checked.stderr


# -- in a browser ----------------------------------------------------------------------------------
def test_the_panel_in_a_browser(server: ServerProcess, lib: dirmq.Store, page: Page) -> None:
    """The overview's line leads to the panel, whose "Check now" runs a check and shows it;
    no CSP violation, console error or dialog on the way (the `page` fixture checks)."""
    damage(lib, "shop")
    page.goto(f"{server.url}/ui/sign-in")
    page.locator("input[name=token]").fill(OPS)
    page.locator("button[type=submit]").click()
    expect(page).to_have_url(f"{server.url}/ui/")
    expect(page.locator("#fsck-line")).to_have_text("never checked")
    page.get_by_role("link", name="fsck").click()
    expect(page).to_have_url(f"{server.url}/ui/fsck")
    expect(page.locator("#fsck-status")).to_contain_text("Never checked")
    page.locator("#check-now").click()
    expect(page.locator("#fsck-status")).to_contain_text("2 problem(s), checked")
    expect(page.locator("p.note")).to_contain_text("2 problem(s) found")
    expect(page.locator("#fsck-kinds")).to_contain_text("corrupt")
    page.wait_for_load_state("networkidle")
    page.goto(f"{server.url}/ui/")
    expect(page.locator("#fsck-line")).to_contain_text("2 problem(s)")
    page.wait_for_load_state("networkidle")


def test_a_check_in_this_process_turns_the_next_away(server: ServerProcess) -> None:
    """The lock of one process (a worker): held, a check returns at once and runs nothing."""
    with fsck_panel._LOCK:
        outcome = fsck_panel.run_check(str(server.root), "ops")
    assert outcome.record is None and outcome.busy is not None
    assert outcome.busy.startswith("a check is running already")
    assert not (server.root / RECORD).exists()
    assert fsck_panel.run_check(str(server.root), "ops").record is not None
