"""Tuning whole ONNX models from the CLI as a pipeline would: every strategy ends in a result or a
stated reason, one kernel's failure does not stop the others, cut-short searches are not served as
complete, and `--strategy default` means what the kernel then uses."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
from helpers import assert_matches, one_kernel_bundle

import portkern
from portkern.base.errors import PerfConfigError
from portkern.cache.config import from_env
from portkern.cache.store import Store
from portkern.cli.main import main
from portkern.tuner import strategies
from portkern.tuner.search import Budget

onnx = pytest.importorskip("onnx", reason="the ONNX models need the onnx package (portkern[onnx])")

#: The single-Conv model of issue 24: x 4x3x32x32, W 16x3x3x3, pads 1.
X_SHAPE, W_SHAPE = (4, 3, 32, 32), (16, 3, 3, 3)


def conv_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """NCHW convolution, stride 1, padding 1, in float64."""
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # n c h w kh kw
    return np.einsum("nchwij,fcij->nfhw", windows, w.astype(np.float64))


@pytest.fixture(scope="module")
def conv_model(tmp_path_factory):
    """A bundle holding the single-Conv model, and its weights."""
    from onnx import TensorProto, helper, numpy_helper

    where = tmp_path_factory.mktemp("conv")
    weights = np.random.default_rng(0).uniform(-1, 1, W_SHAPE).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X_SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16, 32, 32])],
        initializer=[numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    (where / "conv.onnx").write_bytes(model.SerializeToString())
    return one_kernel_bundle(where, "conv.onnx", "conv"), weights


def tune_json(capsys, *argv) -> tuple[int, dict]:
    status = main(["tune", *map(str, argv), "--json"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return status, json.loads(captured.out)


def check_outcomes(report: dict) -> None:
    """Every dispatch ended in a result or a stated reason."""
    for kernel in report["kernels"]:
        for d in kernel["dispatches"]:
            assert d["source"] in ("search", "db", "skipped"), d
            if d["source"] == "skipped" or d["evaluated"] == 0 or not d["complete"]:
                assert d["note"], d
            if d["source"] == "search" and d["evaluated"]:
                assert d["default_s"] and d["best_s"], d
        for failed in kernel["failed_candidates"]:
            assert failed["reason"], failed


@pytest.mark.parametrize("strategy", ["quick", "guided", "random", "full", "default"])
def test_single_conv_model_through_every_strategy(conv_model, tmp_path, capsys, strategy):
    bundle_path, weights = conv_model
    status, report = tune_json(capsys, bundle_path, "--strategy", strategy, "--budget", "2", "--cache-dir", tmp_path)
    assert status == 0 and report["ok"] and report["errors"] == [] and report["json_format"] == 1
    check_outcomes(report)
    (kernel,) = report["kernels"]
    if strategy != "default":
        # the convolution's dispatch: its matmul after im2col (portable.lower.IM2COL_FLAGS), or a direct one
        convolution = [d for d in kernel["dispatches"] if "_conv_" in d["name"] or "_matmul_like_" in d["name"]]
        assert len(convolution) == 1 and convolution[0]["source"] == "search" and convolution[0]["evaluated"] >= 1
    bundle = portkern.load(bundle_path, store=Store(from_env(str(tmp_path))))
    conv = bundle.kernel("conv")  # the stored selection
    assert conv.config == kernel["config"]
    x = np.random.default_rng(1).uniform(-1, 1, X_SHAPE).astype(np.float32)
    assert_matches(conv(x), (conv_reference(x, weights).astype(np.float32),), 1e-4, 1e-4)


def test_time_limited_search_is_stored_incomplete_and_a_complete_request_runs_again(conv_model, tmp_path, capsys):
    bundle_path, _ = conv_model
    common = [bundle_path, "--strategy", "full", "--workers", "1", "--cache-dir", tmp_path]
    status, cut = tune_json(capsys, *common, "--time-limit", "0.5")
    assert status == 0
    (kernel,) = cut["kernels"]
    assert kernel["complete"] is False
    assert any(not d["complete"] and ("time limit" in d["note"]) for d in kernel["dispatches"])
    status, again = tune_json(capsys, *common, "--budget", "1")  # a limited request: served no more than asked
    assert again["kernels"][0]["source"] == "selection"
    status, full = tune_json(capsys, *common)
    (kernel,) = full["kernels"]
    assert kernel["source"] == "search" and kernel["complete"] is True  # not served from the incomplete record
    status, served = tune_json(capsys, *common)
    assert served["kernels"][0]["source"] == "selection" and served["kernels"][0]["complete"] is True


def test_strategy_default_stores_what_the_kernel_then_uses(examples_bundle, tmp_path, capsys):
    common = [examples_bundle, "--kernel", "gemm_bias_relu", "--cache-dir", tmp_path]
    status, tuned = tune_json(capsys, *common, "--strategy", "quick", "--budget", "1")
    status, pinned = tune_json(capsys, *common, "--strategy", "default")
    assert status == 0 and pinned["kernels"][0]["config"] == "default"
    bundle = portkern.load(examples_bundle, store=Store(from_env(str(tmp_path))))
    assert bundle.kernel("gemm_bias_relu").config == "default"
    status, again = tune_json(capsys, *common, "--strategy", "quick", "--budget", "1")
    # a search is asked for again: the stored per-dispatch result answers it, no new search
    assert again["kernels"][0]["source"] == "db" and again["kernels"][0]["dispatches"][0]["config"] == tuned["kernels"][0]["dispatches"][0]["config"]


@pytest.fixture
def failing_for_glu(monkeypatch):
    """A strategy whose search of gemm_glu's dispatches raises a typed error (quick for the others)."""
    quick = strategies.get("quick")
    module = types.ModuleType("portkern_test_failing")
    module.NAME, module.LEVEL, module.BUDGET = "failing", 1, Budget(1)
    module.choose = quick.choose

    def search(search):
        if search.kernel == "gemm_glu":
            raise PerfConfigError("a proposed config does not fit")
        quick.search(search)

    module.search = search
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(strategies.STRATEGIES, "failing", module.__name__)
    return "failing"


def test_one_kernels_failure_is_reported_and_the_others_are_tuned(examples_bundle, tmp_path, capsys, failing_for_glu):
    argv = [examples_bundle, "--kernel", "gemm_glu", "--kernel", "gemm_bias_relu", "--strategy", failing_for_glu, "--cache-dir", tmp_path]
    status, report = tune_json(capsys, *argv)
    assert status == 1 and report["ok"] is False
    (error,) = report["errors"]
    assert error["kernel"] == "gemm_glu" and error["dispatch"].startswith("0:") and error["type"] == "DispatchTuningError"
    assert "PerfConfigError: a proposed config does not fit" in error["message"]
    (tuned,) = report["kernels"]
    assert tuned["kernel"] == "gemm_bias_relu" and tuned["dispatches"][0]["evaluated"] == 1
    assert main(["tune", *map(str, argv)]) == 1
    captured = capsys.readouterr()
    assert "gemm_glu dispatch 0:" in captured.out and "Traceback" not in captured.err


def test_json_of_build_finalize_run_and_tune_carries_the_format_and_per_kernel_timings(conv_model, tmp_path, capsys):
    import shutil

    from portkern.examples import MANIFEST

    bundle_path, _ = conv_model
    shutil.copytree(MANIFEST.parent, tmp_path / "src")
    assert main(["build", str(tmp_path / "src" / "manifest.yaml"), "-o", str(tmp_path / "ex.pkb"), "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert built["json_format"] == 1 and built["kernels"] and all(k["build_s"] > 0 for k in built["kernels"])
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert main(["finalize", str(bundle_path), "--target", "cpu", *cache, "--json"]) == 0
    finalized = json.loads(capsys.readouterr().out)
    assert finalized["json_format"] == 1 and finalized["entries"][0]["finalize_s"] > 0
    x = np.random.default_rng(2).uniform(-1, 1, X_SHAPE).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(bundle_path), "conv", "--inputs", str(tmp_path / "x.npy"), *cache, "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert ran["json_format"] == 1 and ran["timings"]["kernel_s"] >= 0 and ran["timings"]["call_s"] > 0
    status, tuned = tune_json(capsys, bundle_path, "--budget", "1", *cache)
    assert tuned["json_format"] == 1 and tuned["kernels"][0]["wall_s"] > 0 and tuned["kernels"][0]["default_s"] > 0
