"""Dispatch analysis, stamping and CPU search spaces, on the example kernels as IREE configures them."""

from __future__ import annotations

import math

import pytest

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.errors import PerfConfigError
from portkern.jit import devices, finalize
from portkern.portable.compiler import operations
from portkern.tuner import analysis as dispatch_module
from portkern.tuner.amdgpu_config import AmdGpuConfig
from portkern.tuner.cpu_config import CpuConfig
from portkern.tuner.cpu_space import CpuSpace
from portkern.tuner.kernel_config import KernelConfig
from portkern.tuner.registry import space_for


@pytest.fixture(scope="module")
def configured(examples_bundle, tmp_path_factory):
    """Per example kernel: its module at executable-configurations and its dispatches."""
    store = Store(CacheConfig(tmp_path_factory.mktemp("space-cache"), 1 << 30, False))
    bundle = portkern.load(examples_bundle, store=store)
    target = devices.resolve("cpu", store)
    found = {}
    for name in bundle:
        module = finalize.configure(bundle.bundle, bundle.record(name), target)
        found[name] = (module, dispatch_module.dispatches(module))
    return found


def all_dispatches(configured):
    return [d for _, found in configured.values() for d in found]


def test_dispatches_of_the_examples(configured):
    counts = {name: len(found) for name, (_, found) in configured.items()}
    assert counts == {"gemm_bias_relu": 1, "gemm_glu": 2, "gemm_rowsum": 2, "gemm_transpose_add": 1, "mlp": 3}
    gemm = configured["gemm_bias_relu"][1][0]
    assert (gemm.family, gemm.root, gemm.sizes, gemm.parallel, gemm.element_bytes) == (
        "cpu", "linalg.matmul", (256, 384, 512), (True, True, False), 4
    )
    assert isinstance(gemm.default, CpuConfig) and gemm.default.rank == 3 and gemm.tunable
    assert gemm.native_vector_bytes in (16, 32, 64)
    rowsum = configured["gemm_rowsum"][1][1]
    assert rowsum.sizes == (256, 384) and rowsum.parallel == (True, False)


def test_problem_keys_describe_what_a_dispatch_computes(configured):
    problems = [d.problem for d in all_dispatches(configured)]
    assert len(set(problems)) == len(problems)  # every example dispatch differs
    gemm = configured["gemm_bias_relu"][1][0]
    assert "*linalg.matmul" in gemm.problem and "tensor<256x512xf32>" in gemm.problem
    assert "gemm_bias_relu" not in gemm.problem  # names do not matter, only the computation
    again = dispatch_module.dispatches(configured["gemm_bias_relu"][0])[0]
    assert again.problem == gemm.problem


def test_spaces_hold_only_valid_candidates(configured):
    for d in all_dispatches(configured):
        space = space_for(d, threads=2)
        assert isinstance(space, CpuSpace)
        stage0 = space.stage_candidates(0, [])
        stage1 = space.stage_candidates(1, [space.default, *stage0[:2]])
        joint = space.joint()
        for config in {*stage0, *stage1, *joint}:
            assert config != space.default
            assert space.prune_reason(config) is None, (d.label, str(config))
            for i, parallel in enumerate(d.parallel):
                if parallel:
                    assert config.vector_reduction[i] == 0
                    tile = config.distribution[i]
                    assert tile == 0 or d.sizes[i] % tile == 0 or tile == d.default.distribution[i]
                else:
                    assert config.vector_parallel[i] == 0 and config.distribution[i] == 0
        assert set(space.quick_candidates(0, [])) <= set(stage0)
        assert set(stage0) <= set(joint)


def test_prune_rules(configured):
    gemm = configured["gemm_bias_relu"][1][0]
    space = space_for(gemm, threads=2)
    assert space.prune_reason(CpuConfig((64, 64, 0), (8, 16, 16), (0, 0, 16))).startswith("P2")
    assert space.prune_reason(CpuConfig((64, 64, 0), (0, 0, 0), (0, 0, 0))).startswith("P1")
    assert space.prune_reason(CpuConfig((32, 32, 0), (8, 64, 0), (0, 0, 4))).startswith("P3")
    assert space.prune_reason(CpuConfig((64, 64, 0), (4, 16, 0), (0, 0, 4))).startswith("P4")
    assert space.prune_reason(CpuConfig((64, 64, 0), (8, 32, 0), (0, 0, 4))) is None


def test_gemm_space_sizes(configured):
    space = space_for(configured["gemm_bias_relu"][1][0], threads=2)
    stage0 = space.stage_candidates(0, [])
    assert 20 <= len(stage0) <= 60
    assert 5 <= len(space.quick_candidates(0, [])) <= 12
    # the cost model prefers a wider register tile than IREE's default
    best = min(stage0, key=space.score)
    assert space.score(best) < space.score(space.default)
    assert math.prod(v for v in best.vector_parallel if v) > math.prod(v for v in space.default.vector_parallel if v)


def test_stamp_writes_root_and_consumers(configured):
    module, found = configured["gemm_bias_relu"]
    context = finalize.compiler_for(devices.resolve("cpu")).context
    config = CpuConfig((128, 128, 0), (8, 32, 0), (0, 0, 4))
    stamped = dispatch_module.stamp(module, KernelConfig.of({0: config}), context)
    configs = [str(op.attributes["lowering_config"]) for op in operations(stamped) if "lowering_config" in op.attributes]
    assert config.lowering_config() in configs
    assert "#iree_cpu.lowering_config<vector_common_parallel = [8, 32]>" in configs  # fill and epilogue follow
    assert dispatch_module.dispatches(stamped)[0].default == config
    assert dispatch_module.dispatches(module)[0].default == found[0].default  # the original is untouched


@pytest.mark.parametrize(
    "config, message",
    [
        ({0: AmdGpuConfig((64, 128, 0), (2, 4, 0), (0, 0, 0), (0, 0, 16), "none", (256, 1, 1), 64, 2, 0)}, "needs a cpu config"),
        ({0: CpuConfig((64, 64), (8, 32), (0, 0))}, "over 3 loops"),
        ({3: CpuConfig((64, 64, 0), (8, 32, 0), (0, 0, 4))}, "names dispatch 3"),
    ],
)
def test_stamp_refuses_configs_that_do_not_fit(configured, config, message):
    module, _ = configured["gemm_bias_relu"]
    context = finalize.compiler_for(devices.resolve("cpu")).context
    with pytest.raises(PerfConfigError, match=message):
        dispatch_module.stamp(module, KernelConfig.of(config), context)


def test_amd_config_stamps_and_cross_compiles(examples_bundle):
    """A gfx942 dispatch: read IREE's config, stamp another, compile real AMD code (no GPU needed)."""
    from portkern.portable.bundle import read_bundle
    from portkern.portable.compiler import Compiler

    bundle = read_bundle(examples_bundle)
    record = bundle.kernel("gemm_bias_relu")
    stage = record.stage("any")
    compiler = Compiler(("--iree-hal-target-device=hip", "--iree-rocm-target=gfx942"))
    module = compiler.lower(compiler.parse(bundle.blob(stage.blob)), from_phase=stage.phase, to_phase=finalize.CONFIGURED_PHASE)
    (found,) = dispatch_module.dispatches(module)
    assert found.family == "amdgpu" and isinstance(found.default, AmdGpuConfig)
    found.default.check()
    assert len(space_for(found, threads=2).joint()) >= 16  # the AMD space (tests/test_gpu_spaces.py checks its rules)
    new = AmdGpuConfig((32, 128, 0), (1, 4, 0), (0, 0, 0), (0, 0, 8), found.default.mma, (256, 1, 1), 64, 0, 2)
    new.check()
    stamped = dispatch_module.stamp(module, KernelConfig.of({0: new}), compiler.context)
    assert dispatch_module.dispatches(stamped)[0].default == new
    default_code = compiler.to_vmfb(module, from_phase=finalize.CONFIGURED_PHASE)
    tuned_code = compiler.to_vmfb(stamped, from_phase=finalize.CONFIGURED_PHASE)
    assert tuned_code != default_code
    assert b"\x7fELF" in tuned_code and b"gfx942" in tuned_code


def test_root_problem_is_the_root_ops_part_of_the_problem_key(configured):
    gemm = configured["gemm_bias_relu"][1][0]
    root = dispatch_module.root_problem(gemm.problem)
    assert root.startswith("*linalg.matmul") and " ; " not in root and root in gemm.problem
    assert "tensor<256x512xf32>" in root and root != gemm.problem  # the fill and epilogue are left out
