"""`dirmq serve --config FILE`, DIRMQ_* variables and `--print-config`: every option from three
more places, in the order flag > variable > file > default; errors that name the file, the line,
the key or the variable; secrets masked; `make run LISTEN= ROOT=`."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from dirmq.cli import build_parser, config, exits, main
from dirmq.errors import InvalidArgument

from .support.servers import REPO, start_server


def _dirmq(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DIRMQ_")}
    return subprocess.run(
        [sys.executable, "-m", "dirmq", *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _settings(printed: str) -> dict[str, object]:
    """What a --print-config output sets (comments dropped: TOML itself)."""
    return tomllib.loads(printed)


def _origins(printed: str) -> dict[str, str]:
    """key -> where its value came from, from the `# origin` ending each line."""
    found = {}
    for line in printed.splitlines():
        key, _, rest = line.lstrip("# ").partition(" = ")
        if rest and "  # " in rest:
            found[key] = rest.rsplit("  # ", 1)[1]
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the file is honoured, and the order flag > variable > file > default ----------------------
def test_a_served_configuration_comes_from_the_file_the_environment_and_flags(
    tmp_path: Path,
) -> None:
    """A real server: its address and worker count from the file, the body limit from the
    file but overridden by a variable, itself overridden by a flag for one of two limits."""
    port = _free_port()
    (tmp_path / "dirmq.toml").write_text(
        f'listen = "127.0.0.1:{port}"\n'
        "workers = 2\n"
        "max_body_bytes = 100_000   # underscores are accepted too\n"
        "max-header-bytes = 4096\n"
        "idle-timeout = 30\n"
        "log-format = 'json'\n"
    )
    server = start_server(
        tmp_path / "root",
        "--config",
        str(tmp_path / "dirmq.toml"),
        "--max-header-bytes",
        "8192",
        listen=None,
        env={"DIRMQ_MAX_BODY_BYTES": "1000", "DIRMQ_MAX_HEADER_BYTES": "2048"},
    )
    try:
        assert server.url == f"http://127.0.0.1:{port}"
        assert "(2 workers)" in server.output
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.put("/q").status_code == 201
            assert http.post("/q/messages", content=b"x" * 1000).status_code == 201
            assert http.post("/q/messages", content=b"x" * 1001).status_code == 413  # variable
            # The flag's 8192 wins over the variable's 2048 (and the file's 4096).
            assert http.get("/q", headers={"X-Big": "y" * 5000}).status_code == 200
            assert http.get("/q", headers={"X-Big": "y" * 9000}).status_code == 431
        assert server.wait_for(lambda line: line.startswith('{"time"'))  # the file's format
    finally:
        assert server.stop() == 0


def test_print_config_says_where_each_value_came_from(tmp_path: Path) -> None:
    (tmp_path / "dirmq.toml").write_text("workers = 3\nlisten = ':9000'\ndrain-timeout = 2.5\n")
    done = _dirmq(
        "serve",
        "--config",
        "dirmq.toml",
        "--print-config",
        "--listen",
        "127.0.0.1:7000",
        cwd=tmp_path,
        env={"DIRMQ_WORKERS": "4", "DIRMQ_ROOT": "elsewhere", "DIRMQ_UNRELATED": "x"},
    )
    assert done.returncode == 0, done.stderr
    settings, origins = _settings(done.stdout), _origins(done.stdout)
    assert settings["listen"] == "127.0.0.1:7000" and origins["listen"] == "--listen"
    assert settings["workers"] == 4 and origins["workers"] == "DIRMQ_WORKERS"
    assert settings["drain-timeout"] == 2.5 and origins["drain-timeout"] == "dirmq.toml:3"
    assert settings["root"] == "elsewhere" and origins["root"] == "DIRMQ_ROOT"
    assert settings["max-body-bytes"] == 64 * 1024 * 1024 and origins["max-body-bytes"] == "default"
    assert not (tmp_path / "elsewhere").exists()  # printing creates nothing


def test_the_file_and_variables_take_durations_and_sizes_with_units(tmp_path: Path) -> None:
    """What the flags take, as TOML strings (and numbers) and variables: one syntax."""
    (tmp_path / "dirmq.toml").write_text(
        "max-body-bytes = '10MiB'\nmax-header-bytes = '32 KiB'\nmax-body-memory = 1_000_000\n"
        "idle-timeout = '1m30s'\nheader-timeout = '500ms'\nbody-timeout = 45\n"
    )
    env = {"DIRMQ_DRAIN_TIMEOUT": "1h2m"}
    done = _dirmq("serve", "--config", "dirmq.toml", "--print-config", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    settings = _settings(done.stdout)
    assert settings["max-body-bytes"] == 10 * 1024 * 1024
    assert settings["max-header-bytes"] == 32 * 1024
    assert settings["max-body-memory"] == 1_000_000
    assert (settings["idle-timeout"], settings["header-timeout"]) == (90, 0.5)
    assert (settings["body-timeout"], settings["drain-timeout"]) == (45, 3720)
    (tmp_path / "bad.toml").write_text("max-body-bytes = '10M'\n")
    bad = _dirmq("serve", "--config", "bad.toml", "--print-config", cwd=tmp_path)
    assert bad.returncode == exits.USAGE
    assert bad.stderr.startswith(
        "dirmq: error: bad.toml:1: max-body-bytes: '10M' has an ambiguous unit 'M' "
        "(MB is 1000s, MiB 1024s): use bytes (1048576) or a number with a unit: kB, MB, GB, "
        "TB (1000s), KiB, MiB, GiB, TiB (1024s)"
    ), bad.stderr


def test_the_root_flag_before_or_after_the_command_wins_over_the_file(tmp_path: Path) -> None:
    (tmp_path / "dirmq.toml").write_text('root = "from-file"\n')
    for args in (["--root", "flag", "serve"], ["serve", "--root", "flag"]):
        done = _dirmq(*args, "--config", "dirmq.toml", "--print-config", cwd=tmp_path)
        assert _settings(done.stdout)["root"] == "flag", done.stderr
    done = _dirmq("serve", "--config", "dirmq.toml", "--print-config", cwd=tmp_path)
    assert _settings(done.stdout)["root"] == "from-file"
    done = _dirmq("serve", "--print-config", cwd=tmp_path)
    assert _settings(done.stdout)["root"] == "./dirmq-data"


def test_dirmq_config_names_the_file_and_the_flag_wins_over_it(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text("workers = 5\n")
    (tmp_path / "b.toml").write_text("workers = 6\n")
    env = {"DIRMQ_CONFIG": "a.toml"}
    done = _dirmq("serve", "--print-config", cwd=tmp_path, env=env)
    assert _settings(done.stdout)["workers"] == 5
    done = _dirmq("serve", "--config", "b.toml", "--print-config", cwd=tmp_path, env=env)
    assert _settings(done.stdout)["workers"] == 6


def test_print_config_output_is_accepted_back_with_the_same_values(tmp_path: Path) -> None:
    (tmp_path / "first.toml").write_text(
        'listen = "[::1]:0"\nyaq-listen = ":1337"\nsqs-delay-recently-deleted = true\n'
        'sqs-credentials = "keys with spaces \\"quoted\\".txt"\nlog-level = "debug"\n'
    )
    first = _dirmq("serve", "--config", "first.toml", "--print-config", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (tmp_path / "second.toml").write_text(first.stdout)
    second = _dirmq("serve", "--config", "second.toml", "--print-config", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert _settings(second.stdout) == _settings(first.stdout)
    assert _settings(first.stdout)["sqs-credentials"] == 'keys with spaces "quoted".txt'
    assert _settings(first.stdout)["sqs-delay-recently-deleted"] is True


def test_every_option_of_serve_is_a_key_and_a_variable() -> None:
    """Derived from the parser, not listed by hand: an option another change adds to
    `dirmq serve` is in the file, the environment and --print-config at once."""
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    options = {
        o[2:]
        for action in serve._actions
        for o in action.option_strings[:1]
        if o.startswith("--") and o[2:] not in {"help", "config", "print-config"}
    }
    settings = serve.get_default("config_settings")
    assert {s.key for s in settings} == options
    assert {s.env for s in settings} >= {"DIRMQ_ROOT", "DIRMQ_LISTEN", "DIRMQ_MAX_BODY_BYTES"}
    printed = config.render(config.resolve(serve.parse_args([]), {}))
    assert set(_origins(printed)) == options


# -- errors name the file and the line, or the variable, and the key --------------------------
@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "workers = 2\n\nwokers = 3\n",
            "bad.toml:3: unknown key 'wokers' (did you mean 'workers'?)",
        ),
        (
            "workers = 2\nmax-body-bytes = 'big'\n",
            "bad.toml:2: max-body-bytes: 'big' is not a size: use bytes (1048576) or ",
        ),
        (
            "workers = true\n",
            "bad.toml:1: workers: must be a string or a number, not a boolean (true)",
        ),
        ("workers = -1\n", "bad.toml:1: workers: '-1' is negative"),
        ("[serve]\nworkers = 1\n", "bad.toml:1: unknown key 'serve'"),
        ("print-config = true\n", "bad.toml:1: 'print-config' is a command-line option"),
        (
            "listen = ':99999'\n",
            "bad.toml:1: listen: listen address ':99999': port 99999 is out of range",
        ),
        (
            "sqs-delay-recently-deleted = 'yes'\n",
            "bad.toml:1: sqs-delay-recently-deleted: must be true or false",
        ),
        ("log-level = 'loud'\n", "bad.toml:1: log-level: invalid choice: 'loud'"),
        (
            "workers = 1\nmax_body_bytes = 1\nmax-body-bytes = 2\n",
            "bad.toml:3: 'max-body-bytes' is set twice",
        ),
        ("workers = 2\nlisten = 127.0.0.1:80\n", "bad.toml: not valid TOML: "),
        ("workers = 2\nlisten = 127.0.0.1:80\n", "(at line 2, column "),
    ],
)
def test_a_bad_file_names_the_file_the_line_and_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str
) -> None:
    (tmp_path / "bad.toml").write_text(text)
    code = main(["serve", "--config", str(tmp_path / "bad.toml"), "--print-config"])
    err = capsys.readouterr().err
    assert code == exits.USAGE
    assert err.startswith("dirmq: error: ") and said in err.replace(str(tmp_path) + "/", ""), err


def test_a_bad_file_stops_a_real_server_before_it_listens(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("listen = '127.0.0.1:0'\nmax-body-bytes = 1.5\n")
    done = _dirmq("serve", "--config", "bad.toml", cwd=tmp_path)
    assert done.returncode == exits.USAGE
    said = "dirmq: error: bad.toml:2: max-body-bytes: '1.5' is not a whole number of bytes\n"
    assert done.stderr == said
    assert "listening" not in done.stdout and not (tmp_path / "dirmq-data").exists()
    missing = _dirmq("serve", "--config", "nowhere.toml", cwd=tmp_path)
    assert missing.returncode == exits.USAGE
    assert "cannot read the config file nowhere.toml: No such file" in missing.stderr


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"DIRMQ_WORKERS": "many"}, "DIRMQ_WORKERS: 'many' is not an integer"),
        ({"DIRMQ_LISTEN": "nowhere"}, "DIRMQ_LISTEN: listen address 'nowhere' must be HOST:PORT"),
        (
            {"DIRMQ_SQS_DELAY_RECENTLY_DELETED": "maybe"},
            "DIRMQ_SQS_DELAY_RECENTLY_DELETED: 'maybe'",
        ),
        ({"DIRMQ_LOG_FORMAT": "xml"}, "DIRMQ_LOG_FORMAT: invalid choice: 'xml'"),
    ],
)
def test_a_bad_variable_is_named(tmp_path: Path, env: dict[str, str], said: str) -> None:
    done = _dirmq("serve", "--print-config", cwd=tmp_path, env=env)
    assert done.returncode == exits.USAGE
    assert done.stderr.startswith("dirmq: error: " + said), done.stderr


def test_switch_variables_and_empty_ones(tmp_path: Path) -> None:
    for text, expected in (("1", True), ("yes", True), ("ON", True), ("0", False), ("off", False)):
        env = {"DIRMQ_SQS_DELAY_RECENTLY_DELETED": text}
        done = _dirmq("serve", "--print-config", cwd=tmp_path, env=env)
        assert _settings(done.stdout)["sqs-delay-recently-deleted"] is expected, text
    done = _dirmq("serve", "--print-config", cwd=tmp_path, env={"DIRMQ_WORKERS": ""})
    assert _origins(done.stdout)["workers"] == "default"


# -- secrets -------------------------------------------------------------------------------------
def _parser_with_secrets() -> argparse.ArgumentParser:
    """A parser such as later options may make `dirmq serve`'s: inline secrets, and paths of
    files that hold secrets."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--admin-token", default=None)
    parser.add_argument("--tls-key", default=None, metavar="FILE")
    parser.add_argument("--credentials", default=None, metavar="FILE")
    parser.add_argument("--sigv4-secret-key", default=None)
    parser.add_argument("--workers", type=int, default=1)
    config.layer(parser)
    return parser


def test_print_config_masks_secrets_but_not_paths_of_secret_files(tmp_path: Path) -> None:
    parser = _parser_with_secrets()
    (tmp_path / "c.toml").write_text('admin-token = "hunter2"\ntls-key = "/etc/dirmq/key.pem"\n')
    args = parser.parse_args([])
    args.config = str(tmp_path / "c.toml")  # as `--config` of `dirmq serve` sets it
    values = config.resolve(args, {"DIRMQ_SIGV4_SECRET_KEY": "wJalr/K7MDENG", "DIRMQ_WORKERS": "2"})
    assert args.admin_token == "hunter2" and args.sigv4_secret_key == "wJalr/K7MDENG"  # used
    printed = config.render(values)
    assert "hunter2" not in printed and "wJalr" not in printed
    assert f'# admin-token = "{config.MASK}"' in printed
    assert f'# sigv4-secret-key = "{config.MASK}"' in printed
    assert 'tls-key = "/etc/dirmq/key.pem"' in printed  # a path: shown
    assert tomllib.loads(printed) == {"tls-key": "/etc/dirmq/key.pem", "workers": 2}
    assert [s.key for s in parser.get_default("config_settings") if s.secret] == [
        "admin-token",
        "sigv4-secret-key",
    ]


def test_a_flag_given_its_default_value_still_wins(tmp_path: Path) -> None:
    parser = _parser_with_secrets()
    args = parser.parse_args(["--workers", "1"])
    config.resolve(args, {"DIRMQ_WORKERS": "7"})
    assert args.workers == 1
    args = parser.parse_args([])
    with pytest.raises(InvalidArgument, match="DIRMQ_WORKERS: invalid int value: 'x'"):
        config.resolve(args, {"DIRMQ_WORKERS": "x"})


# -- make run ------------------------------------------------------------------------------------
def _make(*args: str) -> list[str]:
    # -o: the venv stamp counts as made; BIN: the interpreter running this test (no install).
    return [
        "make",
        "--no-print-directory",
        "-C",
        str(REPO),
        "-o",
        ".venv/.installed",
        f"BIN={Path(sys.executable).parent}",
        *args,
    ]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_takes_listen_and_root(tmp_path: Path) -> None:
    bare = subprocess.run(_make("-n", "run"), capture_output=True, text=True, check=True)
    assert bare.stdout.strip().endswith("/dirmq serve")
    given = subprocess.run(
        _make("-n", "run", "LISTEN=0.0.0.0:8080", "ROOT=/var/lib/dirmq"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert given.stdout.strip().endswith(
        "/dirmq serve --listen '0.0.0.0:8080' --root '/var/lib/dirmq'"
    )
    root = tmp_path / "made root"
    proc = subprocess.Popen(
        _make("run", "LISTEN=127.0.0.1:0", f"ROOT={root}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # make and the server it starts: one group, ours to signal
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        url = ""
        for line in proc.stdout:
            if " API listening on " in line:
                url = line.rsplit(" ", 1)[1].strip()
            if line.startswith("storing queues under"):
                assert str(root) in line
                break
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        assert httpx.put(url + "/made", timeout=30).status_code == 201
        assert (root / "made").is_dir()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
