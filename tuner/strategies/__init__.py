"""Search strategies, one module each.

A strategy module has `NAME`, `LEVEL` (how thorough: a stored result of an
equal or higher level answers a request without searching again),
`BUDGET` (its default `Budget`), and, when it searches (LEVEL > 0),
`choose(dispatches)` (which dispatches of a kernel it tunes) and
`search(search)` (proposes candidates to a `portkern.tuner.search.Search`
until done or out of budget). A level-0 strategy (`default`) searches
nothing: the tuner stores the compiler's default as the kernel's selection.
`OPTIONS = True`: before the tile search, the tuner times module-option
variants (`tuner.session.OPTION_VARIANTS`) whole, as many as a budget allows,
and searches tiles in the module compiled with the fastest.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Callable, Sequence

from portkern.base.errors import TuningError
from portkern.tuner.dispatch import Dispatch

if TYPE_CHECKING:
    from portkern.tuner.search import Search

#: Strategy name -> module.
STRATEGIES = {
    "default": "portkern.tuner.strategies.default",
    "quick": "portkern.tuner.strategies.quick",
    "full": "portkern.tuner.strategies.full",
    "random": "portkern.tuner.strategies.random",
    "guided": "portkern.tuner.strategies.guided",
}
#: Dispatches below this share of a kernel's work, or this many iteration points, are left at
#: their default by the budget-minded strategies: their time is within a whole kernel's timing noise.
SIGNIFICANT_SHARE = 0.1
SIGNIFICANT_POINTS = 1 << 20


def names() -> tuple[str, ...]:
    return tuple(STRATEGIES)


def get(name: str) -> ModuleType:
    """The strategy module of a name (TuningError for unknown names)."""
    if name not in STRATEGIES:
        raise TuningError(f"unknown tuning strategy {name!r} (known: {', '.join(STRATEGIES)})")
    return importlib.import_module(STRATEGIES[name])


def level(name: str) -> int:
    """How thorough a strategy is (unknown names: 0)."""
    return get(name).LEVEL if name in STRATEGIES else 0


def significant(dispatches: Sequence[Dispatch]) -> list[Dispatch]:
    """The tunable dispatches that carry a real share of the kernel's work (or that the kernel's author asked to tune)."""
    total = sum(d.work for d in dispatches if d.tunable) or 1
    return [d for d in dispatches if d.tunable and (d.requested or d.work >= SIGNIFICANT_POINTS and d.work / total >= SIGNIFICANT_SHARE)]


def carries(dispatches: Sequence[Dispatch], root: str) -> bool:
    """Whether the tunable dispatches whose root op holds `root` ("": any) carry a real share of the
    kernel's work together (what `significant` asks of one dispatch), however many share it."""
    total = sum(d.work for d in dispatches if d.tunable) or 1
    work = sum(d.work for d in dispatches if d.tunable and root in d.root)
    return work >= SIGNIFICANT_POINTS and work / total >= SIGNIFICANT_SHARE


def tunable(dispatches: Sequence[Dispatch]) -> list[Dispatch]:
    return [d for d in dispatches if d.tunable]


def staged(search: "Search", candidates: Callable[[int, list], list], keep: int) -> None:
    """Run the space's stages in order; each stage's candidates derive from the best `keep` before it."""
    space = search.space
    bases = [space.default]
    for index, stage in enumerate(space.stages):
        found = candidates(index, bases)
        search.plan(len(found))
        search.evaluate(found, stage)
        bases = search.best(keep, stage) or bases
