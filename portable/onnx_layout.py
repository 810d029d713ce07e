"""ONNX MatMul weights stored in the layout IREE's CPU code reads best: transposed.

A `MatMul(A, W)` whose `W` is a 2-D initializer of shape (K, N) reads W a column slab per
output tile: strided rows, a few hundred bytes each. Stored as Wt (N, K) and used as
`MatMul(A, Transpose(Wt))`, which IREE fuses into one matmul reading Wt row by row, the same
model ran 6.7x faster (`bench/matmul_layout.py`: batch 8, two 16384x16384 f32 layers mapped as
parameters, 488 -> 72 ms a call; batch 512 over 4096x4096 layers: 3.2x).
`Gemm(A, W, C)` with `transB=0` becomes `Gemm(A, Wt, C, transB=1)`. The model computes the
same function; the bundle's parameter section holds Wt.

An initializer is transposed only when every use of it is such an input (not a graph
input, output or value_info entry, not used inside a subgraph) and it has at least the
parameter threshold's elements (`onnx_parameters.ELEMENTS_THRESHOLD`). Inline values are
transposed here; an initializer whose bytes are external data keeps them where they are and is
marked (`TRANSPOSED_KEY`), so that its reader streams the transpose
(`portable.parameters.transposed_file_pieces`).

**Boolean parameters are stored as bytes** (`bool_parameters_as_bytes`): a BOOL initializer
(or Constant node value) that becomes a parameter is stored as UINT8, the same bytes, and a
`Cast(to=BOOL)` gives the model its boolean tensor back. IREE 3.13 fails to build code that
reads an `i1` parameter with data tiling (an attention mask of transformers' exports: "buffer
and tensor shapes must be compatible", "large vector sizes"); an `i8` one builds, and the
compiler's default code is the same computation.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

from portkern.portable.onnx_model import constant_value, names_taken

#: External-data entry of an initializer whose stored bytes (in its file) are the transpose
#: of the (reversed) dims the model now states.
TRANSPOSED_KEY = "portkern-transposed"
#: Prefix of the Transpose nodes this module inserts (and of their outputs).
NODE_PREFIX = "portkern_transposed_"
#: Prefix of the UINT8 tensors that hold boolean parameters' bytes.
BYTES_PREFIX = "portkern_bytes_"


def transpose_matmul_weights(model: Any, threshold: int) -> list[str]:
    """Rewrite `model` (an `onnx.ModelProto`, in place) so that its eligible MatMul and Gemm
    weights are stored transposed; the names of the initializers transposed."""
    from onnx import helper

    graph = model.graph
    uses = _uses(graph)
    declared = {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    inner = {name for node in graph.node for sub in _subgraphs(node) for name in _names_used(sub)}
    taken = names_taken(graph)
    chosen, transposes = [], []
    for tensor in graph.initializer:
        count = math.prod(tensor.dims)
        if len(tensor.dims) != 2 or count < threshold or tensor.name in declared or tensor.name in inner:
            continue
        if not uses.get(tensor.name) or not all(_reads_as_matmul_rhs(node, index) for node, index in uses[tensor.name]):
            continue
        if not _transpose_initializer(tensor):
            continue
        chosen.append(tensor.name)
        transposed = None
        for node, index in uses[tensor.name]:
            if node.op_type == "Gemm":
                _set_trans_b(node)
                continue
            if transposed is None:
                transposed = _fresh(NODE_PREFIX + tensor.name, taken)
                transposes.append(helper.make_node("Transpose", [tensor.name], [transposed], name=transposed, perm=[1, 0]))
            node.input[index] = transposed
    if transposes:  # first in the graph (a repeated field is copied into, so this comes last)
        nodes = [*transposes, *graph.node]
        del graph.node[:]
        graph.node.extend(nodes)
    return chosen


def bool_parameters_as_bytes(model: Any, threshold: int) -> list[str]:
    """Rewrite `model` (an `onnx.ModelProto`, in place) so that each BOOL tensor of at least
    `threshold` elements that would become a parameter (an initializer of the main graph that
    is not a graph input, or the value of a main-graph Constant node) is stored as UINT8 under
    a fresh name and cast back to BOOL under its own name; the names of the tensors rewritten."""
    from onnx import TensorProto, helper

    graph = model.graph
    inputs = {v.name for v in graph.input}
    taken = names_taken(graph)
    chosen: list[str] = []
    casts = []
    for tensor in graph.initializer:
        if tensor.data_type != TensorProto.BOOL or math.prod(tensor.dims) < threshold or tensor.name in inputs:
            continue
        name = tensor.name
        tensor.name = _fresh(BYTES_PREFIX + name, taken)
        tensor.data_type = TensorProto.UINT8  # (raw, int32_data and external bytes hold UINT8 as BOOL: one byte, one int each)
        casts.append(helper.make_node("Cast", [tensor.name], [name], name=tensor.name + "_cast", to=TensorProto.BOOL))
        chosen.append(name)
    nodes = []
    for node in graph.node:
        nodes.append(node)
        value = constant_value(node)
        if value is None or value.data_type != TensorProto.BOOL or math.prod(value.dims) < threshold or not node.output[0]:
            continue
        name = node.output[0]
        node.output[0] = value.name = _fresh(BYTES_PREFIX + name, taken)  # (the importer names the parameter after the value)
        value.data_type = TensorProto.UINT8
        nodes.append(helper.make_node("Cast", [node.output[0]], [name], name=node.output[0] + "_cast", to=TensorProto.BOOL))
        chosen.append(name)
    if chosen:  # the initializers' casts first in the graph, each Constant's right after it
        del graph.node[:]
        graph.node.extend([*casts, *nodes])
    return chosen


def _reads_as_matmul_rhs(node: Any, index: int) -> bool:
    if node.domain not in ("", "ai.onnx") or index != 1:
        return False
    if node.op_type == "MatMul":
        return True
    return node.op_type == "Gemm" and _attribute(node, "transB", 0) == 0


def _transpose_initializer(tensor: Any) -> bool:
    """Reverse the initializer's dims and transpose its values (inline) or mark its external
    bytes as to be read transposed; False for a type whose values this cannot move."""
    from onnx import TensorProto, numpy_helper
    from onnx.external_data_helper import uses_external_data

    if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED) or tensor.HasField("segment"):
        return False
    if uses_external_data(tensor):
        if any(e.key == TRANSPOSED_KEY for e in tensor.external_data):
            return False
        tensor.dims[:] = list(reversed(tensor.dims))
        entry = tensor.external_data.add()
        entry.key, entry.value = TRANSPOSED_KEY, "1"
        return True
    try:
        values = numpy_helper.to_array(tensor)
    except Exception:  # noqa: BLE001 - a type numpy cannot hold (sub-byte, custom floats): left as it is
        return False
    if values.dtype.kind not in "biuf" or values.ndim != 2:
        return False
    tensor.CopyFrom(numpy_helper.from_array(values.T.copy(), tensor.name))
    return True


def _set_trans_b(node: Any) -> None:
    from onnx import helper

    kept = [a for a in node.attribute if a.name != "transB"]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute("transB", 1)])


def _attribute(node: Any, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            value: int = attribute.i
            return value
    return default


def _uses(graph: Any) -> dict[str, list[tuple[Any, int]]]:
    found: dict[str, list[tuple[Any, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            found.setdefault(name, []).append((node, index))
    return found


def _subgraphs(node: Any) -> Iterator[Any]:
    for attribute in node.attribute:
        if attribute.HasField("g"):
            yield attribute.g
        yield from attribute.graphs


def _names_used(graph: Any) -> Iterator[str]:
    for node in graph.node:
        yield from node.input
        for sub in _subgraphs(node):
            yield from _names_used(sub)


def _fresh(name: str, taken: set[str]) -> str:
    candidate, n = name, 0
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    taken.add(candidate)
    return candidate
