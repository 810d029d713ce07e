"""A seeded, representative subset of the ONNX node conformance cases (every operator family)
through `portkern.onnx`: each case is correct, or a typed failure listed with its cause in
`onnx_expected_failures.yaml`; never a wrong result. `bench/onnx_conformance.py` runs all of them,
side by side with IREE directly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("onnx", reason="the conformance cases come from the onnx package (portkern[onnx])")

from portkern.examples import onnx_conformance as conf  # noqa: E402 - needs onnx

SEED, COUNT = 10, 150
EXPECTED_FILE = Path(__file__).parent / "onnx_expected_failures.yaml"
EXPECTED: dict = yaml.safe_load(EXPECTED_FILE.read_text()) or {}
ALL = conf.node_cases()
SUBSET = conf.representative(ALL, COUNT, SEED)


@pytest.mark.parametrize("case", SUBSET, ids=lambda case: case.name)
def test_node_case(case):
    outcome = conf.judge(case, conf.run_portkern)
    expected = EXPECTED.get(case.name)
    if expected is None:
        assert outcome.kind == conf.CORRECT, f"{outcome.kind}: {outcome.detail}"
        return
    assert outcome.kind in (conf.REFUSED, conf.FINALIZE, conf.RUN), (
        f"listed as an expected failure ({expected['cause']}) but {outcome.kind}: {outcome.detail}"
    )
    assert conf.cause_of(outcome) == expected["cause"], outcome.detail


def test_subset_covers_every_family():
    assert {case.family for case in SUBSET} == {case.family for case in ALL}
    assert abs(len(SUBSET) - COUNT) <= 10


def test_expected_failures_name_cases_and_causes():
    names = {case.name for case in ALL}
    assert set(EXPECTED) <= names, sorted(set(EXPECTED) - names)
    assert {entry["cause"] for entry in EXPECTED.values()} <= set(conf.CAUSES)


def test_a_wrong_result_names_the_elements_that_differ():
    """A wrong output is reported with the first elements beyond the tolerance (NaN where the
    reference has a number counts), so that a wrong case in a long run can be diagnosed."""
    case = next(c for c in ALL if c.name == "test_l2normalization_axis_0")
    want = case.outputs[0]
    got = want.copy()
    got.flat[5] = np.nan
    got.flat[1] += 1.0
    outcome = conf.compare(case, [got])
    assert outcome.kind == conf.WRONG
    assert f"at 1: got {got.flat[1]}, expected {want.flat[1]}" in outcome.detail
    assert f"at 5: got nan, expected {want.flat[5]}" in outcome.detail
    assert conf.compare(case, [want.copy()]).kind == conf.CORRECT


BITSHIFT_OUT_OF_RANGE = sorted(
    case.name for case in ALL if case.name.startswith("test_bitshift_") and case.name.endswith(("_shift_ge_width", "_negative_shift"))
)


@pytest.mark.parametrize("name", BITSHIFT_OUT_OF_RANGE)
def test_bitshift_out_of_range_matches_the_reference(name):
    """A shift by a negative amount or by the type's width or more gives onnx's reference result (0, or the
    sign for a signed RIGHT shift), not what the host's shift instruction makes of it."""
    assert name not in EXPECTED
    case = next(c for c in ALL if c.name == name)
    outcome = conf.judge(case, conf.run_portkern)
    assert outcome.kind == conf.CORRECT, f"{outcome.kind}: {outcome.detail}"


@pytest.mark.parametrize("dtype, direction, constant", [
    ("int8", "LEFT", False), ("int8", "RIGHT", False), ("uint16", "RIGHT", False), ("int64", "LEFT", False), ("int32", "RIGHT", True),
])
def test_bitshift_equals_the_reference_evaluator_for_every_amount(dtype, direction, constant):
    """Every shift amount from below 0 to past the width (as an input, or as a constant initializer),
    on values of both signs, over enough elements to run vectorised: equal to onnx.reference's."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from portkern import onnx as backend

    info = np.iinfo(dtype)
    bits = info.bits
    code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    amounts = np.arange(-3 if info.min < 0 else 0, bits + 4)
    rng = np.random.default_rng(5)
    x = rng.integers(info.min, info.max, size=(len(amounts), 64), endpoint=True, dtype=dtype)
    s = np.broadcast_to(amounts[:, None], x.shape).astype(dtype)
    node = helper.make_node("BitShift", ["x", "s"], ["y"], direction=direction)
    inputs = [helper.make_tensor_value_info("x", code, x.shape)]
    initializers = []
    if constant:
        initializers.append(numpy_helper.from_array(s, "s"))
    else:
        inputs.append(helper.make_tensor_value_info("s", code, s.shape))
    graph = helper.make_graph([node], "bitshift", inputs, [helper.make_tensor_value_info("y", code, x.shape)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)])
    model.ir_version = 10
    feeds = {"x": x} if constant else {"x": x, "s": s}
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    (got,) = backend.prepare(model, "CPU").run(list(feeds.values()))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
