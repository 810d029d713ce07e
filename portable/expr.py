"""Size expressions of launch descriptions: integer arithmetic over tensor dimensions.

Expressions come from manifests and from bundles, both untrusted, so they are
parsed with Python's `ast` into a tree of a few whitelisted node types and
evaluated by walking that tree; Python itself never evaluates them::

    expr      := INT | SYMBOL | ARG.shape[INT] | expr OP expr | -expr | (expr)
               | min(expr, ...) | max(expr, ...) | ceil_div(expr, expr) | round_up(expr, expr)
    OP        := +  -  *  //  %          (Python's floor semantics)
    condition := expr CMP expr [CMP expr ...]      CMP := ==  !=  <  <=  >  >=

A SYMBOL names a dimension bound by an input's shape (`shape: [M, K]` binds M
and K); `ARG.shape[i]` reads dimension i of the input argument ARG.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import field
from typing import Callable, Mapping, Sequence, cast

from portkern.base.errors import LaunchSpecError, printable
from portkern.base.records import frozen_record

MAX_TEXT = 256
MAX_NODES = 64
#: Every literal and intermediate value must stay within +-LIMIT.
LIMIT = 1 << 62


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


_BINARY: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_COMPARE: dict[type, Callable[[int, int], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
#: name -> (function, least argument count, most argument count)
_FUNCTIONS: dict[str, tuple[Callable[..., int], int, int]] = {
    "min": (min, 2, 8),
    "max": (max, 2, 8),
    "ceil_div": (_ceil_div, 2, 2),
    "round_up": (lambda a, b: _ceil_div(a, b) * b, 2, 2),
}

#: The names of the functions expressions may call (not usable as symbols).
FUNCTIONS = tuple(_FUNCTIONS)


@frozen_record
class Expr:
    """A checked expression, its text and what it refers to."""

    text: str
    #: Bare names it uses (symbols bound by input shapes).
    symbols: frozenset[str]
    #: `(argument, axis)` pairs it reads as `ARG.shape[axis]`.
    dims: frozenset[tuple[str, int]]
    condition: bool = False
    _tree: ast.expr = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __str__(self) -> str:
        return self.text

    @property
    def is_symbol(self) -> bool:
        """Whether the expression is one bare name (which binds it when used in an input shape)."""
        return isinstance(self._tree, ast.Name)

    def constant(self) -> int | None:
        """Its value when it refers to no dimension, else None."""
        if self.symbols or self.dims:
            return None
        return self.evaluate({}, {})

    def evaluate(self, symbols: Mapping[str, int], shapes: Mapping[str, Sequence[int]]) -> int:
        """The value for these symbol values and argument shapes (a bool for a condition)."""
        return _evaluate(self._tree, symbols, shapes, self.text)


def parse(text: str | int, *, condition: bool = False) -> Expr:
    """Check an expression (or, with `condition`, a comparison) and return it."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise LaunchSpecError(f"expected an integer or an expression, got {text!r}")
    source = str(text).strip()
    if not source:
        raise LaunchSpecError("empty expression")
    if len(source) > MAX_TEXT:
        raise LaunchSpecError(f"expression is longer than {MAX_TEXT} characters")
    shown = printable(source)  # (the bundle's or the manifest's text, as refusals quote it)
    try:
        tree = ast.parse(source, mode="eval").body
    except SyntaxError as exc:
        hint = ""
        if source.count("(") != source.count(")"):
            hint = '; YAML splits an unquoted list item at its commas: quote the whole expression, e.g. ["round_up(n, 64)"]'
        raise LaunchSpecError(f"`{shown}` is not a valid expression ({exc.msg}){hint}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise LaunchSpecError(f"`{shown}` is too complex ({nodes} nodes; at most {MAX_NODES})")
    if condition:
        if not isinstance(tree, ast.Compare):
            raise LaunchSpecError(f"`{shown}` is not a comparison (use ==, !=, <, <=, > or >=)")
        operands = [tree.left, *tree.comparators]
        for op in tree.ops:
            if type(op) not in _COMPARE:
                raise LaunchSpecError(f"`{shown}`: comparison {type(op).__name__} is not allowed")
    else:
        operands = [tree]
    symbols: set[str] = set()
    dims: set[tuple[str, int]] = set()
    for operand in operands:
        _check(operand, shown, symbols, dims)
    return Expr(source, frozenset(symbols), frozenset(dims), condition, tree)


def _check(node: ast.AST, shown: str, symbols: set[str], dims: set[tuple[str, int]]) -> None:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise LaunchSpecError(f"`{shown}`: only integer literals are allowed, not {node.value!r}")
        if abs(node.value) > LIMIT:
            raise LaunchSpecError(f"`{shown}`: literal {node.value} is too large")
    elif isinstance(node, ast.Name):
        if node.id in _FUNCTIONS:
            raise LaunchSpecError(f"`{shown}`: {node.id} is a function; call it")
        symbols.add(node.id)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        _check(node.left, shown, symbols, dims)
        _check(node.right, shown, symbols, dims)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        _check(node.operand, shown, symbols, dims)
    elif isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in _FUNCTIONS:
            raise LaunchSpecError(f"`{shown}`: unknown function (allowed: {', '.join(_FUNCTIONS)})")
        _, least, most = _FUNCTIONS[name]
        if node.keywords or not least <= len(node.args) <= most or any(isinstance(a, ast.Starred) for a in node.args):
            raise LaunchSpecError(f"`{shown}`: {name}() takes {least}{'' if least == most else f' to {most}'} plain arguments")
        for arg in node.args:
            _check(arg, shown, symbols, dims)
    elif _is_dim(node):
        dims.add((node.value.value.id, node.slice.value))  # type: ignore[attr-defined]
    else:
        raise LaunchSpecError(
            f"`{shown}`: {type(node).__name__} is not allowed "
            "(use integers, names, ARG.shape[i], + - * // %, min, max, ceil_div, round_up)"
        )


def _is_dim(node: ast.AST) -> bool:
    """`ARG.shape[INT]`."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "shape"
        and isinstance(node.value.value, ast.Name)
        and isinstance(node.slice, ast.Constant)
        and type(node.slice.value) is int
        and 0 <= node.slice.value < 64
    )


def _evaluate(node: ast.AST, symbols: Mapping[str, int], shapes: Mapping[str, Sequence[int]], source: str) -> int:
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, symbols, shapes, source)
        for op, right_node in zip(node.ops, node.comparators):
            right = _evaluate(right_node, symbols, shapes, source)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Constant):
        return cast(int, node.value)  # `_check` admits no other constant
    if isinstance(node, ast.Name):
        if node.id not in symbols:
            raise LaunchSpecError(f"`{printable(source)}`: {node.id} has no value")
        return _bounded(int(symbols[node.id]), source)
    if isinstance(node, ast.Subscript):
        arg, axis = node.value.value.id, node.slice.value  # type: ignore[attr-defined]
        shape = shapes.get(arg)
        if shape is None or axis >= len(shape):
            raise LaunchSpecError(f"`{printable(source)}`: {arg}.shape[{axis}] has no value")
        return _bounded(int(shape[axis]), source)
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, symbols, shapes, source)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left = _evaluate(node.left, symbols, shapes, source)
        right = _evaluate(node.right, symbols, shapes, source)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
            raise LaunchSpecError(f"`{printable(source)}`: division by zero")
        return _bounded(_BINARY[type(node.op)](left, right), source)
    function = _FUNCTIONS[node.func.id][0]  # type: ignore[attr-defined]
    args = [_evaluate(a, symbols, shapes, source) for a in node.args]  # type: ignore[attr-defined]
    if function is not min and function is not max and args[1] == 0:
        raise LaunchSpecError(f"`{printable(source)}`: division by zero")
    return _bounded(function(*args), source)


def _bounded(value: int, source: str) -> int:
    if abs(value) > LIMIT:
        raise LaunchSpecError(f"`{printable(source)}`: value out of range")
    return value
