"""NVIDIA GPUs: probing through the CUDA driver (ctypes), and IREE `cuda` targets for sm archs.

IREE 3.13 embeds PTX (not SASS) in its CUDA vmfbs; the driver compiles it at
load time. Its target table lacks sm_90, sm_90a, sm_100 and sm_100a (a flag for
them yields a target without a GPU description, which fails in codegen), so
those are written from sm_80's description with the arch, the first PTX ISA
version that supports it and its shared-memory limit changed. Names such as
`hopper` or `h100` crash IREE's compiler, so only names matching `sm_NN[a]`
from the known list ever reach it.

A device's fingerprint is `sm_<major><minor>` of its compute capability and
nothing else (SM count, memory and name are reported by the probe only).
"""

from __future__ import annotations

import ctypes
import re
import sys

from portkern.base.errors import DeviceError, brief
from portkern.cache.device import DeviceFingerprint
from portkern.cache.store import Store
from portkern.jit import gpu
from portkern.jit.target import Probe, Target

KIND = "cuda"
NAME = "NVIDIA GPU"
DRIVER = "cuda"
#: Archs IREE 3.13's `--iree-cuda-target` describes itself.
IREE_ARCHS = ("sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_120", "sm_121")
#: Archs written from `_BASE`'s description: arch -> (PTX ISA feature, max shared memory per block in bytes).
DERIVED = {
    "sm_90": ("+ptx78", 232448),
    "sm_90a": ("+ptx80", 232448),
    "sm_100": ("+ptx86", 232448),
    "sm_100a": ("+ptx86", 232448),
}
_BASE = "sm_80"
_ARCH = re.compile(r"sm_\d{2,3}a?")

#: cuDeviceGetAttribute numbers (CUdevice_attribute).
_ATTRIBUTES = {
    "cc_major": 75,
    "cc_minor": 76,
    "multiprocessors": 16,
    "warp_size": 10,
    "shared_memory_per_block": 8,
    "shared_memory_per_block_optin": 97,
}
CUDA_ERROR_NO_DEVICE = 100


def canonical(text: str) -> str:
    """A validated CUDA arch name (`sm_80`, `sm_90`, `sm_90a`, ...)."""
    name = text.strip() if isinstance(text, str) else ""
    if not _ARCH.fullmatch(name) or (name not in IREE_ARCHS and name not in DERIVED):
        raise DeviceError(
            f"{text!r} is not a CUDA arch portkern can target (known: {', '.join(sorted(IREE_ARCHS + tuple(DERIVED), key=_order))})"
        )
    return name


def _order(arch: str) -> tuple[int, str]:
    return int(arch[3:].rstrip("a")), arch


def device_arch(arch: str) -> str:
    """A device reports sm_90 for hardware that runs sm_90a code."""
    return arch.removesuffix("a")


def flags(arch: str) -> tuple[str, ...]:
    """IREE flags that select a CUDA arch IREE describes itself."""
    return ("--iree-hal-target-device=cuda", f"--iree-cuda-target={arch}")


def executable_target(arch: str, store: Store | None = None) -> str:
    """The `#hal.executable.target` for a CUDA arch."""
    arch = canonical(arch)
    if arch in DERIVED:
        return derive(executable_target(_BASE, store), arch)
    return gpu.memoised_target(KIND, arch, lambda: gpu.resolved_target(flags(arch)), store)


def derive(base: str, arch: str) -> str:
    """`base` (a CUDA executable target) rewritten for an arch of `DERIVED`."""
    ptx, shared_memory = DERIVED[arch]
    text = base
    for pattern, value in (
        (r'arch = "sm_\d+a?"', f'arch = "{arch}"'),
        (r'features = "[^"]*"', f'features = "{ptx}"'),
        (r"max_workgroup_memory_bytes = \d+", f"max_workgroup_memory_bytes = {shared_memory}"),
    ):
        text, count = re.subn(pattern, value, text)
        if count != 1:
            raise DeviceError(f"cannot write a target for {arch}: {pattern!r} found {count} times in the {_BASE} target")
    return text


def target(arch: str | None, store: Store | None = None) -> Target:
    """The target for a named CUDA arch, or (arch None) for this machine's first NVIDIA GPU."""
    return gpu.make_target(sys.modules[__name__], arch, store)


def _probe() -> Probe:
    library = None
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            library = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if library is None:
        return Probe(KIND, (), "no NVIDIA driver: libcuda.so.1 is not loadable")
    try:
        return _devices(library)
    except Exception as exc:  # noqa: BLE001 - a broken driver must not break probing
        return Probe(KIND, (), f"no NVIDIA device: probing the CUDA driver failed ({type(exc).__name__}: {brief(exc)})")


def _devices(lib) -> Probe:
    status = lib.cuInit(0)
    if status != 0:
        what = " (CUDA_ERROR_NO_DEVICE)" if status == CUDA_ERROR_NO_DEVICE else ""
        return Probe(KIND, (), f"no NVIDIA device: cuInit returned {status}{what}")
    count = ctypes.c_int()
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return Probe(KIND, (), "no NVIDIA device: the CUDA driver reports none")
    version = ctypes.c_int()
    lib.cuDriverGetVersion(ctypes.byref(version))
    devices, details = [], []
    for index in range(count.value):
        device = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(device), index) != 0:
            continue
        values = {}
        for key, attribute in _ATTRIBUTES.items():
            value = ctypes.c_int()
            lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, device)
            values[key] = value.value
        name = ctypes.create_string_buffer(256)
        lib.cuDeviceGetName(name, len(name), device)
        devices.append(DeviceFingerprint(KIND, f"sm_{values.pop('cc_major')}{values.pop('cc_minor')}"))
        details.append({"index": index, "name": name.value.decode(errors="replace"), "driver_version": version.value, **values})
    reason = "" if devices else "no NVIDIA device: cuDeviceGet failed for every device"
    return Probe(KIND, tuple(devices), reason, tuple(details))


probe = gpu.probe_once(_probe, "The NVIDIA GPUs the CUDA driver reports, or why there are none (never raises).")
