"""Drop-in APIs of the systems dirmq replaces, each a thin layer over `dirmq.store`.

`dirmq.compat.vsqs` is VSQS 0.3's `QueueManager`/`Queue` API; `dirmq.compat.vsqs_import` moves an
existing VSQS queue directory into a dirmq queue.
"""
