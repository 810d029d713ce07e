"""NaN through ONNX operators as onnx defines it (onnx.reference, which is NumPy's): Max/Min, Clip,
Sign, ArgMax/ArgMin, Hardmax, the Reduce* operators and the comparisons give the reference's
result, NaN positions included, with NaN first, inside, last, alone and beside infinities."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="the ONNX cases need the onnx package (portkern[onnx])")

from onnx import TensorProto, helper, numpy_helper, shape_inference  # noqa: E402 - needs onnx
from onnx.reference import ReferenceEvaluator  # noqa: E402 - needs onnx

from portkern import onnx as backend  # noqa: E402 - needs onnx
from portkern.portable import onnx_semantics  # noqa: E402 - needs onnx

NAN, INF = np.nan, np.inf
# NaN first, inside, last, twice, alone, everywhere, beside +-inf and ties; a row without NaN
X = np.array([
    [NAN, 1, 3, 2, 0, -1],
    [1, NAN, 3, NAN, 2, 7],
    [1, 5, 3, 2, 4, NAN],
    [NAN, NAN, NAN, NAN, NAN, NAN],
    [INF, 2, NAN, -INF, INF, 1],
    [-INF, -2, 4, NAN, 4, -INF],
    [4, 1, -1, 4, 0, -1],
], np.float32)
Y = np.array([
    [1, NAN, NAN, 2, 0, 5],
    [NAN, 1, 3, 4, 5, NAN],
    [0, 0, 0, 0, 0, 0],
    [1, 2, NAN, 3, 4, 5],
    [NAN, 2, INF, NAN, -INF, 1],
    [-INF, NAN, 4, 3, 5, INF],
    [4, 2, -1, 5, 0, NAN],
], np.float32)


def model(nodes, outputs, inputs=("x", "y"), initializers=(), opset=18, elem=TensorProto.FLOAT, shape=X.shape):
    """A model of `nodes` whose graph outputs are the values named in `outputs`, types inferred."""
    graph = helper.make_graph(
        nodes, "nan", [helper.make_tensor_value_info(name, elem, shape) for name in inputs], [], list(initializers)
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    inferred = {v.name: v for v in shape_inference.infer_shapes(m, strict_mode=True).graph.value_info}
    m.graph.output.extend(inferred[name] for name in outputs)
    return m


def check(m, feeds, exact=True):
    """portkern's outputs equal the reference's (exactly, NaN where it has NaN; or to 1e-5 where `exact` is false)."""
    want = ReferenceEvaluator(m).run(None, feeds)
    got = backend.prepare(m, "CPU").run(list(feeds.values()))
    assert len(got) == len(want)
    for output, g, w in zip(m.graph.output, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, output.name
        if exact or g.dtype.kind not in "fc":
            np.testing.assert_array_equal(g, w, err_msg=output.name)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=output.name)


def test_the_issue_cases():
    """`Max([nan], [1])` is nan, `Clip(nan, -1, 1)` is nan, `ArgMax([1, nan, 3, 2])` is 1."""
    lo, hi = numpy_helper.from_array(np.float32(-1), "lo"), numpy_helper.from_array(np.float32(1), "hi")
    nodes = [
        helper.make_node("Max", ["a", "one"], ["max"]),
        helper.make_node("Clip", ["a", "lo", "hi"], ["clip"]),
        helper.make_node("ArgMax", ["v"], ["argmax"], axis=0, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "issue",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1]), helper.make_tensor_value_info("v", TensorProto.FLOAT, [4])],
        [
            helper.make_tensor_value_info("max", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("clip", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("argmax", TensorProto.INT64, []),
        ],
        [lo, hi, numpy_helper.from_array(np.float32([1]), "one")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    got_max, got_clip, got_argmax = backend.prepare(m, "CPU").run([np.float32([NAN]), np.float32([1, NAN, 3, 2])])
    assert np.isnan(got_max).all() and np.isnan(got_clip).all()
    assert int(got_argmax) == 1
    check(m, {"a": np.float32([NAN]), "v": np.float32([1, NAN, 3, 2])})


def test_max_min_sign_and_clip():
    """Max and Min of two and three operands (broadcast too) give the first NaN operand; Clip gives a NaN
    x, and NaN everywhere where a bound that is an input is NaN; Sign of NaN is NaN."""
    nodes = [
        helper.make_node("Max", ["x", "y"], ["max2"]),
        helper.make_node("Min", ["x", "y"], ["min2"]),
        helper.make_node("Max", ["y", "x", "row"], ["max3"]),
        helper.make_node("Min", ["row", "y", "x"], ["min3"]),
        helper.make_node("Max", ["x", "two"], ["max_scalar"]),
        helper.make_node("Clip", ["x", "lo", "hi"], ["clip"]),
        helper.make_node("Clip", ["x", "lo"], ["clip_lo"]),
        helper.make_node("Clip", ["x", "", "hi"], ["clip_hi"]),
        helper.make_node("Clip", ["x"], ["clip_none"]),
        helper.make_node("Clip", ["y", "nan_lo", "hi"], ["clip_nan_bound"]),
        helper.make_node("Sign", ["x"], ["sign"]),
    ]
    row = np.array([NAN, 0, 9, -9, NAN, 1], np.float32)
    initializers = [
        numpy_helper.from_array(row, "row"),
        numpy_helper.from_array(np.float32(2), "two"),
        numpy_helper.from_array(np.float32(-1), "lo"),
        numpy_helper.from_array(np.float32(1), "hi"),
    ]
    outputs = [n.output[0] for n in nodes]
    m = model(nodes, outputs, inputs=("x", "y"), initializers=initializers)
    m.graph.input.append(helper.make_tensor_value_info("nan_lo", TensorProto.FLOAT, []))
    check(m, {"x": X, "y": Y, "nan_lo": np.float32(NAN)})
    check(m, {"x": X, "y": Y, "nan_lo": np.float32(-0.5)})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_argmax_argmin_take_nan_as_the_extreme(op):
    """The first NaN along the axis (the last with select_last_index), every axis and keepdims."""
    nodes = [
        helper.make_node(op, ["x"], [f"r_{axis}_{keep}_{last}"], axis=axis, keepdims=keep, select_last_index=last)
        for axis in (0, 1, -1)
        for keep in (0, 1)
        for last in (0, 1)
    ]
    nodes.append(helper.make_node(op, ["x"], ["defaults"]))
    m = model(nodes, [n.output[0] for n in nodes], inputs=("x",))
    check(m, {"x": X})


def test_hardmax_puts_its_one_on_the_first_nan():
    for opset, axis in ((13, 1), (13, 0), (11, 1)):
        nodes = [helper.make_node("Hardmax", ["x"], ["h"], axis=axis)]
        check(model(nodes, ["h"], inputs=("x",), opset=opset), {"x": X})


@pytest.mark.parametrize("opset", [13, 18])
def test_reductions_propagate_nan(opset):
    """Every Reduce* operator over one axis and over all, NaN in the reduced slice gives NaN."""
    ops = ["ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]
    nodes, initializers = [], [numpy_helper.from_array(np.array([1], np.int64), "axes")]
    for op in ops:
        for keep in (0, 1):
            attributes = {"keepdims": keep}
            inputs = ["x"]
            if opset >= 18 or op == "ReduceSum":
                inputs.append("axes")
            else:
                attributes["axes"] = [1]
            nodes.append(helper.make_node(op, inputs, [f"{op}_{keep}"], **attributes))
        nodes.append(helper.make_node(op, ["x"], [f"{op}_all"], keepdims=0))
    # absolute values, so that ReduceLogSum and the others see no NaN but the input's
    nodes.insert(0, helper.make_node("Abs", ["x_signed"], ["x"]))
    m = model(nodes, [n.output[0] for n in nodes[1:]], inputs=("x_signed",), initializers=initializers, opset=opset)
    check(m, {"x_signed": X}, exact=False)


def test_comparisons_are_false_on_nan():
    ops = ["Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual"]
    nodes = [helper.make_node(op, ["x", "y"], [op]) for op in ops]
    nodes.append(helper.make_node("Not", ["Equal"], ["NotEqual"]))
    check(model(nodes, [*ops, "NotEqual"]), {"x": X, "y": Y})


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_other_float_types(dtype):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [
        helper.make_node("Max", ["x", "y"], ["max"]),
        helper.make_node("Min", ["y", "x"], ["min"]),
        helper.make_node("Clip", ["x"], ["clip"]),
        helper.make_node("ArgMax", ["x"], ["argmax"], axis=1, keepdims=0),
        helper.make_node("ArgMin", ["y"], ["argmin"], axis=0, select_last_index=1),
    ]
    m = model(nodes, ["max", "min", "clip", "argmax", "argmin"], elem=elem)
    check(m, {"x": X.astype(dtype), "y": Y.astype(dtype)})


def test_max_inside_a_subgraph():
    """A Max in an If branch is rewritten too."""
    then = helper.make_graph(
        [helper.make_node("Max", ["x", "y"], ["m"])], "then", [], [helper.make_tensor_value_info("m", TensorProto.FLOAT, X.shape)]
    )
    other = helper.make_graph(
        [helper.make_node("Min", ["x", "y"], ["n"])], "else", [], [helper.make_tensor_value_info("n", TensorProto.FLOAT, X.shape)]
    )
    nodes = [helper.make_node("If", ["c"], ["out"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(
        nodes,
        "branch",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, X.shape) for n in ("x", "y")] + [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, X.shape)],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    rewritten = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert onnx_semantics.rewrite(rewritten)
    branches = [a.g for a in rewritten.graph.node[0].attribute]
    assert len(branches) == 2 and all({"IsNaN", "Where"} <= {n.op_type for n in g.node} for g in branches)
    for c in (True, False):
        check(m, {"x": X, "y": Y, "c": np.array(c)})


def test_integer_and_nan_free_models_are_left_as_they_are():
    """Integers have no NaN: an int32 Max/Clip/ArgMax model is not rewritten; a float one is."""
    nodes = [
        helper.make_node("Max", ["x", "y"], ["max"]),
        helper.make_node("Clip", ["x"], ["clip"]),
        helper.make_node("ArgMax", ["x"], ["argmax"]),
        helper.make_node("Add", ["x", "y"], ["sum"]),
    ]
    integer = model(nodes, ["max", "clip", "argmax", "sum"], elem=TensorProto.INT32)
    before = integer.SerializeToString()
    assert not onnx_semantics.rewrite(integer)
    assert integer.SerializeToString() == before
    add_only = model([nodes[-1]], ["sum"])
    assert not onnx_semantics.rewrite(add_only)
    floats = model(nodes, ["max", "clip", "argmax", "sum"])
    assert onnx_semantics.rewrite(floats)
    ints = np.arange(X.size, dtype=np.int32).reshape(X.shape) % 5
    check(integer, {"x": ints, "y": ints[::-1].copy()})


def test_a_model_older_than_opset_9():
    """Clip with its bounds as attributes (opset 7), Max and ArgMax, in a model from before IsNaN."""
    nodes = [
        helper.make_node("Clip", ["x"], ["clip"], min=-1.0, max=1.0),
        helper.make_node("Max", ["x", "y"], ["max"]),
        helper.make_node("ArgMax", ["x"], ["argmax"], axis=1),
    ]
    check(model(nodes, ["clip", "max", "argmax"], opset=7), {"x": X, "y": Y})


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_topk_orders_nan_above_every_number(dtype):
    """NaN above +inf (first with largest, last without), ties by the lower index, every axis, k
    short of and up to the whole axis."""
    k = numpy_helper.from_array(np.array([3], np.int64), "k")
    k_all = numpy_helper.from_array(np.array([X.shape[1]], np.int64), "k_all")
    k_rows = numpy_helper.from_array(np.array([X.shape[0]], np.int64), "k_rows")
    nodes = []
    for largest in (1, 0):
        for name, axis in (("k", 1), ("k_all", -1), ("k_rows", 0)):
            nodes.append(helper.make_node("TopK", ["x", name], [f"v_{largest}_{name}", f"i_{largest}_{name}"], axis=axis, largest=largest))
    outputs = [o for n in nodes for o in n.output if o]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    m = model(nodes, outputs, inputs=("x",), initializers=[k, k_all, k_rows], elem=elem)
    check(m, {"x": X.astype(dtype)})


def test_topk_of_integers_is_left_as_it_is():
    k = numpy_helper.from_array(np.array([2], np.int64), "k")
    m = model([helper.make_node("TopK", ["x", "k"], ["v", "i"])], ["v", "i"], inputs=("x",), initializers=[k], elem=TensorProto.INT32)
    assert not onnx_semantics.rewrite(m)


POOL = np.arange(2 * 7 * 7, dtype=np.float32).reshape(1, 2, 7, 7) % 11 - 5
POOL[0, 0, 0, 0] = POOL[0, 0, 0, 3] = POOL[0, 0, 2, 3] = POOL[0, 0, 4, 4] = POOL[0, 0, 6, 5] = NAN
POOL[0, 1, 1, 1] = POOL[0, 1, 3, 3] = NAN
POOL[0, 1, 5, 5] = INF
POOL[0, 1, 6, 0] = -INF


@pytest.mark.parametrize("attributes", [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 0, 0]},
    {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
], ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()))
def test_max_pool_skips_nan_as_the_reference_does(attributes):
    """The reference keeps the numbers of a window and skips its NaN; with strides or dilations
    (its loop) it keeps a NaN that is the first element of the window inside the input."""
    m = model([helper.make_node("MaxPool", ["x"], ["y"], **attributes)], ["y"], inputs=("x",), shape=POOL.shape)
    check(m, {"x": POOL})


def test_max_pool_of_a_window_of_nan_only_is_nan():
    """Where the reference (without strides) has no number to take, the result is NaN; numbers beside it are kept."""
    x = np.full((1, 1, 4, 4), NAN, np.float32)
    x[0, 0, 3, 3], x[0, 0, 0, 3] = 5, -INF
    m = model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])], ["y"], inputs=("x",), shape=x.shape)
    (got,) = backend.prepare(m, "CPU").run([x])
    want = np.full((1, 1, 3, 3), NAN, np.float32)
    want[0, 0, 2, 2], want[0, 0, 0, 2] = 5, -INF
    np.testing.assert_array_equal(got, want)
