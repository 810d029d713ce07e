"""The IREE compiler, driven in-process: parse, clone, lower between phases.

One `Compiler` owns one IREE compiler session, whose flags are fixed for its
lifetime (IREE session flags are sticky and list flags append), so each target
gets its own `Compiler`. Modules parsed by a `Compiler` live in its MLIR
context and must only be lowered by it.
"""

from __future__ import annotations

import ctypes
import io
import threading
from typing import TYPE_CHECKING, Any, Sequence

from portkern.base.errors import CompileError, brief, one_line
from portkern.portable import index_safety
from portkern.portable.interpreter import gil_enabled

if TYPE_CHECKING:
    from iree.compiler import ir

#: IREE's pipeline phases, in order (`iree-compile --compile-to=...`).
PHASES: tuple[str, ...] = (
    "start",
    "input",
    "abi",
    "preprocessing",
    "global-optimization",
    "dispatch-creation",
    "flow",
    "stream",
    "executable-sources",
    "executable-configurations",
    "executable-targets",
    "hal",
    "vm",
    "end",
)

#: The phase where runtime indices are clamped on the way (`portable.index_safety`): every
#: frontend's ops are linalg, tensor and arith ops there.
SAFE_PHASE = "input"

_SEVERITY = {0: "note", 1: "warning", 2: "error", 3: "remark"}
_DIAGNOSTIC_CALLBACK = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p
)
_api_ready = False


def _api() -> Any:
    """The ctypes handle of libIREECompiler with the unwrapped entry points typed."""
    global _api_ready
    from iree.compiler.api import ctypes_dl

    lib = ctypes_dl._dylib
    if not _api_ready:
        for name in ("SetCompileFromPhase", "SetCompileToPhase"):
            getattr(lib, f"ireeCompilerInvocation{name}").argtypes = [
                ctypes.c_void_p,
                ctypes.c_char_p,
            ]
        lib.ireeCompilerInvocationSetVerifyIR.argtypes = [ctypes.c_void_p, ctypes.c_bool]
        lib.ireeCompilerInvocationEnableCallbackDiagnostics.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            _DIAGNOSTIC_CALLBACK,
            ctypes.c_void_p,
        ]
        _api_ready = True
    return lib


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise CompileError(f"unknown IREE phase {phase!r}; known: {', '.join(PHASES)}")


class Compiler:
    """An IREE compiler session with a fixed set of flags."""

    def __init__(self, flags: Sequence[str] = ()) -> None:
        if not gil_enabled():
            # iree-base-compiler 3.13.0 under Python 3.13.5t: Session.context never returned.
            raise CompileError(
                "IREE's compiler API hangs on a free-threaded Python (no GIL); build and finalise "
                "with a standard CPython build (kernels already in the cache still run here)"
            )
        from iree.compiler.api import Session

        self.flags = tuple(flags)
        self._lock = threading.RLock()
        self._session = Session()
        if self.flags:
            try:
                self._session.set_flags(*self.flags)
            except ValueError as exc:
                raise CompileError(f"IREE rejected compiler flags: {exc}") from None

    @property
    def context(self) -> "ir.Context":
        return self._session.context

    def parse(self, data: bytes | str, name: str = "module") -> "ir.Module":
        """Parse MLIR text or bytecode into a module owned by this compiler."""
        from iree.compiler import ir

        with self._lock:
            try:
                return ir.Module.parse(data, self.context)
            except ir.MLIRError as exc:
                raise CompileError(f"{name}: cannot parse MLIR: {brief(exc, None, sep=' ', limit=None)}") from None

    def lower(
        self,
        module: "ir.Module | ir.Operation",
        *,
        from_phase: str,
        to_phase: str,
        name: str = "module",
        safe_indices: bool = True,
    ) -> "ir.Operation":
        """Compile a copy of `module` from one phase to another; return the result. A lowering
        through the `input` phase has its runtime indices clamped there (`portable.index_safety`),
        unless `safe_indices` is false."""
        with self._lock:
            if safe_indices:
                module, from_phase = self._safe_input(module, from_phase, to_phase, name)
            inv, _ = self._run(module, from_phase, to_phase, name)
            try:
                return inv.export_module()
            finally:
                inv._retained_module_op = None
                inv.close()

    def to_vmfb(
        self,
        module: "ir.Module | ir.Operation",
        *,
        from_phase: str,
        name: str = "module",
        safe_indices: bool = True,
        verify_each: bool = True,
    ) -> bytes:
        """Compile a copy of `module` from `from_phase` to a VM flatbuffer (vmfb), its runtime
        indices clamped as `lower` does. `verify_each=False`: the module is verified once, before
        the first pass, not again after every pass (IREE's default); the code is the same."""
        from iree.compiler.api import Output

        with self._lock:
            if safe_indices:
                module, from_phase = self._safe_input(module, from_phase, "end", name)
            inv, diagnostics = self._run(module, from_phase, "end", name, verify_each)
            try:
                output = Output.open_membuffer()
                try:
                    inv.output_vm_bytecode(output)
                except ValueError as exc:
                    raise CompileError(f"{name}: {exc}; {_summary(diagnostics)}") from None
                return bytes(output.map_memory())
            finally:
                inv.close()

    def _safe_input(self, module: Any, from_phase: str, to_phase: str, name: str) -> tuple[Any, str]:
        """`module` and its phase, lowered to the `input` phase and made index-safe
        (`portable.index_safety`) first where the lowering from `from_phase` to `to_phase` passes it."""
        _check_phase(from_phase)
        _check_phase(to_phase)
        if not PHASES.index(from_phase) < PHASES.index(SAFE_PHASE) < PHASES.index(to_phase):
            return module, from_phase
        inv, _ = self._run(module, from_phase, SAFE_PHASE, name)
        try:
            safe = inv.export_module()
        finally:
            inv._retained_module_op = None
            inv.close()
        from iree.compiler import ir

        try:
            index_safety.clamp(safe)
        except (ir.MLIRError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:  # IR it does not expect
            raise CompileError(f"{name}: cannot make its indices safe at phase {SAFE_PHASE}: {one_line(exc, limit=400)}") from None
        return _Owned(safe), SAFE_PHASE

    def _run(
        self, module: Any, from_phase: str, to_phase: str, name: str, verify_each: bool = True
    ) -> tuple[Any, list[tuple[str, str]]]:
        _check_phase(from_phase)
        _check_phase(to_phase)
        lib = _api()
        # the caller's module is left as it was: a copy is compiled (one made here needs none)
        op = module.op if isinstance(module, _Owned) else getattr(module, "operation", module).clone()
        if not verify_each:
            # IREE verifies an imported module only where it verifies after every pass
            from iree.compiler import ir

            try:
                op.verify()
            except ir.MLIRError as exc:
                raise CompileError(f"{name}: invalid MLIR: {brief(exc, None, sep=' ', limit=None)}") from None
        inv = self._session.invocation()
        if not verify_each:
            lib.ireeCompilerInvocationSetVerifyIR(inv._inv_p, False)
        diagnostics: list[tuple[str, str]] = []

        def collect(severity: int, message: bytes, size: int, _user: int | None) -> None:
            diagnostics.append((_SEVERITY.get(severity, "error"), ctypes.string_at(message, size).decode(errors="replace")))

        callback = _DIAGNOSTIC_CALLBACK(collect)
        inv._portkern_callback = callback  # must outlive the invocation
        lib.ireeCompilerInvocationEnableCallbackDiagnostics(inv._inv_p, 0, callback, None)
        try:
            inv.import_module(op)
        except RuntimeError as exc:
            inv.close()
            raise CompileError(f"{name}: {exc}; {_summary(diagnostics)}") from None
        lib.ireeCompilerInvocationSetCompileFromPhase(inv._inv_p, from_phase.encode())
        lib.ireeCompilerInvocationSetCompileToPhase(inv._inv_p, to_phase.encode())
        if not inv.execute():
            inv.close()
            raise CompileError(
                f"{name}: IREE failed between phases {from_phase} and {to_phase}: {_summary(diagnostics)}"
            )
        return inv, diagnostics


class _Owned:
    """A module made by this compiler for its own next step, compiled without a copy."""

    def __init__(self, op: Any) -> None:
        self.op = op


def operations(module: "ir.Module | ir.Operation") -> list["ir.Operation"]:
    """Every operation under `module` (itself first), in program order."""
    from iree.compiler import ir

    found: list[Any] = []

    def visit(op: Any) -> Any:
        found.append(op)
        return ir.WalkResult.ADVANCE

    getattr(module, "operation", module).walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def bytecode(module: "ir.Module | ir.Operation", version: int | None = None) -> bytes:
    """The MLIR bytecode of a module."""
    buffer = io.BytesIO()
    getattr(module, "operation", module).write_bytecode(buffer, desired_version=version)
    return buffer.getvalue()


def bytecode_version(data: bytes) -> int:
    """The version in an MLIR bytecode header: magic `ML\\xefR`, then a PrefixVarInt.

    A PrefixVarInt's first byte holds, in its trailing zero bits, how many more
    bytes follow (a zero first byte: eight more).
    """
    if data[:4] != b"ML\xefR":
        raise CompileError("not MLIR bytecode (bad magic)")
    if len(data) < 5:
        raise CompileError("MLIR bytecode header is truncated")
    first = data[4]
    extra = 8 if first == 0 else (first & -first).bit_length() - 1
    if len(data) < 5 + extra:
        raise CompileError("MLIR bytecode header is truncated")
    if first == 0:
        return int.from_bytes(data[5:13], "little")
    return int.from_bytes(data[4 : 5 + extra], "little") >> (extra + 1)


def _summary(diagnostics: list[tuple[str, str]], limit: int = 3) -> str:
    errors = [m for s, m in diagnostics if s == "error"] or [m for _, m in diagnostics]
    if not errors:
        return "no diagnostics"
    shown = "; ".join(brief(m, None, sep=" ", limit=400) for m in errors[:limit])
    more = len(errors) - limit
    return shown + (f" (+{more} more)" if more > 0 else "")
