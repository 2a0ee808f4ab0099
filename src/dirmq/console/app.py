"""The console as a dialect: it claims its own paths under `/ui/` on the native port, keeps
its own sessions (the Router treats its routes as public and never reads its cookie: the
cookie opens no other door), checks CSRF and Origin on every state-changing request, and
hands each route to its view (`pages.py`, `actions.py`), on the broker's thread pool (views
touch the filesystem). Every answer carries the security headers (`render.SECURITY_HEADERS`).
Any other path under /ui (and /ui itself) names a reserved queue: the native API refuses it.

    GET  /ui/                            overview (?prefix= &sort= &desc=1 &page=; &part=table)
    GET  /ui/sign-in, POST /ui/sign-in   a token for a session;  POST /ui/sign-out
    GET  /ui/static/<version>/<file>     the console's assets
    GET  /ui/q/<queue>                   a queue (its name one segment: `/` as %2F)
    GET  /ui/q/<queue>/browse            ?state=ready|leased|delayed|dead|corrupt &after=<id>
    GET  /ui/q/<queue>/m/<id>[/raw]      a message; its file
    GET  /ui/q/<queue>/redrive/<task>    a redrive task's progress
    GET  /ui/pubsub, /ui/pubsub/log      pub/sub: channels and subscriptions; the retained log
                                         (?after=<seq> &channel=<prefix>)
    GET  /ui/fsck, POST /ui/fsck/check   the last check of the root; a read-only check now
    GET  /ui/schedules[?queue=]          recurring schedules: last and next tick
    POST /ui/schedules/<name>/<op>       pause, resume, delete a schedule
    POST /ui/q/<queue>/<action>          publish, purge, configure (PUT too), pause (or
                                         resume), delete, lease, redrive, cancel
"""

from __future__ import annotations

import logging
import time
from urllib.parse import parse_qs

from dirmq.console import actions, fsck_panel, pages, pubsub_pages, schedules_page
from dirmq.console.call import Call, Console, ServerFacts, View
from dirmq.console.render import SECURITY_HEADERS
from dirmq.console.session import (
    CSRF_FIELD,
    CSRF_HEADER,
    Session,
    cookie_header,
    cookie_of,
    same_origin,
)
from dirmq.errors import AccessDenied, DirmqError, InvalidArgument, Unauthenticated
from dirmq.server.access import OPEN, Access, credentials_required
from dirmq.server.broker import Broker
from dirmq.server.contract import Request, Response, StreamResponse, SwitchProtocols
from dirmq.server.dialect import Dialect
from dirmq.server.errors import error_response, status_of

log = logging.getLogger("dirmq.console")

API = "/ui/api/"  # the mounted `api` dialect's (the samples)
# What may follow /ui/ (anything else is a 404).
OWN = frozenset({"", "static", "sign-in", "sign-out", "q", "api", "pubsub", "fsck", "schedules"})
PUBSUB: dict[str, View] = {
    "/ui/pubsub": pubsub_pages.pubsub,
    "/ui/pubsub/log": pubsub_pages.pubsub_log,
}
UNSAFE = frozenset({"POST", "PUT", "DELETE", "PATCH"})


class ConsoleApp(Dialect):
    name = "console"

    def __init__(
        self,
        broker: Broker,
        access: Access = OPEN,
        *,
        secret: bytes,
        facts: ServerFacts,
        api: Dialect | None = None,
    ) -> None:
        """`api`: the dialect answering `/ui/api/...` (the server's samples), which the
        console mounts: it is asked with the session's principal, as if authenticated by the
        Router, and started and closed with the console."""
        self.console = Console(broker, access, secret, facts)
        self.api = api
        self.console.render.env.globals["has_api"] = api is not None

    def start(self) -> None:
        if self.api is not None:
            self.api.start()

    async def close(self) -> None:
        if self.api is not None:
            await self.api.close()

    def claims(self, request: Request) -> bool:
        """The console's own paths only; any other under /ui names a reserved queue, which
        the native API refuses in its words (400 InvalidName), as for `/health/x`."""
        path = request.path
        if not path.startswith("/ui/"):
            return False
        return path.split("/", 3)[2] in OWN

    def public(self, request: Request) -> bool:
        return True  # the console checks its own session: the Router knows no cookie

    async def __call__(self, request: Request) -> Response | StreamResponse | SwitchProtocols:
        request.route = "console"
        try:
            response = await self._answer(request)
        except DirmqError as exc:
            response = self.console.render.page(
                "error.html", status_of(exc), message=str(exc), principal=""
            )
        except UnicodeDecodeError:
            response = self.console.render.page(
                "error.html", 400, message="the path is not UTF-8 once decoded", principal=""
            )
        response.headers.extend(SECURITY_HEADERS)
        return response

    async def _answer(self, request: Request) -> Response:
        path = request.path
        render = self.console.render
        if path.startswith("/ui/static/"):
            version, _, rest = path[len("/ui/static/") :].partition("/")
            return render.asset(version, rest)
        secure = request.scheme == "https"
        sessions = self.console.sessions
        session = sessions.check(cookie_of(request.headers.get("cookie")))
        if session is not None and not self._still_valid(session.principal):
            session = None
        if path.startswith(API) and self.api is not None:
            return await self._api(request, session)
        if path == "/ui/sign-in":
            return await self._sign_in(request, session, secure)
        set_cookie: str | None = None
        if session is None:
            if self.console.access.enabled:
                if request.method in UNSAFE:
                    raise Unauthenticated("sign in first: your console session has ended")
                return _redirect("/ui/sign-in")
            session = sessions.issue("")  # an open server: a session only for CSRF
            set_cookie = cookie_header(session, secure)
        form = _form(request) if request.method in UNSAFE else {}
        call = Call(request, session, form, sessions.csrf(session))
        if request.method in UNSAFE:
            self._check_forgery(call)
        if path == "/ui/sign-out" and request.method == "POST":
            response = _redirect("/ui/sign-in" if self.console.access.enabled else "/ui/")
            response.headers.append(("Set-Cookie", cookie_header(None, secure)))
            return response
        view = _route(request.method, path)
        response = await self.console.broker.call(view, self.console, call)
        if set_cookie is not None:
            response.headers.append(("Set-Cookie", set_cookie))
        return response

    async def _api(self, request: Request, session: Session | None) -> Response:
        """The mounted API (read-only JSON): asked as the session's principal, or as the one
        the Router found in `Authorization` (a script's Bearer token), else refused 401 where
        credentials are required. It changes nothing (other methods: its 405), so nothing here
        needs a CSRF token."""
        if session is not None:
            request.principal = session.principal
        elif self.console.access.enabled and not request.principal:
            return error_response(credentials_required())
        assert self.api is not None
        answer = await self.api(request)
        if not isinstance(answer, Response):
            raise InvalidArgument(f"{request.path[:100]} answers no stream")
        return answer

    def _still_valid(self, principal: str) -> bool:
        access = self.console.access
        if not access.enabled:
            return principal == ""
        credentials = access.credentials
        return credentials is not None and principal in credentials.principals

    async def _sign_in(self, request: Request, session: Session | None, secure: bool) -> Response:
        render = self.console.render
        access = self.console.access
        if not access.enabled:
            return _redirect("/ui/")
        if request.method == "GET":
            return render.page("sign_in.html", error="", principal="")
        if request.method != "POST":
            raise InvalidArgument("sign in with GET (the form) or POST (a token)")
        if not _same_origin(request):
            raise AccessDenied("a sign-in from another site's page is refused")
        token = (_form(request).get("token") or [""])[0].strip()
        try:
            principal = access.identify(_bearer(request, token)) if token else ""
        except Unauthenticated:
            principal = ""
        if not principal:
            return render.page("sign_in.html", 401, error="That token is not valid.", principal="")
        response = _redirect("/ui/")
        fresh = self.console.sessions.issue(principal)
        response.headers.append(("Set-Cookie", cookie_header(fresh, secure)))
        log.info("console sign-in", extra={"principal": principal})
        return response

    def _check_forgery(self, call: Call) -> None:
        request = call.request
        headers = request.headers
        if not _same_origin(request):
            raise AccessDenied(
                f"a request from another origin ({headers.get('origin', '')[:100]!r}) is refused"
            )
        token = headers.get(CSRF_HEADER) or call.arg(CSRF_FIELD)
        if not self.console.sessions.csrf_ok(call.session, token):
            raise AccessDenied("the CSRF token is missing or wrong: reload the page and try again")


def _route(method: str, path: str) -> View:
    if path == "/ui/" and method == "GET":
        return pages.overview
    if method == "GET" and path in PUBSUB:
        return PUBSUB[path]
    if path == "/ui/fsck" and method == "GET":
        return fsck_panel.page
    if path == "/ui/fsck/check" and method == "POST":
        return fsck_panel.check_now
    parts = path.split("/")  # "", "ui", "q", <queue>, ...
    if path == "/ui/schedules" and method == "GET":
        return schedules_page.page
    if len(parts) == 5 and parts[2] == "schedules" and parts[3] and method == "POST":
        return schedules_page.act
    if len(parts) >= 4 and parts[2] == "q" and parts[3]:
        rest = parts[4:]
        if not rest and method == "GET":
            return pages.queue_page
        if rest == ["browse"] and method == "GET":
            return pages.browse
        if len(rest) in (2, 3) and rest[0] == "m" and method == "GET":
            return pages.raw if rest[2:] == ["raw"] else pages.message
        if len(rest) == 2 and rest[0] == "redrive" and method == "GET":
            return pages.task
        if len(rest) == 1 and method in ("POST", "PUT"):
            action = actions.ACTIONS.get(rest[0])
            if action is not None and (method == "POST" or rest[0] == "configure"):
                return action
    return pages.not_found


def _same_origin(request: Request) -> bool:
    headers = request.headers
    return same_origin(
        headers.get("origin"), headers.get("host"), request.scheme, headers.get("sec-fetch-site")
    )


def _form(request: Request) -> dict[str, list[str]]:
    kind = request.headers.get("content-type", "")
    if request.body and not kind.startswith("application/x-www-form-urlencoded"):
        raise InvalidArgument("the console takes forms (application/x-www-form-urlencoded)")
    try:
        return parse_qs(request.body.decode(), keep_blank_values=True, max_num_fields=20_000)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidArgument(f"the form does not parse: {exc}") from None


def _bearer(request: Request, token: str) -> Request:
    """`request` as an API request carrying `token`: checked as the API checks a Bearer."""
    return Request(
        request.method,
        request.path,
        {},
        {"authorization": f"Bearer {token}"},
        b"",
        request.keep_alive,
        started=time.monotonic(),
    )


def _redirect(location: str) -> Response:
    return Response(303, b"", [("Location", location), ("Cache-Control", "no-store")])
