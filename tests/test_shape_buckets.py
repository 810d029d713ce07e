"""Shape buckets: bucketing rules, per-bucket tuning, and the code each call runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import logged

import portkern
from portkern.base.errors import TuningError
from portkern.cli.main import main
from portkern.jit import devices
from portkern.portable.builder import build_file
from portkern.portable.contract import ShapeContract
from portkern.tuner import strategies
from portkern.tuner.session import Tuner, tune_kernel, tune_kernel_shapes

#: A GEMM+ReLU with a dynamic number of rows: (Mx64, 64x32) -> Mx32.
GEMM_RELU = """
func.func @main(%a: tensor<?x64xf32>, %b: tensor<64x32xf32>) -> tensor<?x32xf32> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %a, %c0 : tensor<?x64xf32>
  %e = tensor.empty(%m) : tensor<?x32xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?x32xf32>) -> tensor<?x32xf32>
  %r = linalg.matmul ins(%a, %b : tensor<?x64xf32>, tensor<64x32xf32>) outs(%f : tensor<?x32xf32>) -> tensor<?x32xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      ins(%r : tensor<?x32xf32>) outs(%e : tensor<?x32xf32>) {
  ^bb0(%x: f32, %o: f32):
    %s = arith.maximumf %x, %z : f32
    linalg.yield %s : f32
  } -> tensor<?x32xf32>
  return %y : tensor<?x32xf32>
}
"""


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory):
    where = tmp_path_factory.mktemp("buckets")
    (where / "gemm.mlir").write_text(GEMM_RELU)
    (where / "manifest.yaml").write_text(
        "bundle: buckets\nkernels:\n  - name: gemm\n    source: gemm.mlir\n"
        "  - name: gemm_bounds\n    source: gemm.mlir\n    buckets: {M: [4, 16]}\n"
    )
    build_file(where / "manifest.yaml", where / "b.pkb")
    return where / "b.pkb"


def reference(a, b):
    return np.maximum(a @ b, 0)


def inputs(rng, m):
    return rng.standard_normal((m, 64)).astype(np.float32), rng.standard_normal((64, 32)).astype(np.float32)


def test_bucketing_rules():
    contract = ShapeContract((("M", "K"), ("K", "N")), (("M", "N"),), buckets={"K": "exact", "N": (8, 64)})
    assert contract.bucket_of({"M": 1, "K": 5, "N": 7}) == "M<=1,K=5,N<=8"
    assert contract.bucket_of({"M": 33, "K": 5, "N": 64}) == "M<=64,K=5,N<=64"
    assert contract.bucket_of({"M": 64, "K": 5, "N": 65}) == "M<=64,K=5,N>64"
    assert contract.bucket_of({"M": 1 << 20, "K": 5, "N": 1}) == "M>65536,K=5,N<=8"


def test_manifest_bucket_rules_are_recorded_and_checked(bundle_path, tmp_path):
    from portkern.base.errors import BuildError

    contract = portkern.load(bundle_path).record("gemm_bounds").signature.contract
    assert contract.buckets == {"M": (4, 16)} and contract.names == ("a", "b")
    assert contract.bucket_of({"M": 17}) == "M>16"
    (tmp_path / "gemm.mlir").write_text(GEMM_RELU)
    (tmp_path / "manifest.yaml").write_text("bundle: b\nkernels:\n  - name: g\n    source: gemm.mlir\n    buckets: {K: exact}\n")
    with pytest.raises(BuildError, match=r"`buckets:` names 'K', which is not a symbol of \(Mx64, 64x32\) -> Mx32"):
        build_file(tmp_path / "manifest.yaml", tmp_path / "b.pkb")


def test_untuned_buckets_run_the_dynamic_default(bundle_path, store, rng):
    kernel = portkern.load(bundle_path, store=store).kernel("gemm")
    for m in (1, 7, 300):
        a, b = inputs(rng, m)
        assert kernel.code_for(a, b) == {"bucket": f"M<={1 if m == 1 else 8 if m == 7 else 512}", "code": "dynamic", "origin": "finalized", "config": "default"}
        np.testing.assert_allclose(kernel(a, b), reference(a, b), rtol=1e-5, atol=1e-4)


def test_a_dynamic_kernel_through_every_strategy_gives_a_result_or_a_typed_error(bundle_path, store):
    loaded = portkern.load(bundle_path, store=store)
    record, target = loaded.record("gemm"), devices.resolve("cpu", store)
    for strategy in strategies.names():
        result = tune_kernel(loaded.natives, record, target, strategy)
        assert result.config == "default"
        if strategy != "default":
            assert "argument 0 dimension 0 (M) is dynamic" in result.note
    with pytest.raises(TuningError, match="does not search"):
        tune_kernel_shapes(loaded.natives, record, target, "default", [{"a": (4, 64)}])
    for bad, message in (
        ([{"c": (4, 64)}], r"has no argument 'c' \(arguments: a, b\)"),
        ([{"b": (64, 32)}], "leave out argument 0"),
        ([{"a": (4, 65)}], r"shape \(4, 65\) does not fit argument 0"),
        ([[(4, 64)]], "takes 2 arguments"),
    ):
        with pytest.raises(TuningError, match=message):
            tune_kernel_shapes(loaded.natives, record, target, "quick", bad)


@pytest.mark.parametrize("strategy", [s for s in strategies.names() if s != "default"])
def test_every_searching_strategy_tunes_a_bucket(bundle_path, store, strategy, rng):
    loaded = portkern.load(bundle_path, store=store)
    record, target = loaded.record("gemm"), devices.resolve("cpu", store)
    with Tuner(workers=1) as tuner:
        found = tune_kernel_shapes(loaded.natives, record, target, strategy, [{"a": (8, 64)}], tuner=tuner, budget=2)
    assert [(r.bucket, r.values) for r in found] == [("M<=8", {"M": 8})]
    assert found[0].code in ("specialised", "dynamic") and found[0].default_s > 0 and found[0].best_s > 0
    a, b = inputs(rng, 8)
    np.testing.assert_allclose(loaded.kernel("gemm")(a, b), reference(a, b), rtol=1e-5, atol=1e-4)


def test_after_tuning_the_bucket_code_runs_for_its_sizes(bundle_path, store, rng):
    loaded = portkern.load(bundle_path, store=store)
    record, target = loaded.record("gemm"), devices.resolve("cpu", store)
    with Tuner(workers=1) as tuner:
        # min_gain=-inf: keep the specialised code whatever the timings say, so the test knows which code runs
        found = tune_kernel_shapes(loaded.natives, record, target, "quick", [[(8, 64), (64, 32)]], tuner=tuner, budget=2, min_gain=float("-inf"))
    assert found[0].code == "specialised"
    kernel = portkern.load(bundle_path, store=store).kernel("gemm")
    assert set(kernel.buckets) == {"M<=8"}
    a, b = inputs(rng, 8)
    chosen = kernel.code_for(a, b)
    assert chosen == {"bucket": "M<=8", "code": "specialised", "origin": "cache", "config": found[0].config}
    np.testing.assert_allclose(kernel(a, b), reference(a, b), rtol=1e-5, atol=1e-4)
    # another size of the bucket: the dynamic module with the tuned config (when the search found one)
    a, b = inputs(rng, 5)
    tuned = found[0].config != "default"
    assert found[0].bucket_config == found[0].config if tuned else found[0].bucket_config == "default"
    expected = {"bucket": "M<=8", "code": "bucket", "origin": "cache", "config": found[0].config} if tuned else {"code": "dynamic"}
    assert expected.items() <= kernel.code_for(a, b).items()
    np.testing.assert_allclose(kernel(a, b), reference(a, b), rtol=1e-5, atol=1e-4)
    a, b = inputs(rng, 9)  # another bucket: the dynamic default
    assert {"bucket": "M<=16", "code": "dynamic", "config": "default"}.items() <= kernel.code_for(a, b).items()
    np.testing.assert_allclose(kernel(a, b), reference(a, b), rtol=1e-5, atol=1e-4)
    assert any(e.kernel == "gemm.M8" and e.config == found[0].config for e in store.entries())


def test_a_tuned_config_stamped_on_the_dynamic_module_is_correct_for_every_size(bundle_path, store, rng):
    from portkern.jit.runtime import Executable

    loaded = portkern.load(bundle_path, store=store)
    record, target = loaded.record("gemm"), devices.resolve("cpu", store)
    executable = Executable(loaded.native(record, target, "0=cpu:v1:16x32x0,4x16x0,0x0x4").data, record.entry)
    for m in (1, 5, 16, 37):
        a, b = inputs(rng, m)
        np.testing.assert_allclose(executable(a, b)[0], reference(a, b), rtol=1e-5, atol=1e-4)


def test_cli_tune_shapes_and_cache_ls_show_the_bucket(bundle_path, tmp_path, capsys, rng):
    cache = str(tmp_path / "cache")
    argv = ["tune", str(bundle_path), "--kernel", "gemm_bounds", "--shapes", "a=2x64,16x64", "--budget", "1", "--workers", "1", "--cache-dir", cache, "--json"]
    assert main(argv) == 0
    found = json.loads(capsys.readouterr().out)["buckets"]
    assert [(r["bucket"], r["values"]) for r in found] == [("M<=4", {"M": 2}), ("M<=16", {"M": 16})]
    assert main(["cache", "ls", "--cache-dir", cache, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    names = {e["kernel"] for e in (listed["entries"] if isinstance(listed, dict) else listed)}
    specialised = {f"gemm_bounds.M{r['values']['M']}" for r in found if r["code"] == "specialised"}
    assert specialised <= names and "gemm_bounds" in names


@pytest.mark.parametrize(
    "shapes, message",
    [
        (["a=2x64", "a=4x64"], "names 'a' twice"),
        (["a=2x64,4x64,8x64", "b=64x32,64x32"], "different numbers of shapes"),
        (["a2x64"], "expected ARG=SHAPE"),
        (["a=2xq"], "a shape is sizes joined by x"),
    ],
)
def test_cli_tune_shapes_errors_are_one_line(bundle_path, tmp_path, capsys, shapes, message):
    argv = ["tune", str(bundle_path), "--kernel", "gemm", "--cache-dir", str(tmp_path / "cache")]
    for item in shapes:
        argv += ["--shapes", item]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("portkern: error: ") and "\n" not in err and message in err


def test_damaged_bucket_records_cost_only_their_bucket(bundle_path, store, rng):
    from portkern.cache.keys import index_problem
    from portkern.jit.loader import compiler_id, selection_problem

    loaded = portkern.load(bundle_path, store=store)
    record, target = loaded.record("gemm"), devices.resolve("cpu", store)
    problem = index_problem(selection_problem(record, target))
    good = {"label": "M<=8", "values": {"M": 8}, "code": "specialised", "config": "0=cpu:v1:nonsense", "stage": "0" * 64, "size": 1}
    damaged = {
        "M<=8": good,
        "M<=16": {**good, "values": {"M": "16"}},
        "M<=32": {**good, "values": [32]},
        "M<=64": "not a record",
        "M<=128": {**good, "values": {"M": 128}, "surprise": 1},
    }
    store.put_tuning(problem, target.fingerprint, compiler_id(record), {"kernel": "gemm", "buckets": damaged})
    kernel = portkern.load(bundle_path, store=store).kernel("gemm")  # the stage digest no longer matches: skipped
    assert kernel.buckets == {}
    a, b = inputs(rng, 8)
    assert kernel.code_for(a, b)["code"] == "dynamic"
    np.testing.assert_allclose(kernel(a, b), reference(a, b), rtol=1e-5, atol=1e-4)


def test_a_bucket_record_with_a_bad_config_warns_and_runs_the_default(bundle_path, store, rng, caplog):
    from portkern.cache.keys import index_problem
    from portkern.jit import buckets
    from portkern.jit.loader import compiler_id, selection_problem
    from portkern.jit.workers import shared_pool

    loaded = portkern.load(bundle_path, store=store)
    record, target = loaded.record("gemm"), devices.resolve("cpu", store)
    _, special = buckets.specialised_bundle(loaded.bundle, record, {"M": 8}, shared_pool())
    stage = special.stage()
    bad = {"label": "M<=8", "values": {"M": 8}, "code": "specialised", "config": "0=cpu:v1:nonsense", "stage": stage.blob, "size": stage.size}
    problem = index_problem(selection_problem(record, target))
    store.put_tuning(problem, target.fingerprint, compiler_id(record), {"kernel": "gemm", "buckets": {"M<=8": bad}})
    kernel = portkern.load(bundle_path, store=store).kernel("gemm")
    assert logged(caplog, r"the tuned code of bucket M<=8 is not usable .* runs the dynamic default")
    a, b = inputs(rng, 8)
    assert kernel.code_for(a, b)["code"] == "dynamic"
    np.testing.assert_allclose(kernel(a, b), reference(a, b), rtol=1e-5, atol=1e-4)


def test_a_bucket_config_serves_every_size_of_its_bucket(bundle_path, store, rng):
    from portkern.cache.keys import index_problem
    from portkern.jit.loader import compiler_id, selection_problem

    loaded = portkern.load(bundle_path, store=store)
    record, target = loaded.record("gemm"), devices.resolve("cpu", store)
    config = "0=cpu:v1:16x32x0,4x16x0,0x0x4"
    decided = {"label": "M<=8", "values": {"M": 8}, "code": "dynamic", "bucket_config": config, "stage": "", "size": 0}
    problem = index_problem(selection_problem(record, target))
    store.put_tuning(problem, target.fingerprint, compiler_id(record), {"kernel": "gemm", "buckets": {"M<=8": decided}})
    kernel = portkern.load(bundle_path, store=store).kernel("gemm")
    for m in (5, 6, 8):
        a, b = inputs(rng, m)
        assert kernel.code_for(a, b) == {"bucket": "M<=8", "code": "bucket", "origin": "finalized", "config": config}
        np.testing.assert_allclose(kernel(a, b), reference(a, b), rtol=1e-5, atol=1e-4)
    a, b = inputs(rng, 3)
    assert kernel.code_for(a, b)["code"] == "dynamic"
