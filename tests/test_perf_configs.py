"""Perf-config strings round-trip, reject bad input, and render to attributes IREE's own parser reads back."""

from __future__ import annotations

import pytest

from portkern.base.errors import PerfConfigError
from portkern.tuner import kernel_config, registry
from portkern.tuner.amdgpu_config import AmdGpuConfig
from portkern.tuner.cpu_config import CpuConfig
from portkern.tuner.cuda_config import CudaConfig
from portkern.tuner.kernel_config import KernelConfig

CPU = [
    CpuConfig((64, 64, 0), (8, 32, 0), (0, 0, 4)),
    CpuConfig((32, 0), (8, 0), (0, 16)),
    CpuConfig((1, 128, 384, 0), (1, 4, 64, 0), (0, 0, 0, 1)),
]
AMD = [
    AmdGpuConfig((64, 128, 0), (2, 4, 0), (0, 0, 0), (0, 0, 16), "MFMA_F32_16x16x4_F32", (256, 1, 1), 64, 2, 0),
    AmdGpuConfig((32, 128, 0), (1, 4, 0), (0, 0, 0), (0, 0, 8), "MFMA_F32_16x16x4_F32", (256, 1, 1), 64, 0, 2),
    AmdGpuConfig((4, 64), (0, 0), (1, 4), (0, 0), "none", (64, 1, 1), 32, 0, 0),
]
CUDA = [
    CudaConfig((32, 128, 1), (0, 0, 0), (1, 16, 0), (0, 0, 32), "none", (32, 8, 1), 32, 0),
    CudaConfig((64, 64, 0), (2, 4, 0), (0, 0, 0), (0, 0, 8), "NV_MMA_SYNC_F32_16x8x16_F16", (128, 1, 1), 32, 2),
]


@pytest.mark.parametrize("config", CPU + AMD + CUDA, ids=str)
def test_string_round_trip(config):
    text = str(config)
    assert text.startswith(f"{config.family}:v{config.version}:")
    assert registry.parse(text) == config
    assert str(registry.parse(text)) == text


def test_known_strings():
    assert str(CPU[0]) == "cpu:v1:64x64x0,8x32x0,0x0x4"
    assert str(AMD[0]) == "amdgpu:v2:64x128x0,2x4x0,0x0x0,0x0x16,MFMA_F32_16x16x4_F32,256x1x1,64,2,0"
    assert str(CUDA[0]) == "cuda:v1:32x128x1,0x0x0,1x16x0,0x0x32,none,32x8x1,0"


def test_kernel_config_round_trip():
    config = KernelConfig.of({2: CPU[1], 0: CPU[0]})
    text = str(config)
    assert text == "0=cpu:v1:64x64x0,8x32x0,0x0x4;2=cpu:v1:32x0,8x0,0x16"
    assert kernel_config.parse(text) == config
    assert kernel_config.parse("default") == KernelConfig() and str(KernelConfig()) == "default"
    assert config.get(2) == CPU[1] and config.get(1) is None
    assert str(config.with_dispatch(0, None)) == "2=cpu:v1:32x0,8x0,0x16"


def test_kernel_config_module_options_come_first():
    config = KernelConfig.of({1: CPU[0]}, ("data-tiling",))
    assert str(config) == "data-tiling;1=cpu:v1:64x64x0,8x32x0,0x0x4"
    assert kernel_config.parse(str(config)) == config and not config.is_default
    alone = kernel_config.parse("data-tiling")
    assert alone.options == ("data-tiling",) and not alone.dispatches and str(alone) == "data-tiling"
    assert str(config.with_dispatch(1, None)) == "data-tiling"  # options stay


@pytest.mark.parametrize(
    "text, message",
    [
        ("cpu:v1:64x64x0,8x32x0", "needs 3 fields, got 2"),
        ("cpu:v1:64x64x0,8x32x0,0x0x4,1x1x1", "needs 3 fields, got 4"),
        ("cpu:v2:64x64x0,8x32x0,0x0x4", "unknown cpu version 'v2'"),
        ("cpu:64x64x0,8x32x0,0x0x4", "not of the form"),
        ("tpu:v1:64x64x0,8x32x0,0x0x4", "unknown family 'tpu'"),
        ("cpu:v1:64x64x0,8x32,0x0x4", "has 2 sizes, expected 3"),
        ("cpu:v1:64x-1x0,8x32x0,0x0x4", "not an integer"),
        ("cpu:v1:64x064x0,8x32x0,0x0x4", "not an integer"),
        ("cpu:v1:64xx0,8x32x0,0x0x4", "not an integer"),
        ("cpu:v1:" + "x".join(["1"] * 9) + ",1,1", "at most 8 sizes"),
        ("cpu:v1:99999999x1,1x1,0x0", "not an integer in"),
        ("64x64x0,8x32x0,0x0x4", "not of the form"),
        ("", "non-empty"),
        ("amdgpu:v1:64x128x0,2x4x0,0x0x16,MFMA_F32_16x16x4_F32,256x1x1,64,2,0", "unknown amdgpu version 'v1'"),
        ("amdgpu:v2:64x128x0,2x4x0,0x0x0,0x0x16,MFMA_F32_16x16x4_F32,256x1x1,64,2", "needs 9 fields, got 8"),
        ("amdgpu:v2:64x128x0,2x4x0,0x0x0,0x0x16,MFMA_F32_16x16x4_F32,256x1x1,48,2,0", "subgroup_size 48"),
        ("amdgpu:v2:64x128x0,2x4x0,0x0x0,0x0x16,MFMA F32,256x1x1,64,2,0", "letters, digits"),
        ("amdgpu:v2:64x128x0,2x4x0,0x0x0,0x0x16,none,2048x1x1,64,2,0", "threads"),
        ("amdgpu:v2:64x128x0,2x4x0,0x0x0,0x0x16,none,256x1,64,2,0", "expected 3"),
        ("amdgpu:v2:64x128x0,2x4x0,1x1x0,0x0x16,MFMA_F32_16x16x4_F32,256x1x1,64,2,0", "not thread tiles"),
        ("cuda:v1:32x128x1,0x0x0,1x16x0,0x0x32,none,32x8x1", "needs 7 fields, got 6"),
        ("cuda:v1:32x128x1,0x0x0,1x16,0x0x32,none,32x8x1,0", "has 2 sizes, expected 3"),
        ("cuda:v1:32x128x1,0x0x0,1x16x0,0x0x32,none,32x8x1,9", "prefetch_stages 9"),
    ],
)
def test_bad_perf_configs_are_rejected(text, message):
    with pytest.raises(PerfConfigError, match=message):
        registry.parse(text)


@pytest.mark.parametrize(
    "text, message",
    [
        ("1=cpu:v1:32x0,8x0,0x16;0=cpu:v1:64x64x0,8x32x0,0x0x4", "canonical"),
        ("0=cpu:v1:32x0,8x0,0x16;0=cpu:v1:32x0,8x0,0x16", "twice"),
        ("d0=cpu:v1:32x0,8x0,0x16", "dispatch index"),
        ("00=cpu:v1:32x0,8x0,0x16", "dispatch index"),
        ("cpu:v1:32x0,8x0,0x16", "dispatch index"),
        ("0=cpu:v1:32x0,8x0", "needs 3 fields"),
        ("0=" + "x" * 5000, "reasonable length"),
        ("tiling;0=cpu:v1:64x64x0,8x32x0,0x0x4", "entry 'tiling' is not <dispatch index>"),
        ("0=cpu:v1:64x64x0,8x32x0,0x0x4;data-tiling", "dispatch index"),
        ("data-tiling;data-tiling", "canonical"),
        ("data-tiling;", "entry '' is not <dispatch index>"),
    ],
)
def test_bad_kernel_configs_are_rejected(text, message):
    with pytest.raises(PerfConfigError, match=message):
        kernel_config.parse(text)


def test_a_family_can_be_required():
    with pytest.raises(PerfConfigError, match="needs a 'cpu' config"):
        registry.parse(str(AMD[0]), "cpu")


def test_dataclasses_validate_values():
    with pytest.raises(PerfConfigError):
        CpuConfig((64, 64, 0), (8, 32), (0, 0, 4))
    with pytest.raises(PerfConfigError):
        CpuConfig((64, -64, 0), (8, 32, 0), (0, 0, 4))
    with pytest.raises(PerfConfigError):
        AmdGpuConfig((64, 128, 0), (2, 4, 0), (0, 0, 0), (0, 0, 16), "none", (256, 1, 1), 64, 99, 0)


def test_amd_launch_shape_must_cover_the_tiles():
    AMD[0].check()
    AMD[1].check()
    with pytest.raises(PerfConfigError, match="need 4 subgroups"):
        AmdGpuConfig((64, 128, 0), (2, 4, 0), (0, 0, 0), (0, 0, 16), "MFMA_F32_16x16x4_F32", (128, 1, 1), 64, 2, 0).check()
    with pytest.raises(PerfConfigError, match="not a multiple"):
        AmdGpuConfig((48, 128, 0), (2, 4, 0), (0, 0, 0), (0, 0, 16), "MFMA_F32_16x16x4_F32", (256, 1, 1), 64, 2, 0).check()
    CUDA[0].check()
    with pytest.raises(PerfConfigError, match="need 512 threads"):
        CudaConfig((32, 128, 1), (0, 0, 0), (1, 8, 0), (0, 0, 32), "none", (32, 8, 1), 32, 0).check()


@pytest.fixture(scope="module")
def mlir_context():
    """An IREE compiler context: every dialect whose attributes the configs render to is registered."""
    from portkern.portable.compiler import Compiler

    return Compiler(("--iree-hal-target-device=hip", "--iree-rocm-target=gfx942")).context


@pytest.mark.parametrize("config", CPU, ids=str)
def test_cpu_attribute_parses_in_mlir(config, mlir_context):
    from iree.compiler import ir

    printed = str(ir.Attribute.parse(config.lowering_config(), mlir_context))
    assert printed == config.lowering_config()
    assert CpuConfig.from_lowering_config(printed) == config


@pytest.mark.parametrize("config", AMD + CUDA, ids=str)
def test_gpu_attributes_parse_in_mlir(config, mlir_context):
    from iree.compiler import ir

    lowering = str(ir.Attribute.parse(config.lowering_config(), mlir_context))
    translation = str(ir.Attribute.parse(config.translation_info(), mlir_context))
    assert lowering == config.lowering_config()
    assert translation == config.translation_info()
    assert type(config).from_attributes(lowering, translation) == config


def test_gpu_config_keeps_the_compilers_other_entries(mlir_context):
    """Entries a config does not own (IREE's `convert_acc_gemm`, pipeline options) survive a restamp."""
    from iree.compiler import ir

    current = (
        "#iree_gpu.lowering_config<{convert_acc_gemm, mma_kind = #iree_gpu.mma_layout<NV_MMA_SYNC_F32_16x8x16_F16>, "
        "promote_operands = [0, 1], reduction = [0, 0, 8], subgroup = [2, 4, 0], workgroup = [64, 64, 0]}>"
    )
    translation = (
        "#iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> workgroup_size = [128, 1, 1] subgroup_size = 32, "
        "{gpu_pipeline_options = #iree_gpu.pipeline_options<prefetch_num_stages = 2, no_reduce_shared_memory_bank_conflicts = false, "
        "use_igemm_convolution = false>}>"
    )
    default = CudaConfig.from_attributes(current, translation)
    assert default == CUDA[1]
    assert str(ir.Attribute.parse(default.lowering_config(current), mlir_context)) == current
    assert str(ir.Attribute.parse(default.translation_info(translation), mlir_context)) == translation
    other = CudaConfig((128, 64, 0), (4, 4, 0), (0, 0, 0), (0, 0, 4), CUDA[1].mma, (128, 1, 1), 32, 3)
    written = other.lowering_config(current)
    assert written.startswith("#iree_gpu.lowering_config<{convert_acc_gemm, ") and "workgroup = [128, 64, 0]" in written
    rewritten = other.translation_info(translation)
    assert "prefetch_num_stages = 3, no_reduce_shared_memory_bank_conflicts = false" in rewritten
    assert CudaConfig.from_attributes(written, rewritten) == other


def test_attribute_text_that_is_not_a_config_is_refused():
    with pytest.raises(PerfConfigError):
        CpuConfig.from_lowering_config("#iree_cpu.lowering_config<vector_common_parallel = [8, 16]>")
    with pytest.raises(PerfConfigError):
        AmdGpuConfig.from_attributes(CPU[0].lowering_config(), "#iree_codegen.translation_info<pipeline = None>")
