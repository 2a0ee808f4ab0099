"""Imports only go downwards: the storage core never pulls in asyncio, HTTP or Spark."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import dirmq


def test_store_imports_without_asyncio_http_or_spark() -> None:
    code = (
        "import sys\n"
        "class Forbid:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        root = name.split('.')[0]\n"
        "        forbidden = {'asyncio', 'httptools', 'uvloop', 'pyspark', 'http'}\n"
        "        if root in forbidden or name.startswith('dirmq.server'):\n"
        "            raise ImportError('forbidden import ' + name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Forbid())\n"
        "import dirmq, dirmq.store, dirmq.store.fsck, dirmq.store.holds, dirmq.store.smallfiles\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def _imports_cleanly(module: str, forbidden: set[str]) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        f"FORBIDDEN = {sorted(forbidden)!r}\n"
        "class Forbid:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if any(name == f or name.startswith(f + '.') for f in FORBIDDEN):\n"
        "            raise ImportError('forbidden import ' + name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Forbid())\n"
        f"import {module}\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


def test_imports_only_go_downwards() -> None:
    layers = {
        "dirmq.store": {"dirmq.wire", "dirmq.client", "dirmq.server", "dirmq.cli", "asyncio"},
        "dirmq.wire": {"dirmq.client", "dirmq.server", "dirmq.cli", "asyncio"},
        # `import dirmq.wire` loads none of its modules: the pub/sub one (on dirmq.pubsub) too.
        "dirmq.wire.pubsub": {
            "dirmq.client",
            "dirmq.server",
            "dirmq.sqs",
            "dirmq.spark",
            "dirmq.cli",
            "asyncio",
        },
        "dirmq.client": {"dirmq.server", "dirmq.cli"},
        "dirmq.compat.vsqs": {"dirmq.server", "dirmq.client", "asyncio"},
        "dirmq.spark": {"dirmq.server", "dirmq.sqs", "dirmq.cli"},
        "dirmq.pubsub.retained": {"dirmq.wire", "dirmq.client", "dirmq.server", "asyncio"},
        "dirmq.pubsub": {
            "dirmq.wire",
            "dirmq.client",
            "dirmq.server",
            "dirmq.sqs",
            "dirmq.cli",
            "asyncio",
        },
    }
    for module, forbidden in layers.items():
        result = _imports_cleanly(module, forbidden)
        assert result.returncode == 0, f"{module}: {result.stderr}"


def test_no_file_locks_anywhere() -> None:
    """flock/lockf/fcntl locks silently fail on NFS (DESIGN.md): link, rename, O_EXCL, mkdir."""
    src = Path(dirmq.__file__).parent
    for path in src.rglob("*.py"):
        code = path.read_text(encoding="utf-8")
        for call in ("import fcntl", "from fcntl", "fcntl.", "flock(", "lockf("):
            assert call not in code, f"{path.relative_to(src)} uses {call}"


def test_public_api_is_pinned() -> None:
    assert sorted(dirmq.__all__) == sorted(
        [
            "ConfigError",
            "CorruptMessage",
            "DirmqError",
            "DiskFull",
            "Durability",
            "InvalidArgument",
            "InvalidName",
            "Message",
            "MessageNotFound",
            "MessageTooLarge",
            "OutgoingMessage",
            "Queue",
            "QueueConfig",
            "QueueExists",
            "QueueFull",
            "QueueNotFound",
            "QueueStats",
            "StaleReceipt",
            "StorageError",
            "Store",
            "StoreEvents",
            "__version__",
        ]
    )
    for name in dirmq.__all__:
        assert hasattr(dirmq, name), name
    queue_api = {n for n in dir(dirmq.Queue) if not n.startswith("_")}
    assert queue_api >= {
        "put",
        "put_many",
        "get",
        "get_one",
        "ack",
        "ack_many",
        "extend_many",
        "nack",
        "extend",
        "delete",
        "dead_letter",
        "peek",
        "browse",
        "stats",
        "purge",
        "sweep",
        "close",
        "config",
        "fileno",
    }


# -- the import graph, read from the source: every import counts, deferred or for typing only --
SRC = Path(dirmq.__file__).parent


def _module_name(path: Path) -> str:
    parts = ("dirmq", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _imports(name: str) -> set[str]:
    """The dirmq modules `name` imports anywhere in its text (`from pkg import sub` names the
    submodule, `from pkg import thing` the package)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            submodules = {f"{base}.{a.name}" for a in node.names} & MODULES.keys()
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name) for name in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_anywhere() -> None:
    assert _cycles(GRAPH) == []


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


# What each layer may import of the others (`dirmq` itself re-exports the store's API). Read
# downwards: the store is the bottom, the composition root and the CLI the top.
MAY_IMPORT: dict[str, set[str]] = {
    "errors": set(),
    "store": {"errors"},
    "wire": {"errors", "store", "pubsub"},
    "pubsub": {"errors", "store"},
    "compat": {"errors", "store"},
    "redrive": {"errors", "store"},
    "schedules": {"errors", "store"},  # recurring schedules: the files and their runners
    "client": {"errors", "store", "wire", "pubsub"},
    "server": {"errors", "store", "wire"},  # the runtime: no dialect
    "dialects": {"errors", "store", "wire", "pubsub", "server", "redrive", "schedules"},
    "sqs": {"errors", "store", "wire", "server", "redrive"},
    "spark": {"errors", "store", "wire", "pubsub", "client"},
    # the web console: a dialect of its own, beside (never importing) the APIs
    "console": {"errors", "store", "wire", "pubsub", "server", "redrive", "schedules"},
    "service": {
        "errors",
        "store",
        "wire",
        "pubsub",
        "server",
        "dialects",
        "sqs",
        "console",
        "schedules",
    },
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return "dirmq" if len(parts) == 1 else parts[1]


def test_each_layer_imports_only_the_layers_below_it() -> None:
    wrong = []
    for module, targets in GRAPH.items():
        allowed = MAY_IMPORT.get(_layer(module))
        if allowed is None:
            continue  # the CLI, `dirmq` and `__main__`: the top, anything goes
        for target in targets:
            layer = "store" if target == "dirmq" else _layer(target)
            if layer != _layer(module) and layer not in allowed:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_every_layer_has_a_rule() -> None:
    layers = {_layer(m) for m in MODULES} - {"dirmq", "cli", "__main__"}
    assert layers <= MAY_IMPORT.keys()


LONG_LINES = 400


def test_a_long_module_says_why_at_its_top() -> None:
    """One concept per module: past ~400 lines a module either splits or says in its docstring
    why it is one piece ("Why it is long: ..."), so growth is a decision, not an accident."""
    unexplained = []
    for name, path in MODULES.items():
        text = path.read_text()
        if text.count("\n") > LONG_LINES:
            docstring = ast.get_docstring(ast.parse(text)) or ""
            if "Why it is long: " not in docstring:
                unexplained.append(f"{name} ({text.count(chr(10))} lines)")
    assert unexplained == []
