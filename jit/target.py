"""What finalisation needs to know about a device: fingerprint, compile flags, runtime."""

from __future__ import annotations

from dataclasses import dataclass

from portkern.cache.device import DeviceFingerprint


@dataclass(frozen=True)
class Target:
    """A device to finalise for, and whether this host can run the result."""

    fingerprint: DeviceFingerprint
    #: Compiler flags that select this target (for IREE: the HAL target flags).
    flags: tuple[str, ...]
    #: The bundle stage family to finalise from ("any": the device-independent stage).
    family: str = "any"
    #: The IREE runtime driver that runs the code ("local-task", "hip", "cuda"), or "opencl".
    driver: str = "local-task"
    #: Whether a device of this kind is present here to run the code.
    runnable: bool = True
    #: Why it is not runnable, when it is not.
    reason: str = ""

    @property
    def label(self) -> str:
        return self.fingerprint.label


@dataclass(frozen=True)
class Probe:
    """What a backend found on this machine: devices, or why there are none."""

    kind: str
    devices: tuple[DeviceFingerprint, ...] = ()
    reason: str = ""
