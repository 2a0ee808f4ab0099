"""Who may open what dirmq keeps under a root: the modes of every file and directory it creates.

A root's access is a setting of the root, kept in its marker `@dirmq.json` ("access") and read
once by each `Store`, which hands it to its queues and to the layers above (pub/sub, SQS, Spark,
VSQS import): every process using a root creates its entries alike, through this one value.

    "private"  files 0600, directories 0700: only the owner's processes (a new root's default)
    "group"    files 0660, directories 2770, in the root's group: the processes of several users
               of one group share the queues. The set-group-id bit makes every new entry take
               its directory's group, whoever creates it; `init_root` gives the root its group.
    (absent)   a root made before this setting ("legacy"): files 0644, directories 0777, less
               the umask, as before. `dirmq init` converts it (`init_root`).

Modes are given where an entry is created (`os.open`, `os.mkdir`), never by changing the
process's umask: a library must not change its host's. The umask still applies to them, so where
it would take away a bit the policy grants (group modes under the common umask 022), an entry is
chmod-ed right after it is created (a syscall more per created file; none with umask 0007 or
0002, nor for private roots under any usual umask). The umask is read from /proc/self/status
when the `Access` is made (once per Store); where it cannot be read, every entry is chmod-ed.

Entries that are not created but renamed, linked or recycled keep their inode's mode. Symlinks
(capacity slots, dedup records) have no mode of their own: they hold message ids, no data.
"""

from __future__ import annotations

import grp
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from dirmq.errors import ConfigError, CorruptConfig, InvalidArgument
from dirmq.store import layout

PRIVATE = "private"
GROUP = "group"
LEGACY = "legacy"  # no "access" in the marker: a root made before the setting existed
ACCESS_KEY = "access"
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_MODES = {  # name -> (file mode, directory mode)
    PRIVATE: (0o600, 0o700),
    GROUP: (0o660, 0o2770),
    LEGACY: (0o644, 0o777),
}


def process_umask() -> int | None:
    """This process's umask, read without changing it (Linux 4.7+); None where unknown."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass(frozen=True, slots=True)
class Access:
    """The modes a root's entries are created with (see the module docstring)."""

    name: str
    file_mode: int
    dir_mode: int
    chmod_after: bool  # the umask takes bits the policy grants: set the mode after creating

    @classmethod
    def named(cls, name: str) -> Access:
        """The access `name` ("private", "group", "legacy") under this process's umask."""
        if name not in _MODES:
            raise ConfigError(f"unknown root access {name!r} (private or group)")
        file_mode, dir_mode = _MODES[name]
        umask = process_umask()
        granted = (file_mode | dir_mode) & 0o777
        chmod_after = name != LEGACY and (umask is None or bool(umask & granted))
        return cls(name, file_mode, dir_mode, chmod_after)

    @classmethod
    def from_marker(cls, data: object) -> Access:
        """The access a parsed `@dirmq.json` records: legacy without the key, private if the
        marker is not an object at all (`dirmq fsck` reports it; nothing is opened wider)."""
        if not isinstance(data, dict):
            return cls.named(PRIVATE)
        if ACCESS_KEY not in data:
            return cls.named(LEGACY)
        name = data[ACCESS_KEY]
        if name not in (PRIVATE, GROUP):
            raise CorruptConfig(
                f"{layout.ROOT_MARKER}: unknown access {name!r} (private or group): "
                "'dirmq init' sets it again"
            )
        return cls.named(name)

    def marker_fields(self) -> dict[str, str]:
        """What the root marker records of this access (nothing for a legacy root)."""
        return {} if self.name == LEGACY else {ACCESS_KEY: self.name}

    # -- creating entries ------------------------------------------------------------------------
    def open(self, path: str, flags: int = _CREATE_FLAGS, *, dir_fd: int | None = None) -> int:
        """`os.open` creating a file (or an O_TMPFILE inode) with this access's file mode."""
        fd = os.open(path, flags, self.file_mode, dir_fd=dir_fd)
        if self.chmod_after:
            try:
                os.fchmod(fd, self.file_mode)
            except PermissionError:
                pass  # an existing file of another user (no O_EXCL): its creator set its mode
            except BaseException:
                os.close(fd)
                raise
        return fd

    def write_new(self, path: str, data: bytes, flags: int = _CREATE_FLAGS) -> None:
        """Create `path` with `data` and close it (an existing name: FileExistsError)."""
        fd = self.open(path, flags)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def mkdir(self, path: str) -> None:
        """`os.mkdir` with this access's directory mode."""
        os.mkdir(path, self.dir_mode)
        if self.chmod_after:
            os.chmod(path, self.dir_mode)

    def makedirs(self, path: str) -> None:
        """`os.makedirs(path, exist_ok=True)`, each directory it makes with this access's mode."""
        try:
            self.mkdir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
        except FileNotFoundError:
            parent = os.path.dirname(os.path.abspath(path))
            if parent == os.path.abspath(path):
                raise
            self.makedirs(parent)
            try:
                self.mkdir(path)
            except FileExistsError:
                if not os.path.isdir(path):
                    raise

    # -- checking existing entries ---------------------------------------------------------------
    def mode_for(self, st: os.stat_result) -> int | None:
        """The permission bits an entry should have (None: any, for legacy roots and entries
        that are neither files nor directories)."""
        if self.name == LEGACY:
            return None
        if stat.S_ISDIR(st.st_mode):
            return self.dir_mode
        if stat.S_ISREG(st.st_mode):
            return self.file_mode
        return None

    def mismatch(self, st: os.stat_result, gid: int | None) -> str | None:
        """What is wrong with an entry of stat `st` under this access, or None. `gid`: the
        group every entry of a group root must have."""
        wanted = self.mode_for(st)
        if wanted is None:
            return None
        found = stat.S_IMODE(st.st_mode)
        problems = []
        if found != wanted:
            problems.append(f"mode {found:04o}, should be {wanted:04o}")
        if gid is not None and st.st_gid != gid:
            problems.append(f"group {st.st_gid}, should be {gid}")
        return "; ".join(problems) or None


def group_id(group: str | int) -> int:
    """The id of group `group` (a name, or a number); InvalidArgument if there is none."""
    if isinstance(group, int) or group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise InvalidArgument(f"no group named {group!r}") from None


def read_marker(root: str) -> object:
    """The parsed root marker of `root`: None if it is absent or not JSON."""
    try:
        with open(os.path.join(root, layout.ROOT_MARKER), "rb") as f:
            return json.loads(f.read())
    except (FileNotFoundError, ValueError):
        return None


def root_access(root: str) -> Access:
    """The access recorded in `root`'s marker (private if it is missing or damaged)."""
    return Access.from_marker(read_marker(root))


def inferred_access(root: str) -> Access:
    """The access `root`'s own directory mode suggests, for a marker that must be rewritten:
    group if it is a set-group-id directory its group may write, private if only its owner may
    enter it, else legacy (a root made before the setting, under the umask)."""
    mode = stat.S_IMODE(os.stat(root).st_mode)
    if mode & stat.S_ISGID and mode & 0o070 == 0o070:
        return Access.named(GROUP)
    if not mode & 0o077:
        return Access.named(PRIVATE)
    return Access.named(LEGACY)


def walk(root: str) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under `root` (and `root` itself) with its lstat, symlinks not followed; an
    entry that vanishes meanwhile is skipped."""
    try:
        yield root, os.lstat(root)
    except FileNotFoundError:
        return
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield entry.path, st
            if stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)


def mismatches(
    root: str, access: Access, gid: int | None = None
) -> Iterator[tuple[str, os.stat_result, str]]:
    """(path, stat, what is wrong) of every entry under `root` whose mode (and, in a group root,
    group: `gid`, by default the root directory's) is not what `access` gives new entries.
    Nothing for a legacy root."""
    if access.name == LEGACY:
        return
    if access.name == GROUP and gid is None:
        gid = os.stat(root).st_gid
    for path, st in walk(root):
        problem = access.mismatch(st, gid)
        if problem is not None:
            yield path, st, problem


def conform(path: str, st: os.stat_result, access: Access, gid: int | None) -> None:
    """Give the entry at `path` (of stat `st`) the mode (and group) `access` gives new ones."""
    if gid is not None and st.st_gid != gid:
        os.chown(path, -1, gid, follow_symlinks=False)  # before the mode: chown clears setgid
    wanted = access.mode_for(st)
    if wanted is not None:
        os.chmod(path, wanted, follow_symlinks=False)
