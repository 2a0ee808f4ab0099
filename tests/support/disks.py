"""Small real filesystems for fault tests: a tmpfs of a given size, an ext4 image on a loop
device, and a read-only remount; each mounted for one test and always unmounted after it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _run(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(args), capture_output=True, check=False)


@contextmanager
def small_tmpfs(parent: Path, size: str) -> Iterator[Path]:
    mount_point = parent / "small"
    mount_point.mkdir()
    result = _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point))
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        _run("umount", "-l", str(mount_point))


@contextmanager
def ext4_loop(parent: Path, size_mib: int = 32) -> Iterator[Path]:
    """A fresh ext4 filesystem of `size_mib` MiB in a file, mounted through a loop device
    (skips when not root or when no loop device can be had)."""
    if os.geteuid() != 0:
        pytest.skip("an ext4 loop mount needs root")
    image = parent / "ext4.img"
    mount_point = parent / "ext4"
    mount_point.mkdir()
    with open(image, "wb") as f:
        f.truncate(size_mib << 20)
    made = _run("mkfs.ext4", "-q", "-F", str(image))
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {made.stderr.decode().strip()}")
    mounted = _run("mount", "-o", "loop", str(image), str(mount_point))
    if mounted.returncode != 0:
        pytest.skip(f"no loop mount here: {mounted.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        _run("umount", "-l", str(mount_point))  # -l: also frees the loop device
        image.unlink()


@contextmanager
def read_only(mount_point: Path) -> Iterator[None]:
    """`mount_point` remounted read-only for the block, then read-write again."""
    result = _run("mount", "-o", "remount,ro", str(mount_point))
    if result.returncode != 0:
        pytest.fail(f"cannot remount {mount_point} read-only: {result.stderr.decode().strip()}")
    try:
        yield
    finally:
        back = _run("mount", "-o", "remount,rw", str(mount_point))
        assert back.returncode == 0, back.stderr.decode()


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
