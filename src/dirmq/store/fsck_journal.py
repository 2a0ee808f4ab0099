"""`dirmq fsck` of `@journal/`, the commit journals (journal.py, journal_replay.py).

A journal whose owner runs is in use: nothing to say. One of a process that died in this boot,
or of an earlier boot (a machine crash), is a notice: the next process to open the root
recovers it, and so does a repair (this boot's: the filesystem flushed and the journal removed;
an earlier boot's: claimed, its missing messages written back, removed). Anything else there
is stray (left alone). One kept when a flush of the filesystem that was to clear it failed
(`unflushed.<name>`) is an error with no repair: kept until a reboot, when it is replayed.
"""

from __future__ import annotations

import os
from functools import partial

from dirmq.store import layout
from dirmq.store.fsck_findings import Kind, Run
from dirmq.store.fsio import fsync_dir
from dirmq.store.journal_judge import Judged, Verdict, judge_all
from dirmq.store.journal_replay import recover


def check_journals(run: Run) -> None:
    directory = os.path.join(run.root, layout.JOURNAL_DIR)
    if not os.path.isdir(directory):
        return
    for judged in judge_all(run.root):
        path = os.path.join(directory, judged.name)
        owner = judged.owner
        if judged.verdict is Verdict.UNKNOWN:
            run.add("", path, Kind.STRAY, "unknown file (not a commit journal's name)")
        elif judged.verdict is Verdict.FOREIGN:
            detail = (
                f"a commit journal of {owner} whose header this dirmq does not read (a newer "
                "format?): left alone; recover it with the dirmq that wrote it"
            )
            run.add("", path, Kind.STRAY, detail)
        elif judged.verdict is Verdict.DEAD:
            detail = f"the commit journal of {owner}, which is gone (this boot)"
            run.fix("", path, Kind.JOURNAL, detail, partial(_recover, run, judged))
        elif judged.verdict is Verdict.UNFLUSHED:
            detail = (
                f"the commit journal of {owner}, kept when a flush of the filesystem that "
                "was to clear it failed (a disk error): messages it covers may not be on the "
                "disk; kept, "
                "and replayed after the next reboot: check the disk (its log, SMART), and "
                "keep this file until then"
            )
            run.add("", path, Kind.UNFLUSHED_JOURNAL, detail)
        elif judged.verdict is Verdict.CRASHED:
            detail = f"the commit journal of {owner}, of an earlier boot (a machine crash)"
            run.fix("", path, Kind.JOURNAL, detail, partial(_recover, run, judged))


def _recover(run: Run, judged: Judged) -> str:
    written = recover(run.root, judged, run.access)
    fsync_dir(os.path.join(run.root, layout.JOURNAL_DIR))
    if judged.verdict is Verdict.DEAD:
        return "flushed the filesystem (its messages are on the disk) and removed it"
    return f"replayed it ({written} missing message(s) written back) and removed it"
