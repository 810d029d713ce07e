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

`@frozen_record` declares an immutable record that behaves as `dataclasses.dataclass(frozen=True)`:
its `__init__`, `__repr__`, `__eq__`, `__hash__`, `__setattr__` and `__delattr__` are the same
methods for every record instead of source that dataclasses generates and compiles for each class
(every process defines the records it imports). `@record` declares a mutable one the same way, as
`dataclasses.dataclass()` would.
"""

from __future__ import annotations

import dataclasses
import operator
import sys
import types
import typing
from collections.abc import Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Any, Callable, TypeVar, Union, overload

if TYPE_CHECKING:  # (type checkers read typing_extensions' for every Python release)
    from typing_extensions import dataclass_transform
else:  # (typing has it from Python 3.11; it only marks the function for type checkers)
    dataclass_transform = getattr(typing, "dataclass_transform", lambda **_: lambda function: function)

#: The dataclass field metadata key `wire` fills.
WIRE = "portkern.records"

R = TypeVar("R")


@overload
@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def frozen_record(cls: type[R], /) -> type[R]: ...
@overload
def frozen_record(*, kw_only: bool = ..., slots: bool = ..., order: bool = ..., unsafe_hash: bool = ...) -> Callable[[type[R]], type[R]]: ...
def frozen_record(cls: type[R] | None = None, /, **options: Any) -> Any:
    """A record class that behaves as `dataclasses.dataclass(cls, frozen=True, **options)`, with
    `__init__`, `__repr__`, `__eq__` and `__hash__` as dataclasses' own (the fields in order, by
    position or by name, else their defaults, then `__post_init__`; the class name and the `repr`
    fields; equal when of the same class with equal `compare` fields; the hash of the hashed fields)
    and the frozen guards (`FrozenInstanceError` on assigning or deleting an attribute once
    `__init__` has set it), shared by every record. A method the class defines itself is kept;
    `order`, `unsafe_hash` or `slots` among `options`, or a class that defines `__setattr__` or
    `__delattr__`, leaves them all to dataclasses, and an `InitVar` field leaves `__init__` to it."""

    def make(c: type[R]) -> type[R]:
        own = c.__dict__
        if options.get("order") or options.get("unsafe_hash") or options.get("slots") or "__setattr__" in own or "__delattr__" in own:
            return dataclasses.dataclass(c, frozen=True, **options)
        explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
        # Not frozen to dataclasses (which would compile a __setattr__ and a __delattr__ for each
        # class): the guards below are shared, and the shared __init__ sets the fields before them.
        made, compared = _with_shared_methods(c, options)
        made.__setattr__ = _assign_once  # type: ignore[method-assign]
        made.__delattr__ = _no_delete  # type: ignore[method-assign]
        if compared and not explicit_hash:
            made.__hash__ = _record_hash  # type: ignore[method-assign]
        return made

    return make if cls is None else make(cls)


@overload
@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def record(cls: type[R], /) -> type[R]: ...
@overload
def record(*, kw_only: bool = ..., slots: bool = ..., order: bool = ..., unsafe_hash: bool = ...) -> Callable[[type[R]], type[R]]: ...
def record(cls: type[R] | None = None, /, **options: Any) -> Any:
    """A mutable record class that behaves as `dataclasses.dataclass(cls, **options)`, with the
    `__init__`, `__repr__` and `__eq__` that `frozen_record` shares (unhashable, as dataclasses
    makes a class with `eq` that is not frozen, unless it defines `__hash__`). `order`,
    `unsafe_hash`, `frozen` or `slots` among `options` leaves them all to dataclasses, and an
    `InitVar` field leaves `__init__` to it."""

    def make(c: type[R]) -> type[R]:
        if options.get("order") or options.get("unsafe_hash") or options.get("slots") or options.get("frozen"):
            return dataclasses.dataclass(c, **options)
        defines_hash = "__hash__" in c.__dict__ or "__eq__" in c.__dict__
        made, compared = _with_shared_methods(c, options)
        if compared and not defines_hash:
            made.__hash__ = None  # type: ignore[assignment]
        return made

    return make if cls is None else make(cls)


def _with_shared_methods(c: type[R], options: Mapping[str, Any]) -> tuple[type[R], bool]:
    """`c` made a dataclass with the shared `__init__`, `__repr__` and `__eq__` where `options` asks
    for them and `c` does not define them itself (dataclasses' own `__init__` where `c` has an
    `InitVar`), and whether it compares (`eq`)."""
    own = c.__dict__
    rest = dict(options)
    shown, compared, init = rest.pop("repr", True), rest.pop("eq", True), rest.pop("init", True)
    shared_init = init and "__init__" not in own and not _has_init_vars(c)
    made = dataclasses.dataclass(c, init=init and not shared_init, repr=False, eq=False, **rest)
    if shared_init:
        made.__init__ = _record_init  # type: ignore[method-assign]
        made.__signature__ = _SIGNATURE  # type: ignore[attr-defined]
    if shown and "__repr__" not in own:
        made.__repr__ = _record_repr  # type: ignore[method-assign]
    if compared and "__eq__" not in own:
        made.__eq__ = _record_eq  # type: ignore[method-assign]
    return made, compared


def _has_init_vars(c: type) -> bool:
    """Whether `c` declares an `InitVar` pseudo-field, or a dataclass it extends does."""
    own = c.__dict__.get("__annotations__", {})
    if any("InitVar" in (hint if isinstance(hint, str) else repr(hint)) for hint in own.values()):
        return True
    for base in c.__mro__[1:]:
        declared = base.__dict__.get("__dataclass_fields__")
        if declared and len(declared) != len(dataclasses.fields(base)):
            if any("InitVar" in str(f.type) for f in declared.values()):
                return True
    return False


#: Per record class with the shared `__init__`: (its fields in order as (name, position among the
#: positional parameters or -1, default, default factory, whether `__init__` takes it), how many
#: positional parameters it takes, whether it has `__post_init__`).
_Init = tuple[tuple[tuple[str, int, Any, Any, bool], ...], int, bool]
_INIT_PLANS: dict[type, _Init] = {}


def _init_plan(cls: type) -> _Init:
    found = _INIT_PLANS.get(cls)
    if found is None:
        fields, position = [], 0
        for f in dataclasses.fields(cls):
            if not f.init and f.default_factory is dataclasses.MISSING:
                continue  # (its default, if any, is the class attribute, as dataclasses leaves it)
            positional = f.init and not getattr(f, "kw_only", False)
            fields.append((f.name, position if positional else -1, f.default, f.default_factory, f.init))
            position += positional
        found = _INIT_PLANS[cls] = (tuple(fields), position, hasattr(cls, "__post_init__"))
    return found


def _record_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """A record's `__init__`: each field from its argument (by position or by name) or its default,
    fields `__init__` does not take from their defaults, then `__post_init__()`; TypeError for the
    arguments a dataclass's `__init__` refuses."""
    fields, takes, post_init = _init_plan(self.__class__)
    given = len(args)
    if given > takes:
        raise TypeError(f"{self.__class__.__qualname__}.__init__() takes {takes + 1} positional arguments but {given + 1} were given")
    state, named, missing = self.__dict__, 0, None
    missing_value = dataclasses.MISSING
    for name, position, default, factory, init in fields:
        if position >= 0 and position < given:
            if kwargs and name in kwargs:
                raise TypeError(f"{self.__class__.__qualname__}.__init__() got multiple values for argument {name!r}")
            state[name] = args[position]
        elif init and kwargs and name in kwargs:
            state[name] = kwargs[name]
            named += 1
        elif default is not missing_value:
            state[name] = default
        elif factory is not missing_value:
            state[name] = factory()
        elif init:
            missing = (missing or []) + [name]
    if missing:
        raise TypeError(f"{self.__class__.__qualname__}.__init__() missing {len(missing)} required argument{'s' if len(missing) > 1 else ''}: "
                        + ", ".join(map(repr, missing)))
    if named != len(kwargs):
        taken = {name for name, _, _, _, init in fields if init}
        unexpected = next(name for name in kwargs if name not in taken)
        raise TypeError(f"{self.__class__.__qualname__}.__init__() got an unexpected keyword argument {unexpected!r}")
    if post_init:
        self.__post_init__()


class _Signature:
    """A record class's `__signature__` (what `inspect.signature` shows for the shared `__init__`): its
    fields as parameters, with their defaults, as dataclasses' generated `__init__` has them."""

    def __get__(self, obj: Any, owner: type) -> Any:
        import inspect  # (only where a signature is asked for)

        empty = inspect.Parameter.empty
        parameters = [
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY if getattr(f, "kw_only", False) else inspect.Parameter.POSITIONAL_OR_KEYWORD,
                              default=f.default if f.default is not dataclasses.MISSING else (empty if f.default_factory is dataclasses.MISSING else _FACTORY),
                              annotation=f.type)
            for f in dataclasses.fields(owner) if f.init
        ]
        return inspect.Signature(parameters, return_annotation=None)


class _Factory:
    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()
_SIGNATURE = _Signature()


#: Per record class: the fields its `__init__` sets (the only attributes `_assign_once` lets be set).
_INIT_FIELDS: dict[type, frozenset[str]] = {}


def _assign_once(self: Any, name: str, value: Any) -> None:
    """A record's `__setattr__`: each field `__init__` takes is set once (by `__init__`); nothing else is set."""
    cls = self.__class__
    settable = _INIT_FIELDS.get(cls)
    if settable is None:
        settable = _INIT_FIELDS[cls] = frozenset(f.name for f in dataclasses.fields(cls) if f.init)
    if name not in settable or name in self.__dict__:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)


def _no_delete(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


#: The values of some of an object's attributes, as a tuple.
_Values = Callable[[Any], tuple[Any, ...]]
#: Per record class: (its compared fields' values, its hashed fields' values, its repr fields' names).
_METHOD_PARTS: dict[type, tuple[_Values, _Values, tuple[str, ...]]] = {}


def _parts(cls: type) -> tuple[_Values, _Values, tuple[str, ...]]:
    found = _METHOD_PARTS.get(cls)
    if found is None:
        fields = dataclasses.fields(cls)
        compared = [f.name for f in fields if f.compare]
        hashed = [f.name for f in fields if (f.compare if f.hash is None else f.hash)]
        found = _METHOD_PARTS[cls] = (_values(compared), _values(hashed), tuple(f.name for f in fields if f.repr))
    return found


def _values(names: list[str]) -> _Values:
    """The named attributes of an object, as a tuple."""
    if not names:
        return lambda obj: ()
    get = operator.attrgetter(*names)
    return get if len(names) > 1 else lambda obj: (get(obj),)


def _record_repr(self: Any) -> str:
    shown = _parts(self.__class__)[2]
    return f"{self.__class__.__qualname__}({', '.join(f'{name}={getattr(self, name)!r}' for name in shown)})"


def _record_eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        compared = _parts(self.__class__)[0]
        return compared(self) == compared(other)
    return NotImplemented


def _record_hash(self: Any) -> int:
    return hash(_parts(self.__class__)[1](self))


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
    values: dict[str, Any] = {}
    for name, key, required, decode in _plan(cls):
        if key not in data:
            if required:
                raise TypeError(f"{cls.__name__}: field {key!r} is missing")
            continue
        value = data[key]
        if decode is not None:
            values[name] = decode(value)
        elif type(value) in _SCALARS:  # (what `typed` gives back as it is, whatever the hint)
            values[name] = value
        else:
            values[name] = _field_converter(cls, name)(value)
    return cls(**values)


def typed(hint: Any, value: Any) -> Any:
    """A plain value as the type hint names it, where its shape fits the hint; else the value as it is."""
    return _converter(hint)(value)


#: Plain values that `typed` returns as they are for every hint.
_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})

#: A field of a record as `from_plain` reads it: (name, key in plain data, whether it has no
#: default, its `wire` decoder or None).
_Field = tuple[str, str, bool, Callable[[Any], Any] | None]

_PLANS: dict[type, tuple[_Field, ...]] = {}
_CONVERTERS: dict[type, dict[str, Callable[[Any], Any]]] = {}


def _plan(cls: type) -> tuple[_Field, ...]:
    """The fields of `cls` that `__init__` takes, as `from_plain` reads them (worked out once per class)."""
    plan = _PLANS.get(cls)
    if plan is None:
        found: list[_Field] = []
        for f in dataclasses.fields(cls):
            if f.init:
                spec = f.metadata.get(WIRE, {})
                required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                found.append((f.name, spec.get("name", f.name), required, spec.get("decode")))
        plan = _PLANS[cls] = tuple(found)
    return plan


def _field_converter(cls: type, name: str) -> Callable[[Any], Any]:
    """`typed` of the type hint of the field `name` of `cls` (the hint is evaluated when the field
    first holds a value that is not a scalar)."""
    found = _CONVERTERS.get(cls)
    if found is None:
        found = _CONVERTERS[cls] = {}
    convert = found.get(name)
    if convert is None:
        convert = found[name] = _converter(_hint(cls, name))
    return convert


def _converter(hint: Any) -> Callable[[Any], Any]:
    """`typed(hint, value)` as a function of the value: dicts become the dataclasses the hint names,
    lists the tuples or lists it names, through `Optional` and other unions (the first arm the
    value's shape fits)."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        record = hint
        return lambda value: from_plain(record, value) if isinstance(value, Mapping) else value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        arms = [(_fitter(arm), _converter(arm)) for arm in args if arm is not type(None)]

        def union(value: Any) -> Any:
            if value is None:
                return None
            for fits, convert in arms:
                if fits(value):
                    return convert(value)
            return value

        return union
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _converter(args[0])
            return lambda value: tuple(item(v) for v in value) if isinstance(value, (list, tuple)) else value
        items = [_converter(a) for a in args]

        def fixed(value: Any) -> Any:
            if not isinstance(value, (list, tuple)):
                return value
            if items and len(items) == len(value):
                return tuple(convert(v) for convert, v in zip(items, value))
            return tuple(value)

        return fixed
    if origin in (list, Sequence):
        if not args:
            return lambda value: list(value) if isinstance(value, (list, tuple)) else value
        item = _converter(args[0])
        return lambda value: [item(v) for v in value] if isinstance(value, (list, tuple)) else value
    if origin in (dict, Mapping):
        if not args:
            return lambda value: dict(value) if isinstance(value, Mapping) else value
        entry = _converter(args[1])
        return lambda value: {k: entry(v) for k, v in value.items()} if isinstance(value, Mapping) else value
    return _same


def _same(value: Any) -> Any:
    return value


def _fitter(hint: Any) -> Callable[[Any], bool]:
    """Whether a plain value has the shape of a type hint (for picking a union's arm), as a function of the value."""
    if hint is Any:
        return lambda value: True
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return lambda value: isinstance(value, Mapping)
    origin = typing.get_origin(hint)
    if origin in (tuple, list, Sequence):
        return lambda value: isinstance(value, (list, tuple))
    if origin in (dict, Mapping):
        return lambda value: isinstance(value, Mapping)
    if origin is Union or origin is types.UnionType:
        fits = [_fitter(arm) for arm in typing.get_args(hint)]
        return lambda value: any(fit(value) for fit in fits)
    if isinstance(hint, type):
        kind = hint
        return lambda value: isinstance(value, kind)
    return lambda value: False


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


def _hint(cls: type, name: str) -> Any:
    """The type hint of the field `name` of `cls`, evaluated where the class that declares it was
    defined (as `typing.get_type_hints(cls)[name]`, without evaluating the other fields' hints)."""
    for declaring in cls.__mro__:
        annotations = declaring.__dict__.get("__annotations__", {})
        if name in annotations:
            one = types.SimpleNamespace(__annotations__={name: annotations[name]})
            module = sys.modules[declaring.__module__]
            return typing.get_type_hints(one, globalns=vars(module), localns=dict(vars(declaring)))[name]
    return Any
