"""The two ways a bundle's kernel becomes native code: IREE (MLIR stages) and OpenCL (SPIR-V stages).

The native-code service asks `toolchain_for(record)` and never tells the two apart itself;
the compiling is done by the workers (`portkern.jit.worker`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from portkern.base.errors import FinalizeError
from portkern.jit.target import Target
from portkern.portable.bundle import Bundle, KernelRecord, Stage
from portkern.portable.producer import installed_compiler, installed_runtime
from portkern.portable.source import readable_stage

if TYPE_CHECKING:
    import numpy as np


#: The config of the compiler's own choices (no module options): `jit.native.DEFAULT_CONFIG`.
DEFAULT = "default"


class Loaded(Protocol):
    """A loaded kernel (`executable` of a toolchain): NumPy arrays in, its results as NumPy arrays out."""

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]: ...


class IreeToolchain:
    """MLIR stages finalised by the IREE compiler, run by the IREE runtime."""

    name = "iree"
    format = "vmfb"

    def tunable(self, record: KernelRecord) -> bool:
        """Whether the tuner searches configs of this kernel."""
        return True

    def accepts(self, target: Target) -> bool:
        return target.driver != "opencl"

    def compiler_id(self) -> str:
        compiler, runtime = installed_compiler(), installed_runtime()
        return f"iree {compiler.version} {compiler.revision[:12]} runtime {runtime.version}"

    def target(self, target: Target, config: str) -> Target:
        """The target that kernel config `config` compiles for: with the flags of its module options."""
        if config == DEFAULT:
            return target
        from portkern.jit.finalize import module_options, with_options  # the compiler's side, loaded when used

        return with_options(target, module_options(config))

    def stage(self, bundle: Bundle, record: KernelRecord, target: Target, config: str) -> tuple[Stage, tuple[str, ...]]:
        """The stage finalised for `target` (with kernel config `config`; the source stage for a bundle of
        another IREE release, or for a config with module options), and what besides it selects the native code."""
        stage: Stage | None
        if config == DEFAULT or not self._options(config):
            stage = readable_stage(record, target.family)
        else:
            stage = record.source_stage()
        if stage is None:
            raise FinalizeError(f"kernel {record.name!r}: config {config[:200]!r} is built from the kernel's source stage, "
                                "and its bundle has none (built with --no-source)")
        if not stage.is_source:
            return stage, target.identity
        from portkern.portable import index_safety  # (the compiler's side: loaded for a source stage)

        # code compiled from a source stage went through this portkern's index-safety rewrite
        return stage, target.identity + (index_safety.REWRITE,)

    @staticmethod
    def _options(config: str) -> tuple[str, ...]:
        from portkern.jit.finalize import module_options

        return module_options(config)

    def check(self, stage: Stage, name: str) -> None:
        """Refuse, before any worker reads it, a stage this compiler cannot read (its bytecode
        version is checked by the worker that parses it: the caller does not import the compiler)."""
        from portkern.jit.finalize import check_stage

        check_stage(stage, name, bytecode=False)

    def executable(self, data: bytes, record: KernelRecord, target: Target, config: str, parameters=None, executor: bool = False) -> Loaded:
        """A loaded, callable kernel for native code built with `config`, reading `parameters`
        (a bundle's mapped parameters) if it has any; `executor`: its tuning found its calls
        faster on the task executor (`jit.runtime.executor_min_bytes`)."""
        from portkern.jit.runtime import Executable

        return Executable(data, record.entry, target.driver, parameters, executor)


class OpenclToolchain:
    """SPIR-V stages finalised and run by the device's OpenCL driver."""

    name = "opencl"

    @property
    def _native(self):
        from portkern.jit import opencl_native

        return opencl_native

    @property
    def format(self) -> str:
        return self._native.FORMAT

    def accepts(self, target: Target) -> bool:
        return target.driver == "opencl"

    def tunable(self, record: KernelRecord) -> bool:
        """Kernels with a parameter space are tuned; others run with their manifest's launch sizes."""
        from portkern.portable.launch import launch_of

        return launch_of(record).tunable

    def compiler_id(self) -> str:
        return self._native.compiler_id()

    def stage(self, bundle: Bundle, record: KernelRecord, target: Target, config: str) -> tuple[Stage, tuple[str, ...]]:
        chosen = self._native.build_choice(bundle.blobs, record, target, config)
        return chosen.stage, chosen.key_flags

    def target(self, target: Target, config: str) -> Target:
        return target

    def check(self, stage: Stage, name: str) -> None:
        """Nothing to refuse beyond what `stage` checked."""

    def executable(self, data: bytes, record: KernelRecord, target: Target, config: str, parameters=None, executor: bool = False) -> Loaded:
        return self._native.Executable(data, record, target, config)


IREE = IreeToolchain()
OPENCL = OpenclToolchain()


def toolchain_for(record: KernelRecord) -> IreeToolchain | OpenclToolchain:
    """OpenCL for kernels whose stages are SPIR-V, IREE for MLIR kernels."""
    return OPENCL if any(stage.format == "spirv" for stage in record.stages) else IREE
