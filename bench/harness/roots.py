"""Roots of many queues, built straight into the on-disk layout (docs/FORMAT.md): thousands of
empty queues in a second, where `create_queue` would take minutes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def make_queues(root: Path, names: Sequence[str]) -> None:
    """A root at `root` (made if new) holding an empty queue, with the default config, under each
    of `names`."""
    import dirmq
    from dirmq.store import layout

    dirmq.Store(root).close()
    config = dirmq.QueueConfig().dumps()
    for name in names:
        path = root / name
        for directory in layout.STATE_DIRS:
            (path / directory).mkdir(parents=True, exist_ok=True)
        (path / layout.CONFIG_FILE).write_bytes(config)
