"""How `make test` spreads the suite over processes (tests/support/distribution.py): its groups
still name the files they are for, and they stay one unit each."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from .support.distribution import FIRST, SHARED, SPLIT, unit_of

REPO = Path(__file__).resolve().parents[1]


def _files(pattern: str) -> list[str]:
    path = pattern.split("::", 1)[0]
    return glob.glob(str(REPO / path))


@pytest.mark.parametrize("pattern", [p for ps in SHARED.values() for p in ps] + list(SPLIT))
def test_every_group_names_files_that_exist(pattern: str) -> None:
    """A renamed GlusterFS test file would otherwise leave its group and wait on the volume lock
    another worker holds."""
    assert _files(pattern), f"{pattern} matches no file under tests/"


@pytest.mark.parametrize("unit", [u for u in FIRST if u not in SHARED])
def test_every_unit_started_first_names_a_file(unit: str) -> None:
    assert _files(unit), f"{unit} matches no file under tests/"


def test_files_sharing_a_resource_are_one_unit_and_others_their_files() -> None:
    gluster = {unit_of(f"tests/{Path(f).name}::test_x") for f in _files("tests/test_gluster*.py")}
    assert gluster == {"gluster"}
    spark_doc = "tests/test_docs.py::test_examples_run_and_show_real_output[docs/spark.md]"
    assert unit_of(spark_doc) == unit_of("tests/test_spark.py::test_http_mode") == "spark"
    cli_doc = "tests/test_docs.py::test_examples_run_and_show_real_output[docs/cli.md]"
    assert unit_of(cli_doc) == cli_doc  # test_docs.py is split test by test
    assert unit_of("tests/test_cli.py::test_stats_and_ls") == "tests/test_cli.py"
    assert unit_of("tests/test_cli.py::Class::test_x[1]") == "tests/test_cli.py"
