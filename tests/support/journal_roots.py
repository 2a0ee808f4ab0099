"""What the journal tests read of a root: its journals, its marked format, and a journal made
one of an earlier boot (what a machine crash leaves behind)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dirmq.store import layout
from dirmq.store.journal_format import boot_id

ANOTHER_BOOT = "00000000-0000-4000-8000-000000000000"  # a boot id this kernel never had


def journals(root: Path) -> list[str]:
    directory = root / layout.JOURNAL_DIR
    return sorted(os.listdir(directory)) if directory.exists() else []


def root_format(root: Path) -> int:
    return int(json.loads((root / layout.ROOT_MARKER).read_text())["format"])


def as_if_rebooted(path: Path) -> None:
    """Make the journal at `path` one of an earlier boot."""
    this_boot, earlier = f"boot={boot_id()}".encode(), f"boot={ANOTHER_BOOT}".encode()
    path.write_bytes(path.read_bytes().replace(this_boot, earlier, 1))
