"""Debian packages and pip requirements a benchmark installs itself when they are missing."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def apt_install(package: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", package]
    if subprocess.run(install, env=env, check=False, timeout=900).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=False, timeout=900)
        subprocess.run(install, env=env, check=True, timeout=900)


def ensure_debian_tool(command: str, package: str) -> str:
    """Install Debian's `package` if `command` is missing; return `command --version`'s text."""
    if shutil.which(command) is None:
        print(f"installing {package} (apt-get) ...", file=sys.stderr, flush=True)
        apt_install(package)
    out = subprocess.run(
        [command, "--version"], check=False, capture_output=True, text=True, timeout=30
    )
    return out.stdout + out.stderr


def ensure_redis_server() -> str:
    """Install Debian's redis-server if missing; return its version."""
    out = ensure_debian_tool("redis-server", "redis-server")
    version = next((w[2:] for w in out.split() if w.startswith("v=")), out.strip())
    if int(version.split(".")[0]) < 7:
        print(f"warning: redis-server {version} is older than 7", file=sys.stderr)
    return version


def ensure_wrk() -> str:
    """Install Debian's wrk if missing; return its version."""
    words = ensure_debian_tool("wrk", "wrk").split()
    return words[1] if len(words) > 1 else "?"


def _present(module: str, dist: str, requirement: str) -> bool:
    if module == "py_spy":  # a binary, not a module
        return shutil.which("py-spy") is not None or _venv_bin("py-spy").exists()
    if importlib.util.find_spec(module) is None:
        return False
    if "==" in requirement:
        try:
            return importlib.metadata.version(dist) == requirement.split("==", 1)[1]
        except importlib.metadata.PackageNotFoundError:
            return False
    return True


def ensure_pip(needs: Sequence[tuple[str, str, str]]) -> dict[str, str]:
    """Pip-install each (import name, distribution, requirement) that is missing, or not at the
    version a `==` requirement pins, into this interpreter; {distribution: version or "missing"}."""
    versions: dict[str, str] = {}
    for module, dist, requirement in needs:
        if not _present(module, dist, requirement):
            print(f"installing {requirement} (pip) ...", file=sys.stderr, flush=True)
            command = [sys.executable, "-m", "pip", "install", "-q", requirement]
            try:
                subprocess.run(command, check=False, timeout=900)
            except subprocess.TimeoutExpired:
                print(f"  pip timed out installing {requirement}", file=sys.stderr)
            importlib.invalidate_caches()
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "missing"
    return versions


def _venv_bin(name: str) -> Path:
    return Path(sys.executable).parent / name


def py_spy_path() -> str | None:
    local = _venv_bin("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


def package_version(package: str) -> str:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or "?"
