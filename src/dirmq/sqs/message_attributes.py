"""SQS message attributes: validated as AWS does, stored as dirmq message headers so the library
and the native API see them too, and read back from headers whoever wrote them.

Stored form (header names are HTTP tokens, compared without case; values are one line):

    X-Attr-<Name>: <value>
        A String attribute whose value is one line without leading or trailing blanks: the
        convention of the native API and the library, so `X-Attr-Colour: blue` published there
        is the SQS attribute Colour, String, "blue", and the other way round.
    X-Sqs-Attr-<Name>: <DataType>;<base64 of the value>
        Every other attribute: Number, Binary, custom types (`String.json`, `Binary.png`),
        strings of several lines or with edge blanks. Exact, whatever the value.
    X-Sqs-Attr-.<hex of the UTF-8 name>: <DataType>;<base64 of the value>
        Names that are not HTTP tokens (SQS allows some Latin letters, `Größe`) or that
        differ from another attribute's name only by case. SQS names never start with a
        period, so this form cannot be mistaken for the one above.
    X-Amzn-Trace-Id: <AWSTraceHeader>
        The one message system attribute.

Why it is long: AWS's rules for attribute names, types and values, the stored form and the MD5
computed over what is read back, kept together so the three cannot drift apart.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from dirmq.sqs.errors import SqsError
from dirmq.sqs.md5 import AttributeValues
from dirmq.store import Message
from dirmq.store.deadletters import format_time

MAX_ATTRIBUTES = 10
MAX_NAME_LENGTH = 256
MAX_TYPE_LENGTH = 256
BASE_TYPES = ("String", "Number", "Binary")
ATTR_PREFIX = "X-Attr-"
SQS_ATTR_PREFIX = "X-Sqs-Attr-"
TRACE_HEADER = "X-Amzn-Trace-Id"
TRACE_ATTRIBUTE = "AWSTraceHeader"
ALLOWED_CHARACTERS = "#x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF"

_NOT_ALLOWED_RE = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_TOKEN_RE = re.compile(r"[A-Za-z0-9_.-]+")
_RESERVED_PREFIXES = ("aws.", "amazon.")
_NUMBER_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


@dataclass(frozen=True, slots=True)
class Attribute:
    """One message attribute: a str value travels as a String, bytes as Binary."""

    data_type: str
    value: str | bytes

    @property
    def base_type(self) -> str:
        return self.data_type.split(".", 1)[0]

    def size(self, name: str) -> int:
        """What it counts towards the message size: name, type and value bytes."""
        value = self.value.encode("utf-8") if isinstance(self.value, str) else self.value
        return len(name.encode("utf-8")) + len(self.data_type.encode("utf-8")) + len(value)

    def to_json(self) -> dict[str, str]:
        if isinstance(self.value, str):
            return {"DataType": self.data_type, "StringValue": self.value}
        return {
            "DataType": self.data_type,
            "BinaryValue": base64.b64encode(self.value).decode("ascii"),
        }


# -- validation -------------------------------------------------------------------------------
def first_invalid_character(text: str) -> str | None:
    """The first character SQS does not accept in bodies and string values (XML 1.0's set)."""
    match = _NOT_ALLOWED_RE.search(text)
    return None if match is None else match.group()


def describe_character(char: str) -> str:
    return f"#x{ord(char):X}"


def valid_name(name: str) -> bool:
    if not name or len(name) > MAX_NAME_LENGTH:
        return False
    if not all(_name_character(c) for c in name):
        return False
    lowered = name.lower()
    return not (
        lowered.startswith(_RESERVED_PREFIXES)
        or name.startswith(".")
        or name.endswith(".")
        or ".." in name
    )


def _name_character(char: str) -> bool:
    # AWS documents A-Z a-z 0-9 _ - . and also accepts Latin letters such as ø ß ä.
    return (char.isascii() and (char.isalnum() or char in "_-.")) or (
        "\u00c0" <= char <= "\u017f" and char.isalpha()
    )


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise SqsError(
            "InvalidParameterValue", "The request must contain non-empty message attribute name."
        )
    if len(name) > MAX_NAME_LENGTH:
        raise SqsError(
            "InvalidParameterValue",
            f"Message (user) attribute names must be at most {MAX_NAME_LENGTH} characters long.",
        )
    if not all(_name_character(c) for c in name):
        raise SqsError(
            "InvalidParameterValue",
            f"Message (user) attribute name '{name}' can only contain alphanumeric characters, "
            "hyphens (-), underscores (_) and periods (.).",
        )
    if name.lower().startswith(_RESERVED_PREFIXES):
        raise SqsError(
            "InvalidParameterValue",
            "You can't use message attribute names beginning with 'AWS.' or 'Amazon.'. "
            "These strings are reserved for internal use.",
        )
    if name.startswith(".") or name.endswith(".") or ".." in name:
        raise SqsError(
            "InvalidParameterValue",
            f"Message (user) attribute name '{name}' must not start or end with a period (.) "
            "or have periods in succession (..).",
        )
    return name


def _check_type(name: str, data_type: object) -> str:
    if not isinstance(data_type, str) or not data_type:
        raise SqsError(
            "InvalidParameterValue",
            f"The message attribute '{name}' must contain non-empty message attribute type.",
        )
    base, dot, label = data_type.partition(".")
    if base not in BASE_TYPES or (dot and not label):
        raise SqsError(
            "InvalidParameterValue",
            f"The type of message (user) attribute '{name}' is invalid. You must use only the "
            "following supported type prefixes: Binary, Number, String.",
        )
    if len(data_type) > MAX_TYPE_LENGTH:
        raise SqsError(
            "InvalidParameterValue",
            f"Message (user) attribute '{name}' type must be at most {MAX_TYPE_LENGTH} "
            "characters long.",
        )
    bad = first_invalid_character(data_type)
    if bad is not None:
        raise SqsError(
            "InvalidParameterValue",
            f"Invalid binary character '{describe_character(bad)}' was found in the type of "
            f"message attribute '{name}', the set of allowed characters is {ALLOWED_CHARACTERS}",
        )
    return data_type


def _check_number(name: str, text: str) -> None:
    """SQS numbers: up to 38 significant digits, magnitude from 10^-128 to 10^+126."""
    invalid = SqsError(
        "InvalidParameterValue",
        f"Can't convert value '{text[:100]}' of message attribute '{name}' to a number.",
    )
    if not _NUMBER_RE.fullmatch(text):
        raise invalid
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise invalid from None
    if number.is_zero():
        return
    _sign, raw_digits, exponent = number.as_tuple()  # exact: normalize() would round
    assert isinstance(exponent, int)
    digits = "".join(map(str, raw_digits)).lstrip("0")
    significant = digits.rstrip("0")
    magnitude = len(digits) + exponent - 1  # the power of ten of the leading digit
    digits = significant
    if len(digits) > 38 or not -128 <= magnitude <= 125:
        raise SqsError(
            "InvalidParameterValue",
            f"Value '{text[:100]}' of message attribute '{name}' is out of range: a Number has "
            "at most 38 digits of precision and lies between 10^-128 and 10^+126.",
        )


def _binary(name: str, raw: object) -> bytes:
    if isinstance(raw, bytes | bytearray):
        return bytes(raw)
    if isinstance(raw, str):
        try:
            return base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            pass
    raise SqsError(
        "InvalidParameterValue",
        f"The BinaryValue of message attribute '{name}' is not valid base64.",
    )


def _check_value(name: str, data_type: str, spec: Mapping[str, Any]) -> str | bytes:
    if spec.get("StringListValues") or spec.get("BinaryListValues"):
        raise SqsError(
            "UnsupportedOperation",
            "Message attribute list values in SendMessage operation are not supported.",
        )
    base = data_type.partition(".")[0]
    if base == "Binary":
        raw = spec.get("BinaryValue")
        value = b"" if raw is None else _binary(name, raw)
        if not value:
            raise SqsError(
                "InvalidParameterValue",
                f"Message (user) attribute '{name}' must contain a non-empty value of type "
                "'Binary'.",
            )
        return value
    text = spec.get("StringValue")
    if not isinstance(text, str) or not text:
        raise SqsError(
            "InvalidParameterValue",
            f"Message (user) attribute '{name}' must contain a non-empty value of type 'String'.",
        )
    bad = first_invalid_character(text)
    if bad is not None:
        raise SqsError(
            "InvalidParameterValue",
            f"Invalid binary character '{describe_character(bad)}' was found in the value of "
            f"message attribute '{name}', the set of allowed characters is {ALLOWED_CHARACTERS}",
        )
    if base == "Number":
        _check_number(name, text)
    return text


def parse_attributes(raw: object) -> dict[str, Attribute]:
    """The MessageAttributes parameter of a send, validated; SqsError says what is wrong."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SqsError("InvalidParameterValue", "MessageAttributes must be a map.")
    if len(raw) > MAX_ATTRIBUTES:
        raise SqsError(
            "InvalidParameterValue",
            f"Number of message attributes [{len(raw)}] exceeds the allowed maximum "
            f"[{MAX_ATTRIBUTES}].",
        )
    parsed: dict[str, Attribute] = {}
    for raw_name, spec in raw.items():
        name = _check_name(raw_name)
        if not isinstance(spec, Mapping):
            raise SqsError(
                "InvalidParameterValue",
                f"The message attribute '{name}' must contain non-empty message attribute type.",
            )
        data_type = _check_type(name, spec.get("DataType"))
        parsed[name] = Attribute(data_type, _check_value(name, data_type, spec))
    return parsed


def parse_system_attributes(raw: object) -> str | None:
    """The MessageSystemAttributes parameter: the AWSTraceHeader value, if given."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SqsError("InvalidParameterValue", "MessageSystemAttributes must be a map.")
    trace: str | None = None
    for name, spec in raw.items():
        if name != TRACE_ATTRIBUTE:
            raise SqsError(
                "InvalidParameterValue",
                f"Message system attribute name '{name}' is invalid. The only supported message "
                f"system attribute is {TRACE_ATTRIBUTE}.",
            )
        if not isinstance(spec, Mapping) or spec.get("DataType") != "String":
            raise SqsError(
                "InvalidParameterValue",
                f"Message system attribute '{name}' must be of type 'String'.",
            )
        value = spec.get("StringValue")
        if usable_trace_header(value) is None:
            raise SqsError(
                "InvalidParameterValue",
                f"Message system attribute '{name}' must contain a non-empty, printable ASCII "
                "X-Ray trace header.",
            )
        trace = value
    return trace


def usable_trace_header(value: object) -> str | None:
    """`value` if it can be an AWSTraceHeader (printable ASCII, 1-4096 characters)."""
    if (
        isinstance(value, str)
        and value
        and value.isprintable()
        and value.isascii()
        and len(value) <= 4096
    ):
        return value
    return None


def total_size(attributes: Mapping[str, Attribute]) -> int:
    return sum(attribute.size(name) for name, attribute in attributes.items())


def md5_values(attributes: Mapping[str, Attribute]) -> AttributeValues:
    return {name: (a.data_type, a.value) for name, a in attributes.items()}


# -- headers ---------------------------------------------------------------------------------
def _plain_string(attribute: Attribute) -> bool:
    value = attribute.value
    return (
        attribute.data_type == "String"
        and isinstance(value, str)
        and "\n" not in value
        and "\r" not in value
        and "\x7f" not in value  # DEL: SQS allows it, an HTTP header value does not
        and value == value.strip(" \t")
    )


def to_headers(
    attributes: Mapping[str, Attribute], trace_header: str | None = None
) -> dict[str, str]:
    """The headers that store `attributes` (and the trace header) with a message."""
    headers: dict[str, str] = {}
    taken: set[str] = set()  # header names in lower case
    for name in sorted(attributes):
        attribute = attributes[name]
        plain_ok = bool(_TOKEN_RE.fullmatch(name))
        if _plain_string(attribute) and plain_ok:
            header = f"{ATTR_PREFIX}{name}"
            if header.lower() not in taken:
                taken.add(header.lower())
                assert isinstance(attribute.value, str)
                headers[header] = attribute.value
                continue
        header = f"{SQS_ATTR_PREFIX}{name}"
        if not plain_ok or header.lower() in taken:
            header = f"{SQS_ATTR_PREFIX}.{name.encode('utf-8').hex()}"
        taken.add(header.lower())
        value = (
            attribute.value.encode("utf-8") if isinstance(attribute.value, str) else attribute.value
        )
        headers[header] = f"{attribute.data_type};{base64.b64encode(value).decode('ascii')}"
    if trace_header is not None:
        headers[TRACE_HEADER] = trace_header
    return headers


def from_headers(headers: Mapping[str, str]) -> dict[str, Attribute]:
    """The SQS attributes of a stored message. Typed headers win over X-Attr-* for one name;
    headers that cannot be SQS attributes (names SQS refuses, damaged values) are left out."""
    typed: dict[str, Attribute] = {}
    plain: dict[str, Attribute] = {}
    for header, value in headers.items():
        lowered = header.lower()
        if lowered.startswith(SQS_ATTR_PREFIX.lower()):
            decoded = _decode_typed(header[len(SQS_ATTR_PREFIX) :], value)
            if decoded is not None:
                typed[decoded[0]] = decoded[1]
        elif lowered.startswith(ATTR_PREFIX.lower()):
            name = header[len(ATTR_PREFIX) :]
            if valid_name(name):
                plain[name] = Attribute("String", value)
    return plain | typed


def _decode_typed(key: str, value: str) -> tuple[str, Attribute] | None:
    if key.startswith("."):
        try:
            name = bytes.fromhex(key[1:]).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return None
    else:
        name = key
    data_type, sep, encoded = value.rpartition(";")
    if not sep or not valid_name(name) or data_type.partition(".")[0] not in BASE_TYPES:
        return None
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    if data_type.startswith("Binary"):
        return name, Attribute(data_type, raw)
    try:
        return name, Attribute(data_type, raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None


def trace_header(headers: Mapping[str, str]) -> str | None:
    for name, value in headers.items():
        if name.lower() == TRACE_HEADER.lower():
            return value
    return None


# -- selecting for a receive -----------------------------------------------------------------
def select(attributes: Mapping[str, Attribute], requested: Iterable[str]) -> dict[str, Attribute]:
    """The attributes a ReceiveMessage asked for: All (or `.*`, `*`), names, `prefix.*`."""
    wanted = [r for r in requested if isinstance(r, str)]
    if not wanted or not attributes:
        return {}
    if any(r in ("All", ".*", "*") for r in wanted):
        return dict(attributes)
    exact = {r for r in wanted if not r.endswith(".*")}
    prefixes = tuple(r[:-2] for r in wanted if r.endswith(".*"))
    return {
        name: attribute
        for name, attribute in attributes.items()
        if name in exact or (prefixes and name.startswith(prefixes))
    }


# A dead letter's provenance where SQS has no notion of its own (the source queue it has:
# DeadLetterQueueSourceArn), as message attributes: what the native door's X-Dead-* say.
DEAD_ATTRIBUTES = (
    "dirmq.DeadReason",
    "dirmq.DeadReceiveCount",
    "dirmq.DeadAt",
    "dirmq.DeadDetail",
)


def of_message(message: Message) -> dict[str, Attribute]:
    """A message's SQS attributes: those it was published with, and its provenance if it was
    dead-lettered (`DEAD_ATTRIBUTES`)."""
    found = from_headers(message.headers)
    dead = message.dead
    if dead is None:
        return found
    values = (dead.reason, str(dead.receive_count), format_time(dead.at_s), dead.detail)
    for name, value in zip(DEAD_ATTRIBUTES, values, strict=True):
        if value is not None:
            kind = "Number" if name == "dirmq.DeadReceiveCount" else "String"
            found[name] = Attribute(kind, value)
    return found
