"""Target probes stop at an early phase and read the same target IREE gives the dispatches."""

from __future__ import annotations

import pytest

from portkern.jit import amdgpu, cuda
from portkern.jit.target import PROBE_MODULE, executable_targets_in, resolve_executable_target
from portkern.portable.compiler import Compiler
from portkern.portable.family import executable_targets

CPU = ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu")


@pytest.mark.parametrize(
    "flags",
    [
        CPU + ("--iree-llvmcpu-target-cpu=host", "--iree-llvmcpu-target-cpu-features=host"),
        CPU + ("--iree-llvmcpu-target-cpu=haswell", "--iree-llvmcpu-target-cpu-features="),
        amdgpu.flags("gfx942"),
        cuda.flags("sm_90"),
    ],
    ids=["cpu-host", "cpu-haswell", "gfx942", "sm_90"],
)
def test_early_probe_reads_the_target_the_dispatch_variant_gets(flags):
    compiler = Compiler(flags)
    module = compiler.lower(compiler.parse(PROBE_MODULE), from_phase="start", to_phase="executable-sources", name="probe")
    (variant_target,) = set(executable_targets(module))
    assert resolve_executable_target(flags) == variant_target


def test_executable_targets_in_text_matches_nested_brackets_and_quotes():
    inner = '#hal.executable.target<"rocm", "rocm-hsaco-fb", {a = #x<b = <c>, s = "q>\\"<">, f = "->"}>'
    text = f'#hal.device.target<"hip", [{inner}, {inner}]>'
    assert executable_targets_in(text) == [inner, inner]
    assert executable_targets_in('#hal.device.target<"hip", []>') == []
    assert executable_targets_in("#hal.executable.target<unclosed") == []
