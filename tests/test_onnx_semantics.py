"""Pow as onnx's reference (NumPy's, C's `pow`) computes it: a negative base raised to an integer
(negative for an odd one, -0 and -inf too), NaN for a negative base raised to a non-integer,
pow(x, 0) = 1 and pow(1, y) = 1 for every x and y (NaN too), zeros, infinities and NaN; float
bases with float or integer exponents, integer bases, broadcasting and constant exponents.
Tolerance: special values (NaN, +-inf, 0, +-1 and the sign) exactly; other results to a relative
1e-6 (a few float32 ulps, IREE's own pow accuracy for a positive base), 1e-12 for float64, and
results below the smallest normal number may be flushed to zero.

Integer Div and Mod (fmod 0 and 1) by zero and of a signed type's minimum by -1, as onnx's
reference (NumPy) computes them: 0 for a zero divisor, the minimum (Div) and 0 (Mod) for the
minimum by -1; exactly. Those kernels run in a child process: the hardware's division traps there
(SIGFPE), which would end the test run rather than fail a test."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("onnx", reason="the ONNX cases need the onnx package (portkern[onnx])")

from onnx import helper, numpy_helper, shape_inference  # noqa: E402 - needs onnx
from onnx.reference import ReferenceEvaluator  # noqa: E402 - needs onnx

from portkern import onnx as backend  # noqa: E402 - needs onnx
from portkern.portable import onnx_semantics  # noqa: E402 - needs onnx

NAN, INF = np.nan, np.inf
BASES = [-INF, -3, -2, -1, -0.5, -0.0, 0.0, 0.5, 1, 2, 3, 7.5, INF, NAN, 1e-30, -1e-30]
EXPONENTS = [0, -0.0, 1, 2, 3, -1, -2, -3, 0.5, -0.5, 1.5, 1 / 3, 10, INF, -INF, NAN, 1e10]


def model(nodes, inputs, outputs, initializers=(), opset=18):
    """A model of `nodes`, `inputs` (name -> array), output types and shapes inferred."""
    graph = helper.make_graph(
        nodes,
        "pow",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for name, v in inputs.items()],
        [],
        list(initializers),
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    inferred = {v.name: v for v in shape_inference.infer_shapes(m, strict_mode=True).graph.value_info}
    m.graph.output.extend(inferred[out] for node in nodes for out in node.output)
    return m


def check(m, feeds, rtol=1e-6):
    """portkern's outputs are the reference's: NaN, infinities and signs exactly, the rest to `rtol`."""
    with np.errstate(all="ignore"):
        want = ReferenceEvaluator(m).run(None, feeds)
    got = backend.prepare(m, "CPU").run(list(feeds.values()))
    assert len(got) == len(want)
    for output, g, w in zip(m.graph.output, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, output.name
        if w.dtype.kind != "f":
            np.testing.assert_array_equal(g, w, err_msg=output.name)
            continue
        tiny = np.finfo(w.dtype).tiny
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{output.name}: NaN positions")
        np.testing.assert_array_equal(np.isinf(g) & (g > 0), np.isinf(w) & (w > 0), err_msg=f"{output.name}: +inf")
        np.testing.assert_array_equal(np.isinf(g) & (g < 0), np.isinf(w) & (w < 0), err_msg=f"{output.name}: -inf")
        np.testing.assert_array_equal(np.sign(g)[np.abs(w) >= tiny], np.sign(w)[np.abs(w) >= tiny], err_msg=f"{output.name}: signs")
        np.testing.assert_allclose(g, w, rtol=rtol, atol=tiny, equal_nan=True, err_msg=output.name)


def grid(dtype=np.float32):
    """Every base against every exponent: bases down a column, exponents along a row (broadcast)."""
    return np.array(BASES, dtype).reshape(-1, 1), np.array(EXPONENTS, dtype).reshape(1, -1)


def test_the_issue_cases():
    """pow(-1, 1) = -1, pow(-2, 3) = -8, pow(1, nan) = pow(nan, 0) = pow(0, 0) = 1."""
    a, b = np.float32([-1, -2, 1, NAN, 0]), np.float32([1, 3, NAN, 0, 0])
    m = model([helper.make_node("Pow", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"])
    (got,) = backend.prepare(m, "CPU").run([a, b])
    np.testing.assert_array_equal(got, np.float32([-1, -8, 1, 1, 1]))
    check(m, {"a": a, "b": b})


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-6), (np.float16, 1e-3), (np.float64, 1e-12)])
def test_every_base_against_every_exponent(dtype, rtol):
    a, b = grid(dtype)
    check(model([helper.make_node("Pow", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"]), {"a": a, "b": b}, rtol=rtol)


@pytest.mark.parametrize("exponent_type", [np.int64, np.int32, np.float16])
def test_exponents_of_another_type(exponent_type):
    """A float32 base raised to int64, int32 and float16 exponents: odd ones keep the sign."""
    a = np.array(BASES, np.float32).reshape(-1, 1)
    b = np.array([0, 1, 2, 3, -1, -2, -3, 7, 10] + ([0.5, -1.5] if exponent_type == np.float16 else [-7, 40]), exponent_type).reshape(1, -1)
    check(model([helper.make_node("Pow", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"]), {"a": a, "b": b})


def test_constant_exponents():
    """Each exponent as a constant scalar (IREE folds some of them into products, reciprocals and
    square roots), as a constant tensor, and a constant base."""
    a = np.array(BASES, np.float32)
    initializers = [numpy_helper.from_array(np.float32(e), f"e{i}") for i, e in enumerate(EXPONENTS)]
    initializers += [
        numpy_helper.from_array(np.float32(EXPONENTS[: len(BASES)]), "tensor"),
        numpy_helper.from_array(np.int64(-3), "int_scalar"),
        numpy_helper.from_array(np.float32(-2), "base"),
    ]
    nodes = [helper.make_node("Pow", ["a", f"e{i}"], [f"y{i}"]) for i in range(len(EXPONENTS))]
    nodes += [
        helper.make_node("Pow", ["a", "tensor"], ["y_tensor"]),
        helper.make_node("Pow", ["a", "int_scalar"], ["y_int"]),
        helper.make_node("Pow", ["base", "a"], ["y_base"]),
    ]
    check(model(nodes, {"a": a}, [], initializers), {"a": a})


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.uint8])
def test_integer_bases(dtype):
    """Integer powers exactly, negative bases and 0 ** 0 too, for every result the type holds."""
    bits = np.iinfo(dtype).bits
    signed = np.iinfo(dtype).min < 0
    bases = [-3, -2, -1, 0, 1, 2, 3, 5] if signed else [0, 1, 2, 3, 5, 7]
    rows = []
    for base in bases:
        for exponent in [0, 1, 2, 3, 4, 5, 7, 8, 19, 31, 40, 62, 63, 100, 1001]:
            if exponent < 256 if dtype != np.int8 else exponent < 128:
                value = base**exponent
                if abs(base) <= 1 or -(2 ** (bits - 1)) <= value < 2 ** (bits - int(signed)):
                    rows.append((base, exponent))
    a = np.array([r[0] for r in rows], dtype)
    b = np.array([r[1] for r in rows], dtype)
    m = model([helper.make_node("Pow", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"])
    check(m, {"a": a, "b": b})
    exponent = np.int64([3])
    m = model([helper.make_node("Pow", ["a", "e"], ["y"])], {"a": a}, ["y"], [numpy_helper.from_array(exponent, "e")])
    check(m, {"a": a})


def test_exponents_iree_computes_right_are_left_as_they_are():
    """x ** 2, x ** 3 and x ** 0.5 with constant exponents, and models without Pow, are not rewritten."""
    a = np.array(BASES, np.float32)
    initializers = [numpy_helper.from_array(np.float32(v), n) for v, n in ((2, "two"), (3, "three"), (0.5, "half"))]
    nodes = [helper.make_node("Pow", ["a", e], [f"y_{e}"]) for e in ("two", "three", "half")]
    m = model(nodes, {"a": a}, [], initializers)
    before = m.SerializeToString()
    assert not onnx_semantics.rewrite(m)
    assert m.SerializeToString() == before
    check(m, {"a": a})
    plain = model([helper.make_node("Add", ["a", "a"], ["y"])], {"a": a}, ["y"])
    assert not onnx_semantics.rewrite(plain)


# Runs the model in argv[1] on the feeds in argv[2] (an .npz, by input name), saves the outputs to argv[3].
RUN_APART = textwrap.dedent(
    """
    import sys
    import numpy as np, onnx
    from portkern import onnx as backend
    model = onnx.load(sys.argv[1])
    feeds = np.load(sys.argv[2])
    outputs = backend.prepare(model, "CPU").run([feeds[i.name] for i in model.graph.input])
    np.savez(sys.argv[3], *outputs)
    """
)

INTEGERS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
DIVISIONS = [("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1})]


def run_apart(m, feeds, tmp_path):
    """portkern's outputs for `m` on `feeds`, computed in a child process (a crash fails the test)."""
    import onnx

    onnx.save(m, tmp_path / "model.onnx")
    np.savez(tmp_path / "feeds.npz", **feeds)
    done = subprocess.run(
        [sys.executable, "-c", RUN_APART, str(tmp_path / "model.onnx"), str(tmp_path / "feeds.npz"), str(tmp_path / "out.npz")],
        capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, f"the kernel's process ended with {done.returncode}: {done.stderr[-2000:]}"
    with np.load(tmp_path / "out.npz") as out:
        return [out[f"arr_{i}"] for i in range(len(out.files))]


def check_apart(m, feeds, tmp_path, reference=None):
    """portkern's outputs, computed in a child process, are exactly the reference's (for `reference`,
    the model the reference runs, where not `m`)."""
    with np.errstate(all="ignore"):
        want = ReferenceEvaluator(reference or m).run(None, feeds)
    got = run_apart(m, feeds, tmp_path)
    assert len(got) == len(want)
    for output, g, w in zip(m.graph.output, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, output.name
        np.testing.assert_array_equal(g, w, err_msg=output.name)


def special_values(dtype):
    """Dividends down a column, divisors along a row: zero, -1, the extremes and their neighbours."""
    info = np.iinfo(dtype)
    values = [info.min, info.min + 1, -7, -2, -1, 0, 1, 2, 7, info.max - 1, info.max]
    values = [v for v in values if info.min <= v]
    return np.array(values, dtype).reshape(-1, 1), np.array(values, dtype).reshape(1, -1)


def test_integer_division_by_zero_and_of_the_minimum_by_minus_one(tmp_path):
    """Div and Mod of every integer type, every special dividend by every special divisor (zero and
    -1 among them, broadcast) and random pairs with small divisors: the process lives, the results
    are the reference's."""
    rng = np.random.default_rng(3)
    feeds, nodes = {}, []
    for dtype in INTEGERS:
        name = np.dtype(dtype).name
        feeds[f"x_{name}"], feeds[f"d_{name}"] = special_values(dtype)
        info = np.iinfo(dtype)
        feeds[f"rx_{name}"] = rng.integers(info.min, info.max, 101, dtype=dtype, endpoint=True)
        feeds[f"rd_{name}"] = rng.integers(max(info.min, -3), 4, 101, dtype=dtype)
        for op, attributes in DIVISIONS:
            tag = f"{op}{attributes.get('fmod', '')}_{name}"
            nodes.append(helper.make_node(op, [f"x_{name}", f"d_{name}"], [f"grid_{tag}"], **attributes))
            nodes.append(helper.make_node(op, [f"rx_{name}", f"rd_{name}"], [f"random_{tag}"], **attributes))
    check_apart(model(nodes, feeds, []), feeds, tmp_path)


def test_constant_divisors(tmp_path):
    """A constant divisor that is zero or -1 somewhere, or unsigned with its top bit set, is rewritten;
    a signed one that is neither (or -1 for a constant dividend without the minimum) is left as it is,
    and so are float divisions."""
    x = np.array([np.iinfo(np.int64).min, -7, -1, 0, 5, np.iinfo(np.int64).max], np.int64)
    initializers = [
        numpy_helper.from_array(np.int64([0, 3, -1, 0, 2, -1]), "risky"),
        numpy_helper.from_array(np.int64(0), "zero"),
        numpy_helper.from_array(np.int64(-1), "minus_one"),
        numpy_helper.from_array(np.uint16([1, 2, 65535, 32768, 3, 7]), "unsigned"),
    ]
    u = np.uint16([0, 7, 65535, 65534, 32769, 40000])
    nodes = [helper.make_node(op, ["x", d], [f"{op}{a.get('fmod', '')}_{d}"], **a) for op, a in DIVISIONS for d in ("risky", "zero", "minus_one")]
    nodes += [helper.make_node(op, ["u", "unsigned"], [f"{op}{a.get('fmod', '')}_unsigned"], **a) for op, a in DIVISIONS]
    m = model(nodes, {"x": x, "u": u}, [], initializers)
    check_apart(m, {"x": x, "u": u}, tmp_path)
    assert onnx_semantics.rewrite(m)

    safe = [
        numpy_helper.from_array(np.int64([3, -2, 7, 1, -5, 2]), "divisors"),
        numpy_helper.from_array(np.int64([5, -7, 0, 9, 1, -3]), "dividends"),
        numpy_helper.from_array(np.int64(-1), "minus_one"),
    ]
    f = np.float32([1, -0.0, 0.0, NAN, INF, -3])
    nodes = [helper.make_node(op, ["x", "divisors"], [f"{op}{a.get('fmod', '')}"], **a) for op, a in DIVISIONS]
    nodes += [helper.make_node(op, ["dividends", "minus_one"], [f"{op}{a.get('fmod', '')}_minus_one"], **a) for op, a in DIVISIONS]
    nodes += [helper.make_node("Div", ["f", "f"], ["float_div"]), helper.make_node("Mod", ["f", "f"], ["float_fmod"], fmod=1)]
    m = model(nodes, {"x": x, "f": f}, [], safe)
    before = m.SerializeToString()
    assert not onnx_semantics.rewrite(m)
    assert m.SerializeToString() == before
    check(m, {"x": x, "f": f})


@pytest.mark.parametrize("op, dtype, opset", [("Div", np.int64, 7), ("Div", np.int32, 8), ("Mod", np.int8, 10), ("Mod", np.uint64, 10)])
def test_divisions_of_older_opsets(op, dtype, opset, tmp_path):
    """A model older than Where (opset 9), or than Equal of every integer type (opset 11), is upgraded first."""
    x, d = special_values(dtype)
    attributes = {"fmod": 1} if op == "Mod" and np.iinfo(dtype).min < 0 else {}
    m = model([helper.make_node(op, ["x", "d"], ["y"], **attributes)], {"x": x, "d": d}, ["y"], opset=opset)
    original = m.SerializeToString()
    assert onnx_semantics.rewrite(m)
    upgraded = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    assert upgraded == (9 if dtype in (np.int32, np.int64) else 11)
    reference = type(m)()
    reference.ParseFromString(original)
    check_apart(m, {"x": x, "d": d}, tmp_path, reference=reference)
