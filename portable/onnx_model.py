"""An ONNX model made ready to be one kernel: the one preparation every ONNX intake passes through
(`prepare`: legacy PRelu slopes, padded MaxPools IREE cannot lower, Gathers of one constant
index as slices), its graph named after the
kernel, and what it needs described (operators, inputs) for refusals and callers. Value names
stay as the model states them: they are data (`portable.contract` derives identifiers beside them)."""

from __future__ import annotations

import re
from typing import Any

from portkern.base.records import frozen_record
from portkern.portable.contract import identifier

_LOCATION = re.compile(r"(?:^|\s)-:(\d+):\d+:")
_OPERATOR = re.compile(r'"onnx\.(\w+)"')


@frozen_record
class GraphInput:
    """One input a caller passes (graph inputs that are initializers are not passed)."""

    name: str
    #: Its identifier form (`portable.contract.identifier`), for keyword arguments.
    kernel_name: str


def constant_value(node: Any) -> Any | None:
    """The tensor a Constant node's `value` attribute holds (None for other nodes and other forms)."""
    if node.op_type != "Constant":
        return None
    return next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)


def names_taken(graph: Any) -> set[str]:
    """Every value name the graph's nodes, initializers, inputs, outputs and value_info entries use."""
    declared = {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    return {name for node in graph.node for name in (*node.input, *node.output)} | declared | {t.name for t in graph.initializer}


def kernel_name(text: str) -> str:
    """A kernel name (letters, digits, underscores) for a model name."""
    return "".join(c if c.isalnum() else "_" for c in text).strip("_") or "model"


def as_kernel(model: Any, name: str) -> Any:
    """A copy of an `onnx.ModelProto` with its graph named `name` (the entry function's name); its
    values keep their names, and the build prepares it like any ONNX source (`prepare`)."""
    import onnx

    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    proto.graph.name = name
    return proto


def prepare(model: Any) -> bool:
    """The one preparation of an ONNX model for IREE's importer, in place, whichever way it came in
    (a manifest's `.onnx` source, `portkern.onnx.prepare`): legacy per-channel PRelu slopes made
    explicit (`channel_slopes`), asymmetric MaxPool padding made an explicit Pad (`explicit_pool_pads`),
    Constant values named (`named_constants`), shape arithmetic on constants computed (`fold_shape_constants`)
    and Gathers of one constant index made slices (`gathers_as_slices`). Whether it changed the model."""
    slopes = channel_slopes(model)
    pads = explicit_pool_pads(model)
    named = named_constants(model)
    folded = fold_shape_constants(model)
    sliced = gathers_as_slices(model)
    return slopes or pads or named or folded > 0 or sliced > 0


#: Operators of shape arithmetic that `fold_shape_constants` computes when every input is a constant.
SHAPE_ARITHMETIC = frozenset({
    "Add", "And", "Cast", "Concat", "ConstantOfShape", "Div", "Equal", "Gather", "Greater", "Less", "Mul",
    "Not", "Or", "Range", "Reshape", "Shape", "Slice", "Squeeze", "Sub", "Unsqueeze", "Where",
})
#: Constants of at most this many elements take part in `fold_shape_constants`.
SHAPE_CONSTANT_ELEMENTS = 64


def fold_shape_constants(model: Any) -> int:
    """Each node of shape arithmetic (`SHAPE_ARITHMETIC`) whose inputs are all small constants and
    whose outputs are small integer or boolean tensors replaced, in place, by Constant nodes of its
    outputs as onnx's reference computes them. torch's TorchScript exporter writes an `expand` to
    `[-1, ...]` as `Where(Equal(shape, -1), ConstantOfShape(...), shape)` over constants, which
    onnx's shape inference does not follow: the expanded value, and what follows it, is then typed
    with unknown dimensions that IREE's `Reshape` lowering does not take back to known ones (GPT-2's
    causal mask). How many nodes were replaced."""
    import math

    import numpy as np
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    overridable = {v.name for v in graph.input}  # an initializer that is also an input may be fed (IR < 4)
    kept = {o.name for o in graph.output}
    constants: dict[str, Any] = {}
    for tensor in graph.initializer:
        if tensor.name not in overridable and math.prod(tensor.dims) <= SHAPE_CONSTANT_ELEMENTS and not tensor.external_data:
            constants[tensor.name] = numpy_helper.to_array(tensor)
    nodes, folded = [], 0
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
            value = constant_value(node)
            if value is not None and math.prod(value.dims) <= SHAPE_CONSTANT_ELEMENTS:
                constants[node.output[0]] = numpy_helper.to_array(value)
        outputs = None
        if (
            node.op_type in SHAPE_ARITHMETIC and node.domain in ("", "ai.onnx") and node.input
            and all(not name or name in constants for name in node.input) and not kept.intersection(node.output)
        ):
            single = helper.make_graph(
                [node], "fold", [], [helper.make_tensor_value_info(o, 0, None) for o in node.output],
                [numpy_helper.from_array(np.asarray(constants[name]), name) for name in dict.fromkeys(node.input) if name],
            )
            try:
                outputs = ReferenceEvaluator(helper.make_model(single, opset_imports=model.opset_import)).run(None, {})
            except Exception:  # noqa: BLE001 - a node onnx's reference cannot compute stays as it is
                outputs = None
        if outputs is None or not all(
            isinstance(o, np.ndarray) and o.dtype.kind in "iub" and o.size <= SHAPE_CONSTANT_ELEMENTS for o in outputs
        ):
            nodes.append(node)
            continue
        for name, value in zip(node.output, outputs):
            constants[name] = value
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name)))
        folded += 1
    if folded:
        del graph.node[:]
        graph.node.extend(nodes)
    return folded


def named_constants(model: Any) -> bool:
    """Each Constant node's unnamed value tensor named after the node's output, in place: IREE's
    importer makes a large one a parameter named after the tensor, and an empty name after a random
    one (`torch.onnx.export(..., dynamo=False)` writes such Constants, BERT's position ids).
    Whether one was named."""
    changed = False
    for node in model.graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or not node.output or not node.output[0]:
            continue
        for attribute in node.attribute:
            if attribute.name == "value" and attribute.HasField("t") and not attribute.t.name:
                attribute.t.name = node.output[0]
                changed = True
    return changed


def channel_slopes(model: Any) -> bool:
    """Before opset 7, a PRelu slope of shape [C] applies per channel (axis 1) of an input of any rank;
    from opset 7 it broadcasts from the last axis, which is what IREE's importer does after upgrading.
    Such a slope initializer is reshaped to [C, 1, ...] in place, which means the same in both.
    Whether one was."""
    opset = _opset(model)
    if opset >= 7:
        return False
    changed = False
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
        changed = True
        for value in graph.input:
            if value.name == slope.name:
                del value.type.tensor_type.shape.dim[:]
                for d in dims:
                    value.type.tensor_type.shape.dim.add().dim_value = d
    return changed


def explicit_pool_pads(model: Any) -> bool:
    """A MaxPool whose padding differs at the two ends of an axis (Caffe2 exports write
    `pads: [0, 0, 1, 1]`) becomes a Pad with -inf followed by an unpadded MaxPool, in place: the
    same values, since every window keeps at least one element of the input. IREE 3.13 lowers
    the padded form through an f64 constant it cannot truncate to f32 when f64 stays f64
    (`lower.BUILD_FLAGS`), so `light_bvlc_alexnet` and `light_inception_v2` failed to build.
    MaxPools with `auto_pad`, `ceil_mode`, a second output or equal padding are left alone.
    Whether one was rewritten."""
    from onnx import TensorProto, helper

    opset = _opset(model)
    graph = model.graph
    lowest = _lowest()
    types: dict[str, int] | None = None
    taken = names_taken(graph)
    nodes: list[Any] = []
    changed = False
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        pads = list(attrs.get("pads") or [])
        spatial = len(pads) // 2
        plain = (
            node.op_type == "MaxPool" and node.domain in ("", "ai.onnx") and len(node.output) == 1 and spatial
            and attrs.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET") and not attrs.get("ceil_mode")
            and pads[:spatial] != pads[spatial:] and min(pads) >= 0
        )
        if plain and opset >= 11 and types is None:
            types = _element_types(model)
        element = types.get(node.input[0]) if types is not None and plain and opset >= 11 else TensorProto.FLOAT
        if not plain or element is None or element not in lowest:
            nodes.append(node)
            continue
        padded = _fresh(f"{node.input[0]}.padded", taken)
        full = [0, 0, *pads[:spatial], 0, 0, *pads[spatial:]]
        if opset >= 11:
            pads_name, value_name = _fresh(f"{padded}.pads", taken), _fresh(f"{padded}.value", taken)
            graph.initializer.append(helper.make_tensor(pads_name, TensorProto.INT64, [len(full)], full))
            graph.initializer.append(helper.make_tensor(value_name, element, [], [lowest[element]]))
            nodes.append(helper.make_node("Pad", [node.input[0], pads_name, value_name], [padded], mode="constant"))
        else:
            nodes.append(helper.make_node("Pad", [node.input[0]], [padded], mode="constant", pads=full, value=float("-inf")))
        pool = helper.make_node("MaxPool", [padded], list(node.output), name=node.name)
        pool.attribute.extend(a for a in node.attribute if a.name != "pads")
        nodes.append(pool)
        changed = True
    if changed:
        del graph.node[:]
        graph.node.extend(nodes)
        if opset < 11:  # upgrading Pad to opset 11 adds initializers that IR 3 would need listed as inputs
            model.ir_version = max(model.ir_version, 4)
    return changed


def gathers_as_slices(model: Any) -> int:
    """Each main-graph Gather of one constant index (a 0-d initializer that is not a graph input, or a
    Constant node's 0-d value) from a tensor of rank 2 or more whose axis has a known size and holds
    the index becomes, in place, a Slice of that one position and a Squeeze of the axis: the same
    values. IREE 3.13 lowers such a Gather to an element-wise gather that it does not vectorise
    (`nn.MultiheadAttention` splits its packed query, key and value projection with three), and a
    Slice to a copy that it does. Rank-1 data (shape arithmetic) and indices out of range are left
    to the Gather. Needs opset 13 (Squeeze's axes as an input). How many Gathers were rewritten."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    if _opset(model) < 13:
        return 0
    inputs = {v.name for v in graph.input}
    indices = {t.name: t for t in graph.initializer if t.name not in inputs and not t.dims}
    indices.update((n.output[0], v) for n in graph.node if (v := constant_value(n)) is not None and not v.dims and n.output)
    candidates = [
        (at, n) for at, n in enumerate(graph.node)
        if n.op_type == "Gather" and n.domain in ("", "ai.onnx") and len(n.input) == 2 and n.input[1] in indices
        and indices[n.input[1]].data_type in (TensorProto.INT32, TensorProto.INT64)
    ]
    if not candidates:
        return 0
    dims = _dims(model)
    taken = names_taken(graph)
    replaced: dict[int, list[Any]] = {}
    for at, node in candidates:
        shape = dims.get(node.input[0])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if shape is None or len(shape) < 2 or not -len(shape) <= axis < len(shape):
            continue
        axis %= len(shape)
        index, size = int(numpy_helper.to_array(indices[node.input[1]])), shape[axis]
        if size is None or not -size <= index < size:
            continue
        index %= size
        base = node.output[0]
        starts, ends, axes = (_fresh(f"{base}.{part}", taken) for part in ("starts", "ends", "axes"))
        sliced = _fresh(f"{base}.slice", taken)
        for name, value in ((starts, index), (ends, index + 1), (axes, axis)):
            graph.initializer.append(helper.make_tensor(name, TensorProto.INT64, [1], [value]))
        replaced[at] = [
            helper.make_node("Slice", [node.input[0], starts, ends, axes], [sliced], name=f"{node.name}.slice"),
            helper.make_node("Squeeze", [sliced, axes], [base], name=f"{node.name}.squeeze"),
        ]
    if replaced:
        nodes = [m for at, n in enumerate(graph.node) for m in replaced.get(at, [n])]
        del graph.node[:]
        graph.node.extend(nodes)
    return len(replaced)


def _dims(model: Any) -> dict[str, list[int | None]]:
    """Value name -> its dims (None where not a fixed size), from the model's declarations and shape inference."""
    dims: dict[str, list[int | None]] = {t.name: list(t.dims) for t in model.graph.initializer}
    for value in _tensor_values(model):
        if value.type.tensor_type.HasField("shape"):
            dims[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]
    return dims


def _opset(model: Any) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def _lowest() -> dict[int, float]:
    """Element type -> the value a MaxPool's padding holds."""
    from onnx import TensorProto

    inf = float("-inf")
    return {TensorProto.FLOAT: inf, TensorProto.DOUBLE: inf, TensorProto.FLOAT16: inf, TensorProto.INT8: -128, TensorProto.UINT8: 0}


def _element_types(model: Any) -> dict[str, int]:
    """Value name -> ONNX element type, from the model's declarations and shape inference."""
    types = {t.name: t.data_type for t in model.graph.initializer}
    types.update((value.name, value.type.tensor_type.elem_type) for value in _tensor_values(model))
    return types


def _tensor_values(model: Any) -> list[Any]:
    """The tensor-typed inputs, value_info entries and outputs of the main graph, as declared and
    as shape inference completes them (inference is best effort: where it fails, as declared)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is best effort; declared types still count
        inferred = model
    return [v for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output) if v.type.HasField("tensor_type")]


def _fresh(name: str, taken: set[str]) -> str:
    candidate, count = name, 1
    while candidate in taken:
        count += 1
        candidate = f"{name}{count}"
    taken.add(candidate)
    return candidate


def graph_inputs(model: Any) -> list[GraphInput]:
    """The inputs a caller passes, in order (initializers listed as inputs are left out)."""
    initializers = {t.name for t in model.graph.initializer}
    return [GraphInput(v.name, identifier(v.name)) for v in model.graph.input if v.name not in initializers]


def operators(model: Any) -> list[str]:
    """The graph's operator types (`domain.Op` outside the default domain), in first-use order."""
    seen: dict[str, None] = {}
    for node in model.graph.node:
        seen.setdefault(f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type)
    return list(seen)


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
