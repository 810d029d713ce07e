"""Finalisation: a bundle's portable MLIR stage to native code for one target.

Each stage is parsed once per process (per target), fitted to the target (a
GPU target's attribute replaces a family stage's placeholder), and cloned for
every compilation, so tuning many configs never re-reads the bytecode. GPU
code is checked to be for the target's arch before it leaves `finish`.
"""

from __future__ import annotations

import threading

from portkern.errors import CompileError, FinalizeError
from portkern.jit import codeobject
from portkern.jit.gpu import fit
from portkern.jit.target import Target
from portkern.portable.bundle import Bundle, KernelRecord
from portkern.portable.compiler import Compiler
from portkern.portable.producer import check_bytecode, check_release

#: The phase at which IREE has chosen a lowering config per dispatch (tuning stamps here).
CONFIGURED_PHASE = "executable-configurations"

_lock = threading.Lock()
_compilers: dict[tuple[str, ...], Compiler] = {}
_parsed: dict[tuple[tuple[str, ...], str], object] = {}  # (target identity, stage blob) -> module


def compiler_for(target: Target) -> Compiler:
    """The process's compiler session for a target's flags."""
    with _lock:
        if target.flags not in _compilers:
            try:
                _compilers[target.flags] = Compiler(target.flags)
            except CompileError as exc:
                raise FinalizeError(f"{target.label}: {exc}") from None
        return _compilers[target.flags]


def stage_module(bundle: Bundle, record: KernelRecord, target: Target):
    """The kernel's stage for `target`, parsed once per process, and that stage."""
    stage = record.stage(target.family)
    if stage.format != "mlir-bytecode":
        raise FinalizeError(f"kernel {record.name!r}: stage format {stage.format!r} is not MLIR")
    check_release(stage.producer, record.name)
    check_bytecode(stage.producer, record.name)
    compiler = compiler_for(target)
    key = (target.identity, stage.blob)
    with _lock:
        module = _parsed.get(key)
    if module is None:
        try:
            module = compiler.parse(bundle.blob(stage.blob), name=record.name)
        except CompileError as exc:
            raise FinalizeError(str(exc)) from None
        fit(module, stage, target)
        with _lock:
            _parsed[key] = module
    return module, stage


def finalize(bundle: Bundle, record: KernelRecord, target: Target) -> bytes:
    """Native code (a vmfb) for a kernel on a target, with the compiler's default config."""
    module, stage = stage_module(bundle, record, target)
    return finish(target, module, stage.phase, record.name)


def configure(bundle: Bundle, record: KernelRecord, target: Target):
    """The kernel lowered to the phase where each dispatch carries its lowering config."""
    module, stage = stage_module(bundle, record, target)
    try:
        return compiler_for(target).lower(module, from_phase=stage.phase, to_phase=CONFIGURED_PHASE, name=record.name)
    except CompileError as exc:
        raise FinalizeError(f"{target.label}: {exc}") from None


def finish(target: Target, module, from_phase: str, name: str) -> bytes:
    """A copy of `module`, compiled from `from_phase` to native code for `target`."""
    try:
        native = compiler_for(target).to_vmfb(module, from_phase=from_phase, name=name)
    except CompileError as exc:
        raise FinalizeError(f"{target.label}: {exc}") from None
    codeobject.check(native, target.fingerprint)
    return native

