"""`random`: a uniform sample of the joint space (vector and distribution tiles together)."""

from __future__ import annotations

import random as _random
from typing import Sequence

from portkern.tuner.dispatch import Dispatch
from portkern.tuner.search import Budget, Search
from portkern.tuner.strategies import significant

NAME = "random"
LEVEL = 2
BUDGET = Budget(16)
OPTIONS = True
SEED = 0


def choose(dispatches: Sequence[Dispatch]) -> list[Dispatch]:
    return significant(dispatches)


def search(search: Search) -> None:
    space = search.space
    candidates = space.joint()
    _random.Random(SEED).shuffle(candidates)
    search.plan(len(candidates))
    search.evaluate(candidates, space.stages[-1])
