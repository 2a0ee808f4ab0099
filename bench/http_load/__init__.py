"""HTTP server benchmark: `dirmq serve` against Redis 7 with an append-only file, on loopback.

Run by hand from the project root (never collected by pytest):

    .venv/bin/python -m bench.http_load                   # full run, 5 to 7 minutes
    .venv/bin/python -m bench.http_load --quick           # smoke run, about a minute
    .venv/bin/python -m bench.http_load --profile DIR     # also py-spy each dirmq server under load
    .venv/bin/python -m bench.http_load --only publish,latency --json /tmp/out.json

It installs what it needs itself: Debian's `redis-server` (apt-get) when it is missing, and the
`redis` and `py-spy` packages (pip, into this interpreter). It starts its own Redis (127.0.0.1,
a free port, `--appendonly yes --appendfsync always --save ''`, in a temp dir) and its own
`dirmq serve` processes (127.0.0.1:0), and at the end stops exactly those, by PID, even when a
step fails. It prints a table and writes JSON (default `bench/results/http.json`).

The load generator is the harness's (`bench.harness.loadgen`, run as child processes): raw
uvloop sockets, HTTP/1.1 keep-alive (or RESP for Redis), one request in flight per connection.
Clients and servers share the machine's cores, so every row also says how many cores each side
used (from /proc/<pid>/stat and the clients' own process time).

The box is shared and noisy: each section runs its subjects in rounds, one trial of each per round
in a rotating order, and reports medians; the verdicts against Redis use the median of per-round
ratios. Every loop is bounded both in count and in time.

What is measured:
1. durable publish (writethrough, dirmq root on disk under /tmp), 64 connections, 100 B bodies,
   one worker and two; the batch endpoint (JSON lines, 100 per request); Redis LPUSH with
   `appendfsync always`, 50 clients; and the same syscalls in a bare loop (the floor);
1b. the same durable publish (1 worker) over TLS with a bearer token (a trustme certificate, a
   credentials file) against plain HTTP without credentials, paired per round (section
   `secure`; issue 17 asks for a ratio of at least 0.8);
2. `writeback` publish on tmpfs (/dev/shm), 2 workers and 1; Redis LPUSH with `everysec`; the
   bare-loop floor on tmpfs;
3. get+ack (GET /{q}/messages, then DELETE /{q}/messages/{receipt}) on a prefilled queue, 64
   connections; Redis LMOVE+LREM (the reliable-queue pattern: also two round trips and an ack)
   and plain RPOP, 50 clients;
4. 10,000 held long polls (GET ?wait=60s on an empty queue, root on tmpfs): the server's extra
   RSS, then 10,000 messages published and how fast every poller gets its one; Redis BLPOP alike;
5. publish-to-wake latency: a parked long poll, a publish on another connection, the time from
   sending the POST to the poller holding the message; Redis BLPOP/LPUSH alike.

They run in the order 1, 2, 5, 4, 3: get+ack unlinks the acked files its pool cannot keep, and on
ext4 without a journal every inode freed in the last minutes makes each later inode allocation
slower (the allocator re-checks them), so it goes last; the run probes one allocation's cost at
its start and at its end (keeping the probed inodes: freeing them would slow what follows).
"""

from __future__ import annotations

from bench.http_load.driver import main

__all__ = ["main"]
