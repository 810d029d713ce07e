"""Finalising GPU stages without a GPU: real AMD code objects and PTX, for the arch asked and no other."""

from __future__ import annotations

import pytest
from helpers import expected_skip

import portkern
from portkern.base.errors import CodeObjectError, DeviceError
from portkern.jit import amdgpu, codeobject, cuda, elf
from portkern.jit.devices import resolve
from portkern.jit.finalize import finalize
from portkern.jit.runtime import Executable
from portkern.portable.bundle import read_bundle
from portkern.portable.compiler import Compiler

PLACEHOLDERS = (b"portkern-placeholder-amdgpu", b"portkern-placeholder-cuda")


@pytest.mark.parametrize("arch, other", [("gfx942", "gfx1100"), ("gfx1100", "gfx942")])
def test_one_bundle_gives_code_objects_for_two_archs(gpu_native, arch, other):
    vmfb = gpu_native(arch)
    images = elf.find(vmfb)
    assert [i.machine for i in images] == [codeobject.EM_AMDGPU]
    (code,) = codeobject.inspect(vmfb).amdgpu
    assert code.processor == code.note_processor == arch
    assert code.target.endswith(f"-amdhsa-unknown-{arch}")
    assert code.code_object_version == 5 and code.kernels
    assert code.wavefront_sizes == ((64,) if arch.startswith("gfx9") else (32,))
    assert other.encode() not in vmfb and not any(p in vmfb for p in PLACEHOLDERS)
    codeobject.check(vmfb, resolve(arch).fingerprint)
    with pytest.raises(CodeObjectError, match=f"code object for {arch}.*expected {other}"):
        codeobject.check(vmfb, resolve(other).fingerprint)


def test_swapped_placeholder_gives_the_same_code_as_a_direct_compile(gpu_bundle, gpu_native):
    bundle = read_bundle(gpu_bundle)
    flow = bundle.blob(bundle.kernel("gemm_bias_relu").stage().blob)
    direct = Compiler(amdgpu.flags("gfx1100"))
    expected = direct.to_vmfb(direct.parse(flow), from_phase="flow")
    image = lambda data: [data[i.offset : i.offset + i.size] for i in elf.find(data)]  # noqa: E731
    assert len(image(expected)) == 1
    assert image(gpu_native("gfx1100")) == image(expected)


def test_flow_stage_is_finalised_when_there_is_no_family_stage(examples_bundle):
    bundle = read_bundle(examples_bundle)
    record = bundle.kernel("gemm_rowsum")
    assert [s.family for s in record.stages if not s.is_source] == ["any"]
    vmfb = finalize(bundle, record, resolve("amdgpu:gfx1100"))
    assert codeobject.inspect(vmfb).archs == ("gfx1100",)


def test_target_features_reach_the_code_object(gpu_native):
    target = resolve("gfx90a:xnack-:sramecc+")
    assert target.label == "amdgpu:gfx90a:sramecc+:xnack-"  # canonical order
    assert target.fingerprint != resolve("gfx90a").fingerprint
    (code,) = codeobject.inspect(gpu_native("gfx90a:sramecc+:xnack-")).amdgpu
    assert (code.processor, code.xnack, code.sramecc) == ("gfx90a", "off", "on")
    assert code.target.endswith("gfx90a:sramecc+:xnack-")
    with pytest.raises(CodeObjectError, match="xnack off, expected any or unsupported"):
        codeobject.check(gpu_native("gfx90a:sramecc+:xnack-"), resolve("gfx90a").fingerprint)


@pytest.mark.parametrize("arch, version", [("sm_80", "7.6"), ("sm_90", "7.8"), ("sm_90a", "8.0")])
def test_cuda_ptx_for_the_asked_arch(gpu_native, arch, version):
    """sm_90 is missing from IREE 3.13's table; portkern writes its target itself."""
    vmfb = gpu_native(f"cuda:{arch}")
    code = codeobject.inspect(vmfb)
    assert code.amdgpu == () and code.other_machines == ()
    assert {(p.version, p.target) for p in code.ptx} == {(version, arch)}
    assert not any(p in vmfb for p in PLACEHOLDERS)
    with pytest.raises(CodeObjectError, match="no AMD code object"):
        codeobject.check(vmfb, resolve("gfx942").fingerprint)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("cuda:hopper", "'hopper' is not a CUDA arch"),  # these three crash IREE's compiler if passed on
        ("cuda:h100", "'h100' is not a CUDA arch"),
        ("cuda:blackwell", "'blackwell' is not a CUDA arch"),
        ("cuda:sm_91", "'sm_91' is not a CUDA arch portkern can target"),
        ("h100", "unknown device kind 'h100'"),
        ("amdgpu:gfx9999", "'gfx9999' is not an AMD GPU arch"),
        ("amdgpu:mi300x", "'mi300x' is not an AMD GPU arch"),
        ("gfx942:xnack", "is not an AMD GPU arch"),
        ("gfx942:xnack+:xnack-", "bad target feature 'xnack-'"),
        ("gfx942:turbo+", "bad target feature 'turbo\\+'"),
        ("amdgpu:../../x", "is not an AMD GPU arch"),
        ("amdgpu:gfx906", "IREE cannot target .*Unknown ROCM target 'gfx906'"),  # LLVM knows it, IREE 3.13 not
    ],
)
def test_bad_gpu_names_are_clean_errors(spec, message):
    with pytest.raises(DeviceError, match=message):
        resolve(spec)


@pytest.mark.skipif(bool(amdgpu.probe().devices or cuda.probe().devices), reason=expected_skip("device", "this machine has a GPU"))
@pytest.mark.parametrize(
    "device, message",
    [
        ("amdgpu", "no AMD GPU here: no "),
        ("cuda", "no NVIDIA GPU here: no "),
        ("gfx942", r"cannot run 'gemm_bias_relu' on amdgpu:gfx942 here: no AMD GPU of arch gfx942 here \(no .*"
                   r"portkern finalize --target amdgpu:gfx942"),
        ("cuda:sm_90a", r"cannot run 'gemm_bias_relu' on cuda:sm_90a here: no NVIDIA GPU of arch sm_90 here"),
    ],
)
def test_gpu_device_absent_is_a_clean_device_error(gpu_bundle, store, device, message):
    with pytest.raises(DeviceError, match=message):
        portkern.load(gpu_bundle, store=store).kernel("gemm_bias_relu", device=device)


def test_launch_path_without_a_device_is_a_device_error(gpu_native):
    from portkern.jit.gpu import driver_problem

    for spec, driver in (("gfx942", "hip"), ("cuda:sm_90", "cuda")):
        if not driver_problem(driver):
            pytest.skip(expected_skip("device", f"IREE's {driver} driver works on this machine"))
        with pytest.raises(DeviceError, match=f"IREE runtime driver '{driver}' is not usable here: .*{driver.upper() if driver == 'cuda' else 'HIP'}"):
            Executable(gpu_native(spec), "gemm_bias_relu", driver)


def test_every_listed_arch_has_a_real_target():
    """The arch lists in the backends match what this IREE describes (or what portkern writes for it)."""
    for arch in amdgpu.IREE_ARCHS:
        assert f'arch = "{arch}"' in amdgpu.executable_target(arch)
    for arch in cuda.IREE_ARCHS + tuple(cuda.DERIVED):
        text = cuda.executable_target(arch)
        assert f'arch = "{arch}"' in text and "iree_codegen.target_info" in text
