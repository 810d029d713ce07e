"""The example kernels finalised for each x86-64 ISA level this host runs (x86-64-v2: SSE4.2, v3: AVX2,
v4: AVX-512), each compared with its NumPy reference: a result that depends on the vector ISA is
caught on any host, not only on the one whose level differs. An ONNX BitShift kernel joins them, its
shift amounts out of range on purpose (onnx's reference decides those, not the shift instruction)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_matches, expected_skip

import portkern
from portkern.examples.reference import EXAMPLES
from portkern.jit import devices

LEVELS = ("cpu:x86-64-v2", "cpu:x86-64-v3", "cpu:x86-64-v4")
KERNELS = ("gemm_bias_relu", "gemm_glu", "gemm_rowsum", "gemm_transpose_add", "mlp")


def runnable_or_skip(spec: str, store):
    """The target of an ISA level; skips (naming why) where this host's CPU lacks its features."""
    if devices.resolve("cpu", store).fingerprint.property("triple").split("-")[0] != "x86_64":
        pytest.skip(expected_skip("cpu", "x86-64 ISA levels run on x86-64 hosts only"))
    target = devices.resolve(spec, store)
    if not target.runnable:
        pytest.skip(expected_skip("cpu", f"this host cannot run {spec} code: {target.reason}"))
    return target


@pytest.mark.parametrize("spec", LEVELS)
def test_example_kernels_match_numpy_at_every_isa_level(spec, examples_bundle, store):
    runnable_or_skip(spec, store)
    loaded = portkern.load(examples_bundle, store=store)
    assert set(KERNELS) == set(loaded)
    rng = np.random.default_rng(39)
    for name in KERNELS:
        kernel = loaded.kernel(name, device=spec)
        assert kernel.device == spec and kernel.native.origin == "finalized", (name, kernel.device, kernel.native.origin)
        example = EXAMPLES[name]
        inputs = example.inputs(rng)
        assert_matches(kernel(*inputs), example.reference(*inputs), rtol=example.rtol, atol=example.atol)


BITSHIFT_MANIFEST = """bundle: bitshift
kernels:
  - name: left
    source: left.onnx
  - name: right
    source: right.onnx
"""


def bitshift_onnx(direction: str) -> bytes:
    """BitShift(x, s) on int8 64x48 operands (opset 18)."""
    from onnx import TensorProto, helper

    info = [helper.make_tensor_value_info(n, TensorProto.INT8, [64, 48]) for n in ("x", "s", "y")]
    graph = helper.make_graph([helper.make_node("BitShift", ["x", "s"], ["y"], direction=direction)], "shift", info[:2], info[2:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model.SerializeToString()


def bitshift_reference(x: np.ndarray, s: np.ndarray, direction: str) -> np.ndarray:
    """onnx's reference BitShift in NumPy: 0 (LEFT) or the sign (RIGHT) where the amount is below 0 or
    at least the width, else the shift (LEFT wrapping as unsigned)."""
    bits = np.iinfo(x.dtype).bits
    inside = (s >= 0) & (s < bits)
    amount = np.where(inside, s, 0)
    if direction == "LEFT":
        shifted = (x.view(np.uint8) << amount.astype(np.uint8)).view(np.int8)
        return np.where(inside, shifted, 0).astype(np.int8)
    return np.where(inside, x >> amount, np.where(x < 0, -1, 0)).astype(np.int8)


@pytest.fixture(scope="module")
def bitshift_bundle(tmp_path_factory):
    pytest.importorskip("onnx", reason="ONNX kernels need the onnx package (portkern[onnx])")
    from portkern.portable.builder import build_file

    where = tmp_path_factory.mktemp("bitshift")
    (where / "left.onnx").write_bytes(bitshift_onnx("LEFT"))
    (where / "right.onnx").write_bytes(bitshift_onnx("RIGHT"))
    (where / "bitshift.yaml").write_text(BITSHIFT_MANIFEST)
    build_file(where / "bitshift.yaml", where / "bitshift.pkb")
    return where / "bitshift.pkb"


@pytest.mark.parametrize("spec", LEVELS)
def test_onnx_bitshift_out_of_range_is_the_same_at_every_isa_level(spec, bitshift_bundle, store):
    runnable_or_skip(spec, store)
    loaded = portkern.load(bitshift_bundle, store=store)
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 127, size=(64, 48), endpoint=True, dtype=np.int8)
    s = rng.integers(-12, 12, size=(64, 48), endpoint=True, dtype=np.int8)
    s[0, :24] = np.arange(-12, 12)  # every amount at least once, in one vector's reach
    assert ((s < 0) | (s >= 8)).mean() > 0.3
    for direction in ("LEFT", "RIGHT"):
        kernel = loaded.kernel(direction.lower(), device=spec)
        assert kernel.device == spec
        np.testing.assert_array_equal(kernel(x, s), bitshift_reference(x, s, direction))
