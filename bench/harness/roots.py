"""Roots of many queues and deep queues, built straight into the on-disk layout (docs/FORMAT.md):
thousands of empty queues in a second, where `create_queue` would take minutes."""

from __future__ import annotations

import os
from collections import Counter
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


def fill_ready(queue_dir: Path, count: int, body: bytes, levels: int = 1) -> None:
    """`count` bare messages of `body` written straight into the queue's layout as puts lay
    them out (docs/FORMAT.md, "A message file", "The backlog" and "Priorities"), spread in turn
    over the priority levels 0 to `levels`-1: per level, into `@ready/` until it holds
    `SPILL_AT` of that level, the rest into the level's backlog tree, but without fsyncs: a
    million in about a minute, where `put_many` would take several. Their ids follow every id
    this process minted before (so a deeper fill goes behind what is there)."""
    from dirmq.store import backlog, codec, ids, layout

    ready = queue_dir / layout.READY
    held = Counter(layout.level_of(name) for name in os.listdir(ready))
    room = {
        level: 0 if backlog.occupied(str(queue_dir), level) else backlog.SPILL_AT - held[level]
        for level in range(levels)
    }
    made: set[Path] = set()
    chunk = 10_000
    n = 0
    for start in range(0, count, chunk):
        for message_id in ids.new_ids(min(chunk, count - start)):
            level = n % levels
            n += 1
            name = layout.ready_name(message_id, 0, None, level)
            if room[level] > 0:
                room[level] -= 1
                path = ready / name
            else:
                bucket = queue_dir / backlog.relative_dir(name)
                if bucket not in made:
                    bucket.mkdir(parents=True, exist_ok=True)
                    made.add(bucket)
                path = bucket / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, codec.encode(body, {}, message_id=message_id))
            finally:
                os.close(fd)
