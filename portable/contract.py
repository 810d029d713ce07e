"""Shape contracts: which argument dimensions must be equal, and what the results' shapes are.

A contract names every dimension of every argument either by its size (an
integer) or by a symbol: dimensions that share a symbol must be equal in a
call, `(MxK, KxN) -> MxN` for a matmul. Result dimensions are symbols or
sizes too, or None when no argument dimension fixes them. The builder
derives a contract from the IR (`portable.contract_ir`) or takes the one a
manifest states; the bundle records it next to the signature, and every call
is checked against it before anything runs. Nothing here parses MLIR.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence, Union

from portkern.errors import ArgumentShapeError

#: One dimension: a size, or a symbol.
Dim = Union[int, str]
#: A bucketing rule: "pow2", "exact", or ascending upper bounds.
Rule = Union[str, tuple[int, ...]]

SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
MAX_SYMBOLS = 256
#: Where a contract came from: derived from the IR, or stated (manifest `shapes:`, ONNX `dim_param`) and checked against it.
ORIGINS = ("ir", "stated")
#: The default bucketing rule of a symbol: powers of two, clamped to [1, POW2_MAX].
POW2_MAX = 1 << 16
MAX_BOUNDS = 64


class UncheckedShapesWarning(UserWarning):
    """A kernel's shape contract could not be derived or stated: its calls cannot be checked."""


@dataclass(frozen=True)
class ShapeContract:
    """Argument and result dimensions as sizes and shared symbols."""

    inputs: tuple[tuple[Dim, ...], ...]
    results: tuple[tuple[Dim | None, ...], ...]
    origin: str = "ir"
    #: Per symbol, how its sizes are grouped into buckets (default "pow2"; see `bucket_of`).
    buckets: Mapping[str, "Rule"] = field(default_factory=dict)
    #: The arguments' names (the source's `%names`, ONNX input names), when known.
    names: tuple[str, ...] = ()

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
        return values

    def result_shapes(self, values: Mapping[str, int]) -> list[tuple[int | None, ...]]:
        """Result shapes for bound symbols (None where no argument fixes a dimension)."""
        return [tuple(d if not isinstance(d, str) else values.get(d) for d in shape) for shape in self.results]

    def bucket_of(self, values: Mapping[str, int]) -> str:
        """The bucket of a call's symbol values, e.g. `M<=64`, `M=50`, `M>2048,N<=8`; "" without symbols.

        "pow2" puts a size in the bucket of the next power of two (clamped to
        POW2_MAX); "exact" gives each size its own bucket; a list of bounds puts
        it in the bucket of the first bound it does not exceed.
        """
        return ",".join(_bucket(symbol, values[symbol], self.buckets.get(symbol, "pow2")) for symbol in self.symbols if symbol in values)

    def arg_index(self, name: str) -> int | None:
        """The argument a name (`a`, `arg0`, `0`) refers to, None when none."""
        if name in self.names:
            return self.names.index(name)
        for prefix in ("arg", ""):
            if name.startswith(prefix) and name[len(prefix):].isdigit() and int(name[len(prefix):]) < len(self.inputs):
                return int(name[len(prefix):])
        return None

    def to_dict(self) -> dict:
        data = {"inputs": [list(s) for s in self.inputs], "results": [list(s) for s in self.results], "origin": self.origin}
        if self.buckets:
            data["buckets"] = {k: (v if isinstance(v, str) else list(v)) for k, v in self.buckets.items()}
        if self.names:
            data["names"] = list(self.names)
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> "ShapeContract":
        """A contract from a bundle record (already schema-checked)."""
        return cls(
            tuple(tuple(s) for s in data["inputs"]),
            tuple(tuple(s) for s in data["results"]),
            data.get("origin", "ir"),
            {k: (v if isinstance(v, str) else tuple(v)) for k, v in data.get("buckets", {}).items()},
            tuple(data.get("names", ())),
        )

    def problem(self, inputs: Sequence[Sequence[int | None]], results: Sequence[Sequence[int | None]]) -> str | None:
        """What makes this contract unfit for a signature with these shapes, or None."""
        if len(self.inputs) != len(inputs) or len(self.results) != len(results):
            return f"has {len(self.inputs)} arguments and {len(self.results)} results, the signature {len(inputs)} and {len(results)}"
        for what, mine, theirs in (("argument", self.inputs, inputs), ("result", self.results, results)):
            for index, (shape, spec) in enumerate(zip(mine, theirs)):
                if len(shape) != len(spec):
                    return f"{what} {index} has rank {len(shape)}, the signature says {len(spec)}"
                for axis, (dim, size) in enumerate(zip(shape, spec)):
                    if isinstance(dim, str) and not SYMBOL.match(dim):
                        return f"{what} {index}: {dim!r} is not a symbol name"
                    if isinstance(dim, int) and size is not None and dim != size:
                        return f"{what} {index} dimension {axis} is {dim}, the signature says {size}"
                    if size is not None and isinstance(dim, str):
                        return f"{what} {index} dimension {axis} is the symbol {dim}, the signature fixes it to {size}"
        result_symbols = {d for shape in self.results for d in shape if isinstance(d, str)}
        unbound = sorted(result_symbols - set(self.symbols))
        if unbound:
            return f"result symbols {', '.join(unbound)} are not bound by any argument"
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
        return None

    def __str__(self) -> str:
        args = ", ".join(shape_text(s) for s in self.inputs)
        results = [shape_text(s) for s in self.results]
        shown = results[0] if len(results) == 1 else f"({', '.join(results)})"
        return f"({args}) -> {shown}"


def shape_text(shape: Sequence[Dim | None]) -> str:
    """`MxK`, `Mx256`, `?x4` (unknown), `scalar` (0-d)."""
    return "x".join("?" if d is None else str(d) for d in shape) or "scalar"


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
    for bound in rule:
        if size <= bound:
            return f"{symbol}<={bound}"
    return f"{symbol}>{rule[-1]}"
