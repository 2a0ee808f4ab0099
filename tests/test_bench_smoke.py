"""The benchmarks (bench/, run by hand: docs/benchmarks.md) still import and run. Every benchmark
module imports; the harness starts a real `dirmq serve`, drives real load processes against it
and stops every process it started, by PID; the consume floor runs; and the benchmarks that need
nothing installed run their smallest form end to end (a few seconds in all). The ones that need
Redis, RabbitMQ, NATS, wrk, moto, Spark or GlusterFS are only imported here: their quick forms
(`--quick`) take a minute or more and install packages.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from bench.harness.floors import PUBLISH_FLUSHES, consume_floor, publish_floor
from bench.harness.load import Trial, run_load
from bench.harness.loadgen import publish_spec
from bench.harness.procs import Processes
from bench.harness.rounds import paired, run_rounds
from bench.harness.servers import create_queue, queue_stats, start_dirmq, warm_up

REPO = Path(__file__).resolve().parent.parent
# A benchmark is a module of `bench`, or a package of it with a `__main__` (bench/http_load/).
BENCHMARKS = sorted(
    [p.stem for p in (REPO / "bench").glob("*.py") if p.stem != "__init__"]
    + [p.parent.name for p in (REPO / "bench").glob("*/__main__.py")]
)
# Experiments removed once their answers were in the docs, which still cite them for the numbers
# they gave (with the commit to `git show` them from).
REMOVED = {"bench/stream_candidates.py", "bench/flush_merge.py"}


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie its parent has yet to reap."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("name", BENCHMARKS)
def test_each_benchmark_imports_as_a_module_of_the_package(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    # spark_cluster is the Spark benchmark's helper (its driver programs), not a benchmark.
    assert name == "spark_cluster" or callable(getattr(module, "main", None))


def test_no_benchmark_shadows_a_standard_library_module() -> None:
    shadowed = sorted(set(BENCHMARKS) & set(sys.stdlib_module_names))
    assert shadowed == []


def test_every_benchmark_the_docs_cite_exists() -> None:
    texts = {p: p.read_text() for p in [*(REPO / "docs").glob("*.md"), REPO / "README.md"]}
    texts[REPO / "Makefile"] = (REPO / "Makefile").read_text()
    missing = []
    for path, text in texts.items():
        for module in re.findall(r"-m (bench(?:\.[a-z_]+)+)", text):
            if importlib.util.find_spec(module) is None:
                missing.append(f"{path.name}: python -m {module}")
        for cited in re.findall(r"bench/[a-z_/]+(?:\.py|/)", text):
            if cited.startswith("bench/results/"):  # the runs' output, git-ignored
                continue
            if not (REPO / cited).exists() and cited not in REMOVED:
                missing.append(f"{path.name}: {cited}")
    assert missing == []


def test_the_harness_serves_loads_and_stops_what_it_started(tmp_path: Path) -> None:
    procs = Processes()
    try:
        server = start_dirmq(procs, str(tmp_path / "root"), 2, "smoke")
        assert len(server.workers) == 2
        create_queue(server.port, "q")
        warm_up(server.port, "q")  # one publish, one get, one ack: the queue is empty again
        spec = {"proto": "http", "port": server.port, "duration_s": 1.0, "max_ops": 200}
        trial = run_load(procs, spec | publish_spec("q"), 4, 2, server.pids)
        assert trial.errors == {}
        assert trial.ops >= 400  # 2 load processes, each until its 200 (the window is ample)
        assert int(queue_stats(server.port, "q")["ready"]) == trial.ops  # every 201 was stored
        assert trial.server_cpu_s > 0
    finally:
        procs.stop_all()
    assert server.proc.returncode is not None
    assert all(_gone(pid) for pid in server.pids)
    assert all(proc.returncode is not None for proc in procs.started)


def test_rounds_rotate_the_subjects_and_pair_ratios_per_round() -> None:
    order: list[str] = []

    def subject(name: str, ops: int) -> Callable[[int], Trial]:
        def run(_round: int) -> Trial:
            order.append(name)
            return Trial(ops=ops, seconds=1.0, server_cpu_s=0.0, client_cpu_s=0.0, errors={})

        return run

    trials = run_rounds("t", {"a": subject("a", 300), "b": subject("b", 100)}, 3)
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert paired(trials, "a", "b") == [3.0, 3.0, 3.0]


def test_the_consume_floor_runs_and_leaves_nothing_behind(tmp_path: Path) -> None:
    rate, seconds = consume_floor(str(tmp_path), 300, processes=2, body_bytes=100)
    assert rate > 0 and seconds > 0
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("console_samples", ["--queues", "20", "--samples", "2", "--output"]),
        ("consume_anatomy", ["--messages", "300", "--rounds", "1", "--json"]),
        ("metrics_scrape", ["--queues", "100", "--scrapes", "2", "--json"]),
        ("scale", ["--quick", "--json"]),
        ("dataflush", ["--quick", "--neighbour", "--json"]),
        ("priority", ["--per-queue", "2000", "--deep", "5000", "--json"]),
    ],
)
def test_a_benchmark_that_needs_nothing_installed_runs_end_to_end(
    name: str, args: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args, str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(out.read_text())  # its results, written where it was told


@pytest.mark.parametrize("lines", [1, 2])
@pytest.mark.parametrize("flush", PUBLISH_FLUSHES)
def test_the_publish_floor_makes_every_file_durable_under_its_name(
    tmp_path: Path, lines: int, flush: str
) -> None:
    rate, seconds = publish_floor(
        str(tmp_path), 100, publishers=8, lines=lines, body_bytes=10, flush=flush
    )
    assert rate > 0 and seconds > 0
    (floor,) = tmp_path.iterdir()
    files = sorted((floor / "ready").iterdir())
    message = b"Content-Length: 10\n\n" + b"x" * 10
    if flush == "append":  # Redis's way: the bodies in one file a line
        assert files == []
        sizes = [(floor / f"append-{n}").stat().st_size for n in range(lines)]
        assert sizes == [96 // lines * len(message)] * lines
        return
    assert len(files) == 96  # whole groups only: 12 groups of 8 (or 2 lines x 12 of 4)
    assert {f.read_bytes() for f in files} == {message}
    assert list((floor / "tmp").iterdir()) == []  # temps unnamed, or unlinked: none left


def test_the_publish_floor_refuses_an_unknown_flush(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="flush must be one of"):
        publish_floor(str(tmp_path), 100, publishers=8, flush="fsync-maybe")
