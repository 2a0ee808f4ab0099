"""One syntax everywhere: every duration option of `dirmq` takes what HTTP takes (2.5, 150ms, 2s,
1h2m), every size option units (10MiB, 10MB, plain bytes), refusals name the option and the forms;
every command and subcommand's --help says what it is and what each argument means."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dirmq.cli import args, build_parser, exits
from dirmq.cli.args import subparsers_of
from dirmq.store import layout


def dirmq(root: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    command = [sys.executable, "-m", "dirmq", args[0], "--root", str(root), *args[1:]]
    return subprocess.run(command, input=stdin, capture_output=True, timeout=60, check=False)


def ok(root: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    done = dirmq(root, *args, stdin=stdin)
    assert done.returncode == 0, done.stderr.decode()
    return done


def only_line(done: subprocess.CompletedProcess[bytes]) -> str:
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# -- --help ------------------------------------------------------------------------------------
def every_parser(
    parser: argparse.ArgumentParser, path: str = "dirmq"
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in subparsers_of(parser):
        for name, child in action.choices.items():
            found += every_parser(child, f"{path} {name}")
    return found


def test_every_command_has_a_description_and_every_argument_a_help() -> None:
    """The whole argparse tree: a parser without a description, or an argument without help
    (a positional like QUEUE, RECEIPT or ID included), fails here naming it."""
    missing: list[str] = []
    parsers = every_parser(build_parser())
    assert len(parsers) > 20  # the walk did reach the subcommands (and token's actions)
    for path, parser in parsers:
        if not (parser.description or "").strip():
            missing.append(f"{path}: no description")
        for action in parser._actions:
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{path}: {'/'.join(action.option_strings) or action.dest}")
    assert not missing, missing


def test_a_commands_help_starts_with_what_it_does_and_explains_its_positionals() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "dirmq", "ack", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "\nAcknowledge (delete) a received message.\n" in shown
    assert "QUEUE       the queue it came from" in shown
    assert "RECEIPT     the receipt `get` printed on stderr" in shown


# -- one type per kind of value ------------------------------------------------------------------
DURATION_WORDS = frozenset({"wait", "visibility", "delay", "timeout", "retention", "interval"})


def test_every_duration_and_size_option_uses_the_one_type_for_it() -> None:
    """An option added later with a duration or size in its name cannot take seconds or bytes
    only: its type is the shared one, and its metavar says which kind of value it takes."""
    durations, sizes = [], []
    for path, parser in every_parser(build_parser()):
        for action in parser._actions:
            longs = [o for o in action.option_strings if o.startswith("--")]
            if not longs or action.nargs == 0:  # a switch takes no value
                continue
            words = set(longs[0][2:].split("-"))
            where = f"{path} {longs[0]}"
            if words & DURATION_WORDS:
                assert action.type in (args.duration, args.optional_duration), where
                assert action.metavar == "DUR", where
                durations.append(where)
            elif words & {"bytes", "memory"}:
                assert action.type is args.size and action.metavar == "SIZE", where
                sizes.append(where)
    assert "dirmq get --wait" in durations and "dirmq serve --drain-timeout" in durations
    assert "dirmq create --max-bytes" in sizes and "dirmq serve --max-body-memory" in sizes
    assert len(durations) >= 20 and len(sizes) == 5, (durations, sizes)


# -- durations ---------------------------------------------------------------------------------
def test_every_duration_option_takes_go_durations(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ok(
        root,
        "create",
        "q",
        "--visibility",
        "1m30s",
        "--delay",
        "150ms",
        "--retention",
        "336h",
        "--writeback-delay",
        "200ms",
    )
    config = json.loads((root / "q" / layout.CONFIG_FILE).read_text())
    assert config["visibility_timeout_s"] == 90 and config["delay_s"] == 0.15
    assert (config["retention_s"], config["writeback_delay_s"]) == (336 * 3600, 0.2)
    ok(root, "configure", "q", "--delay", "0s", "--retention", "none")
    ok(root, "put", "q", "--delay", "0s", "--timeout", "2s", stdin=b"a")
    before = time.time()
    got = json.loads(ok(root, "get", "q", "--wait", "2s", "--visibility", "1h2m", "--json").stdout)
    assert got["lease_deadline_s"] == pytest.approx(before + 3720, abs=30)
    ok(root, "nack", "q", got["receipt"], "--delay", "1h")
    stats = json.loads(ok(root, "stats", "q", "--json").stdout)
    assert (stats["ready"], stats["delayed"]) == (0, 1)
    empty = dirmq(root, "get", "q", "--wait", "100ms")
    assert empty.returncode == exits.EMPTY


@pytest.mark.parametrize(
    ("args", "option", "text"),
    [
        (("get", "q"), "--wait", "2x"),
        (("get", "q"), "--visibility", "1d"),
        (("put", "q"), "--delay", "-1s"),
        (("nack", "q", "r"), "--delay", "1e3"),
        (("configure", "q"), "--retention", "forever"),
        (("subscribe",), "--wait", "2x"),
        (("publish", "c"), "--accept-timeout", "soon"),
        (("serve",), "--idle-timeout", "75 s"),
    ],
)
def test_a_bad_duration_names_the_option_and_the_forms(
    tmp_path: Path, args: tuple[str, ...], option: str, text: str
) -> None:
    done = dirmq(tmp_path / "root", *args, f"{option}={text}")
    assert done.returncode == exits.USAGE
    assert only_line(done) == (
        f"dirmq: error: {option}: {text!r} is not a duration (e.g. 2.5, 150ms, 2s, 1h2m) "
        f"(see 'dirmq {args[0]} --help')"
    )
    assert not (tmp_path / "root").exists()


def test_a_duration_over_a_year_says_so(tmp_path: Path) -> None:
    done = dirmq(tmp_path / "root", "get", "q", "--wait", "9000h")
    assert done.returncode == exits.USAGE
    assert "--wait: '9000h' is longer than a year" in only_line(done)


# -- sizes -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "size"), [("64KiB", 65536), ("10kB", 10_000), ("1MB", 10**6), ("1500", 1500)]
)
def test_max_bytes_takes_units(tmp_path: Path, text: str, size: int) -> None:
    root = tmp_path / "root"
    ok(root, "create", "q", "--max-bytes", text)
    assert json.loads(ok(root, "configure", "q").stdout)["max_message_bytes"] == size
    ok(root, "put", "q", stdin=b"x" * size)
    refused = dirmq(root, "put", "q", stdin=b"x" * (size + 1))
    assert refused.returncode == exits.USAGE
    assert only_line(refused) == (
        f"dirmq: error: message is {size + 1} bytes; queue 'q' accepts at most {size}: raise "
        "its max_message_bytes (`dirmq configure q --max-bytes SIZE`, or PUT /q "
        '{"max_message_bytes": N})'
    )


@pytest.mark.parametrize(
    ("args", "text", "why"),
    [
        (("configure", "q", "--max-bytes"), "10M", "has an ambiguous unit 'M' (MB is 1000s, "),
        (("configure", "q", "--max-bytes"), "-5", "is not a size"),
        (("serve", "--max-body-bytes"), "10KB", "has an ambiguous unit 'KB' (kB is 1000s, "),
        (("serve", "--max-header-bytes"), "1.5", "is not a whole number of bytes"),
        (("serve", "--max-body-memory"), "lots", "is not a size"),
    ],
)
def test_a_bad_size_names_the_option_and_the_forms(
    tmp_path: Path, args: tuple[str, ...], text: str, why: str
) -> None:
    done = dirmq(tmp_path / "root", *args[:-1], f"{args[-1]}={text}")
    assert done.returncode == exits.USAGE
    line = only_line(done)
    assert line.startswith(f"dirmq: error: {args[-1]}: {text!r} {why}"), line
    if "whole" not in why:
        assert "use bytes (1048576) or a number with a unit: kB, MB, GB, TB (1000s), " in line
