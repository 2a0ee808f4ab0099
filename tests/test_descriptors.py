"""A batch holds a bounded number of descriptors: 2,000 messages under a 1,024-descriptor limit
(RLIMIT_NOFILE) are stored, by the library and by the server, instead of failing with EMFILE
(which a retry could never cure)."""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

import dirmq
from dirmq.store import layout
from dirmq.store.publishing import OPEN_FILES_PER_BATCH

from .support.faultfs import FaultyFS
from .support.servers import REPO, start_server

LIMIT = 1024
BATCH = 2000

_LIBRARY = textwrap.dedent(
    """
    import resource, sys
    import dirmq
    from dirmq.store import fsio

    class Everything:
        def __contains__(self, item): return True
        def add(self, item): pass

    if sys.argv[2] == "named":  # the fallback without O_TMPFILE (e.g. NFS)
        fsio._tmpfile_unsupported = Everything()
    resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))
    with dirmq.Store(sys.argv[1]) as store:
        for durability in ("writethrough", "writeback", "memory"):
            q = store.create_queue(durability)
            bodies = [b"%d" % i for i in range({batch})]
            q.put_many(bodies, durability=durability)
            got = q.get({batch})
            assert [m.body for m in got] == bodies, "not all, or not in order"
            assert not q.ack_many(m.receipt for m in got)
            # Again, now from recycled files (this process's pool and the shared one).
            q.put_many(bodies, durability=durability)
            assert q.stats().ready == {batch}
    print("ok")
    """
).format(limit=LIMIT, batch=BATCH)


@pytest.mark.parametrize("temp_files", ["O_TMPFILE", "named"])
def test_a_large_batch_fits_under_a_low_descriptor_limit(tmp_path: Path, temp_files: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _LIBRARY, str(tmp_path / "root"), temp_files],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


def test_server_stores_a_large_json_lines_batch_under_a_low_descriptor_limit(
    tmp_path: Path,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(LIMIT, hard), hard))
    try:  # the server inherits the limit; this process gets its own back at once
        server = start_server(tmp_path / "root")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        lines = "".join(json.dumps({"body": f"m{i}"}) + "\n" for i in range(BATCH))
        with httpx.Client(base_url=server.url, timeout=120) as client:
            assert client.put("/q").status_code == 201
            answer = client.post(
                "/q/messages",
                content=lines.encode(),
                headers={"Content-Type": "application/x-ndjson"},
            )
            assert answer.status_code == 201, answer.text
            assert len(answer.json()["ids"]) == BATCH
            assert client.get("/q").json()["stats"]["ready"] == BATCH
    finally:
        server.stop()


@pytest.mark.parametrize("call", ["link_fd", "write"])
def test_a_large_batch_that_fails_midway_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    root = tmp_path / "root"
    with dirmq.Store(root) as store:
        q = store.create_queue("q")
        fs = FaultyFS(monkeypatch, root)
        fs.fail(call, errno.ENOSPC, after=0 if call == "link_fd" else OPEN_FILES_PER_BATCH + 5)
        with pytest.raises(dirmq.DiskFull):
            q.put_many([b"x"] * (OPEN_FILES_PER_BATCH + 10))
        fs.clear()
        assert fs.raised[call] == 1
        for directory in (layout.TMP, layout.READY):
            assert os.listdir(root / "q" / directory) == []
        q.put_many([b"y"] * (OPEN_FILES_PER_BATCH + 10))
        assert q.stats().ready == OPEN_FILES_PER_BATCH + 10
