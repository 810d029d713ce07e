"""GPU search spaces (AMD gfx942, NVIDIA sm_90) from the dispatch and the target's limits, and
compile-only tuning: a seeded few candidates compiled to checked code objects (the full spaces: bench/gpu_spaces.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from helpers import build_mlir

import portkern
from portkern.base.errors import PerfConfigError
from portkern.cli.main import main
from portkern.examples import GEMM_RELU_768
from portkern.jit import devices
from portkern.jit.workers import Pool
from portkern.tuner import gpu_space, gpu_target, registry
from portkern.tuner.compile_only import compile_space
from portkern.tuner.gpu_config import mma_shape

TARGETS = ["gfx942", "cuda:sm_90"]


@pytest.fixture(scope="module")
def gemm768(tmp_path_factory):
    return build_mlir(tmp_path_factory.mktemp("gemm768"), "gpuspace", gemm_relu_768=GEMM_RELU_768.read_text())


@pytest.fixture(scope="module")
def analysed(examples_bundle, gemm768):
    """`analysed(bundle, kernel, spec)`: the kernel's dispatches lowered for a device (memoised)."""
    found = {}
    paths = {"examples": examples_bundle, "gpuspace": gemm768}

    def analyse(bundle: str, kernel: str, spec: str):
        if (bundle, kernel, spec) not in found:
            loaded = portkern.load(paths[bundle])
            result = loaded.natives.analyse(loaded.plan(loaded.record(kernel), devices.resolve(spec)))
            found[bundle, kernel, spec] = [registry.dispatch_from_data(d) for d in result.dispatches]
        return found[bundle, kernel, spec]

    return analyse


def _space(analysed, bundle, kernel, spec):
    dispatch = analysed(bundle, kernel, spec)[0]
    space = registry.space_for(dispatch, threads=2)
    assert space is not None, registry.no_space_reason(dispatch)
    return dispatch, space


@pytest.mark.parametrize("spec", TARGETS)
@pytest.mark.parametrize("bundle, kernel", [("examples", "gemm_bias_relu"), ("examples", "gemm_glu"), ("gpuspace", "gemm_relu_768")])
def test_space_follows_the_dispatch_and_the_targets_limits(analysed, bundle, kernel, spec):
    dispatch, space = _space(analysed, bundle, kernel, spec)
    limits = gpu_target.limits(dispatch.gpu_target)
    assert dispatch.family == ("amdgpu" if spec.startswith("gfx") else "cuda")
    assert limits.arch == spec.partition(":")[2] or limits.arch == spec
    candidates = space.joint()
    assert len(candidates) >= 16
    assert dispatch.default not in candidates and len(set(map(str, candidates))) == len(candidates)
    m, n = space.tiled
    k = space.reduction_loop
    for config in candidates:
        assert space.prune_reason(config) is None
        config.check()
        assert dispatch.sizes[m] % config.workgroup[m] == 0 and dispatch.sizes[n] % config.workgroup[n] == 0  # G1
        assert config.threads <= limits.max_threads
        if config.mma != "none":  # gfx942 f32: MFMA; sm_90 has no f32 intrinsic: SIMT thread tiles
            assert config.mma in limits.mma  # G2
            assert config.threads // config.subgroup_size <= 8  # G3
            assert dispatch.sizes[k] % (config.reduction[k] * mma_shape(config.mma)[2]) == 0  # G1
            assert space.shared_memory(config) <= limits.max_workgroup_memory  # G5
        else:
            assert config.workgroup_size == (32, config.threads // 32, 1)  # G6
            assert dispatch.sizes[k] % config.reduction[k] == 0
    assert (dispatch.default.mma != "none") == spec.startswith("gfx")


@pytest.mark.parametrize(
    "spec, change, rule",
    [
        ("gfx942", dict(workgroup=(100, 128, 0)), "G1"),
        ("gfx942", dict(reduction=(0, 0, 7)), "G1"),
        ("gfx942", dict(mma="MFMA_F32_16x16x16_F16", reduction=(0, 0, 8)), "G2"),
        ("gfx942", dict(workgroup=(256, 128, 0), subgroup=(4, 2, 0), workgroup_size=(1024, 1, 1)), "G3"),
        ("gfx942", dict(reduction=(0, 0, 160)), "G5"),
        ("gfx942", dict(subgroup=(1, 1, 0), workgroup=(32, 32, 0), workgroup_size=(256, 1, 1)), "G4"),
        ("gfx942", dict(workgroup=(256, 64, 0), subgroup=(8, 1, 0), reduction=(0, 0, 1), workgroup_size=(512, 1, 1), prefetch_stages=3), "G7"),
        ("cuda:sm_90", dict(workgroup_size=(256, 1, 1)), "G6"),
        ("cuda:sm_90", dict(thread=(8, 16, 0), workgroup=(256, 128, 1), workgroup_size=(32, 8, 1)), "G4"),
        ("cuda:sm_90", dict(reduction=(0, 0, 33)), "G1"),
    ],
)
def test_rules_prune_what_they_say(analysed, spec, change, rule):
    dispatch, space = _space(analysed, "gpuspace", "gemm_relu_768", spec)
    try:
        config = replace(dispatch.default, **change)
    except PerfConfigError as exc:  # out of the config's own bounds
        pytest.fail(f"{change}: {exc}")
    reason = space.prune_reason(config)
    assert reason is not None and reason.startswith(rule), reason


def test_kind_of_root_and_family_are_kept(analysed):
    dispatch, space = _space(analysed, "gpuspace", "gemm_relu_768", "gfx942")
    simt = replace(dispatch.default, mma="none", subgroup=(0, 0, 0), thread=(1, 4, 0))
    assert "kind of root" in space.prune_reason(simt)
    cuda_dispatch, _ = _space(analysed, "gpuspace", "gemm_relu_768", "cuda:sm_90")
    assert "not a AmdGpuConfig" in space.prune_reason(cuda_dispatch.default)


@pytest.mark.parametrize("spec", TARGETS)
def test_quick_tries_tiles_that_keep_a_mid_size_gpu_busy(analysed, spec):
    """A GEMM too small for large tiles to fill the GPU: every `quick` candidate launches at least
    half as many workgroups (over the parallel loops) as a mid-size GPU has compute units."""
    dispatch, space = _space(analysed, "examples", "gemm_bias_relu", spec)
    for config in space.quick_candidates(0, []):
        workgroups = math.prod(s // w for s, w, p in zip(dispatch.sizes, config.workgroup, dispatch.parallel) if w and p)
        assert workgroups >= gpu_space.COMPUTE_UNITS // 2, (str(config), workgroups)


@pytest.mark.parametrize("spec", TARGETS)
def test_compile_only_a_seeded_few_give_checked_code_objects(gemm768, spec):
    loaded = portkern.load(gemm768)
    target = devices.resolve(spec)  # compiling only, whether or not such a GPU is here
    with Pool(2) as pool:
        (report,) = compile_space(loaded.natives, loaded.record("gemm_relu_768"), target, pool, budget=3)
    assert report.candidates == 4 and "3 of" in report.note  # the default and three from the space
    assert report.compiled == 4 and report.failed == 0, report.failures


def test_configs_the_rules_prune_fail_in_the_compiler(gemm768):
    """G1 and G5 as IREE 3.13 enforces them for gfx942: a workgroup tile that does not divide its loop
    does not bufferize; operand tiles beyond the shared-memory limit are refused."""
    from portkern.tuner.evaluate import Evaluator, IreeCandidates
    from portkern.tuner.kernel_config import KernelConfig

    loaded = portkern.load(gemm768)
    record, target = loaded.record("gemm_relu_768"), devices.resolve("gfx942")
    analysis = loaded.natives.analyse(loaded.plan(record, target))
    default = registry.dispatch_from_data(analysis.dispatches[0]).default
    from portkern.jit.finalize import CONFIGURED_PHASE
    from portkern.jit.workers import Source

    source = Source("gemm768-gfx942", analysis.configured, CONFIGURED_PHASE)
    bad = {
        "G1": replace(default, workgroup=(256, 256, 0), subgroup=(4, 8, 0), workgroup_size=(512, 1, 1)),
        "G5": replace(default, reduction=(0, 0, 160)),
    }
    with Pool(2) as pool:
        candidates = IreeCandidates(target, record.name, source, record.entry, record.signature)
        evaluator = Evaluator(pool, target, record.name, candidates, target.driver)
        configs = {rule: str(KernelConfig().with_dispatch(0, config)) for rule, config in bad.items()}
        evaluator.compile(list(configs.values()))
    assert evaluator.results[configs["G1"]].status == "error" and "bufferized" in evaluator.results[configs["G1"]].error
    assert "shared memory" in evaluator.results[configs["G5"]].error and "65536" in evaluator.results[configs["G5"]].error


def test_cli_compile_only_reports_counts_and_stores_nothing(examples_bundle, tmp_path, capsys):
    import json

    from portkern.cache.config import CacheConfig
    from portkern.cache.store import Store

    cache = tmp_path / "cache"
    status = main(["tune", str(examples_bundle), "--device", "cuda:sm_90", "--compile-only", "--budget", "1",
                   "--kernel", "gemm_rowsum", "--cache-dir", str(cache), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert status == 0 and data["ok"] and data["compile_only"] and data["device"] == "cuda:sm_90"
    (kernel,) = data["kernels"]
    first, second = kernel["dispatches"]
    assert (first["candidates"], first["compiled"], first["failed"]) == (2, 2, 0)
    assert (second["candidates"], second["compiled"], second["failed"]) == (1, 1, 0)  # the row sum: no space, its note says why
    assert "reduction loop" in second["note"]
    store = Store(CacheConfig(cache, 1 << 30, False))
    assert store.entries() == [] and store.stats()["tuning_results"] == 0
    assert main(["tune", str(examples_bundle), "--device", "gfx942", "--kernel", "gemm_rowsum", "--cache-dir", str(cache)]) == 1
    assert "cannot tune for amdgpu:gfx942 here" in capsys.readouterr().err
