"""The NVIDIA GPU (`cuda`) family: `CudaConfig` (warps of 32), the shared GPU rules."""

from __future__ import annotations

from portkern.tuner.cuda_config import CudaConfig
from portkern.tuner.gpu_family import GpuFamily


class CudaFamily(GpuFamily):
    name = "cuda"
    config = CudaConfig
    backend = "cuda"


FAMILY = CudaFamily()
