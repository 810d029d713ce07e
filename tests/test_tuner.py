"""Tuning end to end: bad candidates never win, results are stored and reused, the loader and CLI use them."""

from __future__ import annotations

import sys
import types

import pytest
from helpers import assert_example, assert_matches, cli_json

import portkern
from portkern.base.errors import FinalizeError, PerfConfigError
from portkern.cache import transfer
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.cli.main import main
from portkern.examples import MANIFEST
from portkern.examples.reference import EXAMPLES
from portkern.jit import devices
from portkern.jit.native import compiler_id, selection_problem
from portkern.jit.runtime import Executable
from portkern.portable.builder import build_file
from portkern.tuner import session, strategies
from portkern.tuner.cpu_config import CpuConfig
from portkern.tuner.search import Budget
from portkern.tuner.session import Tuner

#: A parallel vector tile on the reduction loop: compiles, computes wrong numbers (rule P2).
WRONG = CpuConfig((64, 64, 0), (8, 16, 16), (0, 0, 16))
#: Vector ops over whole 64x512 slices: LLVMCPU refuses to compile them (rule P1).
TOO_LARGE = CpuConfig((64, 64, 0), (0, 0, 0), (0, 0, 0))
GOOD = CpuConfig((128, 128, 0), (8, 32, 0), (0, 0, 4))


@pytest.fixture
def adversarial(monkeypatch):
    """A strategy that proposes a wrong, an invalid and a good candidate for dispatch 0."""
    module = types.ModuleType("portkern_test_adversarial")
    module.NAME, module.LEVEL, module.BUDGET = "adversarial", 1, Budget()
    module.choose = lambda found: [d for d in found if d.index == 0]
    module.search = lambda search: search.evaluate([WRONG, TOO_LARGE, GOOD], search.space.stages[-1])
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(strategies.STRATEGIES, "adversarial", module.__name__)
    return "adversarial"


@pytest.fixture
def shared_tuner_closed():
    yield
    session.shared_tuner().close()


def test_bad_candidates_fail_or_are_rejected_and_never_win(examples_bundle, store, rng, adversarial):
    bundle = portkern.load(examples_bundle, store=store)
    record, target = bundle.record("gemm_bias_relu"), devices.resolve("cpu", store)
    with Tuner(workers=2) as tuner:
        result = tuner.tune(bundle.natives, record, target, adversarial)
    status = {e.config: e.status for e in result.evaluations}
    assert status[f"0={WRONG}"] == "wrong"
    assert status[f"0={TOO_LARGE}"] == "error"
    assert status[f"0={GOOD}"] == "ok"
    (tuned,) = result.dispatches
    assert (tuned.evaluated, tuned.failed, tuned.wrong) == (3, 1, 1)
    assert result.config in ("default", f"0={GOOD}") and tuned.config in ("default", str(GOOD))
    # GOOD is chosen exactly when it beat the default by MIN_GAIN side by side, else the default's time stands
    assert (tuned.config == str(GOOD)) == (tuned.best_s < tuned.default_s * (1 - session.MIN_GAIN))
    kernel = bundle.kernel("gemm_bias_relu")  # tune=None: the stored selection
    assert kernel.config == result.config
    assert_example(kernel, rng, "gemm_bias_relu")


def test_second_tune_of_the_same_problem_is_served_from_the_db(examples_bundle, store, tmp_path, rng):
    source = (MANIFEST.parent / "gemm_bias_relu.mlir").read_text().replace("@gemm_bias_relu", "@renamed")
    (tmp_path / "renamed.mlir").write_text(source)
    (tmp_path / "manifest.yaml").write_text("bundle: other\nkernels:\n  - name: renamed\n    source: renamed.mlir\n")
    # without source stages no module options are tried (they are chosen per kernel): only per-dispatch results
    build_file(tmp_path / "manifest.yaml", tmp_path / "other.pkb", source=False)
    build_file(MANIFEST, tmp_path / "first.pkb", source=False)
    target = devices.resolve("cpu", store)
    first_bundle, other_bundle = portkern.load(tmp_path / "first.pkb", store=store), portkern.load(tmp_path / "other.pkb", store=store)
    with Tuner() as tuner:
        first = tuner.tune(first_bundle.natives, first_bundle.record("gemm_bias_relu"), target, "quick", budget=2)
        assert first.source == "search" and first.dispatches[0].evaluated == 2
        # the first search was cut short by its budget: it answers requests that are limited too
        second = tuner.tune(other_bundle.natives, other_bundle.record("renamed"), target, "quick", budget=2)
        assert second.source == "db" and second.dispatches[0].source == "db"
        assert second.dispatches[0].config == first.dispatches[0].config
        composed = "default" if first.dispatches[0].config == "default" else f"0={first.dispatches[0].config}"
        # only the combined check of the stored config (kept, or dropped when not faster as a whole), no search
        assert {e.config for e in second.evaluations} <= {composed} and second.config in (composed, "default")
        assert tuner.tune(other_bundle.natives, other_bundle.record("renamed"), target, "quick", budget=2).source == "selection"
        # a more thorough strategy is not answered by a quick result
        assert tuner.tune(other_bundle.natives, other_bundle.record("renamed"), target, "random", budget=1).source == "search"
    record = other_bundle.record("renamed")
    assert store.get_tuning(selection_problem(record, target), target.fingerprint, compiler_id(record))["strategy"] == "random"
    kernel = other_bundle.kernel("renamed")
    assert kernel.config == "default" or kernel.config.startswith("0=cpu:v1:")
    assert_example(kernel, rng, "gemm_bias_relu")


def test_loader_tunes_then_reuses_the_selection(examples_bundle, store, rng, shared_tuner_closed):
    bundle = portkern.load(examples_bundle, store=store)
    tuned = bundle.kernel("gemm_transpose_add", tune="quick")
    assert_example(tuned, rng, "gemm_transpose_add")
    assert tuned.tuning is not None and tuned.tuning.source == "search"
    if tuned.config != "default":
        assert tuned.origin == "tuned"
        (entry,) = [e for e in store.entries() if e.config == tuned.config]
        assert entry.kernel_time_s == tuned.tuning.best_s > 0
    again = bundle.kernel("gemm_transpose_add")
    assert again.config == tuned.config
    assert again.origin == "cache"
    assert_example(again, rng, "gemm_transpose_add")
    # its calls run where the tuning found them faster (the executor: said in the note), later loads too
    inputs = EXAMPLES["gemm_transpose_add"].inputs(rng)
    assert tuned.tuning.executor == ("task executor" in tuned.tuning.note)
    assert tuned.executable.driver_for(inputs) == again.executable.driver_for(inputs)
    if tuned.tuning.executor:
        assert again.executable.driver_for(inputs) == "local-task"
    assert bundle.kernel("gemm_transpose_add", tune="default").config == "default"
    mlp = bundle.kernel("mlp", tune="quick")  # only small dispatches: left at the default, nothing searched
    assert mlp.config == "default"
    assert bundle.kernel("mlp", tune="quick").tuning.source == "selection"  # and that is remembered


def test_export_import_carries_tuning_results(examples_bundle, store, tmp_path, rng):
    bundle = portkern.load(examples_bundle, store=store)
    target = devices.resolve("cpu", store)
    with Tuner() as tuner:
        tuned = tuner.tune(bundle.natives, bundle.record("gemm_rowsum"), target, "quick", budget=1)
    report = transfer.export(store, tmp_path / "fleet.pkx")
    # the kernel's selection, its module-options decision and each searched dispatch's result
    records = 2 + sum(d.source == "search" for d in tuned.dispatches)
    assert report.records == records
    other = Store(CacheConfig(tmp_path / "other-cache", 1 << 30, False))
    assert transfer.import_(other, tmp_path / "fleet.pkx", allow_unsigned=True).records == records
    elsewhere = portkern.load(examples_bundle, store=other)
    with Tuner() as tuner:
        again = tuner.tune(elsewhere.natives, elsewhere.record("gemm_rowsum"), target, "quick", budget=1)
    assert again.source == "selection" and again.config == tuned.config
    kernel = elsewhere.kernel("gemm_rowsum")
    assert kernel.config == tuned.config
    assert kernel.origin == ("cache" if tuned.config != "default" else "finalized")
    assert_example(kernel, rng, "gemm_rowsum")


@pytest.mark.parametrize("name, config", [
    ("gemm_glu", "0=cpu:v1:128x128x0,8x32x0,0x0x4;1=cpu:v1:64x128,2x32,0x0"),
    ("gemm_rowsum", "1=cpu:v1:32x0,4x0,0x32"),
])
def test_compile_config_builds_correct_code(examples_bundle, store, rng, name, config):
    bundle = portkern.load(examples_bundle, store=store)
    target = devices.resolve("cpu", store)
    code = bundle.native(bundle.record(name), target, config).data
    example = EXAMPLES[name]
    inputs = example.inputs(rng)
    outputs = Executable(code, bundle.record(name).entry, target.driver)(*inputs)
    assert_matches(tuple(outputs), example.reference(*inputs), example.rtol, example.atol)


def test_a_module_option_builds_correct_code_from_the_source_stage(examples_bundle, store, rng, tmp_path):
    """`data-tiling` (a module option) compiles the kernel from its source stage with IREE's data
    tiling: other code under another key, the same results (the example's tolerance)."""
    bundle = portkern.load(examples_bundle, store=store)
    target = devices.resolve("cpu", store)
    record = bundle.record("gemm_bias_relu")
    plan, default = bundle.plan(record, target, "data-tiling"), bundle.plan(record, target)
    assert plan.stage.is_source and "--iree-opt-data-tiling" in plan.target.flags
    assert plan.key != default.key and plan.target.fingerprint == target.fingerprint
    code = bundle.native(record, target, "data-tiling").data
    assert code != bundle.native(record, target).data
    example = EXAMPLES["gemm_bias_relu"]
    inputs = example.inputs(rng)
    assert_matches(tuple(Executable(code, record.entry, target.driver)(*inputs)), example.reference(*inputs), example.rtol, example.atol)
    built = tmp_path / "no-source.pkb"
    build_file(MANIFEST, built, source=False)
    with pytest.raises(FinalizeError, match="no-source"):
        other = portkern.load(built, store=store)
        other.native(other.record("gemm_bias_relu"), target, "data-tiling")


def test_quick_times_module_options_whole_and_keeps_a_correct_kernel(examples_bundle, store, rng):
    kernel = portkern.load(examples_bundle, store=store).kernel("gemm_bias_relu", tune="quick")
    tuning = kernel.tuning
    tried = [e for e in tuning.evaluations if e.config.startswith("data-tiling")]
    # each compiled and matched the default's outputs (or compiled to the same code as another)
    assert tried and all(e.ok or e.status == "duplicate" for e in tried), [(e.config, e.status, e.error) for e in tried]
    assert any(e.ok for e in tried)
    assert "module options timed whole" in tuning.note
    assert_example(kernel, rng, "gemm_bias_relu")


@pytest.mark.parametrize("config, message", [
    ("0=amdgpu:v2:64x128x0,2x4x0,0x0x0,0x0x16,none,256x1x1,64,2,0", "needs a cpu config"),
    ("5=cpu:v1:64x64x0,8x32x0,0x0x4", "names dispatch 5"),
    ("0=cpu:v9:64x64x0,8x32x0,0x0x4", "unknown cpu version"),
])
def test_compile_config_refuses_configs_that_do_not_fit(examples_bundle, store, config, message):
    bundle = portkern.load(examples_bundle, store=store)
    with pytest.raises(PerfConfigError, match=message):
        bundle.native(bundle.record("gemm_bias_relu"), devices.resolve("cpu", store), config)


def test_time_limit_stops_the_search(examples_bundle, store):
    bundle = portkern.load(examples_bundle, store=store)
    with Tuner(workers=1) as tuner:
        result = tuner.tune(bundle.natives, bundle.record("gemm_rowsum"), devices.resolve("cpu", store), "full", time_limit=0.2)
    assert sum(d.evaluated for d in result.dispatches) <= 2  # one chunk of two candidates, then out of time
    first, second = result.dispatches
    assert not first.complete and "time limit" in first.note
    # compiling and timing the first dispatch's default alone takes longer than the whole limit
    assert second.source == "skipped" and not second.complete and "time limit" in second.note
    assert not result.complete


def test_cli_tune(examples_bundle, tmp_path, capsys):
    argv = ["tune", examples_bundle, "--kernel", "gemm_rowsum", "--budget", "1", "--cache-dir", tmp_path]
    status, output = cli_json(capsys, *argv)
    assert status == 0 and output["json_format"] == 1 and output["ok"] is True and output["errors"] == []
    (report,) = output["kernels"]
    assert report["kernel"] == "gemm_rowsum" and report["source"] == "search" and report["strategy"] == "quick"
    # --budget 1: one module-option variant (data tiling) timed whole, then one candidate per searched
    # dispatch of the module chosen; the kernel is marked cut short
    assert report["complete"] is False and "module options timed whole" in report["note"]
    assert "data-tiling" in {e["config"] for e in report["evaluations"]}
    for d in report["dispatches"]:
        assert d["complete"] is False
        assert d["evaluated"] <= 1 and d["default_s"] > 0 if d["source"] == "search" else d["note"]
    status, output = cli_json(capsys, *argv)  # the same limited request: the incomplete result answers it
    assert status == 0 and output["kernels"][0]["source"] == "selection"
    assert main(["tune", str(examples_bundle), "--kernel", "gemm_rowsum", "--budget", "1", "--cache-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "gemm_rowsum" in shown and "selection" in shown


@pytest.mark.parametrize("extra, message", [
    (["--workers", "0"], "--workers must be at least 1"),
    (["--budget", "-1"], "candidate count >= 0"),
    (["--kernel", "nope"], "has no kernel 'nope'"),
])
def test_cli_tune_errors(examples_bundle, tmp_path, capsys, extra, message):
    assert main(["tune", str(examples_bundle), "--cache-dir", str(tmp_path), *extra]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("portkern: error: ") and "\n" not in err and message in err


def test_cli_tune_json_gives_each_failed_candidates_reason(examples_bundle, tmp_path, capsys, adversarial):
    status, output = cli_json(capsys, "tune", examples_bundle, "--kernel", "gemm_bias_relu", "--strategy", adversarial, "--cache-dir", tmp_path)
    assert status == 0
    (kernel,) = output["kernels"]
    failed = {c["config"]: c for c in kernel["failed_candidates"]}
    assert set(failed) == {f"0={WRONG}", f"0={TOO_LARGE}"}
    assert failed[f"0={WRONG}"]["status"] == "wrong" and "exceeds rtol" in failed[f"0={WRONG}"]["reason"]
    assert failed[f"0={TOO_LARGE}"]["status"] == "error" and failed[f"0={TOO_LARGE}"]["reason"]
    timed = [e for e in kernel["evaluations"] if e["status"] == "ok"]
    assert timed and all(t["min_s"] <= t["median_s"] and t["spread"] >= 0 for e in timed for t in e["timings"].values())
