"""What every search space offers the strategies, and the space for a dispatch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from portkern.tuner.dispatch import Dispatch
from portkern.tuner.perfconfig import PerfConfig


@dataclass(frozen=True)
class Stage:
    """One step of a staged search."""

    name: str
    #: "single": rank on one thread (stable timings); "deployed": on the target's own driver.
    ranking: str


class Space(Protocol):
    """The valid perf configs of one dispatch (the default config is never among the candidates)."""

    dispatch: Dispatch
    stages: tuple[Stage, ...]

    @property
    def default(self) -> PerfConfig: ...

    def stage_candidates(self, stage: int, bases: Sequence[PerfConfig]) -> list[PerfConfig]:
        """Every valid candidate of a stage, derived from the best configs of the stage before."""
        ...

    def quick_candidates(self, stage: int, bases: Sequence[PerfConfig]) -> list[PerfConfig]:
        """A short list of known-good candidates of a stage."""
        ...

    def joint(self) -> list[PerfConfig]:
        """Every valid candidate, all fields varied together."""
        ...

    def score(self, config: PerfConfig) -> float:
        """A cost model's estimate of relative time (lower is better)."""
        ...

    def neighbors(self, config: PerfConfig, pool: Sequence[PerfConfig]) -> list[PerfConfig]:
        """The candidates of `pool` one step away from `config`."""
        ...

    def prune_reason(self, config: PerfConfig) -> str | None:
        """Why a config is not a candidate, None when it is."""
        ...
