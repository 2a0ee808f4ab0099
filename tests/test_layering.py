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
        "import dirmq, dirmq.store, dirmq.store.fsck\n"
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


def _import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports, counting every import statement: at the
    top, in a function, or under TYPE_CHECKING (a circle there is still a circle to read)."""
    base = Path(dirmq.__file__).parent.parent
    modules: dict[str, Path] = {}
    for path in (base / package.replace(".", "/")).rglob("*.py"):
        name = ".".join(path.relative_to(base).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    parts = own_package.split(".")[: len(own_package.split(".")) - node.level + 1]
                    source = ".".join([*parts, source] if source else parts)
                # `from package import module` imports the module; else the names' module.
                found.update(
                    f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source
                    for a in node.names
                )
        graph[name] = {target for target in found if target in modules and target != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            target = next(edges, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        circles.append(sorted(group))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(sorted(graph[target]))))
            elif target in on_stack:
                low[node] = min(low[node], index[target])
    return circles


def test_the_import_graph_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_pubsub_modules_import_no_circle() -> None:
    graph = _import_graph("dirmq.pubsub")
    assert "dirmq.pubsub.subscription" in graph["dirmq.pubsub.hub"]  # the graph sees imports
    assert _circles(graph) == []
