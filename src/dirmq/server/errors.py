"""The one table from dirmq errors to HTTP status codes (the native API and yaq share it)."""

from __future__ import annotations

import json

from dirmq import errors
from dirmq.server.contract import Response

RETRY_AFTER_S = 1

# Most specific first: the first matching class wins.
STATUS_BY_ERROR: tuple[tuple[type[errors.DirmqError], int], ...] = (
    (errors.Unauthenticated, 401),
    (errors.AccessDenied, 403),
    (errors.InvalidName, 400),
    (errors.InvalidArgument, 400),
    (errors.CorruptConfig, 500),  # the stored file is bad: the server's fault, not the client's
    (errors.ConfigError, 400),
    (errors.QueueNotFound, 404),
    (errors.MessageNotFound, 404),
    (errors.TaskNotFound, 404),
    (errors.ScheduleNotFound, 404),
    (errors.RedriveBusy, 409),
    (errors.QueueExists, 409),
    (errors.StaleReceipt, 409),
    (errors.DuplicateMessage, 409),
    (errors.SubscriptionBusy, 409),
    (errors.DeliveryNotFound, 404),
    (errors.MessageTooLarge, 413),
    (errors.QueueFull, 504),
    (errors.CorruptMessage, 500),
    (errors.StorageError, 503),  # the message cannot be guaranteed stored: retry later
)


def status_of(exc: errors.DirmqError) -> int:
    for error_type, status in STATUS_BY_ERROR:
        if isinstance(exc, error_type):
            return status
    return 500


# A 401 says how to authenticate: a token (Bearer), or Basic with the token as the password
# (what makes a browser ask for it).
CHALLENGES = (
    ("WWW-Authenticate", 'Bearer realm="dirmq"'),
    ("WWW-Authenticate", 'Basic realm="dirmq", charset="UTF-8"'),
)


def error_response(exc: errors.DirmqError) -> Response:
    status = status_of(exc)
    response = json_error(status, type(exc).__name__, str(exc))
    if status == 401:
        response.headers.extend(CHALLENGES)
    return response


def json_error(status: int, code: str, message: str) -> Response:
    headers = [("Content-Type", "application/json")]
    if status == 503:
        headers.append(("Retry-After", str(RETRY_AFTER_S)))
    body = json.dumps({"error": code, "message": message}).encode() + b"\n"
    return Response(status, body, headers)
