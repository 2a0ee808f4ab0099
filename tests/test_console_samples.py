"""The console's samples on a real `dirmq serve --workers 2 --sample-interval 1s`: the series
and rates are the same whichever worker answers, say what was done (published, delivered,
acked), a refresh of an unchanged sample is a 304, a SIGKILLed sampler is replaced by another
worker (the samples keep coming, no count goes backwards), a principal sees the samples of the
queues it may see only, and a root of 1,000 queues with a deep one is sampled from its listings
alone (no message file read)."""

from __future__ import annotations

import glob
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from dirmq.client import RemoteStore
from dirmq.console.samples_files import RECORD, SERIES, Point, SampleFiles, slots
from dirmq.server.credentials import new_token, token_digest
from dirmq.store.filemodes import root_access
from dirmq.store.processes import HOST_TAG, current

from .support.fixtures import serve
from .support.metrics_helpers import make_queues, matching
from .support.servers import ServerProcess, start_server
from .support.waiting import wait_until

PUBLISHED = 120
LEASED = 50
ACKED = 30
READY = PUBLISHED - LEASED + 1  # and one nacked
CONNECTIONS = 24  # each its own connection: the kernel spreads them over both workers
WAIT_S = 30.0


server = serve("--workers", "2", "--sample-interval", "1s")


def _get(server: ServerProcess, path: str, **params: str) -> httpx.Response:
    """On a connection of its own (any worker may answer); retried while a worker is gone."""
    for _attempt in range(50):
        try:
            return httpx.get(f"{server.url}{path}", params=params, timeout=30)
        except httpx.TransportError:  # a worker just killed: its connections are reset
            time.sleep(0.1)
    raise AssertionError("no worker answered")


def _rates(server: ServerProcess) -> dict[str, Any]:
    response = _get(server, "/ui/api/rates")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _answered(server: ServerProcess) -> dict[str, float]:
    """Live workers' pid -> requests they answered (their own gauge, updated every second)."""
    text = _get(server, "/metrics").text
    return {
        dict(labels)["pid"]: n
        for labels, n in matching(text, "dirmq_worker_requests_answered").items()
    }


def _run_dir(server: ServerProcess) -> str:
    name = f"dirmq-metrics.{HOST_TAG}.{current().pid_ns}.{server.proc.pid}.*"
    (found,) = glob.glob(f"/dev/shm/{name}") or glob.glob(f"/tmp/{name}")
    return found


def _latest(server: ServerProcess) -> dict[str, Any]:
    with open(os.path.join(_run_dir(server), "samples", "latest.json"), "rb") as f:
        found: dict[str, Any] = json.load(f)
    return found


def _moved(series: dict[str, Any], kind: str) -> float:
    """How many messages a rate series adds up to (rate x interval over its points)."""
    return sum(r for r in series[f"{kind}_per_s"] if r is not None) * series["interval_s"]


def _work(server: ServerProcess) -> None:
    """PUBLISHED publishes over CONNECTIONS connections, then LEASED leased, ACKED of them
    acked, one nacked, one dead-lettered."""
    assert httpx.put(f"{server.url}/paced").status_code == 201

    def publisher(n: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for i in range(PUBLISHED // CONNECTIONS):
                assert client.post("/paced/messages", content=f"{n}-{i}").status_code == 201

    with ThreadPoolExecutor(CONNECTIONS) as pool:
        list(pool.map(publisher, range(CONNECTIONS)))
    with RemoteStore(server.url) as store:
        queue = store.queue("paced")
        got = queue.get(LEASED)
        assert len(got) == LEASED
        assert queue.ack_many([m.receipt for m in got[:ACKED]]) == {}
        queue.nack(got[ACKED].receipt)  # back to ready
        queue.dead_letter(got[ACKED + 1].receipt)  # into the queue's own dead area


def _settled(server: ServerProcess) -> dict[str, Any] | None:
    """The last sample of queue "paced" once it counts all `_work` did."""
    paced: dict[str, Any] | None = _rates(server)["queues"].get("paced")
    if paced and paced["counts"][:5] == [PUBLISHED, LEASED, ACKED, 1, 1]:
        return paced
    return None


def test_every_worker_answers_the_same_samples_which_say_what_was_done(
    server: ServerProcess,
) -> None:
    _work(server)
    last = wait_until(
        timeout_s=WAIT_S, what="a sample of everything done", check=lambda: _settled(server)
    )
    in_flight = LEASED - ACKED - 2
    assert (last["ready"], last["in_flight"], last["dead"]) == (READY, in_flight, 1)
    # One more sample: the series has points after the work too (rates back at 0).
    t = _rates(server)["t"]
    wait_until(timeout_s=WAIT_S, what="the next sample", check=lambda: _rates(server)["t"] > t)

    before = _answered(server)
    answers: dict[str, set[bytes]] = {}
    for _ in range(40):
        for path, params in (("/ui/api/samples", {"queue": "paced"}), ("/ui/api/rates", {})):
            response = _get(server, path, **params)
            assert response.status_code == 200, response.text
            key = f"{path} {response.headers['etag']}"
            answers.setdefault(key, set()).add(response.content)
    time.sleep(1.5)  # each worker's own request gauge is brought up to date every second
    after = _answered(server)
    assert len(after) == 2 and set(after) == set(before)
    assert all(after[pid] - before[pid] >= 5 for pid in after), (before, after)  # both answered
    # Whichever worker answered, one sample (one ETag) is one answer, byte for byte.
    assert all(len(bodies) == 1 for bodies in answers.values()), answers.keys()

    series = _get(server, "/ui/api/samples", queue="paced").json()
    assert series["interval_s"] == 1 and series["queue"] == "paced"
    assert set(series) == {"interval_s", "queue", *SERIES}
    assert len(series["t"]) == 3600  # the hour at 1 s
    assert all(len(series[name]) == 3600 for name in SERIES)
    assert series["t"] == list(range(series["t"][0], series["t"][0] + 3600))
    assert _moved(series, "published") == PUBLISHED
    assert _moved(series, "delivered") == LEASED
    assert _moved(series, "acked") == ACKED
    assert _moved(series, "nacked") == 1
    assert _moved(series, "dead_lettered") == 1
    assert _moved(series, "expired") == 0
    assert series["ready"][-1] == READY
    assert series["in_flight"][-1] == LEASED - ACKED - 2
    assert series["dead"][-1] == 1
    assert series["published_per_s"][-1] == 0.0
    assert series["ready"][0] is None  # the hour before the server started: no points

    totals = _get(server, "/ui/api/samples").json()
    assert totals["queue"] is None
    assert _moved(totals, "published") == PUBLISHED
    assert totals["ready"][-1] == READY


def test_an_unchanged_sample_is_answered_304(server: ServerProcess) -> None:
    for path, params in (("/ui/api/samples", {"queue": "paced"}), ("/ui/api/rates", {})):
        for _attempt in range(10):  # a new sample may land between the two requests
            first = _get(server, path, **params)
            etag = first.headers["etag"]
            again = httpx.get(f"{server.url}{path}", params=params, headers={"If-None-Match": etag})
            if again.status_code == 304:
                assert again.content == b"" and again.headers["etag"] == etag
                break
            assert again.status_code == 200 and again.headers["etag"] != etag
        else:
            raise AssertionError(f"{path}: never a 304")
        stale = httpx.get(f"{server.url}{path}", params=params, headers={"If-None-Match": '"x"'})
        assert stale.status_code == 200


def test_bad_requests_say_what_was_wrong(server: ServerProcess) -> None:
    missing = _get(server, "/ui/api/samples", queue="nowhere")
    assert missing.status_code == 404 and missing.json()["error"] == "QueueNotFound"
    assert _get(server, "/ui/api/samples", queue="a//b").status_code == 400
    unknown = _get(server, "/ui/api/rates", queue="paced")
    assert unknown.status_code == 400
    assert unknown.json()["message"] == (
        "unknown query parameter 'queue' for /ui/api/rates (it takes: prefix)"
    )
    posted = httpx.post(f"{server.url}/ui/api/rates")
    assert posted.status_code == 405 and posted.headers["allow"] == "GET, HEAD"


def test_a_killed_sampler_is_replaced_and_no_count_goes_backwards(
    server: ServerProcess,
) -> None:
    if not _rates(server)["queues"].get("paced"):
        _work(server)  # run alone
    counts = wait_until(
        timeout_s=WAIT_S, what="a sample of everything done", check=lambda: _settled(server)
    )["counts"]
    sampler = _latest(server)["sampler_pid"]
    killed_at = time.time()
    os.kill(sampler, signal.SIGKILL)

    def replaced() -> dict[str, Any] | None:
        latest = _latest(server)
        if latest["t"] > killed_at + 1 and latest["sampler_pid"] != sampler:
            return latest
        return None

    latest = replaced_by = wait_until(timeout_s=WAIT_S, what="another sampler", check=replaced)
    assert replaced_by["queues"]["paced"]["counts"] == counts  # the dead worker's still count
    t = latest["t"]
    wait_until(
        timeout_s=WAIT_S,
        what="the samples to keep coming",
        check=lambda: _rates(server)["t"] >= t + 2,
    )
    series = _get(server, "/ui/api/samples", queue="paced").json()
    assert series["ready"][-1] == READY


CREDENTIALS = """
[principals.ops]
token_sha256 = "{ops}"
read = ["*"]
write = ["*"]
admin = ["*"]

[principals.viewer]
token_sha256 = "{viewer}"
browse = ["seen*"]
"""


def test_a_principal_sees_the_samples_of_its_queues_only(tmp_path: Path) -> None:
    ops, viewer = new_token(), new_token()
    credentials = tmp_path / "credentials.toml"
    credentials.write_text(CREDENTIALS.format(ops=token_digest(ops), viewer=token_digest(viewer)))
    server = start_server(
        tmp_path / "root", "--sample-interval", "1s", "--credentials", str(credentials)
    )
    try:
        as_ops = {"Authorization": f"Bearer {ops}"}
        as_viewer = {"Authorization": f"Bearer {viewer}"}
        for name in ("seen", "hidden"):
            assert httpx.put(f"{server.url}/{name}", headers=as_ops).status_code == 201
        assert httpx.get(f"{server.url}/ui/api/rates").status_code == 401

        def both_sampled() -> bool:
            got = httpx.get(f"{server.url}/ui/api/rates", headers=as_ops).json()
            return {"seen", "hidden"} <= set(got["queues"])

        wait_until(timeout_s=WAIT_S, what="both queues sampled", check=both_sampled)
        rates = httpx.get(f"{server.url}/ui/api/rates", headers=as_viewer)
        assert set(rates.json()["queues"]) == {"seen"}
        page = httpx.get(f"{server.url}/ui/api/rates", params={"prefix": "hid"}, headers=as_ops)
        assert set(page.json()["queues"]) == {"hidden"}
        assert rates.json()["total"]["ready"] == 0  # totals for any principal
        url = f"{server.url}/ui/api/samples"
        assert httpx.get(url, params={"queue": "seen"}, headers=as_viewer).status_code == 200
        refused = httpx.get(url, params={"queue": "hidden"}, headers=as_viewer)
        assert refused.status_code == 403
        assert refused.json()["message"] == "principal 'viewer' has no permission on queue 'hidden'"
        assert httpx.get(url, params={"queue": "ghost"}, headers=as_viewer).status_code == 403
        assert httpx.get(url, headers=as_viewer).status_code == 200
        # The same sample, another principal: another ETag (what each may see differs).
        for _attempt in range(10):
            tags = [
                httpx.get(f"{server.url}/ui/api/rates", headers=who).headers["etag"]
                for who in (as_ops, as_viewer)
            ]
            if tags[0].split("-")[:2] == tags[1].split("-")[:2]:  # no sample between them
                assert tags[0] != tags[1]
                break
        else:
            raise AssertionError("a new sample between every two requests")
    finally:
        assert server.stop() == 0


DEEP = int(os.environ.get("DIRMQ_TEST_DEEP_QUEUE", "200000"))  # 1,000,000 for the case


def _deep_queue(path: Path, messages: int) -> None:
    """`messages` ready message files of 100 bytes (names as the store writes them; contents
    that no census should ever read)."""
    ready = path / "@ready"
    body = b"x" * 100
    base = 1_700_000_000_000_000
    for n in range(messages):
        fd = os.open(ready / f"{base + n:016d}-{n:012x}", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, body)
        os.close(fd)


def _read_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io", encoding="ascii") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_a_root_of_1000_queues_and_a_deep_one_is_sampled_from_listings(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_queues(root, [f"q{n:04d}" for n in range(1000)])
    _deep_queue(root / "q0500", DEEP)
    server = start_server(root, "--sample-interval", "1s")
    try:
        first = wait_until(timeout_s=WAIT_S, what="a sample", check=lambda: _rates(server)["t"])
        read_before = _read_bytes(server.proc.pid)
        latest = wait_until(
            timeout_s=WAIT_S,
            what="the next sample",
            check=lambda: (s := _latest(server))["t"] > first and s,
        )
        read_s = _read_bytes(server.proc.pid) - read_before
        assert latest["queue_count"] == 1000 and latest["omitted"] == 0
        assert latest["queues"]["q0500"]["ready"] == DEEP
        assert latest["total"]["ready"] == DEEP
        # Listings only: the deep queue's bodies (100 bytes each) were not read.
        assert read_s < DEEP * 100 // 10, read_s
        print(
            f"sample of 1,000 queues, one of {DEEP:,} messages: {latest['sample_s']:.3f} s, "
            f"{latest['sample_cpu_s']:.3f} s CPU; {read_s:,} bytes read by the server meanwhile"
        )
    finally:
        assert server.stop() == 0


def test_a_ring_answers_missing_old_and_half_written_points_as_null(tmp_path: Path) -> None:
    files = SampleFiles(str(tmp_path), root_access(str(tmp_path)))
    interval = 10
    end = 1_795_000_000 // interval * interval

    def point(t: int, ready: int) -> Point:
        return Point(t, (ready, 0, 0, 0), None, (ready,) * 7, (0.3,) * 7)

    # The first is over an hour old, in the slot of end - 30 (which nothing rewrote).
    for t in (end - 3630, end - 20, end - 10, end):
        files.write_points(interval, {"q": point(t, max(0, t - end + 100))})
    path = files.ring_path("q")
    with open(path, "r+b") as ring:  # the record of end - 10 caught half-written
        slot = (end - 10) // interval % slots(interval)
        ring.seek(slot * RECORD.size + RECORD.size - 4)
        ring.write(b"\0\0\0\0")
    series = files.read_series("q", interval, end)
    assert series["t"][-3:] == [end - 20, end - 10, end]
    assert series["ready"][-3:] == [80, None, 100]
    assert series["published_per_s"][-3:] == [0.3, None, 0.3]  # a float32 as the number it was
    assert series["oldest_ready_age_s"][-1] is None
    assert series["ready"][:-3] == [None] * (slots(interval) - 3)  # the hour-old one included
    assert files.read_series("never", interval, end)["ready"] == [None] * slots(interval)


def test_a_sample_written_while_an_answer_is_built_is_named_by_its_own_tag(
    tmp_path: Path,
) -> None:
    """A new sample replacing the last one between the tag's stat and the read: the answer
    carries the tag of the sample it holds (one tag, one body, whichever worker answers)."""
    import asyncio

    import dirmq
    from dirmq.console.samples_api import SamplesApi
    from dirmq.server.broker import Broker
    from dirmq.server.contract import Request

    def sample(t: int) -> dict[str, Any]:
        total = {"ready": t}
        return {"interval_s": 1, "t": t, "queues": {"q": total}, "total": total,
                "queue_count": 1, "omitted": 0}  # fmt: skip

    written: list[str] = []  # the tag of each sample written just before a read

    async def main() -> list[tuple[str, dict[str, Any]]]:
        store = dirmq.Store(tmp_path / "root")
        store.create_queue("q")
        broker = Broker(store)
        api = SamplesApi(broker, str(tmp_path / "run"), interval_s=1, max_queues=10)
        files = api.files
        files.write_latest(sample(100))
        read_latest = files.read_latest

        def replaced_first() -> Any:
            files.write_latest(sample(101 + len(written)))  # the next sample lands just now
            version = files.latest_version()
            assert version is not None
            written.append(f'"{version[0]:x}-{version[1]:x}"')
            return read_latest()

        files.read_latest = replaced_first  # type: ignore[method-assign]
        answers = []
        for path, query in (("/ui/api/rates", {}), ("/ui/api/samples", {"queue": "q"})):
            response = await api(Request("GET", path, query, {}, b"", True))
            assert response.status == 200, response.body
            answers.append((dict(response.headers)["ETag"], json.loads(response.body)))
        broker.close()
        store.close()
        return answers

    (rates_tag, rates), (samples_tag, samples) = asyncio.run(main())
    assert (rates["t"], samples["t"][-1]) == (101, 102)
    assert [rates_tag, samples_tag] == written
