"""Where the C library is, found once a process: `ctypes.util.find_library` runs `ldconfig`
(about 1.6 ms a call), and five modules of the store each asked it at import, on the start of
every process (the CLI's among them). Each module still loads its own handle from this path
(its functions' argtypes are its own)."""

from __future__ import annotations

import ctypes.util

LIBC_PATH = ctypes.util.find_library("c") or "libc.so.6"
