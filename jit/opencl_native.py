"""OpenCL kernels on the device: SPIR-V (or SPIR 1.2) to a native program binary, and running it.

Finalising builds the program from the stage the device takes -- SPIR-V IL
when the device reads the module's SPIR-V version, else the SPIR 1.2 bitcode
made on the build host -- then launches the kernel on zero-filled inputs of
shapes its launch description allows, and only then reads the program
binary: PoCL compiles native code at a kernel's first launch, and a binary
read earlier holds only IR. PoCL also compiles one work-group function for
grids narrower than 65535 items ("smallgrid") and another for wider ones, so
there is one launch of each kind. Later runs build the program from the binary.

A kernel with a parameter space has one variant per point; a kernel config
(`Launch.point`) names the one to build and run, "default" the default point.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Callable, Mapping, Sequence

import numpy as np

from portkern.base.errors import (
    CompileError,
    DeviceError,
    FinalizeError,
    KernelRuntimeError,
    LaunchSpecError,
    PerfConfigError,
    PortkernError,
    brief,
)
from portkern.base.records import frozen_record
from portkern.jit import opencl
from portkern.jit.args import bind_launch
from portkern.jit.target import Target
from portkern.portable import spirv
from portkern.portable.bundle import KernelRecord, Stage
from portkern.portable.launch import DEFAULT_CONFIG, Launch, Variant, launch_of

#: The native artifact format (`Entry.format`, `NativeArtifact.format`).
FORMAT = "opencl-binary"
#: Symbol values tried, in order, for the small finalising launch.
SCRATCH_SIZES = (16, 64, 256, 1, 2, 4, 8, 32, 128, 512, 1024)
#: A global size at least this wide gets PoCL's generic (not "smallgrid") code.
WIDE_GRID = 1 << 16
#: Largest inputs plus results a finalising launch may allocate.
MAX_SCRATCH_BYTES = 64 << 20


@frozen_record
class BuildChoice:
    """How a kernel is built for a device: which variant, from which stage, with which options."""

    launch: Launch
    variant: Variant
    stage: Stage
    options: tuple[str, ...]

    @property
    def key_flags(self) -> tuple[str, ...]:
        """Everything besides the stage that changes the native binary."""
        local = "x".join(map(str, self.variant.local)) if self.variant.local else "driver"
        return (*self.options, f"local={local}")


def compiler_id() -> str:
    """The device-side toolchain (the driver's version is in the device fingerprint)."""
    return f"opencl pyopencl {opencl.pyopencl().VERSION_TEXT}"


def select_variant(name: str, launch: Launch, target: Target, config: str = DEFAULT_CONFIG) -> Variant:
    """The point a config names (a kernel with a parameter space), else the variant built for the
    device's sub-group size, else the one for any size."""
    if launch.tunable or config != DEFAULT_CONFIG:
        try:
            return launch.point(config)
        except LaunchSpecError as exc:
            raise PerfConfigError(f"kernel {name!r}: {exc}") from None
    sizes = [int(s) for s in target.fingerprint.property("subgroup_sizes").split(",") if s]
    for variant in launch.variants:
        if variant.subgroup_size in sizes:
            return variant
    for variant in launch.variants:
        if variant.subgroup_size is None:
            return variant
    built = ", ".join(str(v.subgroup_size) for v in launch.variants)
    has = f"sub-group size {', '.join(map(str, sizes))}" if sizes else "no known sub-group size"
    raise DeviceError(f"kernel {name!r} is built for sub-group sizes {built}; {target.label} has {has}")


def build_choice(blobs: Mapping[str, bytes], record: KernelRecord, target: Target, config: str = DEFAULT_CONFIG) -> BuildChoice:
    """The build choice (`blobs`: the bundle's blobs by name), from the launch description and the
    SPIR-V header alone (the module itself is read in a worker, by `build`); DeviceError if the
    device takes neither the SPIR-V version nor SPIR 1.2."""
    launch = launch_of(record)
    variant = select_variant(record.name, launch, target, config)
    stages = {record.stages[i].format: record.stages[i] for i in variant.stages}
    try:
        version = spirv.header_version(blobs[stages["spirv"].blob])
    except CompileError as exc:
        raise FinalizeError(f"kernel {record.name!r}: its SPIR-V stage is unreadable: {exc}") from None
    fp = target.fingerprint
    il = [tuple(map(int, v.split("."))) for v in fp.property("il_versions").split(",") if v]
    if any(have >= version for have in il):
        return BuildChoice(launch, variant, stages["spirv"], ())
    if fp.property("spir") and "spir-bitcode" in stages:
        return BuildChoice(launch, variant, stages["spir-bitcode"], opencl.SPIR_OPTIONS)
    takes = f"SPIR-V {', '.join(fp.property('il_versions').split(','))}" if il else "no SPIR-V IL"
    raise DeviceError(
        f"kernel {record.name!r} is SPIR-V {version[0]}.{version[1]}; {target.label} takes {takes}"
        + ("" if fp.property("spir") else " and no SPIR 1.2")
    )


def check_device(module: spirv.Module, name: str, target: Target) -> None:
    """DeviceError if the kernel uses what the device does not support."""
    fp = target.fingerprint
    extensions = fp.features.split(",")
    for needed, have, what in (
        (module.uses_subgroups, fp.property("subgroups") == "1", "sub-groups"),
        (module.needs_fp64, "cl_khr_fp64" in extensions, "double precision (cl_khr_fp64)"),
        (module.needs_fp16, "cl_khr_fp16" in extensions, "half precision (cl_khr_fp16)"),
    ):
        if needed and not have:
            raise DeviceError(f"kernel {name!r} uses {what}, which {target.label} does not support")


def variant_blobs(blobs: Mapping[str, bytes], record: KernelRecord, target: Target, config: str = DEFAULT_CONFIG) -> dict[str, bytes]:
    """The blobs `build` reads for a config: its variant's stages only."""
    variant = select_variant(record.name, launch_of(record), target, config)
    return {record.stages[i].blob: blobs[record.stages[i].blob] for i in variant.stages}


def build(record: KernelRecord, blobs: Mapping[str, bytes], target: Target, config: str = DEFAULT_CONFIG) -> bytes:
    """The native program binary for a kernel (the point `config` names) on an OpenCL device
    (run in a worker: the driver reads the bundle's SPIR-V or SPIR here)."""
    cl = opencl.pyopencl()
    chosen = build_choice(blobs, record, target, config)
    spirv_stage = next(record.stages[i] for i in chosen.variant.stages if record.stages[i].format == "spirv")
    check_device(_module(blobs[spirv_stage.blob], record.name), record.name, target)
    ctx, _ = opencl.context(target)
    dev = opencl.device(target)
    data = blobs[chosen.stage.blob]
    try:
        program = cl.Program(ctx, data) if chosen.stage.format == "spirv" else cl.Program(ctx, [dev], [data])
        program.build(options=list(chosen.options), devices=[dev])
    except cl.Error as exc:
        raise FinalizeError(f"{target.label}: the OpenCL driver cannot build {record.name!r}: {brief(exc, None, limit=1500) or type(exc).__name__}") from None
    kernel = ClKernel(program, record, chosen.launch, chosen.variant, target)
    for shapes in scratch_shapes(chosen.launch, chosen.variant):
        inputs = [np.zeros(shape, arg.dtype) for shape, arg in zip(shapes, chosen.launch.inputs)]
        try:
            kernel(*inputs)
        except PortkernError as exc:
            raise FinalizeError(f"{target.label}: the finalising launch of {record.name!r} failed: {exc}") from None
    try:
        (binary,) = program.get_info(cl.program_info.BINARIES)
    except (cl.Error, ValueError) as exc:
        raise FinalizeError(f"{target.label}: cannot read the program binary of {record.name!r}: {exc}") from None
    if not binary:
        raise FinalizeError(f"{target.label}: the OpenCL driver returned an empty binary for {record.name!r}")
    return bytes(binary)


@frozen_record
class Scratch:
    """Symbol values for a finalising launch, the input shapes and the global size they give."""

    symbols: dict[str, int]
    shapes: list[tuple[int, ...]]
    global_size: tuple[int, ...]


def scratch_shapes(launch: Launch, variant: Variant) -> list[list[tuple[int, ...]]]:
    """Input shapes for the finalising launches: a small grid, then a wide one where the
    launch description allows it. None when no small shape satisfies it (for instance
    when input shapes refer to other inputs' shapes); the driver then compiles at the
    first call instead."""
    symbols = sorted(launch.symbols)
    candidates = (_scratch(launch, variant, dict.fromkeys(symbols, size)) for size in SCRATCH_SIZES)
    small = next(filter(None, candidates), None)
    if small is None:
        return []
    found = [small]
    if max(small.global_size) < WIDE_GRID:
        for name in symbols:
            wider = (_scratch(launch, variant, {**small.symbols, name: 1 << bits}) for bits in range(5, 25))
            wide = next((w for w in wider if w and max(w.global_size) >= WIDE_GRID), None)
            if wide:
                found.append(wide)
                break
    return [item.shapes for item in found]


def _scratch(launch: Launch, variant: Variant, symbols: dict[str, int]) -> Scratch | None:
    """The launch for these symbol values, if the description accepts them and it fits the memory bound."""
    try:
        shapes = [tuple(d.evaluate(symbols, {}) for d in arg.shape) for arg in launch.inputs]
        views = [np.broadcast_to(np.zeros((), arg.dtype), shape) for shape, arg in zip(shapes, launch.inputs)]
        bound = bind_launch("scratch", launch, variant.local, views, variant.params)
    except (PortkernError, ValueError):
        return None
    total = sum(v.nbytes for v in views)
    total += sum(math.prod(shape) * np.dtype(arg.dtype).itemsize for arg in launch.outputs if (shape := bound.shapes.get(arg.name)))
    if not all(bound.global_size) or total > MAX_SCRATCH_BYTES:
        return None
    return Scratch(symbols, shapes, bound.global_size)


class Executable:
    """A kernel loaded from its native program binary; call it with the checked input arrays."""

    def __init__(self, binary: bytes, record: KernelRecord, target: Target, config: str = DEFAULT_CONFIG) -> None:
        cl = opencl.pyopencl()
        launch = launch_of(record)
        variant = select_variant(record.name, launch, target, config)
        ctx, _ = opencl.context(target)
        try:
            program = cl.Program(ctx, [opencl.device(target)], [binary]).build()
        except cl.Error as exc:
            raise KernelRuntimeError(f"cannot load the OpenCL binary of {record.name!r}: {brief(exc, None, limit=1500) or type(exc).__name__}") from None
        self._kernel = ClKernel(program, record, launch, variant, target)
        self.entry = record.entry

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        return self._kernel(*arrays)

    def prepared(self, *arrays: np.ndarray) -> Callable[[], None]:
        """`ClKernel.prepared`."""
        return self._kernel.prepared(*arrays)


class ClKernel:
    """A built program's kernel with its launch description."""

    def __init__(self, program, record: KernelRecord, launch: Launch, variant: Variant, target: Target) -> None:
        cl = opencl.pyopencl()
        self.name = record.name
        self.launch = launch
        self.local = variant.local
        self.params = variant.params
        self.target = target
        self._ctx, self._queue = opencl.context(target)
        self._lock = threading.Lock()
        try:
            self._kernel = cl.Kernel(program, record.entry)
            allowed = self._kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, opencl.device(target))
        except cl.Error as exc:
            raise KernelRuntimeError(f"{record.name}: no usable kernel {record.entry!r} in the program: {exc}") from None
        if self.local is not None and math.prod(self.local) > allowed:
            raise DeviceError(
                f"kernel {record.name!r}: work-group of {math.prod(self.local)} items is more than "
                f"{target.label} allows for it ({allowed})"
            )
        device = opencl.device(target)
        used = self._kernel.get_work_group_info(cl.kernel_work_group_info.LOCAL_MEM_SIZE, device)
        if used > device.local_mem_size:
            raise DeviceError(f"kernel {record.name!r}: needs {used} bytes of local memory, {target.label} has {device.local_mem_size}")

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        cl = opencl.pyopencl()
        try:
            bound, values, results = self._bind(arrays)
            launched = self._launch(bound, values)
            for host, buffer in results:
                if host.nbytes:
                    cl.enqueue_copy(self._queue, host, buffer, wait_for=launched, is_blocking=True)
            if launched:
                cl.wait_for_events(launched)
        except cl.Error as exc:
            raise KernelRuntimeError(f"{self.name} on {self.target.label}: {exc}") from None
        return [host for host, _ in results]

    def prepared(self, *arrays: np.ndarray) -> Callable[[], None]:
        """A launch on these arrays with the device buffers made once: each call runs the
        kernel and waits for it, copying nothing (what the tuner times)."""
        cl = opencl.pyopencl()
        try:
            bound, values, _ = self._bind(arrays)
        except cl.Error as exc:
            raise KernelRuntimeError(f"{self.name} on {self.target.label}: {exc}") from None

        def launch() -> None:
            try:
                cl.wait_for_events(self._launch(bound, values))
            except cl.Error as exc:
                raise KernelRuntimeError(f"{self.name} on {self.target.label}: {exc}") from None

        return launch

    def _bind(self, arrays: Sequence[np.ndarray]):
        """The bound launch, the kernel's argument values (buffers made) and the (host, buffer) results."""
        cl = opencl.pyopencl()
        opencl.check_process()
        bound = bind_launch(self.name, self.launch, self.local, arrays, self.params)
        inputs = dict(zip((a.name for a in self.launch.inputs), arrays))
        flags = cl.mem_flags
        values, results = [], []
        for arg in self.launch.args:
            role = arg.role
            if role is None:  # a scalar (`arg.is_buffer` is false)
                values.append(bound.scalars[arg.name] if arg.value is not None else inputs[arg.name][()])
                continue
            host = np.empty(bound.shapes[arg.name], arg.dtype) if role == "out" else inputs[arg.name]
            if role == "inout":
                host = host.copy()
            access = {"in": flags.READ_ONLY, "out": flags.WRITE_ONLY, "inout": flags.READ_WRITE}[role]
            if role != "out" and host.nbytes:
                buffer = cl.Buffer(self._ctx, access | flags.COPY_HOST_PTR, hostbuf=host)
            else:
                buffer = cl.Buffer(self._ctx, access, size=max(host.nbytes, host.itemsize))
            values.append(buffer)
            if arg.is_output:
                results.append((host, buffer))
        return bound, values, results

    def _launch(self, bound, values: list) -> list:
        """The kernel enqueued with these argument values (no event for an empty grid)."""
        cl = opencl.pyopencl()
        if not all(bound.global_size):
            return []
        # The kernel object's arguments are shared; a launch captures them when enqueued.
        with self._lock:
            self._kernel.set_args(*values)
            return [cl.enqueue_nd_range_kernel(self._queue, self._kernel, bound.global_size, self.local)]


@functools.lru_cache(maxsize=256)
def _read_module(data: bytes) -> spirv.Module:
    return spirv.read(data)


def _module(data: bytes, name: str) -> spirv.Module:
    try:
        return _read_module(data)
    except CompileError as exc:
        raise FinalizeError(f"kernel {name!r}: its SPIR-V stage is unreadable: {exc}") from None
