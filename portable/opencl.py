"""OpenCL C and SPIR-V kernels on the build host: compile, validate, check, convert.

    .cl  --clang-15 (spirv64, -O2)--> bitcode --llvm-spirv-15 (SPIR-V <= 1.2)--> .spv
    .spv --spirv-val--> checked against the launch description
         --llvm-spirv-15 -r--> SPIR 1.2 bitcode, for devices without SPIR-V IL (PoCL)

Every tool runs as a child process in a temporary directory; a tool that fails
leaves nothing behind. Validation is not optional: llvm-spirv-15 writes
invalid SPIR-V for some inputs, and `llvm-spirv -r` aborts on invalid input.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from portkern import framing
from portkern.errors import BuildError, CompileError, LaunchSpecError, message_lines
from portkern.portable import spirv
from portkern.portable.bundle import KernelRecord, Stage, sha256
from portkern.portable.launch import Launch, LaunchArg, Variant, VariantSource, dotted, from_manifest, where_of
from portkern.portable.manifest import KernelSpec
from portkern.portable.producer import Producer

#: Debian's tool names; clang and llvm-spirv must share an LLVM major version.
CLANG, LLVM_SPIRV, SPIRV_VAL = "clang-15", "llvm-spirv-15", "spirv-val"
APT_HINT = "Debian: apt install clang-15 llvm-spirv-15 spirv-tools"
CL_STD = "CL2.0"
SPIRV_MAX_VERSION = "1.2"
TOOL_TIMEOUT_S = 300
MAX_SOURCE_BYTES = 16 << 20
#: Stage phases/formats written for OpenCL kernels.
SPIRV_STAGE = ("spirv", "spirv")
SPIR_STAGE = ("spir", "spir-bitcode")

_DIAGNOSTIC = re.compile(r"^(?P<where>[^\n]+?:\d+:\d+): (?P<severity>fatal error|error): (?P<message>.*)$", re.M)
_VERSION = re.compile(r"version (\d+\.\d+\.\d+)")
_LOOP_METADATA = re.compile(r", !llvm\.loop ![0-9]+")
_ELEMENTS = {
    "float16": ("float", 16), "float32": ("float", 32), "float64": ("float", 64),
    "int8": ("int", 8), "uint8": ("int", 8), "bool": ("int", 8),
    "int16": ("int", 16), "uint16": ("int", 16), "int32": ("int", 32), "uint32": ("int", 32),
    "int64": ("int", 64), "uint64": ("int", 64),
}  # fmt: skip


class BuildWarning(UserWarning):
    """The build succeeded, but with a compromise the user should know about."""


@dataclass(frozen=True)
class Compiled:
    """One variant's stages and the blobs they refer to."""

    stages: tuple[Stage, ...]
    blobs: dict[str, bytes]


def missing_tools(kind: str = "opencl") -> list[str]:
    """The tools a kernel kind needs that are not on PATH."""
    needed = (CLANG, LLVM_SPIRV, SPIRV_VAL) if kind == "opencl" else (LLVM_SPIRV, SPIRV_VAL)
    return [tool for tool in needed if shutil.which(tool) is None]


@functools.lru_cache(maxsize=None)
def tool_version(tool: str) -> str:
    """The LLVM version a tool reports (`--version`)."""
    done = _run([_path(tool), "--version"], tool)
    match = _VERSION.search(done.stdout + done.stderr)
    return match.group(1) if match else "unknown"


def build_opencl(spec: KernelSpec, source_sha256: str) -> tuple[KernelRecord, dict[str, bytes]]:
    """An `opencl` or `spirv` kernel's bundle record: every variant compiled, validated and checked."""
    try:
        launch, sources = from_manifest(spec.options, spec.kind, spec.source)
    except LaunchSpecError as exc:
        raise BuildError(f"{spec.source}: kernel {spec.name!r}: {dotted(where_of(exc))}: {exc}") from None
    entry = spec.entry or spec.name
    stages: list[Stage] = []
    blobs: dict[str, bytes] = {}
    variants = []
    for variant, source in zip(launch.variants, sources):
        compiled = _compile_variant(spec, launch, variant, source, entry)
        indices = []
        for stage in compiled.stages:
            if stage not in stages:
                stages.append(stage)
            indices.append(stages.index(stage))
        blobs.update(compiled.blobs)
        variants.append(dataclasses.replace(variant, stages=tuple(indices)))
    launch = dataclasses.replace(launch, variants=tuple(variants))
    record = KernelRecord(spec.name, spec.kind, entry, launch.signature(), tuple(stages), source_sha256, (), launch.to_dict())
    return record, blobs


def _compile_variant(spec: KernelSpec, launch: Launch, variant: Variant, source: VariantSource, entry: str) -> Compiled:
    origin = str(source.source) + (f" (sub-group size {variant.subgroup_size} variant)" if variant.subgroup_size else "")
    if spec.kind == "opencl":
        code = compile_opencl(source.source, source.defines, origin)
    else:
        code = _read_source(source.source)
        validate(code, origin)
    try:
        module = spirv.read(code)
    except CompileError as exc:
        raise BuildError(f"{origin}: {exc}") from None
    check_kernel(module, entry, launch, variant, origin)
    if spec.kind == "opencl":
        producer = Producer("clang/llvm-spirv", f"{tool_version(CLANG)}/{tool_version(LLVM_SPIRV)}")
    else:
        producer = Producer(module.generator, str(module.generator_version))
    stages = [_stage(SPIRV_STAGE, code, producer)]
    try:
        stages.append(_stage(SPIR_STAGE, to_spir(code, origin), Producer("llvm-spirv", tool_version(LLVM_SPIRV))))
    except BuildError as exc:
        if spec.kind == "opencl":
            raise
        warnings.warn(f"{exc}; the kernel will only run on devices that take SPIR-V IL", BuildWarning, stacklevel=2)
    return Compiled(tuple(s for s, _ in stages), {s.blob: data for s, data in stages})


def _stage(kind: tuple[str, str], data: bytes, producer: Producer) -> tuple[Stage, bytes]:
    return Stage(kind[0], "opencl", kind[1], sha256(data), len(data), producer), data


def compile_opencl(source: Path, defines: Sequence[tuple[str, str]] = (), origin: str = "") -> bytes:
    """Validated SPIR-V for an OpenCL C file; BuildError with the compiler's file:line message if not."""
    origin = origin or str(source)
    with tempfile.TemporaryDirectory(prefix="portkern-cl-") as tmp:
        work = Path(tmp)
        _clang(source, defines, "-c", work / "kernel.bc")
        code = _translate(work / "kernel.bc", origin)
        problem = _validation_error(code, work)
        if problem is None:
            return code
        # llvm-spirv-15 writes loop merges that spirv-val rejects for loops that
        # carry unroll hints; without the hints the module is valid.
        _clang(source, defines, "-S", work / "kernel.ll")
        text = (work / "kernel.ll").read_text()
        if _LOOP_METADATA.search(text):
            (work / "stripped.ll").write_text(_LOOP_METADATA.sub("", text))
            _check(_run([_path(CLANG), "--target=spirv64", "-c", "-emit-llvm", "-x", "ir", str(work / "stripped.ll"), "-o", str(work / "stripped.bc")], CLANG), CLANG, origin)
            retry = _translate(work / "stripped.bc", origin)
            if _validation_error(retry, work) is None:
                warnings.warn(
                    f"{origin}: loop unroll hints dropped: llvm-spirv-15 turns them into SPIR-V that spirv-val rejects",
                    BuildWarning,
                    stacklevel=2,
                )
                return retry
        raise BuildError(f"{origin}: the SPIR-V that llvm-spirv made fails validation (spirv-val): {problem}")


def validate(code: bytes, origin: str) -> None:
    """Refuse SPIR-V that `spirv-val` rejects, with its message."""
    with tempfile.TemporaryDirectory(prefix="portkern-spv-") as tmp:
        problem = _validation_error(code, Path(tmp))
    if problem is not None:
        raise BuildError(f"{origin}: not valid SPIR-V (spirv-val): {problem}")


def to_spir(code: bytes, origin: str) -> bytes:
    """SPIR 1.2 bitcode (spir64) for validated SPIR-V, from `llvm-spirv -r`."""
    with tempfile.TemporaryDirectory(prefix="portkern-spir-") as tmp:
        work = Path(tmp)
        (work / "kernel.spv").write_bytes(code)
        done = _run([_path(LLVM_SPIRV), "-r", str(work / "kernel.spv"), "-o", str(work / "kernel.bc")], LLVM_SPIRV)
        if done.returncode != 0:
            raise BuildError(f"{origin}: {LLVM_SPIRV} -r cannot convert the SPIR-V to SPIR 1.2: {_first_lines(done.stderr)}")
        return (work / "kernel.bc").read_bytes()


def check_kernel(module: spirv.Module, entry: str, launch: Launch, variant: Variant, origin: str) -> None:
    """Refuse a kernel whose parameters, work-group or sub-group size disagree with the launch description."""
    kernel = module.kernels.get(entry)
    if kernel is None:
        found = ", ".join(sorted(module.kernels)) or "none"
        raise BuildError(f"{origin}: no kernel {entry!r} (kernels found: {found}); set `entry:`")
    if len(kernel.params) != len(launch.args):
        raise BuildError(f"{origin}: kernel {entry!r} takes {len(kernel.params)} arguments, the manifest lists {len(launch.args)}")
    for index, (param, arg) in enumerate(zip(kernel.params, launch.args)):
        problem = _param_problem(param, arg)
        if problem:
            raise BuildError(f"{origin}: kernel {entry!r} argument {index} ({arg.name}): {problem}")
    if kernel.local_size is not None:
        wanted = ", ".join(map(str, kernel.local_size[: len(launch.global_size)]))
        if variant.local is None or tuple(variant.local) + (1,) * (3 - len(variant.local)) != kernel.local_size:
            raise BuildError(
                f"{origin}: kernel {entry!r} declares reqd_work_group_size{kernel.local_size}, "
                f"but the manifest's local size is {list(variant.local) if variant.local else 'unset'}; set `local: [{wanted}]`"
            )
    if kernel.subgroup_size is not None and kernel.subgroup_size != variant.subgroup_size:
        raise BuildError(
            f"{origin}: kernel {entry!r} requires sub-group size {kernel.subgroup_size}; "
            f"build it in a variant with `subgroup_size: {kernel.subgroup_size}`"
        )


def _param_problem(param: spirv.Param, arg: LaunchArg) -> str:
    want = _ELEMENTS[arg.dtype]
    if arg.is_buffer:
        if param.kind != "pointer":
            return f"the kernel parameter is {_c_type(param)}, but the manifest describes a buffer (role {arg.role})"
        if param.space == "local":
            return "__local pointer arguments are not supported; declare __local arrays inside the kernel"
        if param.space not in ("global", "constant"):
            return f"the kernel parameter is {_c_type(param)}; buffers must be __global or __constant"
        if param.element != want:
            return f"the kernel parameter is {_c_type(param)}, but the manifest says {arg.dtype}"
        if arg.is_output and (param.space == "constant" or not param.writable):
            return f"the manifest says role {arg.role}, but the kernel never writes through it ({_c_type(param)}: const or unused)"
        return ""
    if param.kind != "scalar" or param.element != want:
        return f"the kernel parameter is {_c_type(param)}, but the manifest says a scalar of {arg.dtype}"
    return ""


def _c_type(param: spirv.Param) -> str:
    names = {("float", 16): "half", ("float", 32): "float", ("float", 64): "double", ("int", 8): "char",
             ("int", 16): "short", ("int", 32): "int", ("int", 64): "long"}  # fmt: skip
    base = names.get(param.element, "unsupported type") if param.element else "unsupported type"
    return f"__{param.space} {base}*" if param.kind == "pointer" else base


def _read_source(path: Path) -> bytes:
    return framing.read_bounded(path, MAX_SOURCE_BYTES, "OpenCL source", BuildError)


def _path(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise BuildError(f"{tool} is not installed; OpenCL kernels need {CLANG}, {LLVM_SPIRV} and {SPIRV_VAL} ({APT_HINT})")
    return found


def _run(cmd: list[str], tool: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{tool} took longer than {TOOL_TIMEOUT_S} s") from None
    except OSError as exc:
        raise BuildError(f"cannot run {tool}: {exc.strerror or exc}") from None


def _clang(source: Path, defines: Sequence[tuple[str, str]], mode: str, output: Path) -> None:
    cmd = [_path(CLANG), "--target=spirv64", f"-cl-std={CL_STD}", "-O2", "-fno-color-diagnostics", mode, "-emit-llvm"]
    cmd += [f"-D{name}={value}" if value else f"-D{name}" for name, value in defines]
    done = _run([*cmd, "-o", str(output), "--", str(source)], CLANG)
    if done.returncode != 0:
        errors = [f"{m['where']}: {m['severity']}: {m['message']}" for m in _DIAGNOSTIC.finditer(done.stderr)]
        if not errors:
            raise BuildError(f"{source}: {CLANG} failed: {_first_lines(done.stderr)}")
        more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        raise BuildError("; ".join(errors[:3]) + more)


def _translate(bitcode: Path, origin: str) -> bytes:
    output = bitcode.with_suffix(".spv")
    done = _run([_path(LLVM_SPIRV), f"--spirv-max-version={SPIRV_MAX_VERSION}", str(bitcode), "-o", str(output)], LLVM_SPIRV)
    _check(done, LLVM_SPIRV, origin)
    return output.read_bytes()


def _check(done: subprocess.CompletedProcess, tool: str, origin: str) -> None:
    if done.returncode != 0:
        raise BuildError(f"{origin}: {tool} failed: {_first_lines(done.stderr)}")


def _validation_error(code: bytes, work: Path) -> str | None:
    path = work / f"check-{hashlib.sha256(code).hexdigest()[:16]}.spv"
    path.write_bytes(code)
    done = _run([_path(SPIRV_VAL), str(path)], SPIRV_VAL)
    return None if done.returncode == 0 else _first_lines(done.stderr + done.stdout)


def _first_lines(text: str, limit: int = 3) -> str:
    return " | ".join(message_lines(text)[:limit])[:600] or "no message"
