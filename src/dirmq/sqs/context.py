"""What every SQS action needs: the broker (store access for asyncio), the account and region it
answers as, and the mapping between SQS queue names, URLs, ARNs and dirmq queues.

SQS queue names (1-80 of [A-Za-z0-9_-], `.fifo` suffix for FIFO queues) are dirmq queue names
as they are: the queue `orders` of the native API and the library is the SQS queue `orders`,
URL `http://host:port/<account>/orders`. dirmq queues whose names are not valid SQS names
(nested `a/b`, spaces) are invisible to SQS; one addressed all the same is QueueDoesNotExist,
in words that say it exists and why SQS cannot reach it (`unreachable`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from dirmq.errors import DirmqError
from dirmq.server.broker import Broker
from dirmq.sqs.errors import SqsError, no_such_queue, not_an_sqs_name

DEFAULT_ACCOUNT = "000000000000"
DEFAULT_REGION = "us-east-1"
_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
_ACCOUNT_RE = re.compile(r"[0-9]{12}")


def valid_sqs_name(name: str) -> bool:
    base = name[: -len(".fifo")] if name.endswith(".fifo") else name
    return bool(_NAME_RE.fullmatch(base)) and len(name) <= 80


@dataclass(frozen=True, slots=True)
class Context:
    broker: Broker
    base_url: str  # scheme://host:port the client used (from the Host header)
    account: str = DEFAULT_ACCOUNT
    region: str = DEFAULT_REGION
    # The request's X-Amzn-Trace-Id header: AWS stores it as the AWSTraceHeader of the messages
    # a SendMessage(Batch) carries unless they give that system attribute themselves.
    trace_header: str | None = None
    # Refuse CreateQueue of a name deleted less than this long ago (AWS: 60 s); None: never.
    deleted_wait_s: float | None = None
    # Which queue names the request's principal may see: what listings show (sqs/access.py).
    visible: Callable[[str], bool] = lambda _name: True
    principal: str | None = None  # who signed the request: the holder's label of its leases

    def queue_url(self, name: str) -> str:
        return f"{self.base_url}/{self.account}/{name}"

    def queue_arn(self, name: str) -> str:
        return f"arn:aws:sqs:{self.region}:{self.account}:{name}"

    def name_from_url(self, url: str | None) -> str:
        """The queue name in a QueueUrl (any host: clients may use another name for us)."""
        if not url:
            raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
        path = urlsplit(url).path if "://" in url else url
        name = path.rstrip("/").rsplit("/", 1)[-1]
        # A nested queue `a/b` spelled as its URL would be: /<account>/a/b (or a%2Fb).
        account, _, nested = unquote(path).strip("/").partition("/")
        if "/" in nested and _ACCOUNT_RE.fullmatch(account):
            raise self.unreachable(nested)
        if not valid_sqs_name(name):
            raise self.unreachable(unquote(name))
        return name

    def unreachable(self, name: str) -> SqsError:
        """QueueDoesNotExist for `name`, not an SQS name: saying so if the queue exists."""
        try:
            exists = self.broker.store.exists(name)
        except (DirmqError, ValueError):  # not a dirmq queue name either
            exists = False
        return not_an_sqs_name(name) if exists else no_such_queue()

    def name_from_arn(self, arn: str, parameter: str) -> str:
        parts = arn.split(":")
        if (
            len(parts) != 6
            or parts[0] != "arn"
            or parts[2] != "sqs"
            or not valid_sqs_name(parts[5])
        ):
            raise SqsError(
                "InvalidParameterValue",
                f"Value {arn} for parameter {parameter} is invalid. Reason: not an SQS queue ARN.",
            )
        return parts[5]
