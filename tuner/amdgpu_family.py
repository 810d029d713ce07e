"""The AMD GPU (`rocm`) family: `AmdGpuConfig`, roots with workgroup tiles, the config also sets the
function's translation info. No search space: candidates cannot be timed without an AMD GPU."""

from __future__ import annotations

from portkern.tuner import amdgpu_config
from portkern.tuner.amdgpu_config import AmdGpuConfig
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.family import Family
from portkern.tuner.perfconfig import PerfConfig


class AmdGpuFamily(Family):
    name = "amdgpu"
    config = AmdGpuConfig

    def is_root(self, lowering_config: str) -> bool:
        return amdgpu_config.is_root(lowering_config)

    def claims(self, target: str, lowering_configs: list[str]) -> bool:
        return '"rocm"' in target and any(c.startswith(amdgpu_config.ATTRIBUTE + "<") for c in lowering_configs)

    def default_config(self, root_config: str, translation_info: str) -> AmdGpuConfig:
        return AmdGpuConfig.from_attributes(root_config, translation_info)

    def translation_info(self, translation_info: str, config: PerfConfig) -> str | None:
        return config.translation_info(amdgpu_config.pipeline_of(translation_info))  # type: ignore[attr-defined]

    def no_space_reason(self, dispatch: Dispatch) -> str:
        return "no amdgpu search space (candidates need an AMD GPU to be timed)"


FAMILY = AmdGpuFamily()
