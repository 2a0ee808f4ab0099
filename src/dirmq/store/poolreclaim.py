"""Pool directories of processes (pool.py): their names, whose they are, and reclaiming the
pools of processes that are gone.

A process's own pool is `@free/<process>-<nonce>/` (`pool_dir_name`; processes.py: the
identity). The pool of a dead process is reclaimed by `reclaim_pools` (on queue open, by sweep
and by fsck): its blank files go back to the shared pool, and the others (unreaped, or half
overwritten when it died) are unlinked, never handed on. A pool of another host cannot be
checked for liveness: after `ORPHAN_POOL_GRACE_S` untouched it is deleted, never reused.
"""

from __future__ import annotations

import os
import re
import time
from enum import Enum

from dirmq.store.processes import Liveness, current, liveness, parse_token
from dirmq.store.recycled import DEFAULT_POOL_FILES, MAX_RECYCLED_BYTES, is_blank

ORPHAN_POOL_GRACE_S = 3600.0  # a pool of another host: its owner is presumed dead after this

_POOL_DIR_RE = re.compile(r"(.+)-([0-9a-f]{8})")


def pool_dir_name() -> str:
    """This process's own pool directory name, `<process>-<nonce>` (processes.py: its identity;
    a fresh nonce each time: never reused)."""
    return f"{current().token()}-{os.urandom(4).hex()}"


class Owner(Enum):
    """Whose a pool directory is, as far as this process can tell."""

    ALIVE = "alive"  # its process runs (or might: another host, not old): leave it alone
    DEAD = "dead"  # its process is gone for sure: its files may be reused
    STALE = "stale"  # another host's, untouched for an hour: delete, never reuse (see below)
    UNKNOWN = "unknown"  # not a pool directory name


def pool_owner(name: str, path: str) -> Owner:
    match = _POOL_DIR_RE.fullmatch(name)
    # A pool's name has always carried all four fields (no earlier, shorter form).
    owner = parse_token(match.group(1)) if match and match.group(1).count(".") == 3 else None
    if owner is None:
        return Owner.UNKNOWN
    alive = liveness(owner)
    if alive is not Liveness.UNKNOWN:
        return Owner.ALIVE if alive is Liveness.ALIVE else Owner.DEAD
    # Liveness on another host (or in another pid namespace) cannot be checked; an owner
    # that is merely idle could still be overwriting a file it took, so its files are only
    # ever deleted (a put of its that loses its file fails), never handed to another writer.
    try:
        idle_s = time.time() - os.lstat(path).st_mtime
    except OSError:  # gone, or its age cannot be read now: judged again next time
        return Owner.ALIVE
    return Owner.STALE if idle_s > ORPHAN_POOL_GRACE_S else Owner.ALIVE


def reclaim_pool(pool_dir: str, free_dir: str, owner: Owner, room: int) -> int:
    """Empty and remove the pool directory of a process that is gone; returns files handled.

    A dead owner's files go back to the shared pool (up to `room` of them), the rest are
    unlinked. A file that also has another name is only unlinked: after a machine crash on a
    filesystem without ordered metadata, a rename can survive at its target while its source
    entry comes back, so a pool name can share its inode with a published message; overwriting
    it would change that message. So is a file that is not blank: its owner died between
    renaming it into its pool and blanking it (an acknowledged message is never shared)."""
    handled = 0
    try:
        entries = list(os.scandir(pool_dir))
    except FileNotFoundError:
        return 0
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            reuse = (
                owner is Owner.DEAD
                and room > 0
                and entry.is_file(follow_symlinks=False)
                and st.st_nlink == 1
                and st.st_size <= MAX_RECYCLED_BYTES
                and is_blank(entry.path, st.st_size)
            )
            if reuse:
                os.rename(entry.path, os.path.join(free_dir, entry.name))
                room -= 1
            else:
                os.unlink(entry.path)
            handled += 1
        except FileNotFoundError:
            continue  # another process reclaimed it first
        except IsADirectoryError:
            continue  # not ours to guess about; the rmdir below fails and fsck reports it
        except OSError:
            break  # the disk refuses writes now (read-only, failing): reclaimed next time
    try:
        os.rmdir(pool_dir)
    except OSError:
        pass
    return handled


def reclaim_pools(free_dir: str, capacity: int = DEFAULT_POOL_FILES) -> int:
    """Reclaim the pools of dead processes in `free_dir`, keeping the shared pool within
    `capacity` files; returns how many pools."""
    reclaimed = 0
    try:
        with os.scandir(free_dir) as it:
            entries = list(it)
    except OSError:  # gone, or unreadable now (a failing disk): reclaimed next time
        return 0
    dirs = [e for e in entries if e.is_dir(follow_symlinks=False)]
    room = capacity - (len(entries) - len(dirs))
    for entry in dirs:
        owner = pool_owner(entry.name, entry.path)
        if owner in (Owner.DEAD, Owner.STALE):
            room -= reclaim_pool(entry.path, free_dir, owner, room)
            reclaimed += 1
    return reclaimed
