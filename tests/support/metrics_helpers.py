"""For the metrics tests: reading a Prometheus exposition (with prometheus-client's own parser),
counting a process's inotify watches (what a scrape must not leave behind), and making many
queues quickly."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import dirmq
from dirmq.store import layout


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(text: str, name: str, **labels: str) -> float | None:
    """The one sample `name{labels}` (exactly those labels), or None."""
    return samples(text).get((name, frozenset(labels.items())))


def matching(text: str, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return {
        found: number
        for (sample, found), number in samples(text).items()
        if sample == name and wanted <= found
    }


def inotify_watches(pid: int | str = "self") -> int:
    """The inotify watches process `pid` holds, over all its inotify descriptors."""
    total = 0
    fdinfo = f"/proc/{pid}/fdinfo"
    for fd in os.listdir(fdinfo):
        try:
            with open(f"{fdinfo}/{fd}", encoding="ascii", errors="replace") as info:
                total += info.read().count("inotify wd:")
        except OSError:  # closed meanwhile
            continue
    return total


def make_queues(root: Path, names: Iterable[str]) -> None:
    """Queues as `Store.create_queue` lays them out, without its fsyncs (10,000 in a couple of
    seconds): what a census sees is the same."""
    dirmq.Store(root).close()  # the root marker
    config = dirmq.QueueConfig().dumps()
    for name in names:
        path = root / name
        for directory in layout.STATE_DIRS:
            (path / directory).mkdir(parents=True, exist_ok=True)
        (path / layout.CONFIG_FILE).write_bytes(config)
