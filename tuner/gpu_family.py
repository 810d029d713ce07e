"""What the GPU families share: roots carry `#iree_gpu.lowering_config`s with workgroup tiles, a config
also sets the function's translation info, and the space comes from the target's limits (`gpu_space`).

A GPU family module is a `GpuFamily` naming its config class and the HAL backend it claims.
"""

from __future__ import annotations

from typing import ClassVar

from portkern.base.errors import PerfConfigError
from portkern.tuner import gpu_config, gpu_target
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.family import Family
from portkern.tuner.gpu_space import GpuSpace, no_space_reason
from portkern.tuner.perfconfig import PerfConfig


class GpuFamily(Family):
    """A GPU family: its perf-config class (a `GpuConfig`) and the HAL backend name it claims."""

    #: The backend of the executable targets this family tunes ("rocm", "cuda").
    backend: ClassVar[str]
    config: ClassVar[type[gpu_config.GpuConfig]]

    def is_root(self, lowering_config: str) -> bool:
        return gpu_config.is_root(lowering_config)

    def claims(self, target: str, lowering_configs: list[str]) -> bool:
        return target.startswith(f'#hal.executable.target<"{self.backend}"') and any(
            c.startswith(gpu_config.ATTRIBUTE + "<") for c in lowering_configs
        )

    def default_config(self, root_config: str, translation_info: str) -> PerfConfig:
        return self.config.from_attributes(root_config, translation_info)

    def root_config(self, current: str, config: PerfConfig) -> str:
        return self._gpu(config).lowering_config(current)

    def translation_info(self, translation_info: str, config: PerfConfig) -> str | None:
        return self._gpu(config).translation_info(translation_info)

    def _gpu(self, config: PerfConfig) -> gpu_config.GpuConfig:
        """`config` as the GPU config it must be (PerfConfigError for another family's)."""
        if not isinstance(config, gpu_config.GpuConfig):
            raise PerfConfigError(f"{config} is not a {self.name} config")
        return config

    def space(self, dispatch: Dispatch, threads: int) -> GpuSpace | None:
        limits = gpu_target.limits(dispatch.gpu_target)
        if limits is None or no_space_reason(dispatch, limits):
            return None
        return GpuSpace(dispatch, self.config, limits)

    def no_space_reason(self, dispatch: Dispatch) -> str:
        limits = gpu_target.limits(dispatch.gpu_target)
        if limits is None:
            return f"no {self.name} search space: the dispatch's target states no GPU limits"
        return no_space_reason(dispatch, limits) or f"no {self.name} search space"
