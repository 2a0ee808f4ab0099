"""SQS message ids are UUID-shaped; dirmq ids (16 decimal digits of microseconds, a dash, 12 hex
digits of node) map to and from that shape one to one."""

from __future__ import annotations

from dirmq.store.ids import is_id


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
