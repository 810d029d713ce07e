"""Index safety: runtime indices and offsets clamped into their tensors, runtime divisors guarded.

A kernel's IR may index a tensor by a value computed at run time: `tensor.extract %t[%i]`
(also inside a `linalg.generic`, as a gather), `tensor.insert`, or a `tensor.extract_slice` /
`tensor.insert_slice` whose offset is not a constant. MLIR leaves an index outside the tensor
undefined, and IREE compiles it to a read or write outside the buffer (IREE has no option that
checks them). `clamp` rewrites a module at IREE's `input` phase (every frontend's ops are
linalg, tensor and arith ops there) so that each such index is clamped into its tensor before
it is used:

- an element index `i` into a dimension of size `n` becomes `max(min(i, n - 1), 0)`;
- a slice offset `o` of a slice of `s` elements with stride `t` becomes
  `max(min(o, n - 1 - (s - 1) * t), 0)`, so the slice's last element is inside the tensor too;
- each coordinate of an `iree_linalg_ext.scatter`'s index tensor (ONNX ScatterElements and
  ScatterND) is clamped like a slice offset, the update slice's extent as its size.

Constant indices are left as they are. An index into an empty dimension stays outside it:
there is no element to read (the shape contract decides which sizes a call may have).

Scalar integer division and remainder (`arith.divsi/divui/remsi/remui/floordivsi/ceildivsi/ceildivui`)
by a runtime divisor kill the process (SIGFPE) for a divisor of zero, and for the signed minimum
divided by -1: the divisor is made 1 in those cases, and a result whose divisor was zero is 0
(the signed minimum divided by -1 gives itself, its remainder 0, as two's complement wraps).
"""

from __future__ import annotations

from typing import Any

from portkern.base.records import frozen_record

#: Names this rewrite in the cache key of code compiled from a source stage, whose bytes do not
#: show whether the compiling portkern clamped (a flow stage's bytes do).
REWRITE = "index-safety=1"
#: MLIR's marker, in a static offset/size/stride list, of a value given as an operand.
DYNAMIC = -(1 << 63)
#: Integer division and remainder ops whose divisor is guarded.
DIVISIONS = (
    "arith.divsi", "arith.divui", "arith.remsi", "arith.remui",
    "arith.floordivsi", "arith.ceildivsi", "arith.ceildivui",
)
#: IREE's scatter (ONNX ScatterElements and ScatterND become one), whose index tensor is clamped.
SCATTER = "iree_linalg_ext.scatter"
_SIGNED = ("arith.divsi", "arith.remsi", "arith.floordivsi", "arith.ceildivsi")


@frozen_record
class Rewritten:
    """What `clamp` changed in a module."""

    #: Indices and offsets clamped.
    indices: int = 0
    #: Divisions and remainders guarded.
    divisions: int = 0


def clamp(module: Any) -> Rewritten:
    """Clamp every runtime index and offset of `module` (an `input`-phase module, changed in
    place) into its tensor, and guard every runtime integer divisor; what was changed."""
    from iree.compiler import ir

    op = getattr(module, "operation", module)
    targets: list[Any] = []

    def visit(found: Any) -> Any:
        if found.name in ("tensor.extract", "tensor.insert", "tensor.extract_slice", "tensor.insert_slice", SCATTER) or found.name in DIVISIONS:
            targets.append(found)
        return ir.WalkResult.ADVANCE

    with op.context:
        op.walk(visit, ir.WalkOrder.PRE_ORDER)
        rewriter = _Rewriter(ir)
        for target in targets:
            with target.location:
                if target.name in DIVISIONS:
                    rewriter.division(target)
                elif target.name in ("tensor.extract", "tensor.insert"):
                    rewriter.element(target)
                elif target.name == SCATTER:
                    rewriter.scatter(target)
                else:
                    rewriter.slice(target)
    return Rewritten(rewriter.indices, rewriter.divisions)


def _constant(value: Any) -> bool:
    """Whether `value` is an `arith.constant`'s result."""
    from iree.compiler import ir

    return not isinstance(value.owner, ir.Block) and value.owner.name == "arith.constant"


class _Rewriter:
    def __init__(self, ir: Any) -> None:
        self.ir = ir
        self.index = ir.IndexType.get()
        self.indices = 0
        self.divisions = 0

    # -- building -----------------------------------------------------------

    def _op(self, name: str, operands: list[Any], result: Any | None = None, **attributes: Any) -> Any:
        return self.ir.Operation.create(name, results=[result or operands[0].type], operands=operands, attributes=attributes).result

    def _const(self, value: int, kind: Any = None) -> Any:
        kind = kind or self.index
        return self._op("arith.constant", [], kind, value=self.ir.IntegerAttr.get(kind, value))

    def _upper(self, tensor: Any, axis: int, reach: Any) -> Any:
        """The size of `tensor`'s dimension `axis` less `reach` (an int or an index value)."""
        shape = self.ir.RankedTensorType(tensor.type)
        if not shape.is_dynamic_dim(axis) and isinstance(reach, int):
            return self._const(shape.get_dim_size(axis) - reach)
        size = self._const(shape.get_dim_size(axis)) if not shape.is_dynamic_dim(axis) else self._dim(tensor, axis)
        return self._op("arith.subi", [size, self._const(reach) if isinstance(reach, int) else reach])

    def _dim(self, tensor: Any, axis: int) -> Any:
        """A `tensor.dim` of `tensor`'s dimension `axis`, placed right after the tensor is defined
        (so it dominates every use, inside regions too)."""
        owner = tensor.owner
        if isinstance(owner, self.ir.Block):
            point = self.ir.InsertionPoint.at_block_begin(owner)
        else:
            point = self.ir.InsertionPoint.after(owner)
        with point:
            return self._op("tensor.dim", [tensor, self._const(axis)], self.index)

    def _clamped(self, value: Any, upper: Any) -> Any:
        """`max(min(value, upper), 0)` (signed)."""
        self.indices += 1
        return self._op("arith.maxsi", [self._op("arith.minsi", [value, upper]), self._const(0)])

    # -- rewrites -----------------------------------------------------------

    def element(self, op: Any) -> None:
        """`tensor.extract %t[%i, ...]` / `tensor.insert %v into %t[%i, ...]`: each runtime index in [0, n - 1]."""
        tensor_at = 0 if op.name == "tensor.extract" else 1
        tensor = op.operands[tensor_at]
        with self.ir.InsertionPoint(op):
            for axis, position in enumerate(range(tensor_at + 1, len(op.operands))):
                value = op.operands[position]
                if _constant(value):
                    continue
                op.operands[position] = self._clamped(value, self._upper(tensor, axis, 1))

    def slice(self, op: Any) -> None:
        """`tensor.extract_slice` / `tensor.insert_slice`: each runtime offset so that the slice's
        first and last element are inside the sliced tensor (its source, or the insert's dest)."""
        ir = self.ir
        statics = {key: list(ir.DenseI64ArrayAttr(op.attributes[key])) for key in ("static_offsets", "static_sizes", "static_strides")}
        if DYNAMIC not in statics["static_offsets"]:
            return
        first = 1 if op.name == "tensor.extract_slice" else 2
        tensor = op.operands[0 if op.name == "tensor.extract_slice" else 1]
        operands = {}
        position = first
        for key in ("static_offsets", "static_sizes", "static_strides"):
            for axis, value in enumerate(statics[key]):
                if value == DYNAMIC:
                    operands[key, axis] = position
                    position += 1
        with ir.InsertionPoint(op):
            for axis, offset in enumerate(statics["static_offsets"]):
                if offset != DYNAMIC or _constant(op.operands[operands["static_offsets", axis]]):
                    continue
                size, stride = statics["static_sizes"][axis], statics["static_strides"][axis]
                reach: Any
                if size != DYNAMIC and stride != DYNAMIC:
                    reach = max(size - 1, 0) * stride + 1  # the slice spans (s - 1) * t + 1 elements
                else:
                    s = self._const(size) if size != DYNAMIC else op.operands[operands["static_sizes", axis]]
                    t = self._const(stride) if stride != DYNAMIC else op.operands[operands["static_strides", axis]]
                    span = self._op("arith.muli", [self._op("arith.maxsi", [self._op("arith.subi", [s, self._const(1)]), self._const(0)]), t])
                    reach = self._op("arith.addi", [span, self._const(1)])
                at = operands["static_offsets", axis]
                op.operands[at] = self._clamped(op.operands[at], self._upper(tensor, axis, reach))

    def scatter(self, op: Any) -> None:
        """`iree_linalg_ext.scatter`: its index tensor (batch dimensions, then one coordinate per
        `dimension_map` entry) replaced by one whose every coordinate is clamped so that the update
        slice written there is inside the original tensor."""
        ir = self.ir
        updates, indices, original = op.operands[0], op.operands[1], op.operands[2]
        itype, rank = ir.RankedTensorType(indices.type), ir.RankedTensorType(original.type).rank
        dimension_map = list(ir.DenseI64ArrayAttr(op.attributes["dimension_map"]))
        depth = len(dimension_map)
        explicit = itype.rank > 1 and not itype.is_dynamic_dim(itype.rank - 1) and itype.get_dim_size(itype.rank - 1) == depth
        batch = itype.rank - 1 if explicit else itype.rank  # indices of depth 1 may leave the coordinate dimension out
        window = ir.RankedTensorType(updates.type).rank - batch  # the update slice's rank: original's last dimensions
        with ir.InsertionPoint(op):
            bounds = []
            for d in dimension_map:
                reach = 1
                if d >= rank - window:  # the update slice spans this dimension
                    axis = batch + d - (rank - window)
                    utype = ir.RankedTensorType(updates.type)
                    reach = utype.get_dim_size(axis) if not utype.is_dynamic_dim(axis) else self._dim(updates, axis)
                bounds.append(self._upper(original, d, reach))
            sizes = [self._dim(indices, axis) for axis in range(itype.rank) if itype.is_dynamic_dim(axis)]
            empty = self._op("tensor.empty", sizes, itype)
            identity = ir.AffineMapAttr.get(ir.AffineMap.get_identity(itype.rank))
            parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")
            generic = ir.Operation.create(
                "linalg.generic", results=[itype], operands=[indices, empty], regions=1,
                attributes={"indexing_maps": ir.ArrayAttr.get([identity, identity]),
                            "iterator_types": ir.ArrayAttr.get([parallel] * itype.rank),
                            "operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 1])},
            )
            element = itype.element_type
            body = generic.regions[0].blocks.append(element, element)
        with ir.InsertionPoint(body):
            bound = bounds[-1]
            if len(bounds) > 1:
                coordinate = self._op("linalg.index", [], self.index, dim=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), itype.rank - 1))
                eq = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0)
                for k in range(len(bounds) - 2, -1, -1):
                    here = self._op("arith.cmpi", [coordinate, self._const(k)], ir.IntegerType.get_signless(1), predicate=eq)
                    bound = self._op("arith.select", [here, bounds[k], bound], self.index)
            bound = self._op("arith.index_cast", [bound], element)
            self.indices += 1
            value = self._op("arith.maxsi", [self._op("arith.minsi", [body.arguments[0], bound]), self._const(0, element)])
            ir.Operation.create("linalg.yield", results=[], operands=[value])
        op.operands[1] = generic.result

    def division(self, op: Any) -> None:
        """A runtime integer divisor: 1 where it is 0 (the result then 0), and where a signed
        minimum is divided by -1."""
        ir = self.ir
        lhs, rhs = op.operands[0], op.operands[1]
        kind = rhs.type
        if _constant(rhs) or not isinstance(kind, (ir.IntegerType, ir.IndexType)):
            return
        self.divisions += 1
        flag = ir.IntegerType.get_signless(1)
        with ir.InsertionPoint(op):
            zero = self._const(0, kind)
            one = self._const(1, kind)
            is_zero = self._op("arith.cmpi", [rhs, zero], flag, predicate=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0))
            unsafe = is_zero
            if op.name in _SIGNED and isinstance(kind, ir.IntegerType):
                width = kind.width
                eq = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0)
                minimum = self._op("arith.cmpi", [lhs, self._const(-(1 << (width - 1)), kind)], flag, predicate=eq)
                minus_one = self._op("arith.cmpi", [rhs, self._const(-1, kind)], flag, predicate=eq)
                unsafe = self._op("arith.ori", [is_zero, self._op("arith.andi", [minimum, minus_one])])
            op.operands[1] = self._op("arith.select", [unsafe, one, rhs], kind)
        with ir.InsertionPoint.after(op):
            result = op.results[0]
            guarded = self._op("arith.select", [is_zero, self._const(0, kind), result], kind)
        result.replace_all_uses_except(guarded, guarded.owner.operation)
