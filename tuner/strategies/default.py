"""`default`: no search; the compiler's own config everywhere.

`portkern tune --strategy default` stores `default` as the kernel's selection
(without analysing the kernel), so the loader then uses the compiler's config
until a search is asked for again.
"""

from __future__ import annotations

from portkern.tuner.search import Budget

NAME = "default"
LEVEL = 0
BUDGET = Budget(0)
