"""Hypothesis strategies for hostile input: Protobuf messages of any descriptor, JSON, bytes.

`messages(descriptor)` builds random *valid* messages of any message type, field
by field from its descriptor: strings that are empty, huge, unicode, control
characters or path traversals; integers at their type's extremes; floats with
NaN and infinities; enums with values the contract does not declare; repeated
and map fields; nested messages; `Struct`/`Value`/`ListValue` holding deep or
non-finite JSON. `hints` mixes meaningful values into named fields (a real agent
key, a live run id), so that the hostile requests also reach the deep paths.
`mutated(message)` damages a valid message's bytes (flips, cuts, splices), for
requests that are no longer the method's message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import message_factory, struct_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

Hints = Mapping[str, st.SearchStrategy[Any]]
#: Fields whose hint is always taken: values of their type would stall the fuzzing (a Wait
#: of minutes on a run that waits for an answer).
BOUNDED = frozenset({"timeout_ms"})
#: URLs a webhook may be given: a closed port of loopback (allowed), others (refused).
WEBHOOK_URLS = st.sampled_from(
    ["http://127.0.0.1:9/hook", "http://169.254.169.254/latest", "file:///etc/passwd"]
)
#: A Wait's time-out: short, and refused ones.
TIMEOUTS_MS = st.integers(0, 300) | st.sampled_from([-1, 600_001, 2**31 - 1])

#: Strings that have broken servers: traversals, separators, controls, sizes, encodings.
NASTY_STRINGS: tuple[str, ...] = (
    "",
    " ",
    "a\n",
    "\n",
    "\r\n",
    "\x00",
    "a\x00b",
    "\t\x0b\x0c\x1b[31m",
    "..",
    ".",
    "/",
    "../../etc/passwd",
    "..%2f..%2fetc%2fpasswd",
    "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "..\\..\\windows\\win.ini",
    "/etc/passwd",
    "chats/../../x",
    "a/b",
    "a..b",
    ".hidden",
    "-rf",
    "~root",
    "$(id)",
    "`id`",
    "; rm -rf / #",
    "{{city_datetime.date+1d}}",
    "{{__import__}}",
    "%s%s%s%n",
    "<script>alert(1)</script>",
    "' OR '1'='1",
    "null",
    "true",
    "NaN",
    "-1",
    "9" * 30,
    "\u202eevil",
    "\ufeffbom",
    "e\u0301",
    "🙂",
    "\U0010ffff",
    "CON",
    "nul.txt",
)
#: Long strings, as (piece, times): kept short here so that strategies print short.
LONG_STRINGS: tuple[tuple[str, int], ...] = (("x", 129), ("x", 6000), ("🙂", 3000), ("é", 70_000))

#: Integer bounds of each protobuf integer type.
_INT_BOUNDS: dict[int, tuple[int, int]] = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}

MAX_DEPTH = 3  # nesting of ordinary messages
DEEP = 150  # nesting of a deep JSON value (the protobuf parser stops at 100)


def strings() -> st.SearchStrategy[str]:
    """Hostile strings: the list above, random text, and random control-heavy text."""
    return st.one_of(
        st.sampled_from(NASTY_STRINGS),
        st.sampled_from(LONG_STRINGS).map(lambda long: long[0] * long[1]),
        st.text(max_size=24),
        st.text(st.characters(max_codepoint=0x7F), max_size=24),
    )


def integers(kind: int) -> st.SearchStrategy[int]:
    low, high = _INT_BOUNDS[kind]
    extremes = sorted({low, high, 0, 1, -1 if low < 0 else 2, low + 1, high - 1, 2**31 - 1})
    return st.one_of(
        st.sampled_from([v for v in extremes if low <= v <= high]), st.integers(low, high)
    )


def floats(width: int = 64) -> st.SearchStrategy[float]:
    return st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e308 if width == 64 else 3e38]),
        st.floats(width=width),
    )


def json_values(*, finite: bool = False) -> st.SearchStrategy[Any]:
    """JSON-like data (as Struct/Value carry it), NaN and infinities unless `finite`."""
    numbers = st.floats(allow_nan=not finite, allow_infinity=not finite)
    leaves = st.one_of(st.none(), st.booleans(), numbers, st.integers(-(2**53), 2**53), strings())
    nested = st.recursive(
        leaves,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(strings(), children, max_size=4)
        ),
        max_leaves=12,
    )
    deep = st.integers(1, DEEP).map(deep_value)
    return _one_in(8).flatmap(lambda go_deep: deep if go_deep else nested)


def deep_value(depth: int) -> Any:
    """A value nested `depth` levels, alternating lists and objects."""
    value: Any = "bottom"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def to_value(data: Any, out: struct_pb2.Value) -> None:
    """Write JSON-like `data` into a `google.protobuf.Value` (iteratively: any depth)."""
    pending: list[tuple[Any, struct_pb2.Value]] = [(data, out)]
    while pending:
        item, target = pending.pop()
        if item is None:
            target.null_value = struct_pb2.NULL_VALUE
        elif isinstance(item, bool):
            target.bool_value = item
        elif isinstance(item, int | float):
            target.number_value = float(item)
        elif isinstance(item, str):
            target.string_value = item
        elif isinstance(item, list):
            values = target.list_value.values
            pending += [(child, values.add()) for child in item]
            if not item:
                target.list_value.SetInParent()
        else:
            fields = target.struct_value.fields
            pending += [(child, fields[key]) for key, child in item.items()]
            if not item:
                target.struct_value.SetInParent()


@dataclass(frozen=True, slots=True)
class JsonData:
    """JSON-like data for a `Struct`, `Value` or `ListValue`, written in place (`write`).

    Written in place because copying a message parses it again, which stops at the
    parser's depth limit: the deep values must reach the wire to be tried.
    """

    data: Any

    def write(self, target: Message) -> None:
        name = target.DESCRIPTOR.full_name
        if name == "google.protobuf.Value":
            to_value(self.data, target)  # type: ignore[arg-type]
        elif name == "google.protobuf.Struct":
            for key, child in self.data.items():
                to_value(child, target.fields[key])  # type: ignore[attr-defined]
            target.SetInParent()
        else:
            for child in self.data:
                to_value(child, target.values.add())  # type: ignore[attr-defined]
            target.SetInParent()

    def message(self, descriptor: Descriptor) -> Message:
        out = message_factory.GetMessageClass(descriptor)()
        self.write(out)
        return out


def json_data(descriptor: Descriptor) -> st.SearchStrategy[JsonData] | None:
    """Data for a `Struct`, `Value` or `ListValue` field (None for other messages)."""
    name = descriptor.full_name
    if name == "google.protobuf.Value":
        return json_values().map(JsonData)
    if name == "google.protobuf.Struct":
        return st.dictionaries(strings(), json_values(), max_size=4).map(JsonData)
    if name == "google.protobuf.ListValue":
        return st.lists(json_values(), max_size=4).map(JsonData)
    return None


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return strings()
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.one_of(
            st.binary(max_size=64),
            st.sampled_from(
                [(b"", 0), (b"\x00", 1024), (b"\xff\xfe", 2048), (b"%PDF-1.4\n", 1)]
            ).map(lambda piece: piece[0] * piece[1]),
        )
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return floats(64)
    if kind == FieldDescriptor.TYPE_FLOAT:
        return floats(32)
    if kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        declared = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(declared), st.sampled_from([-1, 99, 2**31 - 1, -(2**31)]))
    return integers(kind)


def _generated(
    field: FieldDescriptor, hints: Hints, depth: int, wild: int
) -> st.SearchStrategy[Any] | None:
    """Values for one slot of `field`, hints not taken; None when the depth is used up."""
    if field.type in (FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP):
        assert field.message_type is not None
        if depth >= MAX_DEPTH:
            return None
        data = json_data(field.message_type)
        return data if data is not None else _build(field.message_type, hints, depth + 1, wild)
    return _scalar(field)


def _one_in(n: int) -> st.SearchStrategy[bool]:
    return st.sampled_from([True] + [False] * (n - 1))


@st.composite
def _build(draw: st.DrawFn, descriptor: Descriptor, hints: Hints, depth: int, wild: int) -> Message:
    message = message_factory.GetMessageClass(descriptor)()
    for field in descriptor.fields:
        hint = hints.get(field.name)
        wild_field = draw(_one_in(wild))
        if hint is None and not wild_field:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            _fill_map(draw, message, field, hints, depth, wild)
            continue
        values = (
            hint
            if hint is not None and (not wild_field or field.name in BOUNDED)
            else _generated(field, hints, depth, wild)
        )
        if values is None:
            continue
        if field.is_repeated:
            target = getattr(message, field.name)
            for item in draw(st.lists(values, max_size=3)):
                if isinstance(item, JsonData):
                    item.write(target.add())
                elif isinstance(item, Message):
                    target.add().CopyFrom(item)
                else:
                    target.append(item)
            continue
        value = draw(values)
        if isinstance(value, JsonData):
            value.write(getattr(message, field.name))
        elif isinstance(value, Message):
            getattr(message, field.name).CopyFrom(value)
        else:
            setattr(message, field.name, value)
    return message


def _fill_map(
    draw: st.DrawFn,
    message: Message,
    field: FieldDescriptor,
    hints: Hints,
    depth: int,
    wild: int,
) -> None:
    entry = field.message_type
    assert entry is not None
    keys = _generated(entry.fields_by_name["key"], {}, depth, wild)
    values = _generated(entry.fields_by_name["value"], hints, depth, wild)
    if keys is None or values is None:
        return
    target = getattr(message, field.name)
    for key, value in draw(st.lists(st.tuples(keys, values), max_size=3)):
        if isinstance(value, JsonData):
            value.write(target[key])
        elif isinstance(value, Message):
            target[key].CopyFrom(value)
        else:
            target[key] = value


def messages(
    descriptor: Descriptor, hints: Hints | None = None, *, wild: int = 3
) -> st.SearchStrategy[Message]:
    """Random valid messages of `descriptor`; `hints` (field name → values) mixed in.

    Each field goes wild one time in `wild`: a hinted field then takes a generated
    value instead of a hinted one, any other field is set to a generated value
    (otherwise left unset). A large `wild` makes requests that are wrong in one
    way at most, which reach deep; a small one, requests wrong everywhere.
    """
    data = json_data(descriptor)
    if data is not None:
        return data.map(lambda found: found.message(descriptor))
    return _build(descriptor, hints or {}, 0, wild)


@st.composite
def mutated(draw: st.DrawFn, message: st.SearchStrategy[Message]) -> bytes:
    """The bytes of a valid message, damaged: bits flipped, cut, or spliced with junk."""
    data = bytearray(draw(message).SerializeToString())
    for _ in range(draw(st.integers(1, 4))):
        operation = draw(st.sampled_from(["flip", "cut", "insert", "varint"]))
        position = draw(st.integers(0, len(data)))
        if operation == "flip" and data:
            data[min(position, len(data) - 1)] ^= 1 << draw(st.integers(0, 7))
        elif operation == "cut":
            del data[position:]
        elif operation == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=12))
        else:  # an over-long or truncated varint, a length beyond the end
            data[position:position] = draw(
                st.sampled_from([b"\xff" * 11, b"\x80", b"\x2a\xff\xff\xff\xff\x0f", b"\x12\x7f"])
            )
    return bytes(data)
