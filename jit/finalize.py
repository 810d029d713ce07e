"""Finalisation in this process: a portable MLIR stage to native code for one target.

The native-code service never calls this in the process that loads a bundle,
nor on the build host for prebuilt code: its workers (`portkern.jit.worker`)
do. A stage is parsed once, fitted to the target
(a GPU target's attribute replaces a family stage's placeholder), and cloned
for every compilation. GPU code is checked to be for the target's arch before
it leaves `finish`.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from portkern.base.errors import CompileError, FinalizeError
from portkern.jit import codeobject
from portkern.jit.target import Target
from portkern.portable import source
from portkern.portable.bundle import Bundle, KernelRecord, Stage
from portkern.portable.compiler import Compiler
from portkern.portable.producer import check_bytecode, check_release

#: The phase at which IREE has chosen a lowering config per dispatch (tuning stamps here).
CONFIGURED_PHASE = "executable-configurations"

#: Module options a kernel config may name ahead of its dispatch entries (`data-tiling;3=cpu:...`),
#: with the compiler flags each adds. They act before the flow phase (data tiling sets operand
#: encodings when dispatches are formed), so code with them is built from the kernel's source stage.
MODULE_OPTIONS = {
    # IREE's optimisation level (default O0): global optimisation, dispatch creation (aggressive
    # fusion) and codegen; O3 compiled to the same code as O2 on every example kernel
    "O2": ("--iree-opt-level=O2",),
    "data-tiling": ("--iree-opt-data-tiling",),
    # attention as matmul, softmax and matmul dispatches (preprocessing) instead of one fused
    # `online_attention` dispatch
    "attention-decomposed": (
        "--iree-preprocessing-pass-pipeline=builtin.module(util.func("
        "iree-linalg-ext-convert-attention-to-online-attention,iree-linalg-ext-decompose-attention))",
    ),
}
#: The drivers whose targets take module options (CPU code).
OPTION_DRIVERS = ("local-task", "local-sync")

_lock = threading.Lock()
_compilers: dict[tuple[str, ...], Compiler] = {}


def compiler_for(target: Target) -> Compiler:
    """The process's compiler session for a target's flags, after the builder's own
    (`portable.lower.BUILD_FLAGS`: they act before the flow phase, so a source stage lowered here
    reaches the flow stage the builder would have written, and a flow stage is unaffected)."""
    from portkern.portable.lower import BUILD_FLAGS

    with _lock:
        if target.flags not in _compilers:
            try:
                _compilers[target.flags] = Compiler(BUILD_FLAGS + target.flags)
            except CompileError as exc:
                raise FinalizeError(f"{target.label}: {exc}") from None
        return _compilers[target.flags]


def module_options(config: str) -> tuple[str, ...]:
    """The module options a kernel config string names: its leading entries that are MODULE_OPTIONS."""
    options = []
    for entry in config.split(";"):
        if entry not in MODULE_OPTIONS:
            break
        options.append(entry)
    return tuple(options)


def with_options(target: Target, options: tuple[str, ...]) -> Target:
    """`target` compiling with the flags of module `options` too (FinalizeError where it takes none)."""
    if not options:
        return target
    if target.driver not in OPTION_DRIVERS:
        raise FinalizeError(f"{target.label}: module options ({', '.join(options)}) are for CPU targets")
    return replace(target, flags=target.flags + tuple(flag for option in options for flag in MODULE_OPTIONS[option]))


def check_stage(stage: Stage, name: str, bytecode: bool = True) -> None:
    """Refuse a stage this compiler cannot read (format, producer release, and unless `bytecode`
    is False its bytecode version: knowing that imports the compiler, which `fitted` checks where
    it parses); a source stage is for other releases: whether it parses is known only when a worker parses it."""
    if stage.is_source:
        if stage.format not in source.FORMATS:
            raise FinalizeError(f"kernel {name!r}: source stage format {stage.format!r} is not one this portkern reads")
        return
    if stage.format != "mlir-bytecode":
        raise FinalizeError(f"kernel {name!r}: stage format {stage.format!r} is not MLIR")
    check_release(stage.producer, name)
    if bytecode:
        check_bytecode(stage.producer, name)


def fitted(data: bytes, stage: Stage | None, target: Target, name: str):
    """MLIR (bytecode or text) parsed for `target`; a bundle stage is also fitted to it (a source
    stage is first imported and lowered to the flow phase, see `imported`)."""
    if stage is not None and stage.is_source:
        module = imported(data, stage, target, name)
    else:
        if stage is not None:
            check_bytecode(stage.producer, name)  # not known in the caller (`check_stage(bytecode=False)`)
        try:
            module = compiler_for(target).parse(data, name=name)
        except FinalizeError:
            raise
        except CompileError as exc:
            raise FinalizeError(str(exc)) from None
    if stage is not None and (target.executable_target or stage.placeholder is not None):
        # a GPU target's attribute written in (or a family stage refused for a CPU); CPU stages need
        # nothing, so a CPU worker never imports the GPU families and the lowering (`jit.gpu`)
        from portkern.jit.gpu import fit

        fit(module, stage, target)
    return module


def imported(data: bytes, stage: Stage, target: Target, name: str):
    """A source stage's module made MLIR text, parsed and lowered by this IREE release to the flow
    phase, where a bundle's own flow stage starts; what fails on the way names both releases."""
    from portkern.portable.lower import PORTABLE_PHASE

    text = source.source_text(stage, data, name)
    compiler = compiler_for(target)
    try:
        return compiler.lower(compiler.parse(text, name=name), from_phase=stage.phase, to_phase=PORTABLE_PHASE, name=name)
    except CompileError as exc:
        raise source.uncompilable(stage, name, text, str(exc)) from None


def stage_module(bundle: Bundle, record: KernelRecord, target: Target):
    """The kernel's stage for `target`, parsed and fitted, and that stage."""
    stage = source.readable_stage(record, target.family)
    check_stage(stage, record.name)
    return fitted(bundle.blob(stage.blob), stage, target, record.name), stage


def finalize(bundle: Bundle, record: KernelRecord, target: Target) -> bytes:
    """Native code (a vmfb) for a kernel on a target, with the compiler's default config."""
    module, stage = stage_module(bundle, record, target)
    return finish(target, module, source.fitted_phase(stage), record.name)


def configure(bundle: Bundle, record: KernelRecord, target: Target):
    """The kernel lowered to the phase where each dispatch carries its lowering config."""
    module, stage = stage_module(bundle, record, target)
    return to_configurations(module, source.fitted_phase(stage), target, record.name)


def to_configurations(module, from_phase: str, target: Target, name: str):
    """The module lowered to the phase where each dispatch carries its lowering config."""
    if from_phase == CONFIGURED_PHASE:
        return module
    try:
        return compiler_for(target).lower(module, from_phase=from_phase, to_phase=CONFIGURED_PHASE, name=name)
    except CompileError as exc:
        raise FinalizeError(f"{target.label}: {exc}") from None


def finish(target: Target, module, from_phase: str, name: str, verify_each: bool = False) -> bytes:
    """A copy of `module`, compiled from `from_phase` to native code for `target`. The module is
    verified before the first pass; IREE's passes are not each verified again unless
    `verify_each` (as `iree-compile` does): the code is the same either way."""
    try:
        native = compiler_for(target).to_vmfb(module, from_phase=from_phase, name=name, verify_each=verify_each)
    except CompileError as exc:
        raise FinalizeError(f"{target.label}: {exc}") from None
    codeobject.check(native, target.fingerprint)
    return native
