"""`guided`: cost-model order with local refinement around the best measured candidate.

The space's cost model ranks the joint space; each round evaluates one batch
(one candidate per compile worker): half from the unevaluated neighbours of
the best candidate measured so far, best-scored first, the rest the model's
best picks that are not next to anything tried yet.
"""

from __future__ import annotations

from typing import Sequence

from portkern.tuner.dispatch import Dispatch
from portkern.tuner.search import Budget, Search
from portkern.tuner.strategies import significant

NAME = "guided"
LEVEL = 2
BUDGET = Budget(12)
OPTIONS = True


def choose(dispatches: Sequence[Dispatch]) -> list[Dispatch]:
    return significant(dispatches)


def search(search: Search) -> None:
    space = search.space
    stage = space.stages[-1]
    ordered = sorted(space.joint(), key=lambda c: (space.score(c), str(c)))
    search.plan(len(ordered))
    tried: list = []
    while not search.exhausted:
        best = search.best(1, stage)
        local = [c for c in space.neighbors(best[0], ordered) if not search.evaluated(c)] if tried else []
        local.sort(key=lambda c: (space.score(c), str(c)))
        batch = local[: max(1, search.batch // 2)]
        fresh = [c for c in ordered if not search.evaluated(c) and c not in batch]
        for candidate in fresh:  # model picks not next to anything tried: the local half covers that
            if len(batch) < search.batch and not space.neighbors(candidate, tried + batch):
                batch.append(candidate)
        batch += [c for c in fresh if c not in batch][: search.batch - len(batch)]
        if not batch:
            return
        tried += batch
        search.evaluate(batch, stage)
