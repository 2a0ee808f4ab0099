"""Readiness and stopping notices to the service manager (systemd's `Type=notify`).

systemd passes `$NOTIFY_SOCKET`, a unix datagram socket (a path, or an abstract name written
with a leading `@`); a service sends newline-separated `KEY=value` lines there: `READY=1` once it
serves, `STOPPING=1` when it begins to shut down, `STATUS=...` for `systemctl status`. Without
the variable (not started by systemd) every call does nothing.

Only the process systemd started may notify (`NotifyAccess=main`): a forked worker calls
`forget()`, so its notices are never sent.
"""

from __future__ import annotations

import logging
import os
import socket

ENV = "NOTIFY_SOCKET"
log = logging.getLogger("dirmq.server")


def notify(*assignments: str) -> bool:
    """Send `assignments` ("READY=1", "STATUS=serving", ...) in one datagram; whether it was
    sent. A failure is logged, never raised: the server works without a service manager."""
    address = os.environ.get(ENV, "")
    if address.startswith("@"):
        address = "\0" + address[1:]  # Linux abstract namespace
    elif not address.startswith("/"):
        return False  # unset, or a kind of address (vsock) this does not speak
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(assignments).encode())
    except OSError as exc:
        log.warning("cannot notify the service manager at %s: %s", os.environ[ENV], exc)
        return False
    return True


def forget_notify_socket() -> None:
    """In a forked worker: never notify (systemd accepts notices from its main process only)."""
    os.environ.pop(ENV, None)
