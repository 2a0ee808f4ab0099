"""Progress bars for long commands: tqdm on stderr, only when stderr is a terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# A bar appears only if the work is still going after this long: quick runs print nothing.
SHOW_AFTER_S = 0.5


@contextmanager
def progress_bar(
    description: str, total: int | None = None, unit: str = "msgs"
) -> Iterator[Callable[[int], None]]:
    """Yield `advance(n)`; draws a bar on a terminal, does nothing when stderr is redirected
    (so logs and pipes never receive carriage-return noise). tqdm is imported only when drawn."""
    if not sys.stderr.isatty():
        yield _ignore
        return
    from tqdm import tqdm

    with tqdm(
        total=total,
        desc=description,
        unit=f" {unit}",
        file=sys.stderr,
        delay=SHOW_AFTER_S,
        leave=False,
        dynamic_ncols=True,
    ) as bar:

        def advance(n: int) -> None:
            bar.update(n)

        yield advance


def _ignore(_n: int) -> None:
    pass
