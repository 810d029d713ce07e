"""`full`: every valid candidate of the staged space, on every tunable dispatch.

Stage 1 evaluates every valid vector/reduction tiling; stage 2 every valid
distribution of the best `BASES` of stage 1. (The joint space is ~7x larger;
in bench/tuning.py samples of it, `random` and `guided`, came within timing
noise of this, never clearly past it: distribution tiles barely change
single-thread speed, vector tiles barely change thread balance.)
"""

from __future__ import annotations

from typing import Sequence

from portkern.tuner.dispatch import Dispatch
from portkern.tuner.search import Budget, Search
from portkern.tuner.strategies import staged, tunable

NAME = "full"
LEVEL = 3
BUDGET = Budget()
OPTIONS = True
BASES = 3


def choose(dispatches: Sequence[Dispatch]) -> list[Dispatch]:
    return tunable(dispatches)


def search(search: Search) -> None:
    staged(search, search.space.stage_candidates, BASES)
