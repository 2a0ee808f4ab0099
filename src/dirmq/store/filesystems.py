"""Which filesystem a root is on, as far as the store's choices go: a local disk, where one
kernel sees every change, or a shared one (NFS, SMB/CIFS, FUSE such as GlusterFS, CephFS, 9p,
Lustre, GPFS), where other hosts act on the same names through their own caches.

A shared root gets the shared-filesystem mode (docs/FORMAT.md, "Filesystems"): every transition
safe between clients, at the cost of the local disk's fast paths. FUSE counts as shared whatever
runs behind it: a local FUSE filesystem only pays for the caution.
"""

from __future__ import annotations

import ctypes
import os
import struct

from dirmq.store.libc import LIBC_PATH

# statfs(2) f_type values of filesystems that other hosts (or other kernels' caches) share.
SHARED_MAGIC: dict[int, str] = {
    0x6969: "nfs",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x517B: "smb",
    0x65735546: "fuse",  # GlusterFS, CephFS through ceph-fuse, sshfs, s3fs, ...
    0x00C36400: "ceph",
    0x01021997: "9p",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x5346414F: "afs",
    0x6B414653: "afs",
}

_libc = ctypes.CDLL(LIBC_PATH, use_errno=True)


def filesystem_type(path: str) -> int | None:
    """statfs(2)'s f_type for `path`, or None where it cannot be told."""
    try:
        buf = ctypes.create_string_buffer(128)
        if _libc.statfs(os.fsencode(path), buf) != 0:
            return None
        (f_type,) = struct.unpack_from("l", buf.raw)
        return int(f_type) & 0xFFFFFFFF
    except (OSError, AttributeError):
        return None


def is_shared(path: str) -> bool:
    """True on a filesystem that other hosts may share (SHARED_MAGIC)."""
    return filesystem_type(path) in SHARED_MAGIC


def resolve_shared(setting: bool | None, path: str) -> bool:
    """The mode a root at `path` runs in: `setting` if given, else what `is_shared` says."""
    return is_shared(path) if setting is None else setting
