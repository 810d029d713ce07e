"""`quick`: a short list of known-good candidates per stage, on the significant dispatches.

Stage by stage, the space's known-good shapes (for CPU contractions: five
register tiles x two reduction tiles, then four distributions for the best).
"""

from __future__ import annotations

from typing import Sequence

from portkern.tuner.dispatch import Dispatch
from portkern.tuner.search import Budget, Search
from portkern.tuner.strategies import significant, staged

NAME = "quick"
LEVEL = 1
BUDGET = Budget()
OPTIONS = True


def choose(dispatches: Sequence[Dispatch]) -> list[Dispatch]:
    return significant(dispatches)


def search(search: Search) -> None:
    staged(search, search.space.quick_candidates, 1)
