"""Shape contracts: which argument dimensions must be equal, and what the results' shapes are.

A contract names every dimension of every argument either by its size (an
integer) or by a symbol: dimensions that share a symbol must be equal in a
call, `(MxK, KxN) -> MxN` for a matmul. Result dimensions are symbols or
sizes too, an expression over the symbols (`M - K + 1`, `M * K`), or None when
no argument dimension fixes them. Conditions over the symbols (`requires`:
`M - K + 1 >= 0`, `N <= 1024`) state the relations a kernel needs beyond
equality: a slice no longer than its source, a convolution's window within
its input. The builder
derives a contract from the IR (`portable.contract_ir`) or takes the one a
manifest states; the bundle records it next to the signature, and every call
is checked against it before anything runs. Nothing here parses MLIR.
"""

from __future__ import annotations

import functools
import re
from dataclasses import field
from typing import TYPE_CHECKING, Any, Mapping, Sequence, Union, cast

from portkern.base.errors import ArgumentShapeError, ArgumentTypeError, LaunchSpecError
from portkern.base.records import from_plain, frozen_record, to_plain, wire

if TYPE_CHECKING:
    from portkern.portable.expr import Expr

#: One dimension: a size, or a symbol.
Dim = Union[int, str]
#: A bucketing rule: "pow2", "exact", or ascending upper bounds.
Rule = Union[str, tuple[int, ...]]

SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
#: An argument name as a model states it (exporters write `0`, `gpu_0/data_0`, `onnx::MatMul_12`):
#: 1 to MAX_NAME_CHARS characters, none of them a control character.
MAX_NAME_CHARS = 256
NAME = re.compile(r"^[^\x00-\x1f\x7f-\x9f]{1,%d}$" % MAX_NAME_CHARS)
#: The names bundle formats 1.0 to 1.2 hold; others need format 1.3 (`free_names`).
PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$.]{0,127}$")
#: An argument's identifier form (what Python keywords and MLIR take).
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_SYMBOLS = 256
#: Where a contract came from: derived from the IR, or stated (manifest `shapes:`, ONNX `dim_param`) and checked against it.
ORIGINS = ("ir", "stated")
#: The default bucketing rule of a symbol: powers of two, clamped to [1, POW2_MAX].
POW2_MAX = 1 << 16
MAX_BOUNDS = 64
#: At most this many conditions in a contract's `requires`.
MAX_REQUIRES = 64


class UncheckedShapesWarning(UserWarning):
    """A kernel's shape contract could not be derived or stated: its calls cannot be checked."""


@frozen_record
class ShapeContract:
    """Argument and result dimensions as sizes and shared symbols."""

    inputs: tuple[tuple[Dim, ...], ...]
    results: tuple[tuple[Dim | None, ...], ...]
    origin: str = "ir"
    #: Per symbol, how its sizes are grouped into buckets (default "pow2"; see `bucket_of`).
    buckets: Mapping[str, "Rule"] = field(default_factory=dict, metadata=wire(omit=True))
    #: The arguments' names as the source states them (the source's `%names`, ONNX input names), when known.
    names: tuple[str, ...] = field(default=(), metadata=wire(omit=True))
    #: Beside `names`, an identifier per argument (`identifiers_for`); derived when not recorded
    #: (recorded only for names outside what bundle formats before 1.3 hold).
    identifiers: tuple[str, ...] = field(default=(), metadata=wire(omit=lambda contract: not contract.free_names))
    #: Conditions over the symbols every call must meet (format 1.4), e.g. `M - K + 1 >= 0`.
    requires: tuple[str, ...] = field(default=(), metadata=wire(omit=True))

    def __post_init__(self) -> None:
        if self.names and not self.identifiers:
            object.__setattr__(self, "identifiers", identifiers_for(self.names))

    @property
    def free_names(self) -> bool:
        """Whether an argument name is outside what bundle formats before 1.3 hold."""
        return any(not PLAIN_NAME.match(n) for n in self.names)

    @property
    def has_expressions(self) -> bool:
        """Whether it holds what bundle formats before 1.4 lack: conditions, or result expressions."""
        return bool(self.requires) or any(isinstance(d, str) and not SYMBOL.match(d) for shape in self.results for d in shape)

    @property
    def symbols(self) -> tuple[str, ...]:
        """Every symbol, in order of first appearance in the arguments."""
        seen = dict.fromkeys(d for shape in self.inputs for d in shape if isinstance(d, str))
        return tuple(seen)

    def where(self, symbol: str) -> list[tuple[int, int]]:
        """(argument, dimension) pairs named by `symbol`."""
        return [(i, axis) for i, shape in enumerate(self.inputs) for axis, d in enumerate(shape) if d == symbol]

    def bind(self, kernel: str, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
        """The symbols' values in a call with these argument shapes, or ArgumentShapeError
        naming the two arguments and the symbol they disagree on."""
        values: dict[str, int] = {}
        first: dict[str, tuple[int, int]] = {}
        for index, (want, have) in enumerate(zip(self.inputs, shapes)):
            for axis, (dim, size) in enumerate(zip(want, have)):
                if isinstance(dim, int):
                    if dim != size:
                        raise ArgumentShapeError(
                            f"{kernel}() argument {index} has {size} in dimension {axis}; "
                            f"the shape contract {self} needs {dim} there"
                        )
                elif dim not in values:
                    values[dim], first[dim] = int(size), (index, axis)
                elif values[dim] != size:
                    other, other_axis = first[dim]
                    raise ArgumentShapeError(
                        f"{kernel}() arguments {other} and {index} disagree on {dim}: argument {other} has "
                        f"{values[dim]} in dimension {other_axis}, argument {index} has {size} in dimension {axis} "
                        f"(shape contract {self})"
                    )
        for text in self.requires:
            try:
                holds = condition(text).evaluate(values, {})
            except LaunchSpecError as exc:
                holds, why = False, f": {exc}"
            else:
                why = ""
            if not holds:
                shown = ", ".join(f"{s}={values[s]}" for s in sorted(condition(text).symbols) if s in values)
                raise ArgumentShapeError(f"{kernel}() arguments break `{text}` ({shown}){why} (shape contract {self})")
        return values

    def result_shapes(self, values: Mapping[str, int]) -> list[tuple[int | None, ...]]:
        """Result shapes for bound symbols (None where no argument fixes a dimension)."""
        return [tuple(_dim_value(d, values) for d in shape) for shape in self.results]

    def bucket_of(self, values: Mapping[str, int]) -> str:
        """The bucket of a call's symbol values, e.g. `M<=64`, `M=50`, `M>2048,N<=8`; "" without symbols.

        "pow2" puts a size in the bucket of the next power of two (clamped to
        POW2_MAX); "exact" gives each size its own bucket; a list of bounds puts
        it in the bucket of the first bound it does not exceed.
        """
        return ",".join(_bucket(symbol, values[symbol], self.buckets.get(symbol, "pow2")) for symbol in self.symbols if symbol in values)

    def arg_index(self, name: str) -> int | None:
        """The argument a name (`a`, `gpu_0/data_0` or its identifier `gpu_0_data_0`, `arg0`, `0`)
        refers to, None when none."""
        if name in self.names:
            return self.names.index(name)
        if name in self.identifiers:
            return self.identifiers.index(name)
        for prefix in ("arg", ""):
            if name.startswith(prefix) and name[len(prefix):].isdigit() and int(name[len(prefix):]) < len(self.inputs):
                return int(name[len(prefix):])
        return None

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ShapeContract":
        """A contract from a bundle record (already schema-checked)."""
        return from_plain(cls, data)

    def problem(self, inputs: Sequence[Sequence[int | None]], results: Sequence[Sequence[int | None]]) -> str | None:
        """What makes this contract unfit for a signature with these shapes, or None."""
        if len(self.inputs) != len(inputs) or len(self.results) != len(results):
            return f"has {len(self.inputs)} arguments and {len(self.results)} results, the signature {len(inputs)} and {len(results)}"
        for what, mine, theirs in (("argument", self.inputs, inputs), ("result", self.results, results)):
            for index, (shape, spec) in enumerate(zip(mine, theirs)):
                if len(shape) != len(spec):
                    return f"{what} {index} has rank {len(shape)}, the signature says {len(spec)}"
                for axis, (dim, size) in enumerate(zip(shape, spec)):
                    if isinstance(dim, str) and not SYMBOL.match(dim) and (what == "argument" or expression_problem(dim) is not None):
                        return f"{what} {index}: {dim!r} is not a symbol name" + (f" or an expression ({expression_problem(dim)})" if what == "result" else "")
                    if isinstance(dim, int) and size is not None and dim != size:
                        return f"{what} {index} dimension {axis} is {dim}, the signature says {size}"
                    if size is not None and isinstance(dim, str):
                        return f"{what} {index} dimension {axis} is the symbol {dim}, the signature fixes it to {size}"
        result_symbols = {s for shape in self.results for d in shape if isinstance(d, str) for s in _symbols_of(d)}
        unbound = sorted(result_symbols - set(self.symbols))
        if unbound:
            return f"result symbols {', '.join(unbound)} are not bound by any argument"
        if len(self.requires) > MAX_REQUIRES:
            return f"more than {MAX_REQUIRES} conditions"
        for text in self.requires:
            try:
                needs = condition(text).symbols
            except LaunchSpecError as exc:
                return f"condition {text!r}: {exc}"
            if needs - set(self.symbols):
                return f"condition {text!r} names {', '.join(sorted(needs - set(self.symbols)))}, not a symbol of the arguments"
        if len(self.symbols) > MAX_SYMBOLS:
            return f"more than {MAX_SYMBOLS} symbols"
        for symbol, rule in self.buckets.items():
            if symbol not in self.symbols:
                return f"a bucketing rule for {symbol}, which is not a symbol of the arguments"
            problem = rule_problem(rule)
            if problem:
                return f"bucketing rule of {symbol}: {problem}"
        if self.names and len(self.names) != len(self.inputs):
            return f"{len(self.names)} argument names for {len(self.inputs)} arguments"
        if len(set(self.names)) != len(self.names):
            return "two arguments have the same name"
        bad = next((n for n in self.names if not NAME.match(n)), None)
        if bad is not None:
            return f"the argument name {escaped(bad)} is empty, longer than {MAX_NAME_CHARS} characters or holds a control character"
        if len(self.identifiers) != len(self.names) or len(set(self.identifiers)) != len(self.identifiers):
            return f"{len(self.identifiers)} distinct argument identifiers for {len(self.names)} names"
        bad = next((n for n in self.identifiers if not IDENTIFIER.match(n)), None)
        if bad is not None:
            return f"{escaped(bad)} is not an identifier"
        return None

    def __str__(self) -> str:
        args = ", ".join(shape_text(s) for s in self.inputs)
        results = [shape_text(s) for s in self.results]
        shown = results[0] if len(results) == 1 else f"({', '.join(results)})"
        where = f" where {', '.join(self.requires)}" if self.requires else ""
        return f"({args}) -> {shown}{where}"


@functools.lru_cache(maxsize=4096)
def condition(text: str) -> Expr:
    """A contract condition, parsed once (LaunchSpecError when it is not a comparison of size expressions)."""
    from portkern.portable.expr import parse  # (contracts with expressions only)

    return parse(text, condition=True)


@functools.lru_cache(maxsize=4096)
def expression(text: str) -> Expr:
    """A result dimension's expression, parsed once (LaunchSpecError when it is not one)."""
    from portkern.portable.expr import parse

    return parse(text)


def expression_problem(text: str) -> str | None:
    """What makes `text` unfit as a result dimension's expression (no `ARG.shape[i]`), None when nothing."""
    try:
        parsed = expression(text)
    except LaunchSpecError as exc:
        return str(exc)
    return "it reads ARG.shape[i]; name the dimension's symbol instead" if parsed.dims else None


def _symbols_of(dim: str) -> frozenset[str]:
    if SYMBOL.match(dim):
        return frozenset((dim,))
    try:
        return expression(dim).symbols
    except LaunchSpecError:
        return frozenset()


def _dim_value(dim: Dim | None, values: Mapping[str, int]) -> int | None:
    if not isinstance(dim, str):
        return dim
    if SYMBOL.match(dim):
        return values.get(dim)
    try:
        return expression(dim).evaluate(values, {})
    except LaunchSpecError:
        return None


def identifier(name: str) -> str:
    """An identifier for a name: itself when it is one, else its letters and digits with `_` for
    the rest (`gpu_0/data_0` -> `gpu_0_data_0`), prefixed `v_` where it would start with a digit (`0` -> `v_0`)."""
    if IDENTIFIER.match(name):
        return name
    text = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name).strip("_")
    text = re.sub(r"_+", "_", text) or "v"
    return (text if not text[0].isdigit() else "v_" + text)[:120]


def identifiers_for(names: Sequence[str]) -> tuple[str, ...]:
    """Distinct identifiers for names, in order: `identifier`, with `_2`, `_3`, ... where two would be equal."""
    taken: set[str] = set(n for n in names if IDENTIFIER.match(n))
    out = []
    for name in names:
        base = identifier(name)
        if base != name:
            candidate, count = base, 1
            while candidate in taken:
                count += 1
                candidate = f"{base}_{count}"
            base = candidate
        taken.add(base)
        out.append(base)
    return tuple(out)


def escaped(name: str) -> str:
    """A name as messages show it: as it is when an identifier, else quoted with non-printable and
    non-ASCII characters escaped as Python writes them (`'gpu_0/data_0'`, `'out\\xfc'`)."""
    if IDENTIFIER.match(name):
        return name
    return "'" + name.encode("unicode_escape").decode("ascii").replace("'", "\\'") + "'"


def arrange(kernel: str, contract: "ShapeContract | None", count: int, args: Sequence[Any], named: Mapping[str, Any]) -> list[Any]:
    """Positional arguments for a call that passes some by name (`k(x=..., w=...)`, or
    `k(**{"gpu_0/data_0": x})`): the model's names, their identifiers, or `arg0`, ...;
    ArgumentTypeError for an unknown, repeated or missing one."""
    slots: list[Any] = list(args) + [_MISSING] * max(0, count - len(args))
    if len(args) > count:
        raise ArgumentTypeError(f"{kernel}() takes {count} arguments, {len(args)} were given")
    probe = contract if contract is not None else ShapeContract(tuple(() for _ in range(count)), ())
    for name, value in named.items():
        index = probe.arg_index(str(name))
        if index is None or index >= count:
            known = ", ".join(escaped(n) for n in (probe.names or [f"arg{i}" for i in range(count)]))
            raise ArgumentTypeError(f"{kernel}() has no argument {escaped(str(name))} (arguments: {known})")
        if slots[index] is not _MISSING:
            raise ArgumentTypeError(f"{kernel}() got argument {index} twice (by position or name, and as {escaped(str(name))})")
        slots[index] = value
    missing = [i for i, v in enumerate(slots) if v is _MISSING]
    if missing:
        shown = [escaped(probe.names[i]) if probe.names else f"arg{i}" for i in missing]
        raise ArgumentTypeError(f"{kernel}() has no value for argument {', '.join(shown)}")
    return slots


_MISSING = object()


def shape_text(shape: Sequence[Dim | None]) -> str:
    """`MxK`, `Mx256`, `?x4` (unknown), `(M - K + 1)x4` (an expression), `scalar` (0-d)."""
    return "x".join("?" if d is None else f"({d})" if isinstance(d, str) and not SYMBOL.match(d) else str(d) for d in shape) or "scalar"


def rule_problem(rule: Rule) -> str | None:
    """What is wrong with a bucketing rule, None when nothing."""
    if isinstance(rule, str):
        return None if rule in ("pow2", "exact") else f"{rule!r} is not pow2, exact or a list of bounds"
    bounds = list(rule)
    if not bounds or len(bounds) > MAX_BOUNDS or any(type(b) is not int or b < 1 for b in bounds):
        return f"bounds must be 1 to {MAX_BOUNDS} positive integers"
    if bounds != sorted(set(bounds)):
        return "bounds must be ascending, without repeats"
    return None


def _bucket(symbol: str, size: int, rule: Rule) -> str:
    if rule == "exact":
        return f"{symbol}={size}"
    if rule == "pow2":
        bound = 1 << max(0, int(size) - 1).bit_length()
        return f"{symbol}<={bound}" if bound <= POW2_MAX else f"{symbol}>{POW2_MAX}"
    bounds = cast(tuple[int, ...], rule)  # neither "exact" nor "pow2": ascending bounds
    for bound in bounds:
        if size <= bound:
            return f"{symbol}<={bound}"
    return f"{symbol}>{bounds[-1]}"
