"""Records as plain data: dataclasses to and from the dicts, lists and scalars that bundle metadata,
cache records, tuning results and reports hold, driven by the dataclass fields and their type hints.

`to_plain(record)` gives a dict with one key per field, in field order: nested dataclasses become
dicts, tuples and lists become lists, mappings become dicts; other values are kept as they are.
`from_plain(cls, data)` builds a record back: dicts become the dataclasses the type hints name,
lists become the tuples or lists they name, through `Optional` and other unions; a field missing
from `data` takes its default, unknown keys are ignored, and values are not checked or coerced
(callers check untrusted data first, or after).

A field may say how it is written with `field(metadata=wire(...))`: another key (`name`), when it is
left out (`omit`), and how its value is written or read (`encode`, `decode`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence, Sized
from typing import Any, Callable, TypeVar, Union

#: The dataclass field metadata key `wire` fills.
WIRE = "portkern.records"

R = TypeVar("R")


def wire(
    *,
    name: str | None = None,
    omit: bool | Callable[[Any], bool] = False,
    encode: Callable[[Any], Any] | None = None,
    decode: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """Field metadata for `to_plain`/`from_plain`: `name`, the key in plain data (default: the field's
    name); `omit`, True to leave the field out when it holds its default (None, an empty container, or
    the default value), or a predicate on the record that says when to leave it out; `encode`, the
    field's plain value from its value; `decode`, its value from its plain value."""
    spec: dict[str, Any] = {"omit": omit}
    if name is not None:
        spec["name"] = name
    if encode is not None:
        spec["encode"] = encode
    if decode is not None:
        spec["decode"] = decode
    return {WIRE: spec}


def to_plain(record: Any) -> dict[str, Any]:
    """A dataclass instance as a dict of plain data, one key per field in field order."""
    data: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        spec = f.metadata.get(WIRE, {})
        value = getattr(record, f.name)
        omit = spec.get("omit", False)
        if omit is True and _holds_default(f, value):
            continue
        if callable(omit) and omit(record):
            continue
        encode = spec.get("encode")
        data[spec.get("name", f.name)] = encode(value) if encode is not None else plain(value)
    return data


def plain(value: Any) -> Any:
    """A value as plain data: dataclass instances as dicts, tuples and lists as lists, mappings as dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_plain(value)
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def from_plain(cls: type[R], data: Any) -> R:
    """A `cls` record from plain data (`to_plain`'s form); TypeError when `data` is not a mapping or a
    field without a default is missing (what calling `cls` with them would raise)."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__} from {type(data).__name__}: a mapping is needed")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        spec = f.metadata.get(WIRE, {})
        key = spec.get("name", f.name)
        if key not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}: field {key!r} is missing")
            continue
        decode = spec.get("decode")
        values[f.name] = decode(data[key]) if decode is not None else typed(hints[f.name], data[key])
    return cls(**values)


def typed(hint: Any, value: Any) -> Any:
    """A plain value as the type hint names it, where its shape fits the hint; else the value as it is."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return from_plain(hint, value) if isinstance(value, Mapping) else value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        if value is None:
            return None
        for arm in args:
            if arm is not type(None) and _fits(arm, value):
                return typed(arm, value)
        return value
    if origin is tuple and isinstance(value, (list, tuple)):
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(typed(args[0], v) for v in value)
        if args and len(args) == len(value):
            return tuple(typed(a, v) for a, v in zip(args, value))
        return tuple(value)
    if origin in (list, Sequence) and isinstance(value, (list, tuple)):
        return [typed(args[0], v) for v in value] if args else list(value)
    if origin in (dict, Mapping) and isinstance(value, Mapping):
        return {k: typed(args[1], v) for k, v in value.items()} if args else dict(value)
    return value


def _fits(hint: Any, value: Any) -> bool:
    """Whether a plain value has the shape of a type hint (for picking a union's arm)."""
    if hint is Any:
        return True
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return isinstance(value, Mapping)
    origin = typing.get_origin(hint)
    if origin in (tuple, list, Sequence):
        return isinstance(value, (list, tuple))
    if origin in (dict, Mapping):
        return isinstance(value, Mapping)
    if origin is Union or origin is types.UnionType:
        return any(_fits(arm, value) for arm in typing.get_args(hint))
    return isinstance(hint, type) and isinstance(value, hint)


def _holds_default(f: dataclasses.Field[Any], value: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        return False
    if default is None:
        return value is None
    if isinstance(default, (tuple, list, dict)) and not default:
        return isinstance(value, Sized) and not isinstance(value, str) and len(value) == 0
    return bool(value == default)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]
