"""The web console's security on a real `dirmq serve --credentials FILE` (issue 33): sign-in
and its signed session, which opens no API door; CSRF and Origin on every state-changing
request; permissions exactly as the API asks them (a `browse` principal sees no purge button
and gets 403 on a forged one); the headers every answer carries; no inline script or style."""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import httpx
import pytest

import dirmq
from dirmq.console.permissions import NEEDS as CONSOLE_NEEDS
from dirmq.console.render import CSP
from dirmq.dialects.native.app import NEEDS as NATIVE_NEEDS
from dirmq.errors import InvalidName
from dirmq.server.credentials import new_token
from dirmq.store.names import validate_queue_name

from .support.console import signed_in
from .support.fixtures import serve
from .support.principals import everything, principal
from .support.servers import ServerProcess, fresh, start_server

OPS, VIEWER = new_token(), new_token()
CREDENTIALS = everything("ops", OPS) + principal("viewer", VIEWER, browse=["shop*"])


server = serve(credentials=CREDENTIALS)


@pytest.fixture(scope="module")
def lib(server: ServerProcess) -> Iterator[dirmq.Store]:
    with dirmq.Store(server.root, create=False) as store:
        yield store


def client(server: ServerProcess) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=10)


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert found, page.text[:500]
    return found.group(1)


def test_every_answer_carries_the_security_headers(server: ServerProcess) -> None:
    with client(server) as browser:
        for path in ("/ui/", "/ui/sign-in", "/ui/static/x/console.js", "/ui/q/x/nowhere"):
            answer = browser.get(path)
            assert answer.headers["content-security-policy"] == CSP, path
            assert answer.headers["x-content-type-options"] == "nosniff", path
            assert answer.headers["referrer-policy"] == "no-referrer", path
    assert "unsafe-inline" not in CSP and "unsafe-eval" not in CSP


def test_without_a_session_the_console_sends_the_browser_to_sign_in(
    server: ServerProcess,
) -> None:
    with client(server) as browser:
        for path in ("/ui/", "/ui/q/shop/browse", "/ui/q/shop/m/x"):
            answer = browser.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"] == "/ui/sign-in"
        form = browser.get("/ui/sign-in")
        assert form.status_code == 200
        assert 'name="token"' in form.text
        # A POST without a session is refused outright (no redirect a form would follow).
        assert browser.post("/ui/q/shop/purge", data={"confirm": "shop"}).status_code == 401


def test_a_wrong_token_gets_no_session(server: ServerProcess) -> None:
    with client(server) as browser:
        answer = browser.post("/ui/sign-in", data={"token": "dmq_wrong"})
        assert answer.status_code == 401
        assert "not valid" in answer.text
        assert "set-cookie" not in answer.headers
        assert browser.get("/ui/").status_code == 303


def test_the_session_cookie_is_httponly_strict_and_scoped(server: ServerProcess) -> None:
    with client(server) as browser:
        answer = browser.post("/ui/sign-in", data={"token": OPS})
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert "Path=/ui/" in cookie
        assert "Secure" not in cookie  # plain HTTP here: a Secure cookie would not come back
        assert browser.get("/ui/").status_code == 200


def test_a_forged_or_altered_cookie_is_no_session(server: ServerProcess) -> None:
    with signed_in(server, VIEWER) as browser:
        value = browser.cookies["dirmq_console"]
        principal, expiry, signature = value.split(".")
        ops = "b3Bz"  # base64url of "ops": the same signature over another principal
        with client(server) as other:
            other.cookies.set("dirmq_console", f"{ops}.{expiry}.{signature}", path="/ui/")
            assert other.get("/ui/").status_code == 303
            other.cookies.set("dirmq_console", f"{principal}.{expiry}9.{signature}", path="/ui/")
            assert other.get("/ui/").status_code == 303


def test_the_cookie_opens_no_api_door(server: ServerProcess) -> None:
    with signed_in(server, OPS) as browser:
        cookie = browser.cookies["dirmq_console"]
    with client(server) as api:
        headers = {"Cookie": f"dirmq_console={cookie}"}
        assert api.get("/", headers=headers).status_code == 401
        assert api.put("/cookie-made", headers=headers).status_code == 401
        answer = api.post("/", headers=headers, data={"Action": "ListQueues"})
        assert answer.status_code in (401, 403)
        assert api.get("/", headers={"Authorization": f"Bearer {OPS}"}).status_code == 200


def test_sign_out_ends_the_session(server: ServerProcess) -> None:
    with signed_in(server, OPS) as browser:
        page = browser.get("/ui/")
        answer = browser.post("/ui/sign-out", data={"csrf": csrf_of(page)})
        assert answer.status_code == 303
        assert "Max-Age=0" in answer.headers["set-cookie"]
        browser.cookies.clear()
        assert browser.get("/ui/").status_code == 303


def test_a_principal_sees_only_the_queues_its_patterns_grant(
    server: ServerProcess, lib: dirmq.Store
) -> None:
    shop, other = fresh("shop"), fresh("hidden")
    lib.create_queue(shop)
    lib.create_queue(other)
    with signed_in(server, VIEWER) as browser:
        page = browser.get("/ui/").text
        assert shop in page
        assert other not in page
        assert browser.get(f"/ui/q/{other}").status_code == 403
        # The same refusal for a queue that does not exist: nothing is told.
        assert browser.get("/ui/q/nothing-here").status_code == 403
    with signed_in(server, OPS) as browser:
        page = browser.get("/ui/").text
        assert shop in page and other in page


def test_a_browse_principal_gets_no_action_and_403_on_a_forged_one(
    server: ServerProcess, lib: dirmq.Store
) -> None:
    shop = fresh("shop")
    queue = lib.create_queue(shop)
    queue.put(b"kept")
    with signed_in(server, VIEWER) as browser:
        page = browser.get(f"/ui/q/{shop}")
        assert page.status_code == 200
        assert 'id="purge"' not in page.text
        assert "Publish a test message" not in page.text
        assert '<textarea name="config"' not in page.text
        assert 'id="pause-resume"' not in page.text
        listing = browser.get(f"/ui/q/{shop}/browse", params={"state": "ready"})
        assert listing.status_code == 200 and "kept" in listing.text
        assert "Delete selected" not in listing.text
        token = csrf_of(page)  # its own, valid CSRF token: only the permission is missing
        for action, form in (
            ("purge", {"confirm": shop}),
            ("publish", {"body": "x"}),
            ("configure", {"config": "{}"}),
            ("delete", {"id": "0000000000000001-000000000000"}),
            ("pause", {"op": "pause"}),
        ):
            answer = browser.post(f"/ui/q/{shop}/{action}", data={"csrf": token, **form})
            assert answer.status_code == 403, action
            assert "viewer" in answer.text
    queue.reload_config()
    assert queue.stats().ready == 1 and not queue.config.paused
    with signed_in(server, OPS) as browser:
        page = browser.get(f"/ui/q/{shop}")
        assert 'id="purge"' in page.text and 'id="pause-resume"' in page.text


def test_csrf_and_origin_are_checked_on_every_change(
    server: ServerProcess, lib: dirmq.Store
) -> None:
    shop = fresh("shop")
    queue = lib.create_queue(shop)
    queue.put(b"kept")
    with signed_in(server, OPS) as browser:
        token = csrf_of(browser.get(f"/ui/q/{shop}"))
        purge = f"/ui/q/{shop}/purge"
        assert browser.post(purge, data={"confirm": shop}).status_code == 403
        assert browser.post(purge, data={"confirm": shop, "csrf": "0" * 64}).status_code == 403
        for foreign in (
            {"Origin": "https://evil.example"},
            {"Origin": "null"},  # a sandboxed frame, a data: page
            {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
        ):
            answer = browser.post(purge, data={"confirm": shop, "csrf": token}, headers=foreign)
            assert answer.status_code == 403, foreign
        assert queue.stats().ready == 1
        # The header htmx sends does as well as the form field; the server's own Origin passes.
        answer = browser.post(
            purge,
            data={"confirm": shop},
            headers={"X-CSRF-Token": token, "Origin": server.url},
        )
        assert answer.status_code == 303, answer.text
        # What a browser sends from our own form under Referrer-Policy: no-referrer
        queue.put(b"again")
        same = {"Origin": "null", "Sec-Fetch-Site": "same-origin"}
        answer = browser.post(purge, data={"confirm": shop, "csrf": token}, headers=same)
        assert answer.status_code == 303, answer.text
    assert queue.stats().ready == 0


def test_console_names_are_reserved(server: ServerProcess, lib: dirmq.Store) -> None:
    for name in ("ui", "ui/x", "ui/q/a"):
        with pytest.raises(InvalidName, match="web console"):
            validate_queue_name(name)
    assert validate_queue_name("x/ui") == "x/ui"
    # What is not the console's under /ui is the native API's, refused in its words
    with client(server) as api:
        for method, path in (("GET", "/ui"), ("PUT", "/ui"), ("GET", "/ui/other/messages")):
            answer = api.request(method, path, headers={"Authorization": f"Bearer {OPS}"})
            assert answer.status_code == 400, (method, path)
            assert answer.json()["error"] == "InvalidName" and "/ui/" in answer.text


def test_each_console_action_asks_what_the_api_asks() -> None:
    for action, (permission, route) in CONSOLE_NEEDS.items():
        assert NATIVE_NEEDS[route] == permission, action


def test_no_inline_script_or_style_in_any_template() -> None:
    templates = resources.files("dirmq.console").joinpath("templates")
    for template in templates.iterdir():
        text = template.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            assert "src=" in tag, f"{template.name}: inline script {tag}"
        assert "<style" not in text, template.name
        assert not re.search(r"\sstyle=", text), f"{template.name}: a style attribute"
        assert not re.search(r"\son[a-z]+=", text), f"{template.name}: an event handler"
        assert "javascript:" not in text, template.name


def test_assets_are_versioned_and_cached(server: ServerProcess) -> None:
    with signed_in(server, OPS) as browser:
        page = browser.get("/ui/").text
        found = re.search(r'href="(/ui/static/[^/]+/console\.css)"', page)
        assert found
        answer = browser.get(found.group(1))
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/css")
        assert "immutable" in answer.headers["cache-control"]
        script = found.group(1).replace("console.css", "console.js")
        assert browser.get(script).headers["content-type"].startswith("text/javascript")
        assert browser.get(found.group(1) + "/../../x").status_code == 404


def test_the_console_files_ship_in_the_package() -> None:
    pyproject = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    assert "console/templates/**/*" in pyproject
    assert "console/static/**/*" in pyproject


def test_every_worker_accepts_a_session_another_made(tmp_path: Path) -> None:
    path = tmp_path / "credentials.toml"
    path.write_text(CREDENTIALS)
    path.chmod(0o600)
    running = start_server(tmp_path / "root", "--credentials", str(path), "--workers", "2")
    try:
        with signed_in(running, OPS) as browser:
            cookie = browser.cookies["dirmq_console"]
        answered = set()
        for _ in range(20):  # a connection each: the workers share them out
            with httpx.Client(base_url=running.url, timeout=10) as fresh_browser:
                fresh_browser.cookies.set("dirmq_console", cookie, path="/ui/")
                answer = fresh_browser.get("/ui/")
                assert answer.status_code == 200
                pid = re.search(r'id="worker-pid">(\d+)<', answer.text)
                assert pid
                answered.add(pid.group(1))
        assert len(answered) == 2
    finally:
        assert running.stop() == 0


def test_over_tls_the_session_cookie_is_secure(tmp_path: Path) -> None:
    from .test_tls import make_certificates, tls_options

    certs = make_certificates(tmp_path)
    path = tmp_path / "credentials.toml"
    path.write_text(CREDENTIALS)
    path.chmod(0o600)
    running = start_server(tmp_path / "root", "--credentials", str(path), *tls_options(certs))
    try:
        assert running.url.startswith("https://")
        verify = ssl.create_default_context(cafile=str(certs.ca))
        with httpx.Client(base_url=running.url, verify=verify, timeout=10) as browser:
            answer = browser.post("/ui/sign-in", data={"token": OPS})
            assert answer.status_code == 303
            cookie = answer.headers["set-cookie"]
            assert "; Secure" in cookie and "HttpOnly" in cookie
            page = browser.get("/ui/")
            assert page.status_code == 200
            # The server's own https origin passes; its http twin is another origin.
            http_twin = running.url.replace("https://", "http://")
            form = {"csrf": csrf_of(page), "confirm": "x"}
            refused = browser.post("/ui/q/x/purge", data=form, headers={"Origin": http_twin})
            assert refused.status_code == 403
    finally:
        assert running.stop() == 0


def test_a_session_ends_when_it_expires() -> None:
    from dirmq.console.session import SESSION_S, Sessions, new_secret

    sessions = Sessions(new_secret())
    issued = sessions.issue("ops", now_s=1000.0)
    assert sessions.check(issued.cookie, now_s=1000.0 + SESSION_S - 1) == issued
    assert sessions.check(issued.cookie, now_s=1000.0 + SESSION_S) is None
    assert Sessions(new_secret()).check(issued.cookie, now_s=1000.0) is None  # a restart
    assert sessions.csrf_ok(issued, sessions.csrf(issued))
    assert not sessions.csrf_ok(sessions.issue("ops", now_s=1001.0), sessions.csrf(issued))
