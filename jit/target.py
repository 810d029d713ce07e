"""What finalisation needs to know about a device: fingerprint, compile flags, runtime."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping

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
    #: GPU targets are selected by attribute, not by flags: the `#hal.executable.target`
    #: written into the module in place of a placeholder (empty for flag-selected targets).
    executable_target: str = ""

    @property
    def label(self) -> str:
        return self.fingerprint.label

    @property
    def identity(self) -> tuple[str, ...]:
        """What selects the code besides the fingerprint: the flags, and the written target attribute."""
        if not self.executable_target:
            return self.flags
        digest = hashlib.sha256(self.executable_target.encode()).hexdigest()
        return self.flags + (f"executable-target-sha256={digest}",)


@dataclass(frozen=True)
class Probe:
    """What a backend found on this machine: devices, or why there are none."""

    kind: str
    devices: tuple[DeviceFingerprint, ...] = ()
    reason: str = ""
    #: Per device, in the order of `devices`: what the probe read that does not
    #: change native code and so is not in the fingerprint (name, CU count, memory).
    details: tuple[Mapping[str, Any], ...] = ()
