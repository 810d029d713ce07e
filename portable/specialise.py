"""Specialising a kernel's portable (flow) stage to static sizes.

At IREE's `flow` phase the entry function reads each dynamic argument
dimension with `hal.buffer_view.dim`; replacing those reads by constants lets
IREE fold the sizes into every dispatch, which then compiles (and tunes) as a
static kernel. The entry still asserts each argument's shape when called, so
specialised code refuses other sizes with a runtime error instead of misreading
memory; callers only use it for the sizes it was made for.
"""

from __future__ import annotations

from typing import Mapping

from portkern.base.errors import CompileError
from portkern.portable.compiler import Compiler, bytecode, operations
from portkern.portable.contract import ShapeContract


def specialise(compiler: Compiler, stage: bytes, entry: str, contract: ShapeContract, values: Mapping[str, int], name: str) -> bytes:
    """The flow-stage bytecode with every dynamic argument dimension fixed to its symbol's value."""
    from iree.compiler import ir
    from iree.compiler.dialects import arith

    module = compiler.parse(stage, name=name)
    replaced = 0
    with compiler.context, ir.Location.unknown():
        for op in operations(module):
            if op.name not in ("util.func", "func.func") or str(op.attributes["sym_name"]).strip('"') not in (entry, f"{entry}$async"):
                continue
            views = [a for a in op.regions[0].blocks[0].arguments if "buffer_view" in str(a.type)]
            index = {arg: i for i, arg in enumerate(views)}
            for inner in operations(op)[1:]:
                if inner.name != "hal.buffer_view.dim" or inner.operands[0] not in index:
                    continue
                arg, axis = index[inner.operands[0]], ir.IntegerAttr(inner.attributes["index"]).value
                dim = contract.inputs[arg][axis] if arg < len(contract.inputs) and axis < len(contract.inputs[arg]) else None
                size = values.get(dim) if isinstance(dim, str) else dim
                if size is None:
                    raise CompileError(f"{name}: no size for argument {arg} dimension {axis} ({dim})")
                with ir.InsertionPoint(inner):
                    constant = arith.ConstantOp(ir.IndexType.get(), int(size))
                inner.results[0].replace_all_uses_with(constant.result)
                inner.erase()
                replaced += 1
    if not replaced and any(isinstance(d, str) for shape in contract.inputs for d in shape):
        raise CompileError(f"{name}: the flow stage reads no dynamic dimension of {entry!r}; cannot specialise it")
    return bytecode(module)
