"""How `make test` spreads the suite over worker processes (pytest-xdist, `-n N --dist loadfile`).

A helper, not collected. conftest.py's `pytest_xdist_make_scheduler` hands xdist the scheduler
below when `--dist loadfile` is asked for; plain `pytest` (no `-n`) runs as before.

Why not xdist's own modes:
- `loadfile` alone puts each file on whichever worker is free, but some files share one thing
  of the machine that a second worker cannot have at the same time (SHARED below);
- `loadgroup` (an `xdist_group` mark) groups nothing with pytest >= 9.2: xdist 3.8 renames the
  items by setting `item._nodeid`, which pytest no longer reads (it keeps the id in `_id`).
The controller sees test ids only, no marks, so the groups are named here by file.

Units go out longest first (FIRST, then the others by their number of tests), one at a time
to whichever worker is nearly idle: a long unit left for the end would keep one worker busy
while the others wait.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from xdist.scheduler import LoadScopeScheduling

# Files (patterns) whose tests share one thing of the machine, each group one unit of work:
SHARED = {
    # The session's one GlusterFS volume holds a machine-wide lock (support/gluster.py) from its
    # first test to the end of that worker's session: a second worker's volume would wait for it.
    "gluster": ("tests/test_gluster*.py",),
    # The session's SparkSession (support/spark_fixtures.py; a JVM: seconds to start, hundreds
    # of MiB), made once rather than on every worker.
    "spark": (
        "tests/test_spark.py",
        "tests/test_spark_retained.py",
        "tests/test_docs.py::*docs/spark.md*",
    ),
}
# Files split test by test rather than kept whole: long, no module-scoped fixture of their own.
SPLIT = ("tests/test_docs.py",)
# The units that took longest (over 20 s in a whole run's `--durations`, longest first): they
# start first, so that the run ends on short ones. Any other unit follows, most tests first.
FIRST = (
    "spark",
    "tests/test_docs.py::*docs/cli.md*",
    "tests/test_docs.py::*spark_pipeline.py*",  # its own process and JVM
    "tests/test_fuzz_openapi.py",
    "tests/test_spark_cluster.py",
    "tests/test_docs.py::*docs/operations.md*",
    "tests/test_server_limits.py",
    "tests/test_store_model.py",
    "tests/test_pubsub_poison.py",
    "tests/test_flow.py",
    "gluster",
    "tests/test_contract.py",
    "tests/test_cli_pubsub.py",
    "tests/test_pubsub_server.py",
    "tests/test_cli.py",
    "tests/test_console_browser.py",
    "tests/test_metrics_server.py",
    "tests/test_bench_smoke.py",
    "tests/test_full_disk.py",
    "tests/test_console_samples.py",
    "tests/test_schedules_servers.py",
    "tests/test_yaq.py",
    "tests/test_multiprocess.py",
    "tests/test_fault_transitions.py",
    "tests/test_sqs_move_tasks.py",
    "tests/test_redrive.py",
    "tests/test_many_polls.py",
    "tests/test_logging.py",
    "tests/test_metrics_failures.py",
    "tests/test_large_bodies.py",
    "tests/test_bounds.py",
    "tests/test_priority_doors.py",
)


def matches(nodeid: str, pattern: str) -> bool:
    """A pattern with `::` is matched against the whole test id, one without against its file."""
    return fnmatch.fnmatchcase(nodeid if "::" in pattern else nodeid.split("::", 1)[0], pattern)


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its SHARED group, itself (SPLIT files), or its file."""
    for group, patterns in SHARED.items():
        if any(matches(nodeid, p) for p in patterns):
            return group
    path = nodeid.split("::", 1)[0]
    return nodeid if path in SPLIT else path


def rank(unit: str, tests: int) -> tuple[int, int]:
    """Sort key: FIRST's units in its order, then the others by their number of tests, most
    first."""
    for i, pattern in enumerate(FIRST):
        if unit == pattern or ("::" in pattern and fnmatch.fnmatchcase(unit, pattern)):
            return (i, 0)
    return (len(FIRST), -tests)


class SharedResourceScheduling(LoadScopeScheduling):
    """xdist's `loadfile` with SHARED's groups kept on one worker and the longest units first."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        if log is not None:
            self.log = log.sharedresourcesched
        self.ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        if not self.ordered:  # the first hand-out: the queue is complete, nothing sent yet
            units = sorted(self.workqueue.items(), key=lambda u: rank(u[0], len(u[1])))
            self.workqueue.clear()
            self.workqueue.update(units)
            self.ordered = True
        super()._assign_work_unit(node)
