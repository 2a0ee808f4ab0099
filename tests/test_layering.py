"""Imports only go downwards: the storage core never pulls in asyncio, HTTP or Spark."""

from __future__ import annotations

import subprocess
import sys

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
        "dirmq.client": {"dirmq.server", "dirmq.cli"},
        "dirmq.compat.vsqs": {"dirmq.server", "dirmq.client", "asyncio"},
        "dirmq.spark": {"dirmq.server", "dirmq.sqs", "dirmq.cli"},
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
