"""A finalisation verifies its module once, not after every IREE pass: the code is byte-identical
to a compile that verifies after every pass (IREE's default), and invalid IR is still refused."""

from __future__ import annotations

import pytest
from iree.compiler import ir

from portkern.base.errors import FinalizeError
from portkern.examples import MANIFEST
from portkern.jit import finalize
from portkern.jit.devices import resolve
from portkern.portable import source
from portkern.portable.bundle import read_bundle
from portkern.portable.compiler import operations
from portkern.portable.manifest import load_manifest

KERNELS = [spec.name for spec in load_manifest(MANIFEST).kernels]


def both_ways(bundle_path, name: str, spec: str) -> tuple[bytes, bytes]:
    """The kernel finalised for `spec` as a finalisation does, and with every pass verified."""
    bundle = read_bundle(bundle_path)
    target = resolve(spec)
    module, stage = finalize.stage_module(bundle, bundle.kernel(name), target)
    phase = source.fitted_phase(stage)
    return finalize.finish(target, module, phase, name), finalize.finish(target, module, phase, name, verify_each=True)


@pytest.mark.parametrize("name", KERNELS)
def test_cpu_code_is_byte_identical_to_a_compile_verifying_every_pass(examples_bundle, name):
    fast, checked = both_ways(examples_bundle, name, "cpu")
    assert fast == checked


def test_gpu_code_from_a_placeholder_stage_is_byte_identical(gpu_bundle):
    fast, checked = both_ways(gpu_bundle, "gemm_bias_relu", "amdgpu:gfx942")
    assert fast == checked


def test_invalid_ir_is_still_refused(examples_bundle):
    bundle = read_bundle(examples_bundle)
    target = resolve("cpu")
    module, stage = finalize.stage_module(bundle, bundle.kernel("gemm_bias_relu"), target)
    with finalize.compiler_for(target).context:
        func = next(op for op in operations(module) if op.name == "util.func")
        func.attributes["sym_name"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 1)
    with pytest.raises(FinalizeError, match="invalid MLIR.*requires attribute 'sym_name'"):
        finalize.finish(target, module, source.fitted_phase(stage), "gemm_bias_relu")
