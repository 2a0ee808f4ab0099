"""Identifiers SQS clients see, derived from dirmq's.

- MessageId: UUID-shaped. A dirmq id (16 decimal digits of microseconds, a dash, 12 hex digits
  of node) maps to and from that shape one to one.
- ReceiptHandle: the dirmq receipt itself (`<id>.<receive count>`), so a receipt taken over SQS
  also works with the library and the native API, and the other way round.
- SequenceNumber (FIFO): 20 digits, the id's microseconds then 4 digits from the first 12 bits
  of its node. It increases with the id, so within a message group (whose order is id order)
  it increases too; two processes would have to mint ids in the same microsecond with nodes
  sharing their first 12 bits to give two messages one number.
"""

from __future__ import annotations

from dirmq.store.ids import is_id
from dirmq.store.layout import parse_receipt

SEQUENCE_DIGITS = 20


def sqs_message_id(message_id: str) -> str:
    micros, node = message_id.split("-")
    digits = f"{int(micros):020x}{node}"
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def dirmq_message_id(sqs_id: str) -> str | None:
    digits = sqs_id.replace("-", "")
    if len(digits) != 32:
        return None
    try:
        micros = int(digits[:20], 16)
    except ValueError:
        return None
    candidate = f"{micros:016d}-{digits[20:]}"
    return candidate if is_id(candidate) else None


def sequence_number(message_id: str) -> str:
    micros, node = message_id.split("-")
    return f"{int(micros):016d}{int(node[:3], 16):04d}"


def parse_receipt_handle(handle: object) -> tuple[str, int] | None:
    """(dirmq message id, receive count) of a receipt handle; None when it is not one of ours."""
    if not isinstance(handle, str) or len(handle) > 64:
        return None
    return parse_receipt(handle)
