"""Several hosts on one root through the library, on a real GlusterFS volume (issue 19): two
producers and two consumers on each of two mounts of one volume (two mounts stand for two
hosts; tests/support/gluster.py), one queue, visibility far beyond the run, every message
acknowledged
once (tests/support/gluster_load.py counts). The store runs in its shared-filesystem mode, chosen by
itself for the FUSE mount (docs/FORMAT.md, "Filesystems"). Skipped, saying why, where the
machine cannot run a volume (root, /dev/fuse). The servers' part is test_gluster_servers.py."""

from __future__ import annotations

import os

from dirmq.store.filesystems import is_shared

from .support.gluster import GlusterVolume
from .support.gluster_load import run_load

# About 30 s of load on a busy 2-core machine (plus ~20 s of volume set-up); more by hand:
# DIRMQ_GLUSTER_MESSAGES=10000, or `python tests/support/gluster_load.py run 10000`.
MESSAGES = int(os.environ.get("DIRMQ_GLUSTER_MESSAGES", "600"))
# The 4 consumers each pick one of the 8 oldest (the queue's `peers`), as an operator would
# set it for them: racing for one head, a consumer on a shared filesystem loses most claims.
PEERS = 7


def test_producers_and_consumers_on_two_mounts_lose_nothing_and_deliver_once(
    gluster_volume: GlusterVolume,
) -> None:
    roots = [os.path.join(mount, "library") for mount in gluster_volume.mounts]
    assert all(is_shared(mount) for mount in gluster_volume.mounts)  # the mode is chosen
    timeout_s = max(120.0, MESSAGES / 10)  # well under the visibility at the default count
    result = run_load(roots, MESSAGES, visibility_s=120.0, timeout_s=timeout_s, peers=PEERS)
    summary = (
        f"{result.published} published, {result.acked} acked, {result.lost} lost, "
        f"{result.twice} twice, {result.quarantined} quarantined, {result.stale} stale "
        f"in {result.seconds} s; {result.details}; errors {result.errors}"
    )
    assert result.published == MESSAGES, summary
    assert result.lost == 0, summary
    assert result.twice == 0, summary
    assert result.quarantined == 0, summary
    assert result.stale == 0, summary
    assert result.errors == [], summary
    assert result.fsck == {root: [] for root in roots}, result.fsck
