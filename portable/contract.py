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
from dataclasses import dataclass
from typing import Mapping, Sequence, Union

from portkern.errors import ArgumentShapeError

#: One dimension: a size, or a symbol.
Dim = Union[int, str]

SYMBOL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
MAX_SYMBOLS = 256
#: Where a contract came from: derived from the IR, or stated (manifest `shapes:`, ONNX `dim_param`) and checked against it.
ORIGINS = ("ir", "stated")


class UncheckedShapesWarning(UserWarning):
    """A kernel's shape contract could not be derived or stated: its calls cannot be checked."""


@dataclass(frozen=True)
class ShapeContract:
    """Argument and result dimensions as sizes and shared symbols."""

    inputs: tuple[tuple[Dim, ...], ...]
    results: tuple[tuple[Dim | None, ...], ...]
    origin: str = "ir"

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

    def to_dict(self) -> dict:
        return {"inputs": [list(s) for s in self.inputs], "results": [list(s) for s in self.results], "origin": self.origin}

    @classmethod
    def from_dict(cls, data: Mapping) -> "ShapeContract":
        """A contract from a bundle record (already schema-checked)."""
        return cls(
            tuple(tuple(s) for s in data["inputs"]),
            tuple(tuple(s) for s in data["results"]),
            data.get("origin", "ir"),
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
        return None

    def __str__(self) -> str:
        args = ", ".join(shape_text(s) for s in self.inputs)
        results = [shape_text(s) for s in self.results]
        shown = results[0] if len(results) == 1 else f"({', '.join(results)})"
        return f"({args}) -> {shown}"


def shape_text(shape: Sequence[Dim | None]) -> str:
    """`MxK`, `Mx256`, `?x4` (unknown), `scalar` (0-d)."""
    return "x".join("?" if d is None else str(d) for d in shape) or "scalar"
