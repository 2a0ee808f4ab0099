"""The MD5 digests SQS answers with, so SDKs that check them (Java, .NET, Go v1, JavaScript v2)
accept our answers.

- MD5OfMessageBody / MD5OfBody: MD5 of the body's UTF-8 bytes, in lowercase hex.
- MD5OfMessageAttributes (and MD5OfMessageSystemAttributes, same algorithm over the system
  attributes): attributes sorted by name; for each, the name, then the data type, each as a
  4-byte big-endian length and its UTF-8 bytes; then one byte for the transport type (1 for
  String and Number values, 2 for Binary ones); then the value as a 4-byte big-endian length
  and its bytes (UTF-8 for strings, raw for binary). The digest of the whole buffer, in hex.
  Custom type labels (`Number.float`) are part of the data type as given.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping

STRING_TRANSPORT = 1
BINARY_TRANSPORT = 2

# name -> (data type, value): a str value travels as a String, bytes as Binary.
AttributeValues = Mapping[str, tuple[str, str | bytes]]


def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def _sized(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def md5_of_attributes(attributes: AttributeValues) -> str | None:
    """The digest of `attributes`, or None when there are none (SQS then omits the field)."""
    if not attributes:
        return None
    digest = hashlib.md5(usedforsecurity=False)
    # Java's SDK sorts names as UTF-16 code units; names are ASCII or Latin letters (all in the
    # Basic Multilingual Plane), where that order is code point order, Python's.
    for name in sorted(attributes):
        data_type, value = attributes[name]
        digest.update(_sized(name.encode("utf-8")))
        digest.update(_sized(data_type.encode("utf-8")))
        if isinstance(value, str):
            digest.update(bytes([STRING_TRANSPORT]))
            digest.update(_sized(value.encode("utf-8")))
        else:
            digest.update(bytes([BINARY_TRANSPORT]))
            digest.update(_sized(bytes(value)))
    return digest.hexdigest()
