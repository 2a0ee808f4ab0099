"""Every example in README.md and docs/*.md runs, and shows what it really prints; every
examples/*.py runs and prints true numbers.

The conventions (also in docs/architecture.md, "Examples are tested"):

- Fenced blocks tagged `python`, `sh`, `bash` or `console` run; other blocks (untagged, `json`,
  `cron`, benchmark tables and by-hand benchmark commands) are text.
- Each Markdown file runs in document order, in a fresh temp directory, against its own real
  `dirmq serve` whose root is `./dirmq-data` there; `localhost:8080` / `127.0.0.1:8080` (and the
  yaq port `:1337`) are rewritten to the server's ports, the roots the docs use (ROOT_ALIASES) to
  the server's root, and other absolute paths (PATH_ALIASES) into the temp directory. `dirmq`,
  `aws` and `python` are the venv's. A file's Python blocks share one interpreter and its shell
  commands one bash (so definitions, `export` and `cd` carry over).
- A file whose Python imports `pyspark` runs its Python in the test process instead, on the
  suite's one SparkSession (tests/support/spark_fixtures.py: `SparkSession.builder.getOrCreate()`
  in a
  block returns it); without pyspark the file is skipped. Streaming queries a block leaves
  running are stopped at the end of the file.
- In a shell block, lines starting with `$ ` are commands (a line ending in `\\` or `|` goes on);
  the lines after a command are its output (stdout and stderr), compared after `Date:`/`Server:`
  lines, trailing spaces and trailing blank lines are dropped, and `60.0` read as `60`. A block
  with no `$ ` line runs line by line: exit status checked, output not; a `$ ` command shown
  with no output must exit 0 too. Wherever the status is what is checked (setups and checks
  too), curl runs with `--fail` (from a curlrc the reader does not see), so an HTTP error
  status fails the command: a 409 on an ack cannot pass unseen.
  `dirmq serve` lines are not run: the test's server stands in for them (but for
  `dirmq serve ... --print-config`, which prints and exits).
- In shown output, a message id (`1716000000123456-a1b2c3d4e5f6`), a number of 10+ digits or
  with 3+ decimals (times, ages, deadlines), and a multipart boundary match any such value; the
  value shown then stands for the real one in later commands (so a receipt shown by one command
  can be used by the next). `...` matches anything within a line; a line that is only `...`
  matches any number of lines. `<receipt>` and `<id>` in a command are the last ones printed
  before it (by the previous command or the block's setup).
- `<!-- serve: ARGS -->` anywhere in a document gives its server extra arguments; a block
  right after `<!-- file: NAME -->` is written to NAME in the document's temp directory before
  the server starts, and NAME in ARGS stands for that file (docs/security.md: its credentials
  file, which the examples after it then use).
- HTML comments right before a block: `<!-- no-run: reason -->` skips it (keep them rare,
  with a reason); `<!-- setup: ... -->` (one or more lines) is run first, unseen, in the block's
  language (files to read, queues to exist, names a snippet uses); `<!-- needs: prog ... -->`
  runs it only where those programs are installed (elsewhere it is reported as a skip by
  test_programs_examples_need_are_installed); `<!-- file: NAME -->` writes the block (any
  language: a config file, say) to NAME in the temp directory, addresses and paths rewritten
  as in commands, for the blocks after it to use. An HTML comment right after a block,
  `<!-- check: ... -->`, is run after it, unseen, in its language: assertions on what a block
  that prints nothing did (a Python `assert` must hold, a shell command must exit 0).
- `<!-- server: NAME -->` right before a block: it needs a server started another way (with TLS,
  say); the test that SERVER_KINDS names runs those blocks, in document order, against such a
  server (`run_markdown(..., server_kind=NAME)`), and this file's run leaves them out.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .support.servers import REPO, ServerProcess, start_server
from .support.spark_fixtures import spark_fixture  # noqa: F401  (requested only by Spark documents)

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNABLE = {"python", "sh", "bash", "console"}
ROOT_ALIASES = ("/tmp/queues", "/srv/queues", "/srv/dirmq", "/var/spool/dirmq")
# Other absolute paths the docs use, and where they are in the temp directory.
PATH_ALIASES = {
    "/var/spool/queues": "spool-queues",
    "/backup": "backup",
    "/data/mq": "data-mq",  # docs/spark.md: a root executors read through the filesystem
    "/lake": "lake",
}
COMMAND_TIMEOUT_S = 60.0
# Blocks marked `<!-- server: NAME -->`, and the test that runs them against such a server.
SERVER_KINDS = {
    "tls": "tests/test_tls.py",
    "mtls": "tests/test_tls.py",
    "gluster": "tests/test_gluster_servers.py",  # docs/operations.md, "Several hosts on one root"
}

ID = r"\d{16}-[0-9a-f]{12}"
VOLATILE = re.compile(rf"{ID}|dirmq-[0-9a-f]{{24}}|\d{{10,}}(?:\.\d+)?|\d+\.\d{{3,}}")
# `<receipt>` or `<id>` in a command: the last one the previous command printed.
PLACEHOLDERS = {"<receipt>": rf"{ID}\.\d+", "<id>": ID}
_FENCE = re.compile(r"^```(\w*)\s*$")
_COMMENT = re.compile(r"<!--\s*(no-run|setup|needs|check|server|file):(.*?)-->\s*$", re.DOTALL)
_SERVE = re.compile(r"<!--\s*serve:(.*?)-->")
_COMMENT_AFTER = re.compile(r"\s*(<!--\s*check:.*?-->)", re.DOTALL)


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence
    lang: str
    text: str
    no_run: str | None = None
    setup: str = ""
    needs: list[str] = field(default_factory=list)  # programs it runs only where installed
    check: str = ""  # run after it
    server: str | None = None  # SERVER_KINDS: run by another test, against another server
    file: str = ""  # written to this file name before the document's server starts

    @property
    def where(self) -> str:
        return f"{_shown(self.path)}:{self.line}"


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of `path`, with the HTML comments just before each one applied, and
    the `check` comment just after it."""
    found: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        block = Block(path, i + 1, opening.group(1), "\n".join(lines[i + 1 : end]) + "\n")
        before = "\n".join(lines[:i]).rstrip()
        while before.endswith("-->"):  # the comments right before it, last first
            start = before.rfind("<!--")
            comment = _COMMENT.match(before[start:])
            if comment is None or comment.group(1) == "check":  # a check: the previous block's
                break
            kind, text = comment.groups()
            if kind == "no-run":
                block.no_run = text.strip()
            elif kind == "needs":
                block.needs = text.split()
            elif kind == "server":
                block.server = text.strip()
            elif kind == "file":
                block.file = text.strip()
            else:
                block.setup = text.strip("\n") + "\n"
            before = before[:start].rstrip()
        after = _COMMENT_AFTER.match("\n".join(lines[end + 1 :]))
        if after and (check := _COMMENT.match(after.group(1))):
            block.check = check.group(2).strip("\n") + "\n"
        found.append(block)
        i = end + 1
    return found


@dataclass
class Command:
    line: int
    text: str
    expected: list[str] | None = None  # None: not compared


def commands(block: Block) -> list[Command]:
    """The commands of a shell block: `$ ` lines with the output shown after each, or, in a
    block without `$ ` lines, each line (comments and blank lines left out), output unseen."""
    transcript = any(line.startswith("$ ") for line in block.text.splitlines())
    result: list[Command] = []
    continuing = False
    for offset, line in enumerate(block.text.splitlines(), start=block.line + 1):
        if continuing:
            result[-1].text += "\n" + line
        elif transcript and line.startswith("$ "):
            result.append(Command(offset, line[2:], []))
        elif not transcript:
            if line.strip() and not line.lstrip().startswith("#"):
                result.append(Command(offset, line))
        elif result and result[-1].expected is not None:
            result[-1].expected.append(line)
        else:
            raise AssertionError(f"{block.where}: output before the first command: {line!r}")
        continuing = line.endswith(("\\", "|"))
    return result


class Rewriter:
    """Documented addresses, roots and shown values -> the test's real ones."""

    def __init__(self, server: ServerProcess) -> None:
        self.ports = {":8080": ":" + server.url.rsplit(":", 1)[1]}
        if server.yaq_url:
            self.ports[":1337"] = ":" + server.yaq_url.rsplit(":", 1)[1]
        self.root = str(server.root)
        self.paths = {alias: str(server.root.parent / path) for alias, path in PATH_ALIASES.items()}
        self.seen: dict[str, str] = {}  # a value shown in the docs -> the one really printed
        self.last_output = ""

    def addresses(self, text: str) -> str:
        for documented, real in self.ports.items():
            for host in ("localhost", "127.0.0.1", "0.0.0.0"):
                text = text.replace(host + documented, host + real)
        return text

    def command(self, text: str) -> str:
        text = self.addresses(text)
        paths = {**dict.fromkeys(ROOT_ALIASES, self.root), **self.paths}
        for alias, real in paths.items():
            text = re.sub(re.escape(alias) + r"(?![\w.-])", real, text)  # a whole path
        if self.seen:  # longest first, so an id inside a delivery key is not replaced alone
            pattern = "|".join(map(re.escape, sorted(self.seen, key=len, reverse=True)))
            text = re.sub(pattern, lambda m: self.seen[m.group(0)], text)
        for placeholder, value in PLACEHOLDERS.items():
            if placeholder in text:
                found = re.findall(value, self.last_output)
                assert found, f"no {placeholder} in the previous output: {self.last_output!r}"
                text = text.replace(placeholder, found[-1])
        return text

    def match(self, expected: list[str], actual: str) -> bool:
        """Whether `actual` is what `expected` shows; records the shown volatile values."""
        regex: list[str] = []
        shown: list[str] = []
        while expected and not expected[-1].strip():  # as `normalise` drops them from output
            expected = expected[:-1]
        for line in (_POINT_ZERO.sub("", self.addresses(x).rstrip()) for x in expected):
            if line == "...":
                regex.append(r"(?:.*\n)*?")
                continue
            parts: list[str] = []
            for piece_index, piece in enumerate(line.split("...")):
                if piece_index:
                    parts.append(r".*?")
                last = 0
                for value in VOLATILE.finditer(piece):
                    parts.append(re.escape(piece[last : value.start()]))
                    parts.append(f"({VOLATILE.pattern})")
                    shown.append(value.group(0))
                    last = value.end()
                parts.append(re.escape(piece[last:]))
            regex.append("".join(parts) + r"\n")
        found = re.fullmatch("".join(regex), actual)
        if found is None:
            return False
        for documented, real in zip(shown, found.groups(), strict=True):
            self.seen[documented] = real  # the latest showing is the one meant next
        return True


_POINT_ZERO = re.compile(r"(?<=\d)\.0(?![\d.])")


def normalise(output: str) -> str:
    """Output as compared: LF line ends, no `Date:`/`Server:` lines, no trailing spaces, and
    `60.0` read as `60` (jq 1.6 and 1.7 print the same JSON number differently)."""
    lines = output.replace("\r\n", "\n").split("\n")
    kept = [x.rstrip() for x in lines if not x.startswith(("Date: ", "Server: dirmq"))]
    text = _POINT_ZERO.sub("", "\n".join(kept).strip("\n"))
    return text + "\n" if text else ""


class Shell:
    """One bash for a Markdown file; each command's stdin is /dev/null, stderr joins stdout."""

    _MARK = "__dirmq_docs_done__"

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        # For a command whose exit status is the check: curl fails on an HTTP error status.
        self.strict_curl = Path(env["HOME"]) / ".curl-fail"
        self.strict_curl.mkdir(exist_ok=True)
        (self.strict_curl / ".curlrc").write_text("no-progress-meter\nfail\n")
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def run(self, command: str, where: str, *, strict: bool = False) -> tuple[int, str]:
        """The exit status and output of `command`; `strict`: with curl failing on an HTTP
        error status (its curlrc says `fail`)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        script = f"{{\n{command}\n}} </dev/null 2>&1\nprintf '\\n{self._MARK}%d\\n' $?\n"
        if strict:
            script = f"export CURL_HOME='{self.strict_curl}'\n{script}unset CURL_HOME\n"
        self.proc.stdin.write(script.encode())
        self.proc.stdin.flush()
        out = b""
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        fd = self.proc.stdout.fileno()
        while (end := out.find(b"\n" + self._MARK.encode())) < 0 or not out.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise AssertionError(f"{where}: no answer in {COMMAND_TIMEOUT_S} s: {command}")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"{where}: the shell exited: {out.decode(errors='replace')}")
            out += chunk
        status = int(out[end + len(self._MARK) + 1 :].strip())
        return status, out[:end].decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # this bash's own session: what it started
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


_PYTHON_DRIVER = """
import contextlib, io, json, sys, traceback
namespace = {"__name__": "__main__"}
channel = sys.stdout
for request in sys.stdin:
    code = json.loads(request)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code["source"], code["name"], "exec"), namespace)
        error = None
    except BaseException:
        error = traceback.format_exc()
    channel.write(json.dumps({"error": error, "out": out.getvalue()}) + "\\n")
    channel.flush()
"""


class Python:
    """One interpreter for a Markdown file's Python blocks, which may build on each other."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PYTHON_DRIVER],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, source: str, where: str) -> str | None:
        """None, or why the block failed."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"source": source, "name": where}) + "\n")
        self.proc.stdin.flush()
        fd = self.proc.stdout.fileno()
        if not select.select([fd], [], [], COMMAND_TIMEOUT_S)[0]:
            raise AssertionError(f"{where}: still running after {COMMAND_TIMEOUT_S} s")
        answer = json.loads(self.proc.stdout.readline() or '{"error": "interpreter died"}')
        return (
            None if answer["error"] is None else f"{where}: the example fails:\n{answer['error']}"
        )

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class SparkPython:
    """The Python blocks of a Spark document, run in the test process: there lives the suite's
    SparkSession, which `SparkSession.builder.getOrCreate()` in a block returns."""

    def __init__(self, cwd: Path, spark: Any) -> None:
        self.cwd = cwd
        self.spark = spark
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self.queries_before = {q.id for q in spark.streams.active}

    def run(self, source: str, where: str) -> str | None:
        """None, or why the block failed."""
        out = io.StringIO()  # printed, not compared (as in `Python`)
        try:
            with contextlib.chdir(self.cwd), contextlib.redirect_stdout(out):
                exec(compile(source, where, "exec"), self.namespace)
        except Exception:
            return f"{where}: the example fails:\n{traceback.format_exc()}"
        return None

    def close(self) -> None:
        """Stops the streaming queries the blocks left running (the session is shared)."""
        for query in self.spark.streams.active:
            if query.id not in self.queries_before:
                query.stop()


def _uses_spark(path: Path) -> bool:
    return any(
        b.lang == "python" and b.no_run is None and "pyspark" in b.text for b in blocks(path)
    )


def _missing(programs: list[str], env: dict[str, str] | None = None) -> list[str]:
    path = (env or os.environ).get("PATH")
    return [p for p in programs if shutil.which(p, path=path) is None]


def _environment_path() -> dict[str, str]:
    return {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIRMQ_", "AWS_"))}
    env.update(_environment_path())
    env["HOME"] = str(tmp_path)  # no ~/.aws of this machine, no history files
    # Piped, curl draws a progress meter on stderr that a terminal would not show.
    (tmp_path / ".curlrc").write_text("no-progress-meter\n")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def server_arguments(path: Path, workdir: Path) -> list[str]:
    """The extra arguments of `path`'s server (`<!-- serve: ... -->`), its `file:` blocks
    written into `workdir` (private: a credentials file must be)."""
    found = _SERVE.search(path.read_text())
    if found is None:
        return []
    files: dict[str, str] = {}
    for block in blocks(path):
        if block.file:
            target = workdir / block.file
            target.write_text(block.text)
            target.chmod(0o600)
            files[block.file] = str(target)
    return [files.get(word, word) for word in found.group(1).split()]


@pytest.fixture
def docs_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    callspec = getattr(request.node, "callspec", None)  # the document, for its own test
    path = callspec.params.get("path") if callspec is not None else None
    extra = server_arguments(path, tmp_path) if path is not None else []
    server = start_server(tmp_path / "dirmq-data", *extra, yaq=True)
    try:
        yield server
    finally:
        server.stop()


def _runnable(path: Path) -> bool:
    return any(b.lang in RUNNABLE and b.server is None for b in blocks(path))


@pytest.mark.parametrize(
    "path", [p for p in DOCS if _runnable(p)], ids=lambda p: str(p.relative_to(REPO))
)
def test_examples_run_and_show_real_output(
    path: Path, tmp_path: Path, docs_server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    spark = None
    if _uses_spark(path):
        pytest.importorskip("pyspark")  # an install without the `spark` extra
        spark = request.getfixturevalue("spark")
    failures = run_markdown(path, tmp_path, docs_server, spark)
    assert not failures, "\n\n".join(failures)


def run_markdown(
    path: Path,
    tmp_path: Path,
    docs_server: ServerProcess,
    spark: Any = None,
    server_kind: str | None = None,
) -> list[str]:
    """Run the examples of `path` in `tmp_path` (its Python in this process, on `spark`, if
    given); what differed from the Markdown. `server_kind`: only the blocks marked for that
    kind of server (`<!-- server: NAME -->`), else only the unmarked ones."""
    env = _environment(tmp_path)
    rewrite = Rewriter(docs_server)
    shell = Shell(tmp_path, env)
    python: Python | SparkPython = (
        Python(tmp_path, env) if spark is None else SparkPython(tmp_path, spark)
    )
    failures: list[str] = []
    try:
        for block in blocks(path):
            if block.file:
                (tmp_path / block.file).write_text(rewrite.command(block.text))
            if block.lang not in RUNNABLE or block.no_run is not None:
                continue
            if block.server != server_kind:
                continue
            if _missing(block.needs, env):  # test_programs_examples_need_are_installed says so
                continue
            if block.lang == "python":
                for source, where in (
                    (block.setup, f"{block.where} (setup)"),
                    (block.text, block.where),
                    (block.check, f"{block.where} (check)"),
                ):
                    if source and (error := python.run(rewrite.command(source), where)):
                        failures.append(error)
                        break  # a check of a block that failed says nothing more
                continue
            if block.setup:
                where = f"{block.where} (setup)"
                status, out = shell.run(rewrite.command(block.setup), where, strict=True)
                assert status == 0, f"{block.where}: setup failed ({status}):\n{out}"
                rewrite.last_output = out
            for command in commands(block):
                if _starts_a_server(command.text):
                    continue  # the test's own server stands in for it
                failure = _run_command(shell, rewrite, command, f"{_shown(path)}:{command.line}")
                if failure:
                    failures.append(failure)
            if block.check:
                where = f"{block.where} (check)"
                status, out = shell.run(rewrite.command(block.check), where, strict=True)
                if status != 0:
                    failures.append(f"{where}: exit {status}:\n{block.check}{out}")
    finally:
        shell.close()
        python.close()
    return failures


def _starts_a_server(command: str) -> bool:
    return re.match(r"dirmq serve\b", command) is not None and "--print-config" not in command


def _run_command(shell: Shell, rewrite: Rewriter, command: Command, where: str) -> str | None:
    """Run one shell command; None, or how it differed from the Markdown. A command whose
    output is not compared (no `$ ` in its block) or shown empty must exit 0, and its curl
    fails on an HTTP error status: else a 409 on an ack, say, would pass unseen."""
    expected = command.expected
    while expected and not expected[-1].strip():
        expected = expected[:-1]
    status_checked = not expected
    status, out = shell.run(rewrite.command(command.text), where, strict=status_checked)
    actual = rewrite.last_output = normalise(out)
    if status_checked and status != 0:
        shown = "" if expected is None else " (shown with no output)"
        return f"{where}: $ {command.text}\nexit {status}{shown}:\n{actual}"
    if expected is not None and not rewrite.match(expected, actual):
        return (
            f"{where}: $ {command.text}\n--- shown\n"
            + "".join(x + "\n" for x in expected)
            + f"--- printed (exit {status})\n{actual}"
        )
    return None


_DRIFTED = """
<!-- setup:
printf 'hello' | dirmq put --create jobs
-->
```console
$ curl -s -o /dev/null -w '%{http_code}\\n' -X DELETE localhost:8080/jobs/messages/<id>
204
$ echo '{"id":"1716000000123456-a1b2c3d4e5f6","n":3}'
{"id":"1716000000123456-a1b2c3d4e5f6","n":2}
```

<!-- no-run: shows a skip -->
```sh
false
```

```python
assert open("dirmq-data/@dirmq.json").read()
```
"""


def test_a_drifted_example_fails(tmp_path: Path, docs_server: ServerProcess) -> None:
    """The runner itself: setup, a placeholder from the setup's output, a real server, a skip,
    Python; and a shown output that differs from the printed one is reported, alone."""
    doc = tmp_path / "drifted.md"
    doc.write_text(_DRIFTED)
    failures = run_markdown(doc, tmp_path, docs_server)
    assert len(failures) == 1, failures
    assert failures[0].startswith("drifted.md:8: $ echo") and '"n":3}' in failures[0]


_UNCOMPARED = """
<!-- setup:
printf 'hello' | dirmq put --create jobs
-->
```sh
curl -X DELETE localhost:8080/jobs/messages/<id>.7
```

```console
$ curl -s -o /dev/null -X PUT localhost:8080/jobs --data '{"nope": 1}'
$ curl -s -o /dev/null -X PUT localhost:8080/jobs --data '{"capacity": 5}'
```

<!-- needs: no-such-program-dirmq -->
<!-- setup:
false
-->
```sh
no-such-program-dirmq
```

```sh
touch made
```
<!-- check:
test -e made && test -e other
-->

```python
made = open("made").read()
```
<!-- check:
assert made == "x", repr(made)
-->
"""


def test_status_is_checked_where_output_is_not(tmp_path: Path, docs_server: ServerProcess) -> None:
    """The runner itself: where no output is compared (a block without `$ `, or a command shown
    with no output) a curl that gets an HTTP error fails; a block needing a missing program
    does not run, setup included; checks run after their block."""
    doc = tmp_path / "uncompared.md"
    doc.write_text(_UNCOMPARED)
    failures = run_markdown(doc, tmp_path, docs_server)
    assert len(failures) == 4, failures
    assert failures[0].startswith("uncompared.md:6: $ curl -X DELETE") and "exit 22" in failures[0]
    assert failures[1].startswith("uncompared.md:10: $ curl"), failures[1]
    assert "exit 22 (shown with no output)" in failures[1]
    assert failures[2].startswith("uncompared.md:22 (check): exit 1"), failures[2]
    assert failures[3].startswith("uncompared.md:29 (check)") and "''" in failures[3]


def test_blocks_for_other_servers_are_run_by_a_test() -> None:
    """A block marked `<!-- server: NAME -->` is left out here: a test named in SERVER_KINDS
    must run it (calling run_markdown with server_kind="NAME")."""
    for block in (b for p in DOCS for b in blocks(p) if b.server is not None):
        runner = SERVER_KINDS.get(block.server)
        assert runner is not None, f"{block.where}: no test runs server kind {block.server!r}"
        assert f'"{block.server}"' in (REPO / runner).read_text(), (block.where, runner)


@pytest.mark.parametrize(
    "block", [b for p in DOCS for b in blocks(p) if b.needs], ids=lambda b: b.where
)
def test_programs_examples_need_are_installed(block: Block) -> None:
    """A block marked `<!-- needs: ... -->` runs only where its programs are installed: say
    so where they are not."""
    if missing := _missing(block.needs, _environment_path()):
        pytest.skip(f"{block.where} did not run: {' '.join(missing)} not installed")


def test_skipped_blocks_say_why() -> None:
    """A `no-run` block names its reason, and the skips stay few."""
    skipped = [b for p in DOCS for b in blocks(p) if b.no_run is not None]
    assert all(b.no_run for b in skipped), [b.where for b in skipped if not b.no_run]
    assert len(skipped) <= 12, [f"{b.where}: {b.no_run}" for b in skipped]


def test_benchmark_commands_are_not_run() -> None:
    """Benchmarks take minutes and want an idle machine: their commands stay text (untagged
    blocks) or say `no-run`."""
    for path in (REPO / "docs").glob("benchmarks*.md"):
        for block in blocks(path):
            assert block.lang not in RUNNABLE or block.no_run, f"{block.where}: mark it no-run"


def test_volatile_values_shown_stand_for_real_ones() -> None:
    """The matching rules themselves: a shown id matches any id and maps to it later."""
    server = ServerProcess(None, "http://127.0.0.1:5555", None, Path("/r"))  # type: ignore[arg-type]
    rewrite = Rewriter(server)
    shown = ['{"id":"1716000000123456-a1b2c3d4e5f6"}', "age ... s", "...", "end"]
    assert rewrite.match(shown, '{"id":"1795294026559186-00ab28fa0380"}\nage 3 s\nx\ny\nend\n')
    assert rewrite.command("curl localhost:8080/q/messages/1716000000123456-a1b2c3d4e5f6.1") == (
        "curl localhost:5555/q/messages/1795294026559186-00ab28fa0380.1"
    )
    assert not rewrite.match(["ready 2"], "ready 3\n")
    assert not rewrite.match(["ok"], "ok\nmore\n")
    assert rewrite.match(["took 1.002458s"], "took 0.031s\n")


def _dirmq(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DIRMQ_ROOT"}
    command = [sys.executable, "-m", "dirmq", *args]
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_root_is_taken_before_or_after_the_command(tmp_path: Path) -> None:
    """docs/cli.md lists `--root DIR` as common to every command: `dirmq --root DIR ls` works,
    and a `--root` after the command wins over one before it."""
    assert _dirmq("--root", "a", "create", "shop/orders", cwd=tmp_path).returncode == 0
    listed = _dirmq("--root", str(tmp_path / "a"), "ls", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "shop/orders" in listed.stdout
    assert _dirmq("--root", "nowhere", "ls", "--root", "a", cwd=tmp_path).returncode == 0
    assert _dirmq("ls", cwd=tmp_path).returncode == 4  # ./dirmq-data, not a root: not made
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "dirmq-data").exists()


def test_put_to_a_missing_queue_says_how_to_create_it(tmp_path: Path) -> None:
    _dirmq("create", "other", cwd=tmp_path)
    put = subprocess.run(
        [sys.executable, "-m", "dirmq", "put", "--root", "dirmq-data", "shop/orders"],
        cwd=tmp_path,
        input="hello",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert put.returncode == 4
    assert "dirmq create shop/orders" in put.stderr and "--create" in put.stderr


EXAMPLES = sorted((REPO / "examples").glob("*.py"))
_EVENTS = 2000
# How each example runs in the test, and lines its output must hold (the numbers it reports
# must be true ones). A new example gets an entry here.
EXAMPLE_RUNS = {
    "spark_pipeline.py": (
        ["--events", str(_EVENTS)],
        [
            f"processed {_EVENTS} events; the parquet lake holds {_EVENTS} events",
            "left in shop/events: 0",
            f"clicks in all windows: {_EVENTS}",
        ],
    ),
}


def test_every_example_is_run() -> None:
    assert sorted(p.name for p in EXAMPLES) == sorted(EXAMPLE_RUNS)


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_scripts_run(script: Path, tmp_path: Path) -> None:
    """Each examples/*.py runs as examples/README.md says (a script of its own), prints true
    numbers and leaves no temp directory behind."""
    if script.name.startswith("spark"):
        pytest.importorskip("pyspark")  # an install without the `spark` extra
    arguments, expected_lines = EXAMPLE_RUNS[script.name]
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**_environment(tmp_path), "TMPDIR": str(temp), "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, str(script), *arguments],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    printed = done.stdout.splitlines()
    for line in expected_lines:
        assert line in printed, f"{line!r} not in the output:\n{done.stdout}"
    left = list(temp.glob("dirmq-*"))
    assert not left, f"{script.name} left its temp directory behind: {left}"
