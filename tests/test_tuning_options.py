"""Module options searched per kernel before its tiles (an optimisation level, data tiling, attention
decomposed), under a budget too, and the per-bucket rule that keeps tuned code only where it wins."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_example, attention_mlir, build_mlir

import portkern
from portkern.base.errors import PerfConfigError
from portkern.jit import devices
from portkern.tuner import kernel_config
from portkern.tuner.buckets import Verdict, verdict
from portkern.tuner.session import tune_kernel

ATTENTION = attention_mlir(2, 64, 32)


def attention_reference(q, k, v):
    s = q.astype(np.float64) @ k.transpose(0, 2, 1) * 0.125
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def test_attention_decomposed_is_searched_under_a_budget_stored_and_served(tmp_path, store):
    """Under `--budget 1` the first variant that applies (attention decomposed) is compiled from the
    source stage, checked against the fused default and timed whole; the chosen config names it,
    the search is marked cut short, and a later load serves the stored choice, matching NumPy."""
    path = build_mlir(tmp_path, "att", attention=ATTENTION)
    bundle = portkern.load(path, store=store)
    record, target = bundle.record("attention"), devices.resolve("cpu", store)
    result = tune_kernel(bundle.natives, record, target, "quick", budget=1)
    tried = {e.config: e for e in result.evaluations}
    assert "attention-decomposed" in tried and tried["attention-decomposed"].ok, tried
    assert not any(c.startswith("O2") for c in tried)  # the budget's one variant
    assert "module options timed whole" in result.note and not result.complete
    data = result.to_dict()
    options = kernel_config.parse(data["config"]).options
    # whichever form was faster on this CPU is kept (decomposed: two matmuls and a softmax)
    assert options in ((), ("attention-decomposed",)), result.note
    kernel = portkern.load(path, store=store).kernel("attention")
    assert kernel.config == data["config"]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 64, 32), dtype=np.float32) for _ in range(3))
    np.testing.assert_allclose(kernel(q, k, v), attention_reference(q, k, v), rtol=1e-5, atol=1e-6)


def test_gemm_option_variants_are_checked_against_the_default_under_a_budget(examples_bundle, store, rng):
    """A GEMM kernel's first two variants (data tiling, then the O2 optimisation level) are compiled,
    checked against the default's outputs and timed; whatever is kept computes what NumPy does."""
    bundle = portkern.load(examples_bundle, store=store)
    record, target = bundle.record("gemm_bias_relu"), devices.resolve("cpu", store)
    result = tune_kernel(bundle.natives, record, target, "quick", budget=2)
    tried = {e.config: e for e in result.evaluations if not any(entry[0].isdigit() for entry in e.config.split(";"))}
    assert set(tried) == {"data-tiling", "O2"}, result.note
    assert all(e.ok or e.status == "duplicate" for e in tried.values()), [(e.config, e.status, e.error) for e in tried.values()]
    kernel = portkern.load(examples_bundle, store=store).kernel("gemm_bias_relu")
    assert kernel.config == result.config
    assert_example(kernel, rng)


#: Rows of each matmul of a kernel of like-sized ones (none a tenth of its work alone, as in
#: ResNet-18, whose 20 convolutions carry 3-8 % each); distinct, so each is a dispatch of its own.
ROWS = [64 + 4 * i for i in range(16)]


def many_matmuls_mlir(size: int = 64) -> str:
    """`@many(a0, ..., a15, b)`: each `ai @ b` (ai of ROWS[i] rows, b size x size), 16 results."""
    inputs = [f"tensor<{m}x{size}xf32>" for m in ROWS]
    b = f"tensor<{size}x{size}xf32>"
    body = []
    for i, t in enumerate(inputs):
        body += [f"  %e{i} = tensor.empty() : {t}",
                 f"  %z{i} = linalg.fill ins(%zero : f32) outs(%e{i} : {t}) -> {t}",
                 f"  %m{i} = linalg.matmul ins(%a{i}, %b : {t}, {b}) outs(%z{i} : {t}) -> {t}"]
    args = ", ".join(f"%a{i}: {t}" for i, t in enumerate(inputs))
    return "\n".join([f"func.func @many({args}, %b: {b}) -> ({', '.join(inputs)}) {{", "  %zero = arith.constant 0.0 : f32", *body,
                      f"  return {', '.join(f'%m{i}' for i in range(len(inputs)))} : {', '.join(inputs)}", "}", ""])


def test_a_kernel_of_many_like_sized_matmuls_has_its_module_options_timed(tmp_path, store):
    """No matmul carries a tenth of the kernel's work, so `quick` tunes no dispatch's tiles; together
    they carry all of it, so the module options are compiled, checked and timed whole (the note says
    both), and whatever is kept computes what NumPy does."""
    path = build_mlir(tmp_path, "many", many=many_matmuls_mlir())
    bundle = portkern.load(path, store=store)
    record, target = bundle.record("many"), devices.resolve("cpu", store)
    result = tune_kernel(bundle.natives, record, target, "quick")
    tried = {e.config: e for e in result.evaluations if e.config != "default"}
    assert {"data-tiling", "O2"} <= set(tried), result.note
    assert all(e.ok or e.status == "duplicate" for e in tried.values()), [(e.config, e.status, e.error) for e in tried.values()]
    assert "module options timed whole" in result.note and "no dispatch carries 10%" in result.note, result.note
    assert not kernel_config.parse(result.config).dispatches  # no dispatch's tiles were tuned
    kernel = portkern.load(path, store=store).kernel("many")
    assert kernel.config == result.config
    rng = np.random.default_rng(3)
    a = [rng.standard_normal((m, 64), dtype=np.float32) for m in ROWS]
    b = rng.standard_normal((64, 64), dtype=np.float32)
    for got, ai in zip(kernel(*a, b), a):
        np.testing.assert_allclose(got, ai.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_module_options_print_in_table_order_once_each():
    config = kernel_config.parse("O2;data-tiling;0=cpu:v1:64x64x0,8x32x0,0x0x4")
    assert config.options == ("O2", "data-tiling") and str(config).startswith("O2;data-tiling;0=")
    with pytest.raises(PerfConfigError, match="canonical"):
        kernel_config.parse("data-tiling;O2")


@pytest.mark.parametrize(
    "repeats, expected",
    [
        # specialised code faster in every repeat; the tuned dynamic config in only one of them
        ([[1.0, 0.5, 0.9], [1.0, 0.5, 1.1], [1.0, 0.6, 0.9]], Verdict(specialised=True, tuned=False)),
        # one repeat where the specialised code is not faster by the gain: the default stays
        ([[1.0, 0.5, None], [1.0, 0.99, None], [1.0, 0.5, None]], Verdict(specialised=False, tuned=False)),
        ([[2.0, 1.0, 1.5]] * 3, Verdict(specialised=True, tuned=True)),
        ([], Verdict(specialised=False, tuned=False)),
    ],
)
def test_a_bucket_keeps_tuned_code_only_where_it_beats_the_default_in_every_repeat(repeats, expected):
    assert verdict(repeats, min_gain=0.03) == expected
