"""OpenCL devices through pyopencl: probing, fingerprints, targets, one context per device.

`opencl` picks the first GPU or accelerator, else the first device;
`opencl:N` the N-th device of `portkern devices`; `opencl:<arch>` the device
with that label. Devices with equal fingerprints are interchangeable: the
first of them runs the code.

portkern caches native binaries itself, so unless the user configured PoCL's
kernel cache (POCL_KERNEL_CACHE or POCL_CACHE_DIR), it is switched off for the
process and PoCL's scratch files go to a directory the process removes at exit.

OpenCL drivers do not survive fork(): in a child of a process that started the
OpenCL runtime, using it raises `ForkError` instead of hanging.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import threading
from typing import Any

from portkern.base.errors import DeviceError, ForkError
from portkern.base.records import frozen_record
from portkern.cache import scratch as scratch_dirs
from portkern.cache.device import DeviceFingerprint
from portkern.cache.store import Store
from portkern.jit.target import Probe, Target

KIND = "opencl"
#: Build options for SPIR 1.2 bitcode (the cl_khr_spir extension requires them).
SPIR_OPTIONS = ("-x", "spir", "-spir-std=1.2")

_IL_VERSION = re.compile(r"SPIR-V_(\d+)\.(\d+)")
_lock = threading.Lock()
_contexts: dict[int, tuple[Any, Any]] = {}
#: The process that started the OpenCL runtime (None: not started yet).
_started_in: int | None = None


@frozen_record
class Found:
    """An OpenCL device, its fingerprint and facts about it that do not change code."""

    fingerprint: DeviceFingerprint
    device: Any
    details: dict[str, Any]


def pyopencl():
    """The pyopencl module, with PoCL's own cache configured; DeviceError if it is missing."""
    _configure_pocl()
    try:
        import pyopencl as cl
    except ImportError as exc:
        raise DeviceError(f"pyopencl is not installed or cannot load ({exc}); pip install 'portkern[opencl]'") from None
    return cl


@functools.lru_cache(maxsize=1)
def _configure_pocl() -> None:
    if "POCL_KERNEL_CACHE" in os.environ or "POCL_CACHE_DIR" in os.environ:
        return
    scratch = scratch_dirs.make("pocl")  # named with our pid, so `cache verify` can sweep it if we are killed
    os.environ["POCL_KERNEL_CACHE"] = "0"
    os.environ["POCL_CACHE_DIR"] = scratch
    atexit.register(_remove_scratch, scratch, os.getpid())


def _remove_scratch(path: str, owner: int) -> None:
    """Remove PoCL's scratch directory, in the process that made it only (never in a forked child)."""
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


def check_process() -> None:
    """ForkError if the OpenCL runtime was started by a parent of this forked process."""
    if _started_in is not None and _started_in != os.getpid():
        raise ForkError(
            "the OpenCL runtime was started before this process was forked and does not work after fork(); "
            "start worker processes with the 'spawn' or 'forkserver' method, or fork before the first OpenCL kernel is loaded"
        )


@functools.lru_cache(maxsize=1)
def scan() -> tuple[tuple[Found, ...], str]:
    """Every OpenCL device in platform order, and why there are none when there are none."""
    try:
        cl = pyopencl()
    except DeviceError as exc:
        return (), str(exc)
    global _started_in
    _started_in = os.getpid()
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        return (), f"no OpenCL platform is installed ({exc}); Debian: apt install pocl-opencl-icd"
    found = []
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue
        found += [Found(fingerprint(device), device, details(device)) for device in devices]
    if not found:
        return (), f"OpenCL platforms ({', '.join(p.name for p in platforms)}) have no devices"
    return tuple(found), ""


def fingerprint(device) -> DeviceFingerprint:
    """What about an OpenCL device changes the code its driver builds."""
    cl = pyopencl()
    extensions = sorted(device.extensions.split(None))
    sizes = subgroup_sizes(device)
    properties = {
        "platform": device.platform.name,
        "platform_version": device.platform.version,
        "device_version": device.version,
        "driver_version": device.driver_version,
        "vendor": device.vendor,
        "vendor_id": f"{device.vendor_id:#x}",
        "type": next((name for name in ("GPU", "ACCELERATOR", "CPU") if device.type & getattr(cl.device_type, name)), "OTHER"),
        "il_versions": ",".join(f"{major}.{minor}" for major, minor in il_versions(device)),
        "spir": "1.2" if "cl_khr_spir" in extensions else "",
        "subgroups": "1" if _has_subgroups(device, extensions) else "0",
        "subgroup_sizes": ",".join(map(str, sizes)),
    }
    arch = re.sub(r"[^A-Za-z0-9_.+-]+", "-", device.name).strip("-")[:128] or "device"
    return DeviceFingerprint(KIND, arch, ",".join(extensions), tuple(sorted((k, str(v)) for k, v in properties.items())))


def details(device) -> dict[str, Any]:
    """What `portkern devices` shows besides the fingerprint."""
    return {
        "name": device.name,
        "compute_units": device.max_compute_units,
        "max_work_group_size": device.max_work_group_size,
        "local_mem_size": device.local_mem_size,
        "global_mem_size": device.global_mem_size,
    }


def il_versions(device) -> tuple[tuple[int, int], ...]:
    """The SPIR-V versions the device takes as IL (none for PoCL 3.1)."""
    text = _info(device, "IL_VERSION") or ""
    return tuple(sorted({(int(a), int(b)) for a, b in _IL_VERSION.findall(str(text))}))


def subgroup_sizes(device) -> tuple[int, ...]:
    """The device's sub-group (wave/warp) sizes where the driver says (AMD, NVIDIA); else none."""
    for name in ("WAVEFRONT_WIDTH_AMD", "WARP_SIZE_NV"):
        size = _info(device, name)
        if isinstance(size, int) and size > 0:
            return (size,)
    return ()


def _has_subgroups(device, extensions: list[str]) -> bool:
    count = _info(device, "MAX_NUM_SUB_GROUPS")
    return bool(isinstance(count, int) and count > 0) or any(e in extensions for e in ("cl_khr_subgroups", "cl_intel_subgroups"))


def _info(device, name: str):
    cl = pyopencl()
    try:
        return device.get_info(getattr(cl.device_info, name))
    except (AttributeError, cl.Error):
        return None


def probe(store: Store | None = None) -> Probe:
    found, reason = scan()
    return Probe(KIND, tuple(f.fingerprint for f in found), reason, tuple(f.details for f in found))


def unavailable() -> str:
    """Why OpenCL C kernels cannot be built and run on this machine ("" when they can)."""
    from portkern.portable.opencl import APT_HINT, missing_tools

    missing = missing_tools("opencl")
    return f"{', '.join(missing)} not installed ({APT_HINT})" if missing else probe().reason


def select(arch: str | None) -> Found:
    """The device an `opencl[:arch]` spec names."""
    found, reason = scan()
    if not found:
        raise DeviceError(f"no OpenCL device: {reason}")
    if arch in (None, ""):
        return next((f for f in found if f.fingerprint.property("type") in ("GPU", "ACCELERATOR")), found[0])
    if arch.isdigit():
        if int(arch) < len(found):
            return found[int(arch)]
    else:
        for item in found:
            if item.fingerprint.arch.lower() == arch.lower():
                return item
    listing = ", ".join(f"{i}: {f.fingerprint.label}" for i, f in enumerate(found))
    raise DeviceError(f"no OpenCL device {arch!r} here (found {listing})")


def target(arch: str | None, store: Store | None = None) -> Target:
    """The target for an OpenCL device on this machine."""
    fp = select(arch).fingerprint
    runnable = bool(fp.property("il_versions") or fp.property("spir"))
    reason = "" if runnable else "the device takes neither SPIR-V IL nor SPIR 1.2 bitcode"
    return Target(fp, (), KIND, KIND, runnable, reason)


def device(target: Target):
    """The pyopencl device a target stands for."""
    found, reason = scan()
    check_process()
    for item in found:
        if item.fingerprint == target.fingerprint:
            return item.device
    raise DeviceError(f"{target.label} is not on this machine ({reason or 'no device with its fingerprint'})")


def context(target: Target) -> tuple[Any, Any]:
    """The process's (context, command queue) for a target's device."""
    cl = pyopencl()
    dev = device(target)
    check_process()
    with _lock:
        if dev.int_ptr not in _contexts:
            try:
                ctx = cl.Context([dev])
                _contexts[dev.int_ptr] = (ctx, cl.CommandQueue(ctx, dev))
            except cl.Error as exc:
                raise DeviceError(f"cannot open {target.label}: {exc}") from None
        return _contexts[dev.int_ptr]
