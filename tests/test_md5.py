"""SQS's MD5 digests (dirmq.sqs.md5) and attribute headers (dirmq.sqs.message_attributes).

The vectors marked AWS are digests Amazon SQS itself returned (recorded against AWS by
LocalStack's validated snapshot tests); the others come from AWS's published algorithm as other
implementations compute it."""

from __future__ import annotations

import base64
import hashlib

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dirmq.sqs import message_attributes as attrs
from dirmq.sqs.errors import SqsError
from dirmq.sqs.md5 import md5_of_attributes, md5_of_body
from dirmq.store import codec

KENOBI = {
    "Help.Me": ("String", "Me"),
    "Hello": ("String", "There"),
    "General": ("String", "Kenobi"),
}


@pytest.mark.parametrize(
    ("attributes", "digest"),
    [
        (KENOBI, "4c360f3fdafd970e05fae2f149d997f5"),  # AWS
        ({k: KENOBI[k] for k in ("General", "Hello")}, "fca026605781cb4126a1e9044df24232"),  # AWS
        ({"Hello": KENOBI["Hello"]}, "a311262e065454b75da111d535b8dacd"),  # AWS
        ({k: KENOBI[k] for k in ("Hello", "Help.Me")}, "83fee93c1bcd8b9a5a923ffacdc636c7"),  # AWS
        ({"Foo": ("String", "Bar")}, "ae7155c6026991b6d54b11589678bf9c"),  # AWS
        ({"timestamp": ("Number", "1493147359900")}, "235c5c510d26fb653d073faed50ae77c"),  # AWS
        (
            {
                "attr1": (
                    "Binary",
                    b"traceparent\x1e00-774062d6c37081a5a0b9b5b88e30627c-2d2482211f6489da-01",
                )
            },
            "8cbe4db156db8a94db8b801b7addb984",  # AWS
        ),
        ({"attribName1": ("String", "attribValue 1")}, "19e27d4e946b072f3f58da80d94fd778"),
        (
            {"customNumberTypeAttrib": ("Number.float", "4563442423554324324264524243.32543234")},
            "9fe1b90bbd9965bdf77bac517c7d2495",
        ),
        (
            {"binaryAttribute": ("Binary", b"Hello binary world!")},
            "31a92b15d92f8db860eda32aceb656c3",
        ),
        (
            {
                "attribName1": ("String", "attribValue 1"),
                "customNumberTypeAttrib": (
                    "Number.float",
                    "4563442423554324324264524243.32543234",
                ),
                "binaryAttribute": ("Binary", b"Hello binary world!"),
            },
            "c932db14a896c663f83c260297d594ff",
        ),
    ],
)
def test_md5_of_attributes_known_vectors(
    attributes: dict[str, tuple[str, str | bytes]], digest: str
) -> None:
    assert md5_of_attributes(attributes) == digest


def test_md5_of_system_attributes_aws_vector() -> None:
    trace = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    assert md5_of_attributes({"AWSTraceHeader": ("String", trace)}) == (
        "5ae4d5d7636402d80f4eb6d213245a88"  # AWS's MD5OfMessageSystemAttributes
    )


def test_md5_of_body_known_vectors() -> None:
    assert md5_of_body("msg") == "6e2baaf3b97dbeef01c0043275f9a0e7"  # AWS
    assert md5_of_body("test") == "098f6bcd4621d373cade4e832627b4f6"  # AWS
    text = "Zoë ☃ 🐍"
    assert md5_of_body(text) == hashlib.md5(text.encode("utf-8")).hexdigest()


def test_md5_of_no_attributes_is_none() -> None:
    assert md5_of_attributes({}) is None


def test_md5_of_attributes_order_does_not_matter() -> None:
    forward = dict(KENOBI)
    backward = dict(reversed(list(KENOBI.items())))
    assert md5_of_attributes(forward) == md5_of_attributes(backward)


# -- attributes as headers ---------------------------------------------------------------------
_NAME_START = st.sampled_from("abcXYZ019_-ßøä")
_NAME_REST = st.text(alphabet="abcXYZ019_-.ßøäÀſ", max_size=20)
names = st.builds(lambda a, b: a + b, _NAME_START, _NAME_REST).filter(attrs.valid_name)
sqs_text = st.text(
    alphabet=st.characters(
        blacklist_categories=["Cs"],
        blacklist_characters=[chr(c) for c in range(0x20) if c not in (9, 10, 13)]
        + ["\ufffe", "\uffff"],
    ),
    min_size=1,
    max_size=40,
)
labels = st.text(alphabet="abcxyz019._-", max_size=8)


@st.composite
def attribute(draw: st.DrawFn) -> attrs.Attribute:
    base = draw(st.sampled_from(["String", "Number", "Binary"]))
    label = draw(labels)
    data_type = f"{base}.{label}" if label else base
    if base == "Binary":
        return attrs.Attribute(data_type, draw(st.binary(min_size=1, max_size=40)))
    if base == "Number":
        number = draw(st.decimals(min_value=-(10**30), max_value=10**30, places=3))
        return attrs.Attribute(data_type, str(number))
    return attrs.Attribute(data_type, draw(sqs_text))


attribute_maps = st.dictionaries(names, attribute(), max_size=10)


@given(attribute_maps, st.none() | st.just("Root=1-5759e988-bd862e3fe1be46a994272793"))
@example({"A": attrs.Attribute("String", "x\x7fy")}, None)  # DEL: no header may carry it
def test_attributes_round_trip_through_headers(
    attributes: dict[str, attrs.Attribute], trace: str | None
) -> None:
    headers = attrs.to_headers(attributes, trace)
    codec.check_headers(headers)  # the store accepts them as they are
    stored = codec.decode(codec.encode(b"body", headers)).headers
    assert attrs.from_headers(stored) == attributes
    assert attrs.trace_header(stored) == trace
    digest = md5_of_attributes(attrs.md5_values(attributes))
    assert digest == md5_of_attributes(attrs.md5_values(attrs.from_headers(stored)))


@given(attribute_maps)
def test_parsed_request_attributes_round_trip(attributes: dict[str, attrs.Attribute]) -> None:
    request = {name: a.to_json() for name, a in attributes.items()}
    assert attrs.parse_attributes(request) == attributes


def test_plain_strings_use_the_library_convention() -> None:
    headers = attrs.to_headers(
        {
            "Colour": attrs.Attribute("String", "blue"),
            "Count": attrs.Attribute("Number", "3"),
            "Lines": attrs.Attribute("String", "a\nb"),
            "Blob": attrs.Attribute("Binary", b"\x00\x01"),
            "Json": attrs.Attribute("String.json", "{}"),
            "Größe": attrs.Attribute("String", "XL"),
        }
    )
    assert headers["X-Attr-Colour"] == "blue"
    assert headers["X-Sqs-Attr-Count"] == "Number;Mw=="
    assert headers["X-Sqs-Attr-Lines"] == "String;" + base64.b64encode(b"a\nb").decode()
    assert headers["X-Sqs-Attr-Blob"] == "Binary;AAE="
    assert headers["X-Sqs-Attr-Json"] == "String.json;e30="
    assert headers["X-Sqs-Attr-." + "Größe".encode().hex()] == "String;WEw="


def test_names_differing_by_case_do_not_collide() -> None:
    attributes = {
        "colour": attrs.Attribute("String", "red"),
        "Colour": attrs.Attribute("String", "blue"),
        "COLOUR": attrs.Attribute("Number", "1"),
        "cOLOUR": attrs.Attribute("Number", "2"),
    }
    headers = attrs.to_headers(attributes)
    codec.check_headers(headers)
    assert attrs.from_headers(headers) == attributes


def test_library_headers_read_as_attributes() -> None:
    headers = {
        "Content-Type": "text/plain",
        "X-Attr-Colour": "blue",
        "x-attr-size": "XL",
        "X-Attr-bad!name": "skipped",
        "X-Attr-AWS.reserved": "skipped",
        "X-Sqs-Attr-Broken": "no separator",
        "X-Sqs-Attr-Bad64": "String;***",
        "X-Sqs-Attr-Unknown": "Float;MQ==",
    }
    assert attrs.from_headers(headers) == {
        "Colour": attrs.Attribute("String", "blue"),
        "size": attrs.Attribute("String", "XL"),
    }


def test_typed_header_wins_over_plain_one() -> None:
    headers = {"X-Attr-N": "text", "X-Sqs-Attr-N": "Number;NDI="}
    assert attrs.from_headers(headers) == {"N": attrs.Attribute("Number", "42")}


@pytest.mark.parametrize(
    "name",
    ["", "a" * 257, "AWS.x", "amazon.y", ".a", "a.", "a..b", "a b", "a!b", "a/b", "a§"],
)
def test_invalid_names_refused(name: str) -> None:
    with pytest.raises(SqsError) as info:
        attrs.parse_attributes({name: {"DataType": "String", "StringValue": "v"}})
    assert info.value.kind.code == "InvalidParameterValue"


@pytest.mark.parametrize(
    "spec",
    [
        {"DataType": "String", "StringValue": ""},
        {"DataType": "String"},
        {"DataType": "Binary"},
        {"DataType": "Binary", "BinaryValue": ""},
        {"DataType": "", "StringValue": "v"},
        {"DataType": "Float", "StringValue": "1"},
        {"DataType": "String.", "StringValue": "v"},
        {"DataType": "Number." + "x" * 256, "StringValue": "1"},
        {"DataType": "Number", "StringValue": "abc"},
        {"DataType": "Number", "StringValue": "NaN"},
        {"DataType": "Number", "StringValue": "1" * 39},
        {"DataType": "Number", "StringValue": "1e126"},
        {"DataType": "Number", "StringValue": "1e-129"},
        {"DataType": "String", "StringValue": "bell\x07"},
        {"DataType": "String", "StringValue": "\ufffe"},
        {"DataType": "Binary", "BinaryValue": "not base64!"},
    ],
)
def test_invalid_values_refused(spec: dict[str, str]) -> None:
    with pytest.raises(SqsError) as info:
        attrs.parse_attributes({"a": spec})
    assert info.value.kind.code == "InvalidParameterValue"


@pytest.mark.parametrize("number", ["0", "-1", "1.5", "1e125", "1e-128", "9" * 38, "0.000"])
def test_valid_numbers_accepted(number: str) -> None:
    parsed = attrs.parse_attributes({"n": {"DataType": "Number", "StringValue": number}})
    assert parsed["n"].value == number


def test_list_values_unsupported() -> None:
    with pytest.raises(SqsError) as info:
        attrs.parse_attributes({"a": {"DataType": "String", "StringListValues": ["x"]}})
    assert info.value.kind.code == "UnsupportedOperation"


def test_at_most_ten_attributes() -> None:
    ten = {f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(10)}
    assert len(attrs.parse_attributes(ten)) == 10
    with pytest.raises(SqsError, match=r"\[11\] exceeds the allowed maximum \[10\]"):
        attrs.parse_attributes({**ten, "a10": {"DataType": "String", "StringValue": "v"}})


def test_select() -> None:
    parsed = {
        name: attrs.Attribute("String", value)
        for name, (_type, value) in KENOBI.items()
        if isinstance(value, str)
    }
    assert attrs.select(parsed, []) == {}
    assert attrs.select(parsed, ["All"]) == parsed
    assert attrs.select(parsed, [".*"]) == parsed
    assert attrs.select(parsed, ["*"]) == parsed
    assert set(attrs.select(parsed, ["Foo", "Hello"])) == {"Hello"}
    assert set(attrs.select(parsed, ["Hel.*"])) == {"Hello", "Help.Me"}
    assert attrs.select(parsed, ["AWS."]) == {}


def test_system_attributes() -> None:
    spec = {"DataType": "String", "StringValue": "Root=1-abc"}
    assert attrs.parse_system_attributes({"AWSTraceHeader": spec}) == "Root=1-abc"
    assert attrs.parse_system_attributes(None) is None
    for bad in (
        {"Other": spec},
        {"AWSTraceHeader": {"DataType": "Number", "StringValue": "1"}},
        {"AWSTraceHeader": {"DataType": "String", "StringValue": "a\nb"}},
    ):
        with pytest.raises(SqsError):
            attrs.parse_system_attributes(bad)
