"""The codec of the contract: each type's JSON derived from its fields.

A field is written once, as a dataclass field; `encode` and `decode` walk the fields
(cached per type), so a type inherits `to_json` from `Encodable` and `from_json`
from `Decodable`, and writes one of its own only where it refuses some input.
Imports nothing of the package's types; its underscored helpers (`_on_wire`, the
readers `_int`, `_str`, `_obj`) are the package's modules' own, never used outside it."""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


class _Absent(enum.Enum):
    """A key not written yet (an incident's step to come), told from a null value."""

    ABSENT = 0

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Literal[_Absent.ABSENT] = _Absent.ABSENT
Absent = Literal[_Absent.ABSENT]


def _typed(value: Any, types: type | tuple[type, ...], default: T) -> Any:
    """`value` if it has one of `types` (a bool is no int here), else `default`."""
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        return default
    return value if isinstance(value, types) else default


def _int(value: Any) -> int | None:
    return _typed(value, int, None)  # type: ignore[no-any-return]


def _num(value: Any) -> float | None:
    return _typed(value, (int, float), None)  # type: ignore[no-any-return]


# Every string read through the contract is cut here: a peer's `/status` is read
# through it, and a peer may send a 4 MiB "frames" text that would become a 4 MB log
# line and megabytes of incident journal (issue 48, defect 3). Ours are far shorter.
MAX_TEXT = 4096


def _str(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def _text(value: Any) -> str:
    """A list's text item, stringified and cut."""
    return (value if isinstance(value, str) else str(value))[:MAX_TEXT]


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# -- the codec: each class's JSON derived from its fields ----------------------------------
#
# A field is written once, as a dataclass field; its JSON key is its name, in field
# order. `to_json` encodes by value (a nested contract type by its own `to_json`, a
# tuple as a list, an enum as its value); `from_json` decodes by the field's type:
# a scalar of the wrong type reads as the field's default, a list keeps its items
# of the right type (text items are stringified; an object its type refuses is
# left out), a nested type reads through its own `from_json`. What a class cannot do
# without is checked by its `from_json` before the codec runs. A field's `metadata` may say:
#   WIRE_SKIP: never a key of its own;   OMIT: "none" (no key while None or ABSENT) or
#   "absent" (no key while ABSENT; null is a value) or "empty" (no key while an empty
#   list);   READ: a function of the whole
#   object giving the field's value.

WIRE_SKIP, OMIT, READ = "wire_skip", "omit", "read"
_DROP = object()  # an item of the wrong type: left out of its list


def _item(tp: Any) -> Callable[[Any], Any]:
    """How one item of a list (or value of a mapping) is read: _DROP if unfit."""
    if tp is str:
        return _text
    if tp is Any:
        return lambda v: v
    origin = get_origin(tp)
    if origin in (tuple, list, dict) or dataclasses.is_dataclass(tp):
        kind = dict if origin is dict or dataclasses.is_dataclass(tp) else list
        read = _decoder(tp)

        def item(v: Any) -> Any:
            try:
                return read(v) if isinstance(v, kind) else _DROP
            except ValueError:  # refused by its type (a rank without its job...)
                return _DROP
        return item
    read = _decoder(tp)
    if origin in (Union, UnionType):  # an optional item (str | None) stays null
        return read
    return lambda v: _DROP if (got := read(v)) is None else got


def _decoder(tp: Any) -> Callable[[Any], Any]:
    """How a value of type `tp` is read from JSON: None if unfit."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, UnionType):
        members = tuple(a for a in args if a is not type(None) and get_origin(a) is not Literal)
        if len(members) == 1:
            return _decoder(members[0])
        return lambda v: _typed(v, members, None)  # str | bool: either, as it is
    if tp is bool:
        return lambda v: v if isinstance(v, bool) else None
    if tp in (int, float, str):
        return {int: _int, float: _num, str: _str}[tp]
    if tp is Any:
        return lambda v: v
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = {member.value: member for member in tp}
        return lambda v: values.get(v) if isinstance(v, (str, int)) else None
    if dataclasses.is_dataclass(tp):
        return lambda v: tp.from_json(v)  # type: ignore[union-attr]  # looked up when read
    if origin in (tuple, list):
        item, kind = _item(args[0]), origin
        return lambda v: kind(x for x in map(item, v) if x is not _DROP) \
            if isinstance(v, list) else None
    if origin is dict:
        if args[1] is Any:
            return lambda v: v if isinstance(v, dict) else None
        value = _item(args[1])
        return lambda v: {str(k): x for k, x in ((k, value(x)) for k, x in v.items())
                          if x is not _DROP} if isinstance(v, dict) else None
    raise TypeError(f"no JSON codec for {tp!r}")


def _same(value: Any) -> Any:
    return value


_Plan = tuple[tuple[str, Callable[[Any], Any], Callable[[], Any], Any, Any], ...]
_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    """Per wire field of `cls`: (name, decoder, its default's maker, omit, read)."""
    if cls in _PLANS:
        return _PLANS[cls]
    hints = get_type_hints(cls)
    plan = []
    for f in dataclasses.fields(cls):
        if f.metadata.get(WIRE_SKIP) and f.metadata.get(READ) is None:
            continue  # never on the wire, nor read from it
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory  # called per object: never one shared dict
        else:
            default = functools.partial(_same, None if f.default is dataclasses.MISSING
                                        else f.default)
        plan.append((f.name, _decoder(hints[f.name]), default,
                     "skip" if f.metadata.get(WIRE_SKIP) else f.metadata.get(OMIT),
                     f.metadata.get(READ)))
    _PLANS[cls] = tuple(plan)
    return _PLANS[cls]


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _encode(value: Any) -> Any:
    if type(value) in _SCALARS:  # most fields: taken as they are, first
        return value
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, enum.Enum):
        return value.value
    return value


_ENCODE_PLANS: dict[type, tuple[tuple[str, Any], ...]] = {}


def encode(obj: Any) -> dict[str, Any]:
    """A contract object's JSON: every wire field, in field order."""
    cls = type(obj)
    plan = _ENCODE_PLANS.get(cls)
    if plan is None:
        plan = _ENCODE_PLANS[cls] = tuple((name, omit) for name, _, _, omit, _ in _plan(cls)
                                          if omit != "skip")
    out: dict[str, Any] = {}
    for name, omit in plan:
        value = getattr(obj, name)
        if type(value) in _SCALARS:
            if value is not None or omit != "none":
                out[name] = value
        elif value is not ABSENT and not (omit == "empty" and not value):
            out[name] = _encode(value)
    return out


def decode(cls: type[T], data: Any) -> T:
    """A contract object read from untrusted JSON (not an object: every field defaults).
    A missing key of an OMIT="absent" field reads as ABSENT; a value of the wrong type
    as the field's default (a falsy one too, when the default is not None)."""
    data = _obj(data)
    values: dict[str, Any] = {}
    for name, read, default, omit, whole in _plan(cls):
        if whole is not None:
            values[name] = whole(data)
        elif omit == "absent":  # null is a value: no key, not written yet
            values[name] = read(data[name]) if name in data else ABSENT
        else:
            value, fallback = read(data.get(name)), default()
            values[name] = value if fallback is None else value or fallback
    return cls(**values)


class Encodable:
    """A contract type whose JSON the codec writes from its fields alone."""

    def to_json(self) -> dict[str, Any]:
        """The value's JSON object, derived from its fields."""
        return encode(self)


class Decodable(Encodable):
    """One the codec reads back too (a type that refuses some input, or reads a
    non-object as None, has a `from_json` of its own)."""

    @classmethod
    def from_json(cls: type[D], data: Any) -> D:
        """The value read from untrusted JSON, field by field."""
        return decode(cls, data)


D = TypeVar("D", bound=Decodable)


def _on_wire(omit: str | None = None, read: Callable[[Any], Any] | None = None,
             skip: bool = False) -> dict[str, Any]:
    return {OMIT: omit, READ: read, WIRE_SKIP: skip}
