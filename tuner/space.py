"""What every search space offers the strategies, and the space for a dispatch."""

from __future__ import annotations

from typing import Protocol, Sequence, TypeVar

from portkern.base.records import frozen_record
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.perfconfig import PerfConfig


@frozen_record
class Stage:
    """One step of a staged search."""

    name: str
    #: "single": rank on one thread (stable timings); "deployed": on the target's own driver.
    ranking: str


#: The perf-config class of a space (a space takes back only configs of its own family).
ConfigT = TypeVar("ConfigT", bound=PerfConfig)


class Space(Protocol[ConfigT]):
    """The valid perf configs of one dispatch (the default config is never among the candidates)."""

    @property
    def dispatch(self) -> Dispatch: ...

    @property
    def stages(self) -> tuple[Stage, ...]: ...

    @property
    def default(self) -> ConfigT: ...

    def stage_candidates(self, stage: int, bases: Sequence[ConfigT]) -> list[ConfigT]:
        """Every valid candidate of a stage, derived from the best configs of the stage before."""
        ...

    def quick_candidates(self, stage: int, bases: Sequence[ConfigT]) -> list[ConfigT]:
        """A short list of known-good candidates of a stage."""
        ...

    def joint(self) -> list[ConfigT]:
        """Every valid candidate, all fields varied together."""
        ...

    def score(self, config: ConfigT) -> float:
        """A cost model's estimate of relative time (lower is better)."""
        ...

    def neighbors(self, config: ConfigT, pool: Sequence[ConfigT]) -> list[ConfigT]:
        """The candidates of `pool` one step away from `config`."""
        ...

    def prune_reason(self, config: ConfigT) -> str | None:
        """Why a config is not a candidate, None when it is."""
        ...
