"""AMD GPUs: probing with hip-python, and IREE `rocm` targets for gfx archs.

An AMD device's fingerprint is its processor (`gfx942`): IREE compiles for a
bare processor with the xnack and sramecc features left "any", which runs in
every mode. A target named with explicit features (`gfx942:sramecc+:xnack-`,
AMD's target-id syntax) is a different fingerprint. CU count, wave size, LDS
size and memory are reported by the probe but change no code and are not in
the fingerprint, so code finalised ahead of time for `gfx942` is served to
every gfx942 device.
"""

from __future__ import annotations

import re
import sys

from portkern.base.errors import DeviceError, brief
from portkern.cache.device import DeviceFingerprint
from portkern.cache.store import Store
from portkern.jit import gpu
from portkern.jit.codeobject import AMDGPU_PROCESSORS
from portkern.jit.target import Probe, Target

KIND = "amdgpu"
NAME = "AMD GPU"
DRIVER = "hip"
#: The processors IREE 3.13's rocm target accepts (others LLVM knows are refused by IREE, cleanly).
IREE_ARCHS = ("gfx908", "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1103", "gfx1150", "gfx1151", "gfx1200", "gfx1201")
#: Target features a target id may set, in the order LLVM requires.
FEATURES = ("sramecc", "xnack")
_TARGET_ID = re.compile(r"(gfx[0-9a-f]{3,4})((?::[a-z]{1,16}[+-]){0,4})")


def canonical(text: str) -> str:
    """A validated AMD target id: `gfx942`, `gfx90a:xnack-`, `gfx942:sramecc+:xnack-`."""
    match = _TARGET_ID.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None or match.group(1) not in AMDGPU_PROCESSORS:
        raise DeviceError(
            f"{text!r} is not an AMD GPU arch: expected a target id such as gfx942 or gfx90a:xnack- "
            f"(IREE targets {', '.join(IREE_ARCHS)})"
        )
    features: dict[str, str] = {}
    for part in filter(None, match.group(2).split(":")):
        name = part[:-1]
        if name not in FEATURES or name in features:
            raise DeviceError(f"{text!r}: bad target feature {part!r} (each of {', '.join(FEATURES)} at most once, with + or -)")
        features[name] = part[-1]
    return match.group(1) + "".join(f":{n}{features[n]}" for n in FEATURES if n in features)


def device_arch(target_id: str) -> str:
    return target_id.partition(":")[0]


def flags(target_id: str) -> tuple[str, ...]:
    """IREE flags that select a (validated) AMD target id."""
    processor, _, features = target_id.partition(":")
    selected: tuple[str, ...] = ("--iree-hal-target-device=hip", f"--iree-rocm-target={processor}")
    if features:
        llvm = ",".join(f"{p[-1]}{p[:-1]}" for p in features.split(":"))
        selected += (f"--iree-rocm-target-features={llvm}",)
    return selected


def executable_target(target_id: str, store: Store | None = None) -> str:
    """The `#hal.executable.target` IREE uses for this target id."""
    target_id = canonical(target_id)
    return gpu.memoised_target(KIND, target_id, lambda: gpu.resolved_target(flags(target_id)), store)


def target(arch: str | None, store: Store | None = None) -> Target:
    """The target for a named AMD arch, or (arch None) for this machine's first AMD GPU."""
    return gpu.make_target(sys.modules[__name__], arch, store)


def _probe() -> Probe:
    try:
        from hip import hip
    except ImportError as exc:
        return Probe(KIND, (), f"hip-python is not installed (pip install 'portkern[amd]'): {exc}")
    except Exception as exc:  # noqa: BLE001 - a broken install must not break probing
        return Probe(KIND, (), f"hip-python failed to import: {type(exc).__name__}: {brief(exc)}")
    try:
        return _devices(hip)
    except Exception as exc:  # noqa: BLE001 - hip-python raises RuntimeError for a missing symbol, and more
        return Probe(KIND, (), f"no AMD device: probing HIP failed ({type(exc).__name__}: {brief(exc)})")


def _devices(hip) -> Probe:
    if not hip.has_symbol("hipGetDeviceCount"):
        return Probe(KIND, (), "no ROCm: the HIP runtime library libamdhip64.so is not loadable (looked in ROCM_PATH, /opt/rocm and the library path)")
    err, count = hip.hipGetDeviceCount()
    if err != hip.hipError_t.hipSuccess:
        return Probe(KIND, (), f"no AMD device: hipGetDeviceCount returned {getattr(err, 'name', err)}")
    if count == 0:
        return Probe(KIND, (), "no AMD device: the HIP runtime reports none")
    if not hip.has_symbol("hipGetDevicePropertiesR0600"):
        _, version = hip.hipRuntimeGetVersion()
        return Probe(
            KIND,
            (),
            f"ROCm too old: HIP runtime {version} has no hipGetDevicePropertiesR0600; "
            "this hip-python needs ROCm 6 or newer (install the hip-python that matches the ROCm here)",
        )
    devices, details, failures = [], [], []
    for index in range(count):
        err, props = hip.hipGetDeviceProperties(index)
        if err != hip.hipError_t.hipSuccess:
            failures.append(f"device {index}: {getattr(err, 'name', err)}")
            continue
        target_id = _text(props.gcnArchName)
        devices.append(DeviceFingerprint(KIND, device_arch(target_id)))
        details.append(
            {
                "index": index,
                "name": _text(props.name),
                "target_id": target_id,
                "wave_size": int(props.warpSize),
                "compute_units": int(props.multiProcessorCount),
                "lds_bytes_per_block": int(props.sharedMemPerBlock),
                "memory_bytes": int(props.totalGlobalMem),
            }
        )
    reason = "" if devices else "no AMD device: " + "; ".join(failures)
    return Probe(KIND, tuple(devices), reason, tuple(details))


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, (bytes, bytearray)) else str(value)


probe = gpu.probe_once(_probe, "The AMD GPUs the HIP runtime reports, or why there are none (never raises).")
