"""`default`: no search; the compiler's own config everywhere."""

from __future__ import annotations

from typing import Sequence

from portkern.tuner.dispatch import Dispatch
from portkern.tuner.search import Budget, Search

NAME = "default"
LEVEL = 0
BUDGET = Budget(0)


def choose(dispatches: Sequence[Dispatch]) -> list[Dispatch]:
    return []


def search(search: Search) -> None:
    return None
