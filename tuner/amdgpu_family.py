"""The AMD GPU (`rocm`) family: `AmdGpuConfig` (with the `amdgpu-waves-per-eu` hint), the shared GPU rules."""

from __future__ import annotations

from portkern.tuner.amdgpu_config import AmdGpuConfig
from portkern.tuner.gpu_family import GpuFamily


class AmdGpuFamily(GpuFamily):
    name = "amdgpu"
    config = AmdGpuConfig
    backend = "rocm"


FAMILY = AmdGpuFamily()
