"""A GlusterFS volume on loopback, mounted several times (each mount stands for one host), for
the tests and probes of several hosts on one root (issue 19). A helper, not a test module.

`running_volume()` (a context manager) and the `gluster_volume` fixture (module scope; skips
with the reason where the machine does not allow it) give a `GlusterVolume`: a volume
distributed over `bricks` bricks on 127.0.0.2, mounted `mounts` times through FUSE.

How, and why so:
- Needs root, `/dev/fuse` and the Debian packages `glusterfs-server` and `glusterfs-client`,
  which are installed with apt-get when missing.
- glusterd refuses bricks on 127.0.0.1, so glusterd and the bricks use 127.0.0.2. Rather than
  editing `/etc/glusterfs/glusterd.vol`, glusterd is started on a copy of it (`-f`) with
  `transport.socket.bind-address 127.0.0.2`, `transport.address-family inet` and its own
  `working-directory` in this run's temp dir: the system's config and `/var/lib/glusterd` are
  never written, so a crash leaves nothing to restore, and every run starts from a blank state.
- glusterd runs in the foreground (`-N`) as our child; it spawns one `glusterfsd` per brick
  (daemonized; their pids are in `/var/run/gluster/vols/<volume>/*.pid`); each mount is one
  `glusterfs` FUSE client (daemonized; it exits when unmounted). The volume is made with the
  `gluster` CLI over glusterd's local socket (the TCP door is read-only for remote hosts).
- The bricks live in the temp dir, on the root filesystem, hence `force`.
- Teardown unmounts, stops and deletes the volume, then ends the bricks, the FUSE clients and
  glusterd by pid, and removes the temp dir, the volume's pid files and the brick logs. Every
  step runs whatever failed before it. A run first clears what an earlier run whose owner died
  left behind (its mounts and processes are found by its temp dir, `/tmp/dirmq-gluster-*`, whose
  `owner` file names a pid that no longer runs), so a run after a failed one starts clean.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

ADDRESS = "127.0.0.2"
GLUSTERD_PORT = 24007
SYSTEM_VOLFILE = "/etc/glusterfs/glusterd.vol"
SYSTEM_STATE = "/var/lib/glusterd"
RUN_DIR = "/var/run/gluster"
BRICK_LOG_DIR = "/var/log/glusterfs/bricks"
BASE_PREFIX = "dirmq-gluster-"
# One volume at a time on this machine: glusterd's port on ADDRESS is one. Runs that overlap
# (two test sessions, a benchmark) wait here for each other rather than fail or collide.
LOCK_PATH = "/tmp/dirmq-gluster.lock"
PACKAGES = ("glusterfs-server", "glusterfs-client")

# glusterd.vol as Debian ships it, for a machine whose copy is missing.
_DEFAULT_VOLFILE = """volume management
    type mgmt/glusterd
    option working-directory /var/lib/glusterd
    option transport-type socket
    option transport.socket.keepalive-time 10
    option transport.socket.keepalive-interval 2
    option transport.socket.read-fail-log off
    option transport.socket.listen-port 24007
    option ping-timeout 0
    option event-threads 1
    option max-port  60999
end-volume
"""


# The client-side caches that let one mount serve another mount's old names, attributes and
# bytes for up to a second (measured by bench/gluster_probe.py; docs/FORMAT.md), turned off.
NO_CACHE_VOLUME_OPTIONS = {
    "performance.stat-prefetch": "off",  # md-cache: attributes and names
    "performance.quick-read": "off",
    "performance.io-cache": "off",
    "performance.read-ahead": "off",
    "performance.readdir-ahead": "off",
    "performance.open-behind": "off",
    "performance.write-behind": "off",
    "performance.nl-cache": "off",
}
# FUSE's own caches of lookups and attributes (1 s each by default), and the kernel's page cache
# (without direct-io a mount reads another mount's in-place overwrite stale for seconds, even
# with every other cache off). (`fopen-keep-cache=no` cannot be given: mount.glusterfs 10.3
# passes it on as "==no", which glusterfs refuses.)
NO_CACHE_MOUNT_OPTIONS = (
    "attribute-timeout=0",
    "entry-timeout=0",
    "negative-timeout=0",
    "direct-io-mode=enable",
)


class GlusterUnavailable(Exception):
    """The machine cannot run a GlusterFS volume; the message says why."""


@dataclass
class GlusterVolume:
    name: str
    base: str  # this run's temp dir: glusterd's state, the bricks, the mount points, the logs
    mounts: tuple[str, ...]
    bricks: tuple[str, ...]
    glusterd_pid: int
    timings: dict[str, float] = field(default_factory=dict)  # seconds per set-up/teardown step


def _run(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)


def _gluster(*args: str) -> subprocess.CompletedProcess[str]:
    return _run("gluster", "--mode=script", *args, timeout=120.0)


def _must(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        raise RuntimeError(
            f"{what} failed ({result.returncode}): {(result.stderr or result.stdout).strip()}"
        )


def ensure_installed() -> None:
    """Installs the GlusterFS packages with apt-get when glusterd or mount.glusterfs is missing."""
    if shutil.which("glusterd") and shutil.which("gluster") and shutil.which("mount.glusterfs"):
        return
    if shutil.which("apt-get") is None:
        raise GlusterUnavailable("GlusterFS is not installed and there is no apt-get to install it")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")

    def install() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            # another test process may hold dpkg's lock (make test runs several): wait for it
            ["apt-get", "-o", "DPkg::Lock::Timeout=500", "install", "-y", "-q", *PACKAGES],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=False,
        )

    result = install()
    if result.returncode != 0:  # a stale package list: refresh it once
        subprocess.run(
            ["apt-get", "update", "-q"], capture_output=True, env=env, timeout=600, check=False
        )
        result = install()
    if result.returncode != 0 or not shutil.which("glusterd"):
        raise GlusterUnavailable(
            f"apt-get could not install {' '.join(PACKAGES)}: {result.stderr.strip()[-300:]}"
        )


def check_machine() -> None:
    """Raises GlusterUnavailable saying why this machine cannot run the volume."""
    if os.uname().sysname != "Linux":
        raise GlusterUnavailable("GlusterFS needs Linux")
    if os.geteuid() != 0:
        raise GlusterUnavailable("a GlusterFS volume needs root (glusterd, FUSE mounts)")
    try:
        if not stat.S_ISCHR(os.stat("/dev/fuse").st_mode):
            raise GlusterUnavailable("/dev/fuse is not a character device")
    except FileNotFoundError:
        raise GlusterUnavailable("no /dev/fuse: FUSE mounts are not possible here") from None
    ensure_installed()
    clear_leftovers()
    with socket.socket() as probe:
        try:
            probe.bind((ADDRESS, 0))
        except OSError as exc:
            raise GlusterUnavailable(f"cannot bind {ADDRESS}: {exc}") from None
    if _accepts(ADDRESS, GLUSTERD_PORT) or _accepts("127.0.0.1", GLUSTERD_PORT):
        raise GlusterUnavailable(f"a glusterd (not ours) already listens on port {GLUSTERD_PORT}")


def _accepts(host: str, port: int) -> bool:
    with socket.socket() as conn:
        conn.settimeout(0.5)
        return conn.connect_ex((host, port)) == 0


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except OSError:
        return []


def _pids_mentioning(text: str) -> list[int]:
    """Pids of the gluster processes whose command line mentions `text` (a temp dir of ours)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            args = _cmdline(int(entry))
            if args and "gluster" in os.path.basename(args[0]) and any(text in arg for arg in args):
                pids.append(int(entry))
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _end(pids: list[int], grace_s: float = 5.0) -> None:
    """SIGTERM to each pid, then SIGKILL to those still alive after `grace_s`."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _mounts_under(base: str) -> list[str]:
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    return [p for p in points if p.startswith(base + "/")]


def _unmount(point: str) -> None:
    if _run("umount", point).returncode != 0:
        _run("umount", "-l", point)


def _volume_name(base: str) -> str | None:
    try:
        with open(os.path.join(base, "volume")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _brick_pids(volume: str) -> list[int]:
    pids = []
    for path in glob.glob(os.path.join(RUN_DIR, "vols", volume, "*.pid")):
        with contextlib.suppress(OSError, ValueError), open(path) as f:
            pids.append(int(f.read().strip()))
    return pids


def _sockets_of(pids: list[int] | set[int]) -> list[str]:
    """The unix sockets glusterd made for these bricks (`-S` on their command lines)."""
    return [
        args[i + 1]
        for args in map(_cmdline, pids)
        for i, arg in enumerate(args[:-1])
        if arg == "-S"
    ]


def _system_state() -> set[str]:
    return set(os.listdir(SYSTEM_STATE)) if os.path.isdir(SYSTEM_STATE) else set()


def _clear(base: str) -> None:
    """Removes every trace of the run in `base`, whatever state it was left in."""
    volume = _volume_name(base)
    for point in _mounts_under(base):
        _unmount(point)
    # FUSE clients exit once unmounted; bricks and glusterd are ended by pid.
    pids = set(_pids_mentioning(base + "/"))
    if volume:
        pids.update(p for p in _brick_pids(volume) if base + "/" in " ".join(_cmdline(p)))
    sockets = _sockets_of(pids)
    _end(sorted(pids))
    if volume:
        shutil.rmtree(os.path.join(RUN_DIR, "vols", volume), ignore_errors=True)
        for log in glob.glob(
            os.path.join(BRICK_LOG_DIR, base.strip("/").replace("/", "-") + "-*.log")
        ):
            with contextlib.suppress(OSError):
                os.unlink(log)
    for socket_path in set(sockets) | set(_read_lines(os.path.join(base, "sockets"))):
        with contextlib.suppress(OSError):
            os.unlink(socket_path)
    # What glusterd makes in /var/lib/glusterd whatever its working directory (geo-replication/,
    # ss_brick/): removed when it was not there before the run.
    before = os.path.join(base, "system-state-before")
    if os.path.exists(before):
        for entry in _system_state() - set(_read_lines(before)):
            shutil.rmtree(os.path.join(SYSTEM_STATE, entry), ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)


def _read_lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return [line.strip() for line in f if line.strip()]
    except OSError:
        return []


def clear_leftovers(parent: str | None = None) -> list[str]:
    """Clears the runs under `parent` (default: the temp dir) whose owner process is gone;
    returns their dirs."""
    cleared = []
    for base in glob.glob(os.path.join(parent or tempfile.gettempdir(), BASE_PREFIX + "*")):
        owner = _read_lines(os.path.join(base, "owner"))
        if owner and owner[0].isdigit() and _alive(int(owner[0])):
            continue
        _clear(base)
        cleared.append(base)
    return cleared


def _volfile(workdir: str) -> str:
    try:
        with open(SYSTEM_VOLFILE) as f:
            text = f.read()
    except OSError:
        text = _DEFAULT_VOLFILE
    lines = [
        line
        for line in text.splitlines()
        if not re.match(
            r"\s*option\s+(working-directory|transport\.socket\.bind-address|transport\.address-family)\s",
            line,
        )
    ]
    end = max(i for i, line in enumerate(lines) if line.strip() == "end-volume")
    lines[end:end] = [
        f"    option working-directory {workdir}",
        f"    option transport.socket.bind-address {ADDRESS}",
        "    option transport.address-family inet",
    ]
    return "\n".join(lines) + "\n"


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


@contextmanager
def running_volume(
    mounts: int = 2,
    bricks: int = 2,
    parent: str | None = None,
    volume_options: dict[str, str] | None = None,
    mount_options: tuple[str, ...] = (),
) -> Iterator[GlusterVolume]:
    """A fresh volume over `bricks` bricks, mounted `mounts` times; everything removed after.
    `volume_options` are set before the volume starts (`gluster volume set`); `mount_options`
    are given to every mount (`-o`), e.g. NO_CACHE_VOLUME_OPTIONS and NO_CACHE_MOUNT_OPTIONS.
    Waits for any other run on this machine to end first (LOCK_PATH)."""
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if we die
        # Checked under the lock: another run's glusterd on the port is not "not ours".
        check_machine()
        with _running_volume(mounts, bricks, parent, volume_options, mount_options) as volume:
            yield volume


@contextmanager
def _running_volume(
    mounts: int,
    bricks: int,
    parent: str | None,
    volume_options: dict[str, str] | None,
    mount_options: tuple[str, ...],
) -> Iterator[GlusterVolume]:
    if parent is not None:
        clear_leftovers(parent)
    timings: dict[str, float] = {}
    started = time.monotonic()
    base = tempfile.mkdtemp(prefix=BASE_PREFIX, dir=parent)
    name = "dirmq" + os.path.basename(base)[len(BASE_PREFIX) :].replace("_", "").lower()
    with open(os.path.join(base, "owner"), "w") as f:
        f.write(f"{os.getpid()}\n")
    with open(os.path.join(base, "volume"), "w") as f:
        f.write(name + "\n")
    glusterd: subprocess.Popen[bytes] | None = None
    with open(os.path.join(base, "system-state-before"), "w") as f:
        f.writelines(entry + "\n" for entry in sorted(_system_state()))
    try:
        workdir = os.path.join(base, "glusterd")
        os.mkdir(workdir)
        if os.path.isdir(
            os.path.join(SYSTEM_STATE, "groups")
        ):  # option groups (`volume set group`)
            shutil.copytree(os.path.join(SYSTEM_STATE, "groups"), os.path.join(workdir, "groups"))
        volfile = os.path.join(base, "glusterd.vol")
        with open(volfile, "w") as f:
            f.write(_volfile(workdir))
        glusterd = subprocess.Popen(
            ["glusterd", "-N", "-f", volfile, "-l", os.path.join(base, "glusterd.log")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for(
            lambda: _accepts(ADDRESS, GLUSTERD_PORT) or glusterd.poll() is not None, "glusterd", 30
        )
        if glusterd.poll() is not None:
            raise RuntimeError(
                f"glusterd exited with {glusterd.returncode}: see {base}/glusterd.log"
            )
        _wait_for(lambda: _gluster("volume", "list").returncode == 0, "the gluster CLI", 30)
        timings["glusterd"] = time.monotonic() - started
        step = time.monotonic()
        brick_dirs = tuple(os.path.join(base, "bricks", f"b{i}") for i in range(bricks))
        for brick in brick_dirs:
            os.makedirs(brick)
        _must(
            _gluster("volume", "create", name, *(f"{ADDRESS}:{b}" for b in brick_dirs), "force"),
            "volume create",
        )
        for key, value in (volume_options or {}).items():
            _must(_gluster("volume", "set", name, key, value), f"volume set {key} {value}")
        _must(_gluster("volume", "start", name), "volume start")
        with open(os.path.join(base, "sockets"), "w") as f:
            f.writelines(path + "\n" for path in _sockets_of(set(_brick_pids(name))))
        timings["volume"] = time.monotonic() - step
        step = time.monotonic()
        points = tuple(os.path.join(base, f"mnt{i}") for i in range(mounts))
        for i, point in enumerate(points):
            os.mkdir(point)
            log = os.path.join(base, f"mount{i}.log")
            _must(
                _run(
                    "mount",
                    "-t",
                    "glusterfs",
                    "-o",
                    ",".join((f"log-file={log}", *mount_options)),
                    f"{ADDRESS}:/{name}",
                    point,
                ),
                f"mount {point}",
            )
            _wait_for(functools.partial(os.path.ismount, point), f"the mount on {point}", 30)
        timings["mounts"] = time.monotonic() - step
        timings["setup"] = time.monotonic() - started
        yield GlusterVolume(name, base, points, brick_dirs, glusterd.pid, timings)
    finally:
        step = time.monotonic()
        with contextlib.suppress(Exception):
            for point in _mounts_under(base):
                _unmount(point)
        if glusterd is not None and glusterd.poll() is None:
            with contextlib.suppress(Exception):
                _gluster("volume", "stop", name, "force")
                _gluster("volume", "delete", name)
        if glusterd is not None:
            glusterd.terminate()
            try:
                glusterd.wait(10)
            except subprocess.TimeoutExpired:
                glusterd.kill()
                glusterd.wait(10)
        _clear(base)
        timings["teardown"] = time.monotonic() - step


@pytest.fixture(scope="session")
def gluster_volume() -> Iterator[GlusterVolume]:
    """A volume over 2 bricks on 127.0.0.2, mounted twice; skips with the reason where it cannot.
    One for the whole session (each test module works in its own root on it): a volume's
    set-up and teardown cost more than most tests on it. Registered by conftest.py: a module
    that imported it would get a volume of its own, waiting on the session's for the lock."""
    # check_machine runs inside running_volume, under the lock: a volume of another run
    # (whose glusterd holds the port meanwhile) is waited for, not taken for a foreign one.
    with contextlib.ExitStack() as stack:
        try:
            volume = stack.enter_context(running_volume())
        except GlusterUnavailable as exc:
            pytest.skip(str(exc))
        yield volume
