"""OpenCL C and SPIR-V kernels on the build host: compile, validate, check, convert.

    .cl  --clang-15 (spirv64, -O2)--> bitcode --llvm-spirv-15 (SPIR-V <= 1.2)--> .spv
    .spv --spirv-val--> checked against the launch description
         --llvm-spirv-15 -r--> SPIR 1.2 bitcode, for devices without SPIR-V IL (PoCL)

Every tool runs as a child process in a temporary directory; a tool that fails
leaves nothing behind. Validation is not optional: llvm-spirv-15 writes
invalid SPIR-V for some inputs, and `llvm-spirv -r` aborts on invalid input.
When it does so for optimised bitcode, the kernel is built again at -O0 (the
driver optimises on the device) with a warning. A kernel with a parameter
space is compiled once per valid point, in parallel threads (each runs the
tools as child processes).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Sequence

from portkern.base.errors import BuildError, CompileError, LaunchSpecError, brief, one_line
from portkern.base.framing import read_bounded
from portkern.base.records import frozen_record
from portkern.portable import spirv
from portkern.portable.bundle import KernelRecord, Stage, sha256
from portkern.portable.launch import ELEMENTS, Launch, LaunchArg, Variant, VariantSource, dotted, from_manifest, point_text, where_of
from portkern.portable.manifest import KernelSpec
from portkern.portable.producer import Producer

#: Debian's tool names; clang and llvm-spirv must share an LLVM major version.
CLANG, LLVM_SPIRV, SPIRV_VAL = "clang-15", "llvm-spirv-15", "spirv-val"
APT_HINT = "Debian: apt install clang-15 llvm-spirv-15 spirv-tools"
CL_STD = "CL2.0"
SPIRV_MAX_VERSION = "1.2"
TOOL_TIMEOUT_S = 300
#: Build compromises warned about one by one per kernel; the rest are counted.
MAX_NOTES = 3
MAX_SOURCE_BYTES = 16 << 20
#: Stage phases/formats written for OpenCL kernels.
SPIRV_STAGE = ("spirv", "spirv")
SPIR_STAGE = ("spir", "spir-bitcode")

_DIAGNOSTIC = re.compile(r"^(?P<where>[^\n]+?:\d+:\d+): (?P<severity>fatal error|error): (?P<message>.*)$", re.M)
_VERSION = re.compile(r"version (\d+\.\d+\.\d+)")
_LOOP_METADATA = re.compile(r", !llvm\.loop ![0-9]+")


class BuildWarning(UserWarning):
    """The build succeeded, but with a compromise the user should know about."""


@frozen_record
class Compiled:
    """One variant's stages and the blobs they refer to."""

    stages: tuple[Stage, ...]
    blobs: dict[str, bytes]
    #: Compromises of the build, for a BuildWarning (the same text for every point it concerns).
    notes: tuple[str, ...] = ()


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
    """An `opencl` or `spirv` kernel's bundle record: every variant (or every valid point of its
    parameter space) compiled, validated and checked; identical stages are stored once."""
    try:
        launch, sources = from_manifest(spec.options, spec.kind, spec.source)
    except LaunchSpecError as exc:
        raise BuildError(f"{spec.source}: kernel {spec.name!r}: {dotted(where_of(exc))}: {exc}") from None
    entry = spec.entry or spec.name
    if launch.tunable:
        built = _build_points(spec, launch, sources, entry)
    else:
        built = [(v, _compile_variant(spec, launch, v, s, entry)) for v, s in zip(launch.variants, sources)]
    notes = sorted({n for _, compiled in built for n in compiled.notes})
    for note in notes[:MAX_NOTES]:
        warnings.warn(note, BuildWarning, stacklevel=2)
    if len(notes) > MAX_NOTES:
        warnings.warn(f"{spec.source}: kernel {spec.name!r}: {len(notes) - MAX_NOTES} more points built with such a compromise", BuildWarning, stacklevel=2)
    stages: list[Stage] = []
    index: dict[Stage, int] = {}
    blobs: dict[str, bytes] = {}
    variants = []
    for variant, compiled in built:
        for stage in compiled.stages:
            if stage not in index:
                index[stage] = len(stages)
                stages.append(stage)
        blobs.update(compiled.blobs)
        variants.append(dataclasses.replace(variant, stages=tuple(index[s] for s in compiled.stages)))
    launch = dataclasses.replace(launch, variants=tuple(variants))
    record = KernelRecord(spec.name, spec.kind, entry, launch.signature(), tuple(stages), source_sha256, (), launch.to_dict())
    return record, blobs


def _build_points(spec: KernelSpec, launch: Launch, sources: Sequence[VariantSource], entry: str) -> list[tuple[Variant, "Compiled"]]:
    """Every point of a parameter space compiled in parallel; points that fail are dropped with a
    warning giving each reason. The default point (the first) must build."""
    spir: dict[str, bytes] = {}

    def one(item: tuple[Variant, VariantSource]) -> tuple[Variant, Compiled | BuildError]:
        variant, source = item
        try:
            return variant, _compile_variant(spec, launch, variant, source, entry, spir)
        except BuildError as exc:
            return variant, exc

    workers = max(1, min(len(sources), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="portkern-cl") as threads:
        outcomes = list(threads.map(one, zip(launch.variants, sources)))
    default, first = outcomes[0]
    if isinstance(first, BuildError):
        raise BuildError(
            f"{spec.source}: kernel {spec.name!r}: the default point ({point_text(default.params)}) does not build: {first}; "
            "set `defines:` to a point that builds"
        )
    failed = [(v, o) for v, o in outcomes if isinstance(o, BuildError)]
    if failed:
        reasons = "; ".join(f"{point_text(v.params)}: {one_line(o, limit=300)}" for v, o in failed[:5])
        more = f" (+{len(failed) - 5} more)" if len(failed) > 5 else ""
        warnings.warn(
            f"{spec.source}: kernel {spec.name!r}: {len(failed)} of {len(outcomes)} points of the parameter space "
            f"do not build and are left out: {reasons}{more}",
            BuildWarning,
            stacklevel=3,
        )
    return [(v, o) for v, o in outcomes if not isinstance(o, BuildError)]


def _compile_variant(
    spec: KernelSpec, launch: Launch, variant: Variant, source: VariantSource, entry: str, spir: dict[str, bytes] | None = None
) -> Compiled:
    """One variant's stages (`spir`: SPIR bitcode already converted, by SPIR-V digest, shared by points)."""
    origin = str(source.source) + (f" (sub-group size {variant.subgroup_size} variant)" if variant.subgroup_size else "")
    if variant.params:
        origin = f"{source.source} ({point_text(variant.params)})"
    notes: list[str] = []
    if spec.kind == "opencl":
        code = _compile(source.source, source.defines, origin, notes)
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
    digest = sha256(code)
    try:
        converted = spir.get(digest) if spir is not None else None
        if converted is None:
            converted = to_spir(code, origin)
            if spir is not None:
                spir[digest] = converted
        stages.append(_stage(SPIR_STAGE, converted, Producer("llvm-spirv", tool_version(LLVM_SPIRV))))
    except BuildError as exc:
        if spec.kind == "opencl":
            raise
        warnings.warn(f"{exc}; the kernel will only run on devices that take SPIR-V IL", BuildWarning, stacklevel=2)
    return Compiled(tuple(s for s, _ in stages), {s.blob: data for s, data in stages}, tuple(notes))


def _stage(kind: tuple[str, str], data: bytes, producer: Producer) -> tuple[Stage, bytes]:
    return Stage(kind[0], "opencl", kind[1], sha256(data), len(data), producer), data


def compile_opencl(source: Path, defines: Sequence[tuple[str, str]] = (), origin: str = "", opt: str = "-O2") -> bytes:
    """Validated SPIR-V for an OpenCL C file; BuildError with the compiler's file:line message if not.
    Compromises the build made (unroll hints dropped, -O0) are BuildWarnings."""
    notes: list[str] = []
    code = _compile(source, defines, origin or str(source), notes, opt)
    for note in notes:
        warnings.warn(note, BuildWarning, stacklevel=2)
    return code


def _compile(source: Path, defines: Sequence[tuple[str, str]], origin: str, notes: list[str], opt: str = "-O2") -> bytes:
    """`compile_opencl`, with its compromises appended to `notes` (safe to run in threads)."""
    with tempfile.TemporaryDirectory(prefix="portkern-cl-") as tmp:
        work = Path(tmp)
        _clang(source, defines, "-c", work / "kernel.bc", opt)
        try:
            code = _translate(work / "kernel.bc", origin)
            problem = _validation_error(code, work)
        except BuildError as exc:
            code, problem = b"", str(exc)
        if problem is None:
            return code
        # llvm-spirv-15 writes loop merges that spirv-val rejects for loops that
        # carry unroll hints; without the hints the module is valid.
        _clang(source, defines, "-S", work / "kernel.ll", opt)
        text = (work / "kernel.ll").read_text()
        if code and _LOOP_METADATA.search(text):
            (work / "stripped.ll").write_text(_LOOP_METADATA.sub("", text))
            _check(_run([_path(CLANG), "--target=spirv64", "-c", "-emit-llvm", "-x", "ir", str(work / "stripped.ll"), "-o", str(work / "stripped.bc")], CLANG), CLANG, origin)
            retry = _translate(work / "stripped.bc", origin)
            if _validation_error(retry, work) is None:
                notes.append(f"{origin}: loop unroll hints dropped: llvm-spirv-15 turns them into SPIR-V that spirv-val rejects")
                return retry
        # Optimised bitcode is what llvm-spirv-15 mistranslates (blocks before their
        # dominators, undefined IDs); unoptimised bitcode translates, and the driver optimises.
        if opt != "-O0":
            _clang(source, defines, "-c", work / "plain.bc", "-O0")
            plain = _translate(work / "plain.bc", origin)
            if _validation_error(plain, work) is None:
                notes.append(
                    f"{origin}: built at -O0: llvm-spirv-15 made no valid SPIR-V from the {opt} build "
                    f"({one_line(problem, limit=200)}); the OpenCL driver optimises the kernel on the device"
                )
                return plain
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
            raise BuildError(f"{origin}: {LLVM_SPIRV} -r cannot convert the SPIR-V to SPIR 1.2: {(brief(done.stderr, 3, limit=600) or 'no message')}")
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
    want = ELEMENTS[arg.dtype]
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
    return read_bounded(path, MAX_SOURCE_BYTES, "OpenCL source", BuildError)


def _path(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise BuildError(f"{tool} is not installed; OpenCL kernels need {CLANG}, {LLVM_SPIRV} and {SPIRV_VAL} ({APT_HINT})")
    return found


def _run(cmd: list[str], tool: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{tool} took longer than {TOOL_TIMEOUT_S} s") from None
    except OSError as exc:
        raise BuildError(f"cannot run {tool}: {exc.strerror or exc}") from None


def _clang(source: Path, defines: Sequence[tuple[str, str]], mode: str, output: Path, opt: str = "-O2") -> None:
    cmd = [_path(CLANG), "--target=spirv64", f"-cl-std={CL_STD}", opt, "-fno-color-diagnostics", mode, "-emit-llvm"]
    cmd += [f"-D{name}={value}" if value else f"-D{name}" for name, value in defines]
    done = _run([*cmd, "-o", str(output), "--", str(source)], CLANG)
    if done.returncode != 0:
        errors = [f"{m['where']}: {m['severity']}: {m['message']}" for m in _DIAGNOSTIC.finditer(done.stderr)]
        if not errors:
            raise BuildError(f"{source}: {CLANG} failed: {(brief(done.stderr, 3, limit=600) or 'no message')}")
        more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        raise BuildError("; ".join(errors[:3]) + more)


def _translate(bitcode: Path, origin: str) -> bytes:
    output = bitcode.with_suffix(".spv")
    done = _run([_path(LLVM_SPIRV), f"--spirv-max-version={SPIRV_MAX_VERSION}", str(bitcode), "-o", str(output)], LLVM_SPIRV)
    _check(done, LLVM_SPIRV, origin)
    return output.read_bytes()


def _check(done: subprocess.CompletedProcess[str], tool: str, origin: str) -> None:
    if done.returncode != 0:
        raise BuildError(f"{origin}: {tool} failed: {(brief(done.stderr, 3, limit=600) or 'no message')}")


def _validation_error(code: bytes, work: Path) -> str | None:
    path = work / f"check-{hashlib.sha256(code).hexdigest()[:16]}.spv"
    path.write_bytes(code)
    done = _run([_path(SPIRV_VAL), str(path)], SPIRV_VAL)
    return None if done.returncode == 0 else (brief(done.stderr + done.stdout, 3, limit=600) or 'no message')
