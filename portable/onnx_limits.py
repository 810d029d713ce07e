"""ONNX operator uses that IREE (3.13) imports and compiles but computes wrong: refused at build,
naming the operator and the reason, before any result can be wrong.

Each rule was found by the ONNX backend conformance cases (`bench/onnx_conformance.py`): the case
built and ran, and its results differed from onnx's reference beyond the case's tolerance.
"""

from __future__ import annotations

from typing import Any, Callable

from portkern.base.errors import BuildError
from portkern.base.records import frozen_record


@frozen_record
class Use:
    """One node as a rule sees it: its operator, attributes, and the element type and rank of
    each input ("" and None where an input is absent or its type unknown)."""

    op: str
    attributes: dict[str, Any]
    input_types: tuple[str, ...]
    input_ranks: tuple[int | None, ...]
    inputs: tuple[str, ...]
    constants: frozenset[str]

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attributes.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def given(self, index: int) -> bool:
        return index < len(self.inputs) and bool(self.inputs[index])


@frozen_record
class Rule:
    op: str
    applies: Callable[[Use], bool]
    reason: str


#: ONNX's float8 element types (TensorProto FLOAT8E4M3FN .. FLOAT8E5M2FNUZ) and their NumPy names.
FLOAT8_TYPES = (17, 18, 19, 20)
FLOAT8_NAMES = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
SATURATE_REASON = "casting to float8 with saturate=1, IREE gives inf/NaN for values out of range where onnx's reference saturates"

RULES = (
    Rule("Cast", lambda u: u.attr("to") in FLOAT8_TYPES and u.attr("saturate", 1) == 1, SATURATE_REASON),
    Rule("CastLike", lambda u: len(u.input_types) > 1 and u.input_types[1] in FLOAT8_NAMES and u.attr("saturate", 1) == 1, SATURATE_REASON),
    Rule(
        "AveragePool",
        lambda u: u.attr("ceil_mode", 0) == 1 and u.attr("count_include_pad", 0) == 1 and any(d != 1 for d in u.attr("dilations", ()) or ()),
        "with ceil_mode=1, count_include_pad=1 and dilations, IREE averages the last windows over the wrong count",
    ),
    Rule("Det", lambda u: True, "IREE's determinant gives NaN where a leading element of the elimination is 0 (it does not pivot)"),
    Rule(
        "Gelu",
        lambda u: u.attr("approximate", "none") == "tanh",
        "with approximate='tanh', IREE's result differs from onnx's reference beyond 1e-3 relative where it is near 0",
    ),
    Rule("GridSample", lambda u: u.attr("mode", "linear") == "nearest", "with mode='nearest', IREE rounds sample positions differently"),
    Rule(
        "GridSample",
        lambda u: u.attr("padding_mode", "zeros") == "zeros",
        "with padding_mode='zeros' (the default), IREE reads outside the input for samples out of bounds instead of 0",
    ),
    Rule("LSTM", lambda u: u.given(7), "with peephole weights (input P), IREE's result differs"),
    Rule(
        "QLinearMatMul",
        lambda u: (u.input_ranks[0] or 0) > 2 or (u.input_ranks[3] or 0) > 2,
        "on operands of rank above 2, IREE's result differs",
    ),
    Rule(
        "Resize",
        lambda u: u.attr("coordinate_transformation_mode", "half_pixel") == "align_corners"
        and u.attr("mode", "nearest") in ("linear", "cubic")
        and not (u.given(2) and u.inputs[2] in u.constants),
        "with coordinate_transformation_mode='align_corners', mode linear or cubic and scales given at run time, "
        "IREE's result differs when downsampling",
    ),
    Rule(
        "Softmax",
        lambda u: u.input_types[0] in ("float16", "bfloat16"),
        "on float16 and bfloat16, with masked (-inf) entries in a row, IREE's result differs from onnx's reference beyond the case's rtol",
    ),
    Rule(
        "LpNormalization",
        lambda u: True,
        "where a slice's norm is 0, IREE gives NaN (0/0) and onnx's reference gives 0",
    ),
    Rule(
        "SpaceToDepth",
        lambda u: u.attr("mode", "DCR") == "CRD",
        "with mode='CRD', IREE rearranges as in the default mode 'DCR'",
    ),
    Rule(
        "SoftmaxCrossEntropyLoss",
        lambda u: u.given(2) and u.attr("reduction", "mean") == "mean",
        "with class weights and reduction='mean', IREE's loss differs",
    ),
)
_BY_OP: dict[str, list[Rule]] = {op: [rule for rule in RULES if rule.op == op] for op in {rule.op for rule in RULES}}


def check_model(data: bytes, source: str) -> None:
    """Refuse (BuildError) a serialized ONNX model that uses an operator the way IREE computes wrong."""
    import onnx
    from onnx import helper, shape_inference

    try:
        model = onnx.load_model_from_string(data)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and others: the importer says what is wrong
        return
    if not any(node.op_type in _BY_OP for node in model.graph.node):
        return
    try:
        inferred = shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - a model shape inference rejects is judged on the types it states
        inferred = model.graph
    types = {}
    for value in (*inferred.input, *inferred.value_info, *inferred.output):
        tensor = value.type.tensor_type
        types[value.name] = (_dtype_name(tensor.elem_type), len(tensor.shape.dim) if tensor.HasField("shape") else None)
    for init in model.graph.initializer:
        types[init.name] = (_dtype_name(init.data_type), len(init.dims))
    constants = frozenset(t.name for t in model.graph.initializer) | frozenset(
        out for node in model.graph.node if node.op_type == "Constant" for out in node.output
    )
    for node in model.graph.node:
        rules = _BY_OP.get(node.op_type, ())
        if not rules or node.domain not in ("", "ai.onnx"):
            continue
        use = Use(
            node.op_type,
            {a.name: helper.get_attribute_value(a) for a in node.attribute},
            tuple(types.get(n, ("", None))[0] for n in node.input),
            tuple(types.get(n, ("", None))[1] for n in node.input),
            tuple(node.input),
            constants,
        )
        for rule in rules:
            if rule.applies(use):
                raise BuildError(f"{source}: IREE computes ONNX operator {node.op_type} wrong here ({rule.reason}); refused")


def _dtype_name(elem_type: int) -> str:
    from onnx import helper

    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).name if elem_type else ""
    except (KeyError, ValueError, TypeError):
        return ""
