"""SQS actions by name (see `registry.py`), one module per family."""

from __future__ import annotations

from dirmq.sqs.actions.registry import REGISTRY, Action


def load() -> dict[str, Action]:
    """Import every action module (each registers its actions) and return the registry."""
    from dirmq.sqs.actions import move_tasks, queues, receiving, sending, settling  # noqa: F401

    return REGISTRY
