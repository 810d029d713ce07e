"""ONNX operator semantics IREE (3.13) leaves to the hardware, rewritten before import so that a
kernel computes what onnx's reference computes, on every ISA level it runs on.

- BitShift by a negative amount or by the element type's width or more: IREE's shift is LLVM's,
  whose result there is undefined (x86 masks the amount per instruction, and AVX2 and AVX-512 code
  differ). onnx's reference gives 0, and for a RIGHT shift of a signed type the sign (-1 for a
  negative value). The rewrite selects that value where the amount is out of range and shifts by
  an amount clamped into range elsewhere:
  `Where(out, fill, BitShift(x, Where(out, 0, s)))`, `out = Or(Less(s, 0), Greater(s, width - 1))`,
  `fill` 0, or `BitShift(x, width - 1)` (RIGHT, signed).
- NaN, for floating-point inputs (integer models are left as they are). onnx's reference is
  NumPy's: `Max`/`Min` give the first NaN operand, `Clip` gives a NaN `x` (or a NaN bound), `Sign`
  gives NaN, `ArgMax`/`ArgMin` take a NaN as the extreme (the first NaN along the axis, the last
  with `select_last_index`), `Hardmax` puts its 1 on that NaN. IREE gives the other operand,
  the clipped bound, 0, and an index or position that ignores the NaN. The rewrites:
  `Max(a, b, ...)` -> `Where(IsNaN(a), a, Where(IsNaN(b), b, ... Max(a, b, ...)))` (`Min` alike);
  `Clip(x, lo, hi)` -> `Where(IsNaN(x), x, Where(IsNaN(lo), lo, Where(IsNaN(hi), hi, Clip(...))))`,
  `Sign(x)` -> `Where(IsNaN(x), x, Sign(x))`;
  `ArgMax(x)` -> `Where(any, ArgMax(m), ArgMax(x))` with `m = Cast(IsNaN(x), float)` and
  `any = ReduceMax(m) > 0` along the same axis (`ArgMin` alike, with `ArgMax(m)`);
  `Hardmax(x)` -> `Where(any, Hardmax(m), Hardmax(x))` with `any` kept as a dimension. Operands
  that are constant numbers are not checked. A model older than opset 9 (which brought IsNaN and
  Where) is upgraded to opset 9 first.
  Where IREE already agrees with the reference (checked on IREE 3.13: `ReduceMax`, `ReduceMin` and
  the other `Reduce*` propagate NaN; `Greater`, `Less`, `Equal`, `GreaterOrEqual`, `LessOrEqual`
  are false on NaN; `Relu`, `LeakyRelu`, `Abs`, `Floor`, `Ceil`, `Round`, `Exp`, `Log`, `Sqrt`,
  `Tanh`, `Sigmoid`, `Softmax`, `LogSoftmax`, `Mean`, `Sum`, `Mod`, `CumSum`, `GlobalMaxPool` keep
  it), nothing is rewritten.
- `Pow`: IREE gives NaN for a negative base, for `pow(1, nan)`, `pow(nan, 0)` and `pow(0, 0)`, -inf
  for `0 ** -n` with a constant `n`, and its integer Pow goes through a float pow (NaN, so the
  type's minimum, for a negative base; inexact beyond 2**53). onnx's reference is C's `pow`. A
  float base becomes `r = Where(|x| == 1, 1, Abs(Pow(|x|, y)))` (float32 for float16 and bfloat16
  bases), negated where x is negative (-0 and -inf too) and y an odd integer, NaN where x is
  finite and negative and y no integer, 1 where y is 0. A constant exponent drops the checks it
  needs none of; a single constant exponent that is a non-negative integer or 0.5 is left to
  IREE (products and sqrt, as the reference's NumPy computes them), a single infinite or NaN one
  is computed outright. An integer base with an integer exponent becomes squarings and
  products, exact for every result the type holds (an overflowing one differs: the reference
  wraps). Left as they are: an integer base with a float exponent, and a broadcast exponent 0.5
  with a -inf base that is not a constant (NumPy takes sqrt there: NaN; the rewrite gives C's +inf).
- `TopK` of floating-point input: the reference sorts NaN above +inf (first with `largest`, last
  without), ties by the lower index; IREE places NaN anywhere. The rewrite sorts a double key
  (NaN -> +inf, +inf -> the largest double) and maps the values back (float64: GatherElements,
  opset 11 on, and a largest double in the input ties with +inf).
- `MaxPool` of floating-point input (one output): the reference skips NaN in a window and, with
  strides or dilations (its loop), keeps a NaN that is the window's first element inside the
  input; IREE spreads every NaN. The rewrite pools `Where(IsNaN(x), -inf, x)`, then puts back
  the window's first element where it is NaN (Gather of constant indices; a -inf Pad in front,
  as `onnx_model.explicit_pool_pads` writes, counts as padding), or without strides (and where
  sizes are not known) NaN where a window holds no number (a second pool over `Not(IsNaN(x))`;
  the reference fails there).
- Integer `Div` and `Mod` (`fmod` 0 and 1) by zero, and of a signed type's minimum by -1: IREE
  divides in hardware, and x86 traps there (SIGFPE: the process dies) for 64-bit types, while
  narrower ones give whatever the vector code leaves. onnx's reference (NumPy) gives 0 for a zero
  divisor, and for the minimum by -1 the minimum (`Div`) and 0 (`Mod`). The rewrite divides by 1
  there, which gives those results, except a `Div` by zero, selected as 0:
  `Where(Equal(d, 0), 0, Div(x, Where(bad, 1, d)))`, `bad = Or(Equal(d, 0), And(Equal(x, min),
  Equal(d, -1)))`. A constant divisor with neither value is left as it is, and so is a constant
  dividend without the minimum. A model older than opset 9 (Where), or than opset 11 (Equal of
  every integer type) with a divisor of another type than int32 and int64, is upgraded first.
  IREE's importer also divides unsigned integers as signed ones (wrong where an operand has its
  top bit set), and cannot Cast to uint16, uint32 or uint64: an unsigned Div or Mod becomes
  `q = ((x >> 1) / d) << 1` (a signed division of operands below the top bit is right), plus 1
  where `x - q * d >= d`, and `x >= d` (0 or 1) outright for a divisor with its top bit set.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from portkern.base.errors import BuildError, brief

if TYPE_CHECKING:
    import numpy as np

#: Value name -> TensorProto element type code.
Types = dict[str, int]
#: Value name -> a constant's (initializer's or Constant node's) array.
Constants = dict[str, "np.ndarray"]
#: Value name -> its dimensions (None where not known).
Dims = dict[str, list["int | None"]]

#: Integer element types (TensorProto codes) -> (bits, signed).
_INTEGERS = {2: (8, False), 3: (8, True), 4: (16, False), 5: (16, True), 6: (32, True), 7: (64, True), 12: (32, False), 13: (64, False)}
#: Floating-point element types (TensorProto codes) IREE imports: float, float16, double, bfloat16.
_FLOATS = {1, 10, 11, 16}
#: Operators whose NaN results IREE computes differently from onnx's reference.
_NAN_OPS = ("Max", "Min", "Clip", "Sign", "ArgMax", "ArgMin", "Hardmax")
#: Operators whose results IREE computes differently from onnx's reference for more than NaN.
_MORE_OPS = ("Pow", "TopK", "MaxPool")
#: Operators that divide integers in hardware, which traps on a zero divisor and on the minimum by -1.
_DIVISIONS = ("Div", "Mod")
#: Integer element types whose Equal the opsets before 11 define.
_EQUAL_7 = (6, 7)
_DOUBLE = 11
_HALVES = (10, 16)
_FLOAT, _BOOL = 1, 9
#: The first opset with IsNaN and Where, which the NaN rewrites use; an older model is upgraded to it first.
_NAN_OPSET = 9


def rewrite(model: Any) -> bool:
    """Rewrite `model` (an onnx ModelProto) in place as this module says; returns whether it changed.
    Subgraphs (If, Loop, Scan bodies) are rewritten too."""
    graphs = list(_graphs(model.graph))
    ops = ("BitShift", *_NAN_OPS, *_MORE_OPS, *_DIVISIONS)
    if not any(_is_onnx(node) and node.op_type in ops for g in graphs for node in g.node):
        return False
    wanted = {node.input[0] for g in graphs for node in g.node if _is_onnx(node) and node.op_type in ops and node.input}
    wanted |= {name for g in graphs for node in g.node if _is_onnx(node) and node.op_type in ("BitShift", "Pow") for name in node.input}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    ranked = {node.input[0] for g in graphs for node in g.node if _is_onnx(node) and node.op_type == "Hardmax" and node.input} if opset < 13 else set()
    types, ranks = _element_types(model, wanted, ranked)

    def needs_opset_9(n: Any) -> bool:
        code = types.get(n.input[0]) if n.input else None
        return code in _FLOATS or (n.op_type == "Pow" and code in _INTEGERS)

    if opset < _NAN_OPSET and any(_is_onnx(n) and n.op_type in (*_NAN_OPS, *_MORE_OPS) and needs_opset_9(n) for g in graphs for n in g.node):
        _upgrade(model, _NAN_OPSET)
        return rewrite(model) or True
    if opset < 11:
        divisions = [n for g in graphs for n in g.node if _is_onnx(n) and n.op_type in _DIVISIONS and len(n.input) == 2]
        if divisions:
            known: Constants = {}
            for g in graphs:
                known.update(_constant_values(g, {v for n in divisions for v in n.input}))
            unsafe = [types.get(n.input[0]) or types.get(n.input[1]) for n in divisions if _unsafe_division(n, types, known)]
            needed = 11 if any(code not in _EQUAL_7 for code in unsafe) else _NAN_OPSET if unsafe else 0
            if opset < needed:
                _upgrade(model, needed, "its integer divisions by zero need")
                return rewrite(model) or True
    pools = [n for g in graphs for n in g.node if _is_onnx(n) and n.op_type == "MaxPool" and types.get(n.input[0]) in _FLOATS]
    pads = {out: n.input[0] for g in graphs for n in g.node if n.op_type == "Pad" and n.input for out in n.output}
    dims = _dims(model, {v for n in pools for v in (n.input[0], pads.get(n.input[0], n.input[0]), *n.output[:1])}) if pools else {}
    names = _Names(graphs)
    changed = False
    for graph in reversed(graphs):  # innermost first: an outer graph's new nodes are copies
        constants = _constant_values(graph, {name for node in graph.node if _is_onnx(node) and node.op_type in ("BitShift", "Clip", "Max", "Min", "Pow", "Pad", *_DIVISIONS) for name in node.input})
        producers = {out: node for node in graph.node for out in node.output}
        nodes: list[Any] = []
        rewritten = False
        for node in graph.node:
            replacement: list[Any] | None = None
            if _is_onnx(node) and node.op_type == "BitShift" and len(node.input) == 2:
                replacement = _bitshift(node, types, constants, names)
            elif _is_onnx(node) and node.op_type in _NAN_OPS:
                replacement = _nan(node, types, ranks, constants, names, opset)
            elif _is_onnx(node) and node.op_type == "Pow" and len(node.input) == 2:
                replacement = _pow(node, types, constants, names)
            elif _is_onnx(node) and node.op_type == "TopK":
                replacement = _topk(node, types, names, opset)
            elif _is_onnx(node) and node.op_type == "MaxPool":
                replacement = _max_pool(node, types, dims, constants, producers, names)
            elif _is_onnx(node) and node.op_type in _DIVISIONS and len(node.input) == 2:
                replacement = _division(node, types, constants, names)
            if replacement is not None:
                nodes += replacement
                rewritten = True
                continue
            nodes.append(node)
        if rewritten:
            del graph.node[:]
            graph.node.extend(nodes)
            changed = True
    return changed


def _upgrade(model: Any, opset: int, need: str = "its NaN semantics need") -> None:
    """Convert `model` in place to `opset` (onnx's version converter), or a BuildError."""
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, opset)
    except Exception as exc:  # noqa: BLE001 - the converter's failures are RuntimeErrors and assertions
        raise BuildError(
            f"the model (opset {next((o.version for o in model.opset_import if o.domain in ('', 'ai.onnx')), 1)}) could not be "
            f"upgraded to opset {opset}, which {need}: {brief(exc, last=True)}"
        ) from None
    model.CopyFrom(converted)


def _is_onnx(node: Any) -> bool:
    return node.domain in ("", "ai.onnx")


def _graphs(graph: Any) -> Iterator[Any]:
    """`graph` and every subgraph in it, outermost first."""
    yield graph
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("g"):
                yield from _graphs(a.g)
            for sub in a.graphs:
                yield from _graphs(sub)


class _Names:
    """Fresh value and node names, unused by the model."""

    def __init__(self, graphs: Iterable[Any]) -> None:
        self.used: set[str] = set()
        for graph in graphs:
            self.used |= {v for node in graph.node for v in (*node.input, *node.output, node.name)}
            self.used |= {v.name for v in (*graph.input, *graph.output, *graph.initializer, *graph.value_info)}

    def __call__(self, base: str) -> str:
        index = 0
        while f"{base}_{index}" in self.used:
            index += 1
        name = f"{base}_{index}"
        self.used.add(name)
        return name


def _element_type(node: Any, types: Types, inputs: Sequence[str], why: str) -> int:
    """The element type code of `inputs` (the first one known); BuildError naming the node and `why`
    it is needed when none is known."""
    code = None
    for name in inputs:
        code = code or types.get(name)
    if code is None:
        what = "its inputs" if len(inputs) > 1 else "its input"
        raise BuildError(f"{node.op_type} node {node.name or node.output[0]!r}: the element type of {what} is not known, so {why}")
    return code


def _bitshift(node: Any, types: Types, constants: Constants, names: _Names) -> list[Any] | None:
    """The nodes that replace one BitShift node, or None where its shift amounts are all in range."""
    import numpy as np
    from onnx import helper, numpy_helper

    x, s = node.input
    (y,) = node.output
    code = _element_type(node, types, (x, s), "a shift by a negative amount or by the type's width or more could not be made to give onnx's result")
    if code not in _INTEGERS:
        return None  # not an integer type: the importer refuses it
    bits, signed = _INTEGERS[code]
    amount = constants.get(s)
    if amount is not None and np.all((amount >= 0) & (amount < bits)):
        return None
    direction = next((a.s.decode() for a in node.attribute if a.name == "direction"), "")
    dtype = helper.tensor_dtype_to_np_dtype(code)
    base = (node.name or y).replace("/", "_")

    def constant(value: int) -> tuple[object, str]:
        name = names(f"{base}_bitshift_const")
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype=dtype), name)), name

    zero_node, zero = constant(0)
    top_node, top = constant(bits - 1)
    high, low, out, safe = (names(f"{base}_bitshift_{what}") for what in ("high", "low", "out", "safe"))
    made = [zero_node, top_node, helper.make_node("Greater", [s, top], [high])]
    if signed:
        made += [helper.make_node("Less", [s, zero], [low]), helper.make_node("Or", [low, high], [out])]
    else:
        out = high
    made.append(helper.make_node("Where", [out, zero, s], [safe]))
    shifted = names(f"{base}_bitshift_in_range")
    made.append(helper.make_node("BitShift", [x, safe], [shifted], name=node.name, direction=direction))
    if direction == "RIGHT" and signed:
        fill = names(f"{base}_bitshift_sign")
        made.append(helper.make_node("BitShift", [x, top], [fill], direction="RIGHT"))
    else:
        fill = zero
    made.append(helper.make_node("Where", [out, fill, shifted], [y]))
    return made


def _nan(node: Any, types: Types, ranks: dict[str, int], constants: Constants, names: _Names, opset: int) -> list[Any] | None:
    """The nodes that give one Max, Min, Clip, Sign, ArgMax, ArgMin or Hardmax node onnx's NaN
    results, or None where its input is not floating-point (or the node needs none)."""
    from onnx import helper

    op = node.op_type
    if not node.input or not node.input[0] or (op in ("Max", "Min") and len(node.input) < 2):
        return None
    x = node.input[0]
    y = node.output[0] if node.output else ""
    if not y:
        return None
    code = _element_type(node, types, (x,), "its result for a NaN could not be made to give onnx's")
    if code not in _FLOATS:
        return None
    base = (node.name or y).replace("/", "_")
    inner = names(f"{base}_nan_inner")
    original = helper.make_node(op, list(node.input), [inner, *node.output[1:]], name=node.name)
    original.attribute.extend(node.attribute)
    made = [original]

    def make(op_type: str, inputs: list[str], **attributes: Any) -> str:
        out = names(f"{base}_nan_{op_type.lower()}")
        made.append(helper.make_node(op_type, inputs, [out], **attributes))
        return out

    if op in ("Max", "Min", "Clip", "Sign"):
        # the NaN operands, first to last; Clip's bounds where they may be NaN
        checked = list(node.input) if op in ("Max", "Min") else [x, *node.input[1:3]] if op == "Clip" else [x]
        checked = [v for v in checked if v and not _is_number(constants.get(v))]
        if not checked:
            return None
        result = inner
        for i, value in enumerate(reversed(checked)):
            last = i == len(checked) - 1
            where = helper.make_node("Where", [make("IsNaN", [value]), value, result], [y if last else names(f"{base}_nan_where")])
            made.append(where)
            result = where.output[0]
        return made
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if op == "Hardmax":
        axis = attributes.get("axis", -1 if opset >= 13 else 1)
        axes = [axis]
        if opset < 13:  # Hardmax-1/11 work on the input flattened to 2-D at `axis`
            rank = ranks.get(x)
            if rank is None:
                raise BuildError(
                    f"Hardmax node {node.name or y!r}: the rank of its input is not known, so its result "
                    "for a NaN could not be made to give onnx's"
                )
            axes = list(range(axis % rank if rank else 0, rank))
        mask = make("Cast", [make("IsNaN", [x])], to=code)
        nan_at = make("Hardmax", [mask], **attributes)
        keepdims = 1
    else:  # ArgMax, ArgMin: a NaN is the extreme either way
        axes = [attributes.get("axis", 0)]
        keepdims = attributes.get("keepdims", 1)
        mask = make("Cast", [make("IsNaN", [x])], to=_FLOAT)
        nan_at = make("ArgMax", [mask], **attributes)
    if opset >= 18:
        import numpy as np
        from onnx import numpy_helper

        axes_name = names(f"{base}_nan_axes")
        made.append(helper.make_node("Constant", [], [axes_name], value=numpy_helper.from_array(np.array(axes, dtype=np.int64), axes_name)))
        any_nan = make("ReduceMax", [mask, axes_name], keepdims=keepdims)
    else:
        any_nan = make("ReduceMax", [mask], axes=axes, keepdims=keepdims)
    made.append(helper.make_node("Where", [make("Cast", [any_nan], to=_BOOL), nan_at, inner], [y]))
    return made


class _Builder:
    """New nodes for one rewritten node, named after it."""

    def __init__(self, base: str, names: _Names) -> None:
        self.base, self.names = base.replace("/", "_"), names
        self.made: list[Any] = []

    def node(self, node: Any) -> None:
        self.made.append(node)

    def const(self, value: Any, code: int) -> str:
        import numpy as np
        from onnx import helper, numpy_helper

        name = self.names(f"{self.base}_const")
        array = np.array(value, dtype=helper.tensor_dtype_to_np_dtype(code))
        self.made.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name)))
        return name

    def ints(self, values: Iterable[int], name: str = "indices") -> str:
        from onnx import TensorProto, helper

        name = self.names(f"{self.base}_{name}")
        values = list(values)
        self.made.append(helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values)))
        return name

    def __call__(self, op_type: str, *inputs: str, out: str | None = None, **attributes: Any) -> str:
        from onnx import helper

        out = out or self.names(f"{self.base}_{op_type.lower()}")
        self.made.append(helper.make_node(op_type, list(inputs), [out], **attributes))
        return out


def _unsafe_division(node: Any, types: Types, constants: Constants) -> tuple[bool, bool] | None:
    """For an integer Div or Mod node: whether its divisor may be 0, and whether its dividend may be
    the type's minimum while its divisor is -1 (signed types) or an operand may have its top bit set
    (unsigned types); None for floating-point inputs or where none of these may happen."""
    import numpy as np
    from onnx import helper

    x, d = node.input
    code = _element_type(node, types, (x, d), "an integer division by zero could not be kept from the hardware")
    if code not in _INTEGERS:
        return None
    bits, signed = _INTEGERS[code]
    divisor, dividend = constants.get(d), constants.get(x)
    zero = divisor is None or bool(np.any(divisor == 0))
    if not signed:
        high = any(v is None or bool(np.any(v >= 2 ** (bits - 1))) for v in (divisor, dividend))
        return (zero, high) if zero or high else None
    overflow = signed and (divisor is None or bool(np.any(divisor == -1)))
    if overflow and dividend is not None:
        overflow = bool(np.any(dividend == np.iinfo(helper.tensor_dtype_to_np_dtype(code)).min))
    return (zero, overflow) if zero or overflow else None


def _division(node: Any, types: Types, constants: Constants, names: _Names) -> list[Any] | None:
    """The nodes that keep one integer Div or Mod node from dividing by zero, or a signed type's
    minimum by -1, with onnx's results there; None where it does neither (or is not integer)."""
    import numpy as np
    from onnx import helper

    unsafe = _unsafe_division(node, types, constants)
    if unsafe is None:
        return None
    zero_divisor, overflow = unsafe
    x, d = node.input
    (out,) = node.output
    code = types.get(x) or types.get(d)
    assert code is not None  # `_unsafe_division` refuses an unknown element type
    b = _Builder(node.name or out, names)
    zero, one = b.const(0, code), b.const(1, code)
    bad: list[str] = []
    if zero_divisor:
        is_zero = b("Equal", d, zero)
        bad.append(is_zero)
    if overflow and not _INTEGERS[code][1]:  # IREE divides unsigned integers as signed ones
        safe = b("Where", is_zero, one, d) if zero_divisor else d
        result = _unsigned_division(node, code, safe, b, out if not (zero_divisor and node.op_type == "Div") else None)
        if zero_divisor and node.op_type == "Div":
            b("Where", is_zero, zero, result, out=out)
        return b.made
    if overflow:
        minimum = b.const(np.iinfo(helper.tensor_dtype_to_np_dtype(code)).min, code)
        bad.append(b("And", b("Equal", x, minimum), b("Equal", d, b.const(-1, code))))
    safe = b("Where", bad[0] if len(bad) == 1 else b("Or", *bad), one, d)
    # x / 1 is x: the minimum, as NumPy's minimum // -1 wraps; x % 1 is 0, NumPy's remainder by 0 and of the minimum by -1
    selected = node.op_type == "Div" and zero_divisor
    divided = names(f"{b.base}_divided") if selected else out
    division = helper.make_node(node.op_type, [x, safe], [divided], name=node.name)
    division.attribute.extend(node.attribute)
    b.node(division)
    if selected:
        b("Where", is_zero, zero, divided, out=out)
    return b.made


def _unsigned_division(node: Any, code: int, d: str, b: _Builder, out: str | None) -> str:
    """Unsigned `x / d` or `x % d` (d nonzero) through a signed division of operands below the top
    bit: `((x >> 1) / d) << 1`, corrected by one, and 0 or 1 for a divisor with its top bit set."""
    x = node.input[0]
    bits, _ = _INTEGERS[code]
    one = b.const(1, code)
    big = b("Greater", d, b.const(2 ** (bits - 1) - 1, code))
    small = b("Where", big, one, d)
    q = b("BitShift", b("Div", b("BitShift", x, one, direction="RIGHT"), small), one, direction="LEFT")
    r = b("Sub", x, b("Mul", q, small))
    over = b("Not", b("Less", r, small))
    at_least = b("Not", b("Less", x, d))  # for a divisor with its top bit set, the quotient is 0 or 1
    if node.op_type == "Div":
        return b("Where", big, b("Where", at_least, one, b.const(0, code)), b("Where", over, b("Add", q, one), q), out=out)
    return b("Where", big, b("Where", at_least, b("Sub", x, d), x), b("Where", over, b("Sub", r, small), r), out=out)


def _pow(node: Any, types: Types, constants: Constants, names: _Names) -> list[Any] | None:
    """The nodes that give one Pow node C's (NumPy's) results, or None where IREE's already are."""
    import numpy as np
    from onnx import helper

    x, y = node.input
    (out,) = node.output
    code, exponent_code = types.get(x), types.get(y)
    if code is None or (exponent_code is None and code in _FLOATS):
        raise BuildError(
            f"Pow node {node.name or out!r}: the element type of its inputs is not known, so its result for a negative "
            "base, a zero exponent or a NaN could not be made to give onnx's"
        )
    c = constants.get(y)
    if code in _INTEGERS:
        if exponent_code is None or exponent_code not in _INTEGERS:
            return None  # an integer raised to floating-point powers is left to IREE (see the module's docstring)
        return _integer_pow(node, code, exponent_code, c, _Builder(node.name or out, names))
    if c is not None and c.size == 1 and np.isfinite(c).all() and ((c >= 0) & (c == np.floor(c)) | (c == 0.5)).all():
        return None  # IREE computes x * x ..., 1 and sqrt(x) for such an exponent, as the reference does
    base_value = constants.get(x)
    if code in _FLOATS and base_value is not None and (np.isfinite(base_value) & (base_value > 0) & (base_value != 1)).all():
        return None  # a positive base other than 1: IREE's pow(b, y) is the reference's
    if code not in _FLOATS:
        return None
    assert exponent_code is not None  # refused above for a floating-point base
    b = _Builder(node.name or out, names)
    one, ax = b.const(1.0, code), b("Abs", x)
    if c is not None and c.size == 1 and not np.isfinite(c).all():  # IREE's importer fails on some, folds others wrong
        if np.isnan(c).all():
            b("Where", b("Equal", x, one), one, b.const(float("nan"), code), out=out)
        else:
            above, below = (float("inf"), 0.0) if (c > 0).all() else (0.0, float("inf"))
            inside = b("Where", b("Less", ax, one), b.const(below, code), b("Where", b("IsNaN", x), x, one))
            b("Where", b("Greater", ax, one), b.const(above, code), inside, out=out)
        return b.made
    raised = names(f"{b.base}_pow")
    if code in _HALVES:  # IREE's float16 pow is off by 2 ulp and more; float32's rounds to the reference's
        b.node(helper.make_node("Pow", [b("Cast", ax, to=_FLOAT), y], [raised], name=node.name))
        raised = b("Cast", raised, to=code)
    else:
        b.node(helper.make_node("Pow", [ax, y], [raised], name=node.name))
    # pow(1, y) is 1 for every y, a NaN or an infinity too; the absolute value undoes IREE's -inf for 0 ** -n
    r = b("Where", b("Equal", ax, one), one, b("Abs", raised))
    integral = exponent_code in _INTEGERS or (c is not None and np.all(np.floor(c) == c))
    zero, zero_e = b.const(0.0, code), b.const(0, exponent_code)
    steps: list[tuple[str, str]] = []  # (condition, value) pairs, applied innermost first
    if c is None or np.any(_odd(c)):  # a negative base (-0 and -inf too) raised to an odd integer is negative
        two_e = b.const(2, exponent_code)
        if exponent_code in _INTEGERS:
            odd = b("Not", b("Equal", b("Sub", y, b("Mul", b("Div", y, two_e), two_e)), zero_e))
        else:
            halved = b("Floor", b("Mul", y, b.const(0.5, exponent_code)))
            odd = b("Equal", b("Sub", y, b("Mul", halved, two_e)), b.const(1, exponent_code))
        negative = b("Or", b("Less", x, zero), b("Less", b("Reciprocal", x), zero))
        steps.append((b("And", negative, odd), b("Neg", r)))
    if not integral:  # a finite negative base raised to a non-integer is NaN
        finite_negative = b("And", b("Less", x, zero), b("Greater", x, b.const(float("-inf"), code)))
        steps.append((b("And", finite_negative, b("Not", b("Equal", b("Floor", y), y))), b.const(float("nan"), code)))
    if c is None or np.any(c == 0):  # x ** 0 is 1 for every x, a NaN too
        steps.append((b("Equal", y, zero_e), one))
    for i, (condition, value) in enumerate(steps):
        r = b("Where", condition, value, r, out=out if i == len(steps) - 1 else None)
    if not steps:
        b("Identity", r, out=out)
    return b.made


def _odd(values: np.ndarray) -> np.ndarray:
    """Which of `values` (an array) are odd integers."""
    import numpy as np

    values = np.asarray(values)
    odd: np.ndarray
    if values.dtype.kind in "iu":
        odd = values % 2 != 0
        return odd
    with np.errstate(invalid="ignore"):
        odd = np.isfinite(values) & (np.floor(values) == values) & (np.fmod(values, 2) != 0)
        return odd


def _integer_pow(node: Any, code: int, exponent_code: int, exponent: np.ndarray | None, b: _Builder) -> list[Any]:
    """An integer Pow as squarings and products: exact for every result the type holds."""
    import numpy as np

    bits, _ = _INTEGERS[code]
    steps = bits.bit_length() - 1  # |x| >= 2 raised to 2 ** steps or more overflows
    x, y = node.input
    (out,) = node.output
    zero_e, one_e, two_e = (b.const(v, exponent_code) for v in (0, 1, 2))
    # a larger exponent keeps its parity, for the bases -1, 0 and 1 whose powers do not overflow
    e = y
    if exponent is None or not np.all((exponent >= 0) & (exponent < 2**steps)):
        limit = b.const(2**steps - 2, exponent_code)
        parity = b("Abs", b("Sub", y, b("Mul", b("Div", y, two_e), two_e)))
        e = b("Where", b("Less", y, zero_e), zero_e, b("Where", b("Greater", y, limit), b("Add", limit, parity), y))
    result, square = b.const(1, code), x
    for step in range(steps):
        half = b("Div", e, two_e)
        bit = b("Equal", b("Sub", e, b("Mul", half, two_e)), one_e)
        result = b("Where", bit, b("Mul", result, square), result, out=out if step == steps - 1 else None)
        if step < steps - 1:
            square, e = b("Mul", square, square), half
    return b.made


def _topk(node: Any, types: Types, names: _Names, opset: int) -> list[Any] | None:
    """The nodes that make one TopK node order NaN above +inf, or None where its input is not
    floating-point. The order is TopK's over a double key: NaN -> +inf, +inf -> the largest double."""
    from onnx import helper

    x = node.input[0] if node.input else ""
    if not x or len(node.output) < 2 and not node.output[0]:
        return None
    code = _element_type(node, types, (x,), "its order for a NaN could not be made onnx's")
    if code not in _FLOATS or (code == _DOUBLE and opset < 11):
        return None
    b = _Builder(node.name or node.output[0], names)
    wide = x if code == _DOUBLE else b("Cast", x, to=_DOUBLE)
    top, inf = b.const(1.7976931348623157e308, _DOUBLE), b.const(float("inf"), _DOUBLE)
    key = b("Where", b("IsNaN", wide), inf, b("Where", b("Equal", wide, inf), top, wide))
    values, indices = (list(node.output) + [""])[:2]
    key_values = names(f"{b.base}_key_values")
    index_name = indices or names(f"{b.base}_indices")
    sort = helper.make_node("TopK", [key, *node.input[1:]], [key_values, index_name], name=node.name)
    sort.attribute.extend(node.attribute)
    b.node(sort)
    if values:
        if code == _DOUBLE:
            axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), -1)
            b("GatherElements", x, index_name, out=values, axis=axis)
        else:
            narrow = b("Cast", key_values, to=code)
            narrow = b("Where", b("Equal", key_values, top), b.const(float("inf"), code), narrow)
            b("Where", b("Equal", key_values, inf), b.const(float("nan"), code), narrow, out=values)
    return b.made


def _max_pool(node: Any, types: Types, dims: Dims, constants: Constants, producers: dict[str, Any], names: _Names) -> list[Any] | None:
    """The nodes that give one MaxPool node onnx's NaN results, or None where its input is not
    floating-point or it has an Indices output."""
    from onnx import helper

    if len(node.output) != 1 or not node.input or not node.input[0]:
        return None
    x, (out,) = node.input[0], node.output
    code = _element_type(node, types, (x,), "its result for a NaN could not be made onnx's")
    if code not in _FLOATS:
        return None
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    kernel = list(attributes.get("kernel_shape") or [])
    rank = len(kernel)
    strides = list(attributes.get("strides") or [1] * rank)
    dilations = list(attributes.get("dilations") or [1] * rank)
    b = _Builder(node.name or out, names)
    nan, zero = b.const(float("nan"), code), b.const(0.0, code)
    missing = b("IsNaN", x)
    pooled = names(f"{b.base}_numbers")
    pool = helper.make_node("MaxPool", [b("Where", missing, b.const(float("-inf"), code), x)], [pooled], name=node.name)
    pool.attribute.extend(node.attribute)
    b.node(pool)
    first = None
    if set(strides) != {1} or set(dilations) != {1}:
        first = _first_in_window(x, out, attributes, kernel, strides, dilations, dims, constants, producers, b)
    if first is not None:  # the reference's loop keeps a NaN it meets first in a window, and skips later ones
        b("Where", b("IsNaN", first), first, pooled, out=out)
    else:  # NaN where a window holds no number
        numbers = names(f"{b.base}_counted")
        counted = helper.make_node("MaxPool", [b("Cast", b("Not", missing), to=code)], [numbers])
        counted.attribute.extend(node.attribute)
        b.node(counted)
        b("Where", b("Greater", numbers, zero), pooled, nan, out=out)
    return b.made


def _first_in_window(
    x: str, out: str, attributes: dict[str, Any], kernel: list[int], strides: list[int], dilations: list[int],
    dims: Dims, constants: Constants, producers: dict[str, Any], b: _Builder,
) -> str | None:
    """Each window's first element of the input (the first one inside it, in row-major order), or
    None where the input's or the output's spatial size is not known. A Pad with -inf in front of
    the MaxPool (`onnx_model.explicit_pool_pads`) counts as the pool's padding."""
    import math

    import numpy as np
    from onnx import helper

    rank = len(kernel)
    pads = list(attributes.get("pads") or [0] * (2 * rank))
    source = x
    padding = producers.get(x)
    if padding is not None and _is_onnx(padding) and padding.op_type == "Pad":
        pad_attributes = {a.name: helper.get_attribute_value(a) for a in padding.attribute}
        amounts = pad_attributes.get("pads")
        if amounts is None and len(padding.input) > 1:
            amounts = constants.get(padding.input[1])
        value = pad_attributes.get("value")
        if value is None and len(padding.input) > 2 and padding.input[2]:
            value = constants.get(padding.input[2])
        full = len(amounts) // 2 if amounts is not None else 0
        if (
            amounts is not None and value is not None and np.all(np.asarray(value) == -np.inf)
            and pad_attributes.get("mode", b"constant") in (b"constant", "constant") and len(padding.input) < 4
            and full == rank + 2 and not any(amounts[:2]) and not any(amounts[full:full + 2])
        ):
            source = padding.input[0]
            pads = [int(p) + q for p, q in zip([*amounts[2:full], *amounts[full + 2:]], pads)]
    in_shape, out_shape = dims.get(source), dims.get(out)
    if in_shape is None or out_shape is None or len(in_shape) != rank + 2 or len(out_shape) != rank + 2:
        return None
    sizes = [v for v in in_shape[2:] if v is not None]
    outs = [v for v in out_shape[2:] if v is not None]
    if len(sizes) != rank or len(outs) != rank or min(pads, default=0) < 0:  # a spatial size is not known
        return None
    auto_pad = attributes.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    first = source
    for axis in range(rank):
        span = (kernel[axis] - 1) * dilations[axis] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            total = max(0, (outs[axis] - 1) * strides[axis] + span - sizes[axis])
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        elif auto_pad == "VALID":
            begin = 0
        else:
            begin = pads[axis]
        indices: list[int] = []
        for o in range(outs[axis]):
            start = o * strides[axis] - begin
            if start < 0:
                start += math.ceil(-start / dilations[axis]) * dilations[axis]
            indices.append(min(max(start, 0), sizes[axis] - 1))
        if indices != list(range(sizes[axis])):
            first = b("Gather", first, b.ints(indices), axis=axis + 2)
    return first


def _is_number(value: np.ndarray | None) -> bool:
    """Whether `value` (a constant's array, or None) is known and holds no NaN."""
    import numpy as np

    return value is not None and not (value.dtype.kind in "fc" and np.isnan(value).any())


def _element_types(model: Any, wanted: AbstractSet[str], ranked: AbstractSet[str] = frozenset()) -> tuple[Types, dict[str, int]]:
    """Value name -> TensorProto element type, and value name -> rank where known, as the model states
    them in any of its graphs (shape inference where it states no type for a `wanted` value, or no
    rank for a `ranked` one)."""

    def read(graphs: Iterable[Any]) -> tuple[Types, dict[str, int]]:
        found: Types = {}
        ranks: dict[str, int] = {}
        for g in graphs:
            found.update({t.name: t.data_type for t in g.initializer})
            ranks.update({t.name: len(t.dims) for t in g.initializer})
            for value in (*g.input, *g.output, *g.value_info):
                if value.type.HasField("tensor_type"):
                    tensor = value.type.tensor_type
                    if tensor.elem_type:
                        found[value.name] = tensor.elem_type
                    if tensor.HasField("shape"):
                        ranks[value.name] = len(tensor.shape.dim)
            for node in g.node:
                if node.op_type == "Constant":
                    for a in node.attribute:
                        if a.name == "value" and a.HasField("t"):
                            found[node.output[0]] = a.t.data_type
                            ranks[node.output[0]] = len(a.t.dims)
        return found, ranks

    types, ranks = read(_graphs(model.graph))
    if wanted - set(types) or ranked - set(ranks):
        try:
            from onnx import shape_inference

            inferred, inferred_ranks = read(_graphs(shape_inference.infer_shapes(model).graph))
            types = {**inferred, **types}
            ranks = {**inferred_ranks, **ranks}
        except Exception:  # noqa: BLE001 - a model shape inference cannot read keeps the stated types
            pass
    return types, ranks


def _dims(model: Any, wanted: AbstractSet[str]) -> Dims:
    """Value name -> its dimensions (an int, or None where not known), for the `wanted` values
    whose shape the model states or shape inference finds."""

    def read(graphs: Iterable[Any]) -> Dims:
        found: Dims = {}
        for g in graphs:
            for value in (*g.input, *g.output, *g.value_info):
                tensor = value.type.tensor_type if value.type.HasField("tensor_type") else None
                if value.name in wanted and tensor is not None and tensor.HasField("shape"):
                    found[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        return found

    found = read(_graphs(model.graph))
    if any(name not in found or None in found[name] for name in wanted):
        try:
            from onnx import shape_inference

            inferred = read(_graphs(shape_inference.infer_shapes(model).graph))
            found = {**found, **{k: v for k, v in inferred.items() if k not in found or None in found[k]}}
        except Exception:  # noqa: BLE001 - a model shape inference cannot read keeps the stated shapes
            pass
    return found


def _constant_values(graph: Any, wanted: AbstractSet[str]) -> Constants:
    """Value name -> its array, for the `wanted` values that are initializers with inline data (and
    not graph inputs) or Constant nodes' values."""
    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data

    inputs = {i.name for i in graph.input}
    found: Constants = {}
    for tensor in graph.initializer:
        if tensor.name in wanted and tensor.name not in inputs and not uses_external_data(tensor):
            found[tensor.name] = numpy_helper.to_array(tensor)
    for node in graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] in wanted:
            for a in node.attribute:
                if a.name == "value" and a.HasField("t"):
                    found[node.output[0]] = numpy_helper.to_array(a.t)
    return found
