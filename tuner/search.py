"""One dispatch's search, as a strategy drives it: budgets, stages, best-so-far.

A strategy proposes perf configs for the dispatch; `Search.evaluate` turns
each into a kernel config (the other dispatches fixed at `base`), evaluates it
and counts it against the budget. The compiler's default is always evaluated
first and never counts.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from portkern.base.records import frozen_record
from portkern.tuner.evaluate import Evaluator
from portkern.tuner.kernel_config import KernelConfig
from portkern.tuner.measure import driver_for
from portkern.tuner.perfconfig import PerfConfig
from portkern.tuner.results import FAILED, Evaluation
from portkern.tuner.space import Space, Stage


@frozen_record
class Budget:
    """Limits of one search: candidates evaluated (the default not counted) and wall time."""

    evaluations: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        from portkern.base.errors import TuningError

        if self.evaluations is not None and self.evaluations < 0 or self.seconds is not None and self.seconds <= 0:
            raise TuningError(f"a tuning budget needs a candidate count >= 0 and a time > 0 s (got {self.evaluations}, {self.seconds})")


@frozen_record
class Progress:
    """Reported after every candidate of a search."""

    kernel: str
    dispatch: str
    done: int
    planned: int
    evaluation: Evaluation


class Search:
    """The state of one dispatch's search."""

    def __init__(
        self,
        evaluator: Evaluator,
        space: Space[Any],
        base: KernelConfig,
        index: int,
        budget: Budget,
        kernel: str = "",
        progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.evaluator = evaluator
        self.space = space
        self.base = base
        self.index = index
        self.budget = budget
        self.kernel = kernel
        self.progress = progress
        self.started = time.perf_counter()
        self.deadline = self.started + budget.seconds if budget.seconds else None
        #: (perf config, evaluation, driver) for every candidate, in evaluation order.
        self.history: list[tuple[PerfConfig, Evaluation, str]] = []
        self.planned = 0
        self._seen: set[str] = set()

    # --- what strategies call ----------------------------------------------------

    @property
    def batch(self) -> int:
        """Candidates worth proposing at a time (one per compile worker)."""
        return self.evaluator.pool.size

    @property
    def remaining(self) -> int | None:
        if self.budget.evaluations is None:
            return None
        return max(0, self.budget.evaluations - len(self._seen))

    @property
    def out_of_time(self) -> bool:
        return self.deadline is not None and time.perf_counter() >= self.deadline

    @property
    def exhausted(self) -> bool:
        return self.remaining == 0 or self.out_of_time

    def stopped_by(self) -> str:
        """What ended the search early: "time limit", "budget", or "" (the strategy ran to its end).

        A budget counts only when it was reached: a strategy with candidates
        left cannot tell whether they would have won.
        """
        if self.out_of_time:
            return "time limit"
        return "budget" if self.remaining == 0 else ""

    def plan(self, count: int) -> None:
        """Tell progress displays how many more candidates are expected."""
        remaining = self.remaining
        self.planned = len(self._seen) + (count if remaining is None else min(count, remaining))

    def evaluated(self, config: PerfConfig) -> bool:
        return str(self.kernel_config(config)) in self._seen

    def evaluate(self, configs: Sequence[PerfConfig], stage: Stage) -> list[Evaluation]:
        """Evaluate configs ranked as `stage` says, until the budget runs out."""
        driver = driver_for(stage.ranking, self.evaluator.deployed)
        self.default_timing(driver)
        done = []
        chunk = max(1, 2 * self.batch)
        pending = [c for c in dict.fromkeys(configs) if c != self.space.default]
        while pending and not self.exhausted:
            take = pending[: chunk if self.remaining is None else min(chunk, self.remaining)]
            pending = pending[len(take) :]
            kernel_configs = [str(self.kernel_config(c)) for c in take]
            for config, evaluation in zip(take, self.evaluator.evaluate(kernel_configs, driver)):
                if evaluation.config not in self._seen:
                    self._seen.add(evaluation.config)
                    self.history.append((config, evaluation, driver))
                    if self.progress is not None:
                        self.progress(Progress(self.kernel, str(self.index), len(self._seen), max(self.planned, len(self._seen)), evaluation))
                done.append(evaluation)
        return done

    def best(self, count: int, stage: Stage) -> list[PerfConfig]:
        """The fastest checked configs timed for `stage`'s ranking (the default among them).

        Candidates rank by their fastest call: load from other processes only adds time.
        """
        driver = driver_for(stage.ranking, self.evaluator.deployed)
        timed = [(e.timings[driver].min_s, str(c), c) for c, e, _ in self.history if e.ok and driver in e.timings]
        default = self.default_timing(driver)
        if default is not None:
            timed.append((default, "", self.space.default))
        return [c for _, _, c in sorted(timed, key=lambda t: (t[0], t[1]))[:count]]

    # --- bookkeeping -------------------------------------------------------------

    def kernel_config(self, config: PerfConfig) -> KernelConfig:
        return self.base.with_dispatch(self.index, None if config == self.space.default else config)

    def default_timing(self, driver: str) -> float | None:
        base = str(self.base)
        evaluation = self.evaluator.evaluate([base], driver)[0]
        return evaluation.timings[driver].min_s if evaluation.ok else None

    def counts(self) -> dict[str, int]:
        statuses = [e.status for _, e, _ in self.history]
        return {
            "evaluated": len(statuses),
            "failed": sum(s in FAILED for s in statuses),
            "wrong": statuses.count("wrong"),
            "duplicates": statuses.count("duplicate"),
        }

    def finalists(self, per_driver: int) -> list[str]:
        """Kernel configs of the best checked candidates on each driver they were timed on."""
        chosen: list[str] = []
        drivers = dict.fromkeys(d for _, e, _ in self.history for d in e.timings)
        for driver in drivers:
            timed = sorted((e.timings[driver].min_s, e.config) for _, e, _ in self.history if e.ok and driver in e.timings)
            chosen += [config for _, config in timed[:per_driver]]
        return list(dict.fromkeys(chosen))
