"""The console's pub/sub pages over HTTP on a real `dirmq serve` (issue 33): subscriptions with
their filters, position, lag, held deliveries and delivery policy; channels; the retained log
paged by sequence number, its bodies and headers escaped; permissions as the pub/sub API asks
them; and looking moves no cursor, delivers nothing and creates nothing."""

from __future__ import annotations

import html
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import dirmq
from dirmq.pubsub.hub import PubSub
from dirmq.server.credentials import new_token, token_digest

from .support.console import signed_in
from .support.servers import ServerProcess, fresh, start_server

XSS = "<img src=x onerror=alert(1)>"
OPS, SHOP, OUTSIDER = new_token(), new_token(), new_token()
CREDENTIALS = f"""
[principals.ops]
token_sha256 = "{token_digest(OPS)}"
metrics = true
read = ["*"]
write = ["*"]
admin = ["*"]

[principals.shop]
token_sha256 = "{token_digest(SHOP)}"
browse = ["@channel/shop*", "@subscription/shop-*"]

[principals.outsider]
token_sha256 = "{token_digest(OUTSIDER)}"
write = ["orders*"]
"""


@pytest.fixture
def ui(module_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=module_server.url, timeout=30) as browser:
        yield browser


@pytest.fixture
def hub(module_lib: dirmq.Store) -> PubSub:
    return PubSub(module_lib)


def row_of(page: str, attribute: str, value: str) -> list[str]:
    """The cells of the row `<tr data-<attribute>="<value>">`, their tags removed."""
    found = re.search(rf'<tr data-{attribute}="{re.escape(value)}"[^>]*>(.*?)</tr>', page, re.S)
    assert found, page[-3000:]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", found.group(1), re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in cells]


def seqs_of(page: str) -> list[int]:
    return [int(s) for s in re.findall(r'<tr data-seq="(\d+)"', page)]


def tree(directory: str) -> dict[str, bytes]:
    """Every file under `directory` with its content: what a look must leave as it was."""
    found = {}
    for top, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(top, name)
            with open(path, "rb") as file:
                found[os.path.relpath(path, directory)] = file.read()
    return found


# -- subscriptions and channels --------------------------------------------------------------------
def test_subscriptions_show_position_lag_held_and_policy(
    ui: httpx.Client, module_lib: dirmq.Store, hub: PubSub
) -> None:
    name, dlq = fresh("billing"), fresh("billing-dlq")
    module_lib.create_queue(dlq)
    channel = fresh("orders")
    head = hub.retained.refresh_head()
    with hub.subscribe(
        name,
        replay_from=head + 1,  # what is published from now on (else the whole log)
        channels=[channel],
        subjects=["created"],
        max_deliveries=4,
        backoff_s=2,
        dead_letter=dlq,
    ) as subscription:
        hub.publish(channel, b"for anyone", subject="created")  # the pool: taken when received
        held = subscription.receive(wait_s=5)
        assert held is not None and held.mode == "anyone"
        for n in range(3):
            hub.publish(channel, f"kept {n}".encode(), subject="created", mode="future")
        page = ui.get("/ui/pubsub")
        assert page.status_code == 200
        cells = row_of(page.text, "subscription", name)
        position = head + 1  # it has read none of the three yet
        assert cells == [
            name,
            channel,
            "created",
            "yes",
            str(position),
            "3",  # lag
            "1",  # held
            "4",
            "2 s, doubling up to 300 s",
            dlq,
        ]
        assert f'href="/ui/q/{dlq}"' in page.text
        subscription.done(held)
    channels = row_of(page.text, "channel", channel)
    assert channels[0] == channel and channels[1] == "3"  # three retained on it
    assert channels[2].startswith(f"#{head + 3}, ") and channels[3] == "1"
    overview = ui.get("/ui/").text
    assert 'href="/ui/pubsub"' in overview and "no channels seen" not in overview
    assert f'<tr><td>{channel}</td><td class="n">3</td><td class="n">1</td></tr>' in overview


def test_looking_moves_no_cursor_and_delivers_nothing(
    ui: httpx.Client, module_server: ServerProcess, hub: PubSub
) -> None:
    name, channel = fresh("looker"), fresh("news")
    head = hub.retained.refresh_head()
    hub.subscribe(name, channels=[channel], replay_from=head + 1).close()
    for n in range(5):
        hub.publish(channel, f"story {n}".encode(), mode="future")
    hub.publish(fresh("unheard"), b"for anyone")  # waits in the pool: nobody takes it
    pubsub = Path(module_server.root) / "@pubsub"
    before = tree(str(pubsub / "subs")), sorted(os.listdir(pubsub / "anyone"))
    for path in ("/ui/pubsub", "/ui/pubsub/log", f"/ui/pubsub/log?after={head}", "/ui/"):
        assert ui.get(path).status_code == 200
    assert row_of(ui.get("/ui/pubsub").text, "subscription", name)[4:7] == [
        str(head + 1),
        "5",
        "0",
    ]
    assert (tree(str(pubsub / "subs")), sorted(os.listdir(pubsub / "anyone"))) == before
    with hub.subscribe(name, channels=[channel]) as subscription:  # all of it still to come
        first = subscription.receive(wait_s=5)
        assert first is not None and first.body == b"story 0"
        subscription.done(first)


# -- the retained log ------------------------------------------------------------------------------
def test_the_log_pages_by_sequence_number(ui: httpx.Client, hub: PubSub) -> None:
    channel = fresh("paged")
    head = hub.retained.refresh_head()
    for n in range(150):
        hub.publish(channel, f"entry {n}".encode(), mode="future", persistence="none")
    first = ui.get("/ui/pubsub/log", params={"after": head})
    assert first.status_code == 200
    assert seqs_of(first.text) == list(range(head + 1, head + 101))
    cursor = re.search(r'href="/ui/pubsub/log\?after=(\d+)" id="next-page"', first.text)
    assert cursor and int(cursor.group(1)) == head + 100
    second = ui.get("/ui/pubsub/log", params={"after": cursor.group(1)})
    assert seqs_of(second.text) == list(range(head + 101, head + 151))
    assert 'id="next-page"' not in second.text
    assert "entry 149" in second.text and "entry 99" not in second.text
    [row] = [r for r in [row_of(second.text, "seq", str(head + 150))]]
    assert row[0] == str(head + 150) and row[1] == channel and row[3] == "future"
    # a channel's entries only, from the start of the log
    only = ui.get("/ui/pubsub/log", params={"channel": channel}).text
    assert seqs_of(only)[:2] == [head + 1, head + 2] and len(seqs_of(only)) == 100
    assert ui.get("/ui/pubsub/log", params={"after": "x"}).status_code == 400
    assert ui.get("/ui/pubsub/log", params={"after": "-1"}).status_code == 400


def test_a_page_of_large_bodies_stops_at_8_mib_and_its_cursor_goes_on(
    ui: httpx.Client, hub: PubSub
) -> None:
    channel = fresh("large")
    head = hub.retained.refresh_head()
    big = 3 * 1024 * 1024
    for n in range(4):
        hub.publish(channel, bytes([65 + n]) * big, mode="future", persistence="none")
    first = ui.get("/ui/pubsub/log", params={"after": head}).text
    assert seqs_of(first) == [head + 1, head + 2, head + 3]  # 9 MiB read: no more
    assert "cut: 3.0 MiB in all" in first and "A" * 4096 in first and "A" * 4097 not in first
    cursor = re.search(r'href="/ui/pubsub/log\?after=(\d+)" id="next-page"', first)
    assert cursor and int(cursor.group(1)) == head + 3
    second = ui.get("/ui/pubsub/log", params={"after": cursor.group(1)}).text
    assert seqs_of(second) == [head + 4]
    # the channel's count reads the files' heads only, large or not
    assert row_of(ui.get("/ui/pubsub").text, "channel", channel)[1] == "4"


def test_a_hostile_body_and_header_are_shown_as_text(ui: httpx.Client, hub: PubSub) -> None:
    channel = fresh("hostile")
    head = hub.retained.refresh_head()
    hub.publish(channel, XSS.encode(), mode="future", headers={"X-Evil": XSS})
    page = ui.get("/ui/pubsub/log", params={"after": head}).text
    assert XSS not in page
    assert page.count(html.escape(XSS, quote=False)) == 2  # the header's value and the body
    assert row_of(page, "seq", str(head + 1))[5:] == [f"X-Evil{XSS}", XSS]


def test_a_lost_entry_is_shown_as_lost(
    ui: httpx.Client, module_server: ServerProcess, hub: PubSub
) -> None:
    channel = fresh("lost")
    head = hub.retained.refresh_head()
    for n in range(2):
        hub.publish(channel, f"n{n}".encode(), mode="future")
    os.unlink(hub.paths.retained_entry(head + 1))
    page = ui.get("/ui/pubsub/log", params={"after": head}).text
    assert row_of(page, "seq", str(head + 1))[1] == "lost: absent"
    assert row_of(page, "seq", str(head + 2))[1] == channel


# -- who sees what ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("console-pubsub")
    path = base / "credentials.toml"
    path.write_text(CREDENTIALS)
    path.chmod(0o600)
    running = start_server(base / "root", "--credentials", str(path))
    yield running
    assert running.stop() == 0


def test_each_principal_sees_what_the_pubsub_api_would_show_it(guarded: ServerProcess) -> None:
    with dirmq.Store(guarded.root, create=False) as store:
        hub = PubSub(store)
        hub.subscribe("shop-mails", channels=["shop"]).close()
        hub.subscribe("audit", channels=["secret"]).close()
        hub.publish("shop.orders", b"an order", mode="future")
        hub.publish("secret.keys", b"a key", mode="future")
    with signed_in(guarded, OPS) as ops:
        page = ops.get("/ui/pubsub").text
        assert 'id="log-link"' in page and "audit" in page and "secret.keys" in page
        assert "waiting for anyone" in page  # the counters of `GET /@pubsub`: metrics
        log = ops.get("/ui/pubsub/log")
        assert log.status_code == 200 and seqs_of(log.text) == [1, 2]
    with signed_in(guarded, SHOP) as shop:
        page = shop.get("/ui/pubsub").text
        assert 'data-subscription="shop-mails"' in page and "audit" not in page
        assert "waiting for anyone" not in page
        assert 'data-channel="shop.orders"' in page and "secret" not in page
        assert 'id="log-link"' not in page and 'href="/ui/pubsub/log"' not in page
        assert 'href="/ui/pubsub/log?channel=shop.orders"' in page  # its own channels' log
        assert shop.get("/ui/pubsub/log").status_code == 403
        assert shop.get("/ui/pubsub/log", params={"channel": "secret"}).status_code == 403
        mine = shop.get("/ui/pubsub/log", params={"channel": "shop"})
        assert mine.status_code == 200 and seqs_of(mine.text) == [1]
        overview = shop.get("/ui/").text
        assert 'href="/ui/pubsub/log"' not in overview and "secret" not in overview
    with signed_in(guarded, OUTSIDER) as outsider:
        page = outsider.get("/ui/pubsub").text
        assert "no subscriptions" in page and "no channels seen" in page
        assert outsider.get("/ui/pubsub/log").status_code == 403
    with httpx.Client(base_url=guarded.url, timeout=30) as nobody:
        assert nobody.get("/ui/pubsub/log").status_code == 303  # to the sign-in page


def test_a_root_that_never_used_pubsub_says_so_and_gets_nothing(tmp_path: Path) -> None:
    running = start_server(tmp_path / "root")
    try:
        with httpx.Client(base_url=running.url, timeout=30) as ui:
            for path in ("/ui/pubsub", "/ui/pubsub/log", "/ui/"):
                answer = ui.get(path)
                assert answer.status_code == 200
                if path != "/ui/":
                    assert "pub/sub is not in use" in answer.text
        assert not (tmp_path / "root" / "@pubsub").exists()
    finally:
        assert running.stop() == 0
