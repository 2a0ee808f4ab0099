"""Consumers of the flow-control tests (pause, delivery rate, TTL): `python -m
tests.support.flow_workers ROLE ...`. Each prints one line per message it received, `<epoch
seconds of the claim> <body>`, flushed, so the parent can count what was delivered when."""

from __future__ import annotations

import sys
import time

import httpx

import dirmq


def library(root: str, queue: str, run_s: str) -> None:
    """Receive (library, long polls of 1 s) and ack for `run_s` seconds."""
    q = dirmq.Store(root).queue(queue)
    end = time.monotonic() + float(run_s)
    visibility = 60.0
    while time.monotonic() < end:
        wait_s = min(1.0, max(0.0, end - time.monotonic()))
        for message in q.get(5, visibility_s=visibility, wait_s=wait_s):
            claimed = (message.lease_deadline_s or 0.0) - visibility
            print(f"{claimed:.3f} {message.body.decode()}", flush=True)
            q.ack(message.receipt or "")


def native(url: str, queue: str, run_s: str) -> None:
    """Receive over the native HTTP API (long polls of 1 s) and ack for `run_s` seconds."""
    end = time.monotonic() + float(run_s)
    with httpx.Client(base_url=url, timeout=30) as http:
        while time.monotonic() < end:
            answer = http.get(f"/{queue}/messages", params={"wait": "1", "visibility": "60"})
            if answer.status_code == 204:
                continue
            answer.raise_for_status()
            claimed = float(answer.headers["x-lease-deadline"]) - 60
            print(f"{claimed:.3f} {answer.text}", flush=True)
            http.delete(f"/{queue}/messages/{answer.headers['x-receipt']}").raise_for_status()


if __name__ == "__main__":
    {"library": library, "native": native}[sys.argv[1]](*sys.argv[2:])
