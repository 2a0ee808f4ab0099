"""The test helper `start_server`: a server that exits before listening leaves nothing open."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import pytest

from .support.servers import start_server


def test_a_server_that_never_listens_leaves_no_pipe_open(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="before listening"):
            start_server(tmp_path / "root", "--listen", "127.0.0.1:99999")
        gc.collect()  # an unclosed pipe warns when it is collected
    unclosed = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert unclosed == [], [str(w.message) for w in unclosed]
