"""An ONNX model made ready to be one kernel: its graph named after the kernel, its values given
identifier names, and what it needs described (operators, inputs) for refusals and callers."""

from __future__ import annotations

import re
from dataclasses import dataclass

_LOCATION = re.compile(r"(?:^|\s)-:(\d+):\d+:")
_OPERATOR = re.compile(r'"onnx\.(\w+)"')


@dataclass(frozen=True)
class GraphInput:
    """One input a caller passes (graph inputs that are initializers are not passed)."""

    name: str
    #: The name the kernel's source uses (an identifier).
    kernel_name: str


def kernel_name(text: str) -> str:
    """A kernel name (letters, digits, underscores) for a model name."""
    return "".join(c if c.isalnum() else "_" for c in text).strip("_") or "model"


def identifier(name: str) -> str:
    """A value name as an identifier (`0` -> `v_0`); identifiers and the empty name stay as they are."""
    return name if not name or name.isidentifier() else "v_" + kernel_name(name)


def as_kernel(model, name: str):
    """A copy of an `onnx.ModelProto` with its graph named `name`, every value named by `identifier`,
    and legacy per-channel PRelu slopes made explicit (`channel_slopes`)."""
    import onnx

    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    proto.graph.name = name
    _rename(proto.graph)
    channel_slopes(proto)
    return proto


def channel_slopes(model) -> None:
    """Before opset 7, a PRelu slope of shape [C] applies per channel (axis 1) of an input of any rank;
    from opset 7 it broadcasts from the last axis, which is what IREE's importer does after upgrading.
    Such a slope initializer is reshaped to [C, 1, ...] in place, which means the same in both."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset >= 7:
        return
    graph = model.graph
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim] for v in graph.input}
    initializers = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type != "PRelu" or len(node.input) != 2 or node.input[1] not in initializers:
            continue
        x, slope = shapes.get(node.input[0]), initializers[node.input[1]]
        if x is None or len(x) <= 2 or len(slope.dims) != 1 or slope.dims[0] in (1, None) or slope.dims[0] != x[1]:
            continue
        dims = [slope.dims[0]] + [1] * (len(x) - 2)
        slope.dims[:] = dims
        for value in graph.input:
            if value.name == slope.name:
                del value.type.tensor_type.shape.dim[:]
                for d in dims:
                    value.type.tensor_type.shape.dim.add().dim_value = d


def graph_inputs(model) -> list[GraphInput]:
    """The inputs a caller passes, in order (initializers listed as inputs are left out)."""
    initializers = {t.name for t in model.graph.initializer}
    return [GraphInput(v.name, identifier(v.name)) for v in model.graph.input if v.name not in initializers]


def operators(model) -> list[str]:
    """The graph's operator types (`domain.Op` outside the default domain), in first-use order."""
    seen: dict[str, None] = {}
    for node in model.graph.node:
        seen.setdefault(f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type)
    return list(seen)


def _rename(graph) -> None:
    for value in (*graph.input, *graph.output, *graph.value_info):
        value.name = identifier(value.name)
    for tensor in graph.initializer:
        tensor.name = identifier(tensor.name)
    for node in graph.node:
        node.input[:] = [identifier(n) for n in node.input]
        node.output[:] = [identifier(n) for n in node.output]


def failing_operator(mlir: bytes, message: str) -> str | None:
    """The ONNX operator at the first source line a compiler diagnostic on the importer's MLIR names
    (each graph node is imported as ops on lines of their own), or None."""
    found = _LOCATION.search(message)
    lines = mlir.splitlines()
    if found is None or not 0 < int(found.group(1)) <= len(lines):
        return None
    line = lines[int(found.group(1)) - 1].decode("utf-8", "replace")
    operator = _OPERATOR.search(line)
    return operator.group(1) if operator else None
