"""Perf-config strings round-trip, reject bad input, and render to attributes IREE's own parser reads back."""

from __future__ import annotations

import pytest

from portkern.errors import PerfConfigError
from portkern.tuner import kernel_config, registry
from portkern.tuner.amdgpu_config import AmdGpuConfig
from portkern.tuner.cpu_config import CpuConfig
from portkern.tuner.kernel_config import KernelConfig

CPU = [
    CpuConfig((64, 64, 0), (8, 32, 0), (0, 0, 4)),
    CpuConfig((32, 0), (8, 0), (0, 16)),
    CpuConfig((1, 128, 384, 0), (1, 4, 64, 0), (0, 0, 0, 1)),
]
AMD = [
    AmdGpuConfig((64, 128, 0), (2, 4, 0), (0, 0, 16), "MFMA_F32_16x16x4_F32", (256, 1, 1), 64, 2, 0),
    AmdGpuConfig((32, 128, 0), (1, 4, 0), (0, 0, 8), "MFMA_F32_16x16x4_F32", (256, 1, 1), 64, 0, 2),
    AmdGpuConfig((4, 64), (0, 0), (0, 0), "none", (64, 1, 1), 32, 0, 0),
]


@pytest.mark.parametrize("config", CPU + AMD, ids=str)
def test_string_round_trip(config):
    text = str(config)
    assert text.startswith(f"{config.family}:v1:")
    assert registry.parse(text) == config
    assert str(registry.parse(text)) == text


def test_known_strings():
    assert str(CPU[0]) == "cpu:v1:64x64x0,8x32x0,0x0x4"
    assert str(AMD[0]) == "amdgpu:v1:64x128x0,2x4x0,0x0x16,MFMA_F32_16x16x4_F32,256x1x1,64,2,0"


def test_kernel_config_round_trip():
    config = KernelConfig.of({2: CPU[1], 0: CPU[0]})
    text = str(config)
    assert text == "0=cpu:v1:64x64x0,8x32x0,0x0x4;2=cpu:v1:32x0,8x0,0x16"
    assert kernel_config.parse(text) == config
    assert kernel_config.parse("default") == KernelConfig() and str(KernelConfig()) == "default"
    assert config.get(2) == CPU[1] and config.get(1) is None
    assert str(config.with_dispatch(0, None)) == "2=cpu:v1:32x0,8x0,0x16"


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
        ("amdgpu:v1:64x128x0,2x4x0,0x0x16,MFMA_F32_16x16x4_F32,256x1x1,64,2", "needs 8 fields, got 7"),
        ("amdgpu:v1:64x128x0,2x4x0,0x0x16,MFMA_F32_16x16x4_F32,256x1x1,48,2,0", "subgroup_size 48"),
        ("amdgpu:v1:64x128x0,2x4x0,0x0x16,MFMA F32,256x1x1,64,2,0", "letters, digits"),
        ("amdgpu:v1:64x128x0,2x4x0,0x0x16,none,2048x1x1,64,2,0", "threads"),
        ("amdgpu:v1:64x128x0,2x4x0,0x0x16,none,256x1,64,2,0", "expected 3"),
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
        AmdGpuConfig((64, 128, 0), (2, 4, 0), (0, 0, 16), "none", (256, 1, 1), 64, 99, 0)


def test_amd_launch_shape_must_cover_the_tiles():
    AMD[0].check()
    AMD[1].check()
    with pytest.raises(PerfConfigError, match="need 4 subgroups"):
        AmdGpuConfig((64, 128, 0), (2, 4, 0), (0, 0, 16), "MFMA_F32_16x16x4_F32", (128, 1, 1), 64, 2, 0).check()
    with pytest.raises(PerfConfigError, match="not a multiple"):
        AmdGpuConfig((48, 128, 0), (2, 4, 0), (0, 0, 16), "MFMA_F32_16x16x4_F32", (256, 1, 1), 64, 2, 0).check()


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


@pytest.mark.parametrize("config", AMD, ids=str)
def test_amd_attributes_parse_in_mlir(config, mlir_context):
    from iree.compiler import ir

    lowering = str(ir.Attribute.parse(config.lowering_config(), mlir_context))
    translation = str(ir.Attribute.parse(config.translation_info("TileAndFuse"), mlir_context))
    assert lowering == config.lowering_config()
    assert translation == config.translation_info("TileAndFuse")
    assert AmdGpuConfig.from_attributes(lowering, translation) == config


def test_attribute_text_that_is_not_a_config_is_refused():
    with pytest.raises(PerfConfigError):
        CpuConfig.from_lowering_config("#iree_cpu.lowering_config<vector_common_parallel = [8, 16]>")
    with pytest.raises(PerfConfigError):
        AmdGpuConfig.from_attributes(CPU[0].lowering_config(), "#iree_codegen.translation_info<pipeline = None>")
