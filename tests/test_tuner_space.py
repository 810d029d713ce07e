"""Dispatch analysis, stamping and CPU search spaces, on the example kernels as IREE configures them for
named x86-64 ISA levels (never the host's own CPU): expectations follow each level's vector width."""

from __future__ import annotations

import math

import pytest

import portkern
from portkern.base.errors import PerfConfigError
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.jit import devices, finalize
from portkern.portable.compiler import operations
from portkern.tuner import analysis as dispatch_module
from portkern.tuner.amdgpu_config import AmdGpuConfig
from portkern.tuner.cpu_config import CpuConfig
from portkern.tuner.cpu_space import CpuSpace
from portkern.tuner.kernel_config import KernelConfig
from portkern.tuner.registry import space_for

#: The x86-64 ISA levels these tests configure for (cross-compiled: configuring runs no code, so every
#: host checks both), with each level's vector register width in bytes and register count (AVX2:
#: 16 ymm registers of 32 bytes; AVX-512: 32 zmm registers of 64 bytes).
ISA = {"cpu:x86-64-v3": (32, 16), "cpu:x86-64-v4": (64, 32)}
F32_BYTES = 4


@pytest.fixture(scope="module", params=sorted(ISA))
def configured(request, examples_bundle, tmp_path_factory):
    """Per example kernel: its module at executable-configurations for the target, and its dispatches."""
    store = Store(CacheConfig(tmp_path_factory.mktemp("space-cache"), 1 << 30, False))
    bundle = portkern.load(examples_bundle, store=store)
    target = devices.resolve(request.param, store)
    found = {}
    for name in bundle:
        module = finalize.configure(bundle.bundle, bundle.record(name), target)
        found[name] = (module, dispatch_module.dispatches(module))
    found["target"] = request.param
    return found


def lanes_of(configured) -> int:
    """f32 lanes of one vector register of the configured target."""
    return ISA[configured["target"]][0] // F32_BYTES


def registers_of(configured) -> int:
    return ISA[configured["target"]][1]


def kernels(configured) -> dict:
    return {name: found for name, found in configured.items() if name != "target"}


def all_dispatches(configured):
    return [d for _, found in kernels(configured).values() for d in found]


def test_dispatches_of_the_examples(configured):
    counts = {name: len(found) for name, (_, found) in kernels(configured).items()}
    assert counts == {"gemm_bias_relu": 1, "gemm_glu": 2, "gemm_rowsum": 2, "gemm_transpose_add": 1, "mlp": 3}
    gemm = configured["gemm_bias_relu"][1][0]
    assert (gemm.family, gemm.root, gemm.sizes, gemm.parallel, gemm.element_bytes) == (
        "cpu", "linalg.matmul", (256, 384, 512), (True, True, False), 4
    )
    assert isinstance(gemm.default, CpuConfig) and gemm.default.rank == 3 and gemm.tunable
    assert gemm.native_vector_bytes == ISA[configured["target"]][0]
    assert space_for(gemm, threads=2).lanes == lanes_of(configured)
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
    """Each rule, with tiles derived from the target's lanes and registers (8 rows of 2 lane vectors:
    16 accumulators, a quarter to all of the registers on AVX2 and on AVX-512)."""
    gemm = configured["gemm_bias_relu"][1][0]
    space = space_for(gemm, threads=2)
    lanes, registers = lanes_of(configured), registers_of(configured)
    assert space.prune_reason(CpuConfig((64, 64, 0), (8, 2 * lanes, 16), (0, 0, 16))).startswith("P2")
    assert space.prune_reason(CpuConfig((64, 64, 0), (0, 0, 0), (0, 0, 0))).startswith("P1")
    assert space.prune_reason(CpuConfig((32, 32, 0), (8, 64, 0), (0, 0, 4))).startswith("P3")
    # too few accumulators (1 row of one lane vector), too many (16 rows of 4 lane vectors), a lane tile off the lanes
    assert 1 < registers // 4 and 16 * 4 > registers
    assert space.prune_reason(CpuConfig((64, 64, 0), (1, lanes, 0), (0, 0, 4))).startswith("P4: 1 accumulator")
    assert space.prune_reason(CpuConfig((64, 64, 0), (16, 4 * lanes, 0), (0, 0, 4))).startswith("P4: 64 accumulator")
    assert space.prune_reason(CpuConfig((64, 64, 0), (8, lanes + lanes // 2, 0), (0, 0, 4))).startswith("P4: lane tile")
    assert space.prune_reason(CpuConfig((64, 64, 0), (8, 2 * lanes, 0), (0, 0, 4))) is None


def test_gemm_space_sizes(configured):
    space = space_for(configured["gemm_bias_relu"][1][0], threads=2)
    stage0 = space.stage_candidates(0, [])
    assert 20 <= len(stage0) <= 60
    assert 5 <= len(space.quick_candidates(0, [])) <= 12
    # the cost model finds a register tile it rates above IREE's default that fits the registers:
    # accumulators plus one row of lane vectors plus a broadcast
    best = min(stage0, key=space.score)
    assert space.score(best) < space.score(space.default)
    lanes, registers = lanes_of(configured), registers_of(configured)
    width = best.vector_parallel[1] // lanes
    assert best.vector_parallel[0] * width + width + 1 <= registers
    default_tile = math.prod(v for v in space.default.vector_parallel if v)
    tile = math.prod(v for v in best.vector_parallel if v)
    if registers > 16:  # room beyond IREE's 8-row default: a wider tile (the AVX-512 sweep's finding)
        assert tile > default_tile
    else:  # AVX2's 16 registers hold IREE's 8x(one vector) default and little more
        assert tile >= default_tile


def test_stamp_writes_root_and_consumers(configured):
    module, found = configured["gemm_bias_relu"]
    context = finalize.compiler_for(devices.resolve(configured["target"])).context
    width = 2 * lanes_of(configured)
    config = CpuConfig((128, 128, 0), (8, width, 0), (0, 0, 4))
    stamped = dispatch_module.stamp(module, KernelConfig.of({0: config}), context)
    configs = [str(op.attributes["lowering_config"]) for op in operations(stamped) if "lowering_config" in op.attributes]
    assert config.lowering_config() in configs
    follower = f"#iree_cpu.lowering_config<vector_common_parallel = [8, {width}]>"
    assert configs.count(follower) == 2, configs  # fill and epilogue follow
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
    context = finalize.compiler_for(devices.resolve(configured["target"])).context
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


REPEATED = """
func.func @repeated(%a: tensor<256x512xf32>, %b: tensor<512x512xf32>, %x: tensor<128x128xf32>, %y: tensor<128x128xf32>,
                    %w: tensor<128x256xf32>) -> (tensor<256x512xf32>, tensor<128x256xf32>, tensor<128x256xf32>) {
  %zero = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<256x512xf32>
  %f0 = linalg.fill ins(%zero : f32) outs(%e0 : tensor<256x512xf32>) -> tensor<256x512xf32>
  %big = linalg.matmul ins(%a, %b : tensor<256x512xf32>, tensor<512x512xf32>) outs(%f0 : tensor<256x512xf32>) -> tensor<256x512xf32>
  %e1 = tensor.empty() : tensor<128x256xf32>
  %f1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<128x256xf32>) -> tensor<128x256xf32>
  %p = linalg.matmul ins(%x, %w : tensor<128x128xf32>, tensor<128x256xf32>) outs(%f1 : tensor<128x256xf32>) -> tensor<128x256xf32>
  %q = linalg.matmul ins(%y, %w : tensor<128x128xf32>, tensor<128x256xf32>) outs(%f1 : tensor<128x256xf32>) -> tensor<128x256xf32>
  return %big, %p, %q : tensor<256x512xf32>, tensor<128x256xf32>, tensor<128x256xf32>
}
"""


def test_a_dispatch_called_from_several_places_counts_each_in_its_share(tmp_path):
    """A dispatch the module calls from two places (two matmuls of one shape) has `sites` 2 and twice
    the work: 6 % of the kernel's points counted once, 11 % counted twice, so `quick` tunes it."""
    from helpers import build_mlir

    from portkern.tuner import strategies

    store = Store(CacheConfig(tmp_path / "cache", 1 << 30, False))
    loaded = portkern.load(build_mlir(tmp_path, "repeated", repeated=REPEATED), store=store)
    found = dispatch_module.dispatches(finalize.configure(loaded.bundle, loaded.record("repeated"), devices.resolve("cpu:x86-64-v3", store)))
    matmuls = {d.sizes: d for d in found if d.root == "linalg.matmul"}
    big, small = matmuls[(256, 512, 512)], matmuls[(128, 256, 128)]
    assert (big.sites, small.sites) == (1, 2)
    assert small.work == 2 * math.prod(small.sizes)
    assert math.prod(small.sizes) / (math.prod(small.sizes) + big.work) < strategies.SIGNIFICANT_SHARE
    assert {d.sizes for d in strategies.significant(found)} == {big.sizes, small.sizes}
