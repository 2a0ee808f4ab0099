"""The Queue API over HTTP: the same operations as the brokerless library (`dirmq.Store`,
`dirmq.Queue`), talking to a `dirmq serve` instance.

    from dirmq.client import RemoteStore
    store = RemoteStore("http://127.0.0.1:8080")
    orders = store.create_queue("shop/orders")
    orders.put(b"hello")

Errors are the library's (`QueueNotFound`, `StaleReceipt`, `StorageError`, ...), rebuilt from the
server's answer. `AsyncRemoteStore` (`dirmq.client.aio`) has the same API for asyncio programs.
`RemotePubSub` (`dirmq.client.pubsub`) is the pub/sub API (`dirmq.pubsub.PubSub`) over HTTP.
"""

from dirmq.client.aio import AsyncRemoteQueue, AsyncRemoteStore
from dirmq.client.pubsub import RemotePubSub, RemoteSubscription
from dirmq.client.remote import RemoteQueue, RemoteStore

__all__ = [
    "AsyncRemoteQueue",
    "AsyncRemoteStore",
    "RemotePubSub",
    "RemoteQueue",
    "RemoteStore",
    "RemoteSubscription",
]
