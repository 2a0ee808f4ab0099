"""The console's pub/sub pages, views on the broker's thread pool as `pages.py`'s are:

    GET /ui/pubsub                       channels, subscriptions (filters, position, lag, held,
                                         delivery policy), the log's head
    GET /ui/pubsub/log?after=&channel=   the retained log, 100 entries a page after sequence
                                         number `after`, on channels starting with `channel`

Each shows what the pub/sub API would show the same principal: subscriptions it may see (as
`GET /@pubsub/subscriptions`), counters with the metrics permission (as `GET /@pubsub`), and the
log only with `browse` on every channel the page asks for (as `GET /@pubsub/retained`). Looking
reads files only: no cursor moves, nothing is delivered, nothing is created.
"""

from __future__ import annotations

from urllib.parse import urlencode

from dirmq.console.call import Call, Console
from dirmq.console.pubsub_view import LOG_PAGE, hub_of, log_page, pubsub_summary, viewer_of
from dirmq.errors import InvalidArgument
from dirmq.pubsub.layout import SEQ_DIGITS
from dirmq.server.contract import Response
from dirmq.server.credentials import BROWSE


def pubsub(console: Console, call: Call) -> Response:
    principal = call.session.principal
    return console.render.page(
        "pubsub.html",
        principal=principal,
        signed_in=console.access.enabled,
        csrf=call.csrf,
        pubsub=pubsub_summary(console, principal),
        log_url=log_url,
    )


def pubsub_log(console: Console, call: Call) -> Response:
    query = call.request.query
    channel = query.get("channel", "")
    after = _seq(query.get("after", "0") or "0")
    principal = call.session.principal
    access = console.access
    viewer = viewer_of(console, principal)
    if not viewer.log(channel):
        target = f"every channel starting with {channel[:100]!r}"
        raise access.refusal(principal, BROWSE, target)
    hub = hub_of(console)
    page = log_page(hub, after, channel) if hub is not None else None
    newest = max(0, page.head - LOG_PAGE) if page is not None else 0
    return console.render.page(
        "pubsub_log.html",
        principal=principal,
        signed_in=access.enabled,
        csrf=call.csrf,
        log=page,
        channel=channel,
        after=after,
        newest=newest,
        whole_log=viewer.log(""),
        log_url=log_url,
    )


def log_url(after: int = 0, channel: str = "") -> str:
    """A log page's URL: its cursor and channel prefix (neither when 0 and "")."""
    query = urlencode({k: v for k, v in (("after", after), ("channel", channel)) if v})
    return "/ui/pubsub/log" + ("?" + query if query else "")


def _seq(text: str) -> int:
    if not text.isdigit() or len(text) > SEQ_DIGITS:
        raise InvalidArgument(f"after= takes a sequence number (0: the start), not {text[:40]!r}")
    return int(text)
