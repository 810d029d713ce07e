"""The tuning sweep: every strategy over every dispatch of a bundle's kernels, each outcome classified.

Allowed outcomes per dispatch: a measured result, or a stated reason (the
dispatch then runs at the compiler's default); a kernel whose tuning raises a
typed `PortkernError` counts as an error with its type. Anything else is an
untyped error: a bug. `tests/test_tuning_sweep.py` runs a seeded subset,
`bench/tuning_sweep.py` all of it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import field
from typing import Sequence

from portkern.base.errors import PortkernError
from portkern.base.records import frozen_record, record, to_plain
from portkern.jit import finalize
from portkern.portable.bundle import IREE_KINDS
from portkern.tuner import analysis, registry
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.results import DispatchResult

#: Outcome kinds.
RESULT, REASON, ERROR, UNTYPED = "result", "reason", "error", "untyped"
#: Reasons by what their note says, so that a tally groups them.
_REASON_KINDS = (
    ("left at default by the strategy", "not chosen by the strategy (a small share of the kernel)"),
    ("when the module is loaded", "run by the module's initializer only, never in a call"),
    ("no indexing maps", "root op without indexing maps (softmax, attention, ...)"),
    ("dynamic loop ranges", "dynamic loop ranges (tuned per shape bucket)"),
    ("root ops (expected one)", "not exactly one root op"),
    ("no lowering config", "no lowering config of a known family"),
    ("no candidate besides", "no candidate besides the compiler's default"),
    ("no candidate compiled", "every candidate failed or was wrong"),
    ("stopped by the budget", "stopped by the budget (stored incomplete)"),
    ("time limit", "stopped by the time limit (stored incomplete)"),
    ("search space", "no search space for the family"),
    ("integers in [", "more loops than a perf config holds (rank above 8)"),
    ("kernels are not tuned", "kernel kind not tuned"),
    ("stored as the kernel's selection", "default strategy: the compiler's config"),
)


@frozen_record
class Outcome:
    """How one strategy ended on one dispatch (or on a whole kernel, when `dispatch` is "")."""

    bundle: str
    kernel: str
    strategy: str
    dispatch: str
    kind: str
    detail: str


def reason_kind(note: str) -> str:
    """The group a stated reason belongs to."""
    for marker, kind in _REASON_KINDS:
        if marker in note:
            return kind
    return re.sub(r"\d+", "N", note)[:80] or "(no reason given)"


def classify(d: DispatchResult) -> tuple[str, str]:
    """(kind, detail) of one dispatch's outcome."""
    if d.source == "db" or d.source == "search" and d.evaluated and d.default_s:
        return RESULT, d.config
    return REASON, reason_kind(d.note)


def space_outcome(dispatch: Dispatch, threads: int, bundle: str = "", kernel: str = "") -> Outcome:
    """Every strategy's candidate generation on one dispatch (no compiling): a space whose
    candidates all pass its own rules, or the stated reason it has none."""
    where = dict(bundle=bundle, kernel=kernel, strategy="(all: candidate generation)", dispatch=dispatch.label)
    try:
        space = registry.space_for(dispatch, threads)
        if space is None:
            return Outcome(**where, kind=REASON, detail=reason_kind(registry.no_space_reason(dispatch)))
        stage0 = space.stage_candidates(0, [])
        quick0 = space.quick_candidates(0, [])
        bases = [space.default, *stage0[:2]]
        later = [*space.stage_candidates(1, bases), *space.quick_candidates(1, quick0[:1] or [space.default])]
        joint = space.joint()
        for config in joint:
            space.score(config)
        if joint:
            space.neighbors(joint[0], joint)
        bad = [str(c) for c in {*stage0, *quick0, *later, *joint} if space.prune_reason(c) is not None]
        if bad:
            return Outcome(**where, kind=UNTYPED, detail=f"candidates its own rules reject: {bad[:3]}")
    except PortkernError as exc:
        return Outcome(**where, kind=ERROR, detail=type(exc).__name__)
    except Exception as exc:  # noqa: BLE001 - the sweep's job is to count what is not typed
        return Outcome(**where, kind=UNTYPED, detail=f"{type(exc).__name__}: {exc}"[:300])
    if not joint and not stage0:
        return Outcome(**where, kind=REASON, detail=reason_kind("no candidate besides the compiler's default"))
    return Outcome(**where, kind=RESULT, detail=f"{len(stage0)} staged, {len(quick0)} quick, {len(joint)} joint candidates")


def sweep_spaces(loaded, target, threads: int) -> list[Outcome]:
    """`space_outcome` for every dispatch of every kernel of a loaded bundle (MLIR kernels only)."""
    outcomes = []
    for name in loaded.names():
        record = loaded.record(name)
        if record.kind not in IREE_KINDS:
            continue
        try:
            found = analysis.dispatches(finalize.configure(loaded.bundle, record, target))
        except PortkernError as exc:
            outcomes.append(Outcome(loaded.bundle.name, name, "(analysis)", "", ERROR, type(exc).__name__))
            continue
        outcomes += [space_outcome(d, threads, loaded.bundle.name, name) for d in found]
    return outcomes


def sweep_bundle(tuner, loaded, target, strategies: Sequence[str], budget: int | None = 1) -> list[Outcome]:
    """Every strategy (searching afresh) on every kernel of a loaded bundle, outcomes per dispatch."""
    outcomes = []
    for name in loaded.names():
        record = loaded.record(name)
        for strategy in strategies:
            where = dict(bundle=loaded.bundle.name, kernel=name, strategy=strategy)
            try:
                result = tuner.tune(loaded.natives, record, target, strategy, budget=budget, retune=True)
            except PortkernError as exc:
                outcomes.append(Outcome(**where, dispatch=getattr(exc, "dispatch", ""), kind=ERROR, detail=type(exc).__name__))
                continue
            except Exception as exc:  # noqa: BLE001 - the sweep's job is to count what is not typed
                outcomes.append(Outcome(**where, dispatch="", kind=UNTYPED, detail=f"{type(exc).__name__}: {exc}"[:300]))
                continue
            if not result.dispatches:
                outcomes.append(Outcome(**where, dispatch="", kind=REASON, detail=reason_kind(result.note)))
            for d in result.dispatches:
                kind, detail = classify(d)
                outcomes.append(Outcome(**where, dispatch=f"{d.index}:{d.name}", kind=kind, detail=detail))
    return outcomes


@record
class Tally:
    """Outcomes counted: dispatch outcomes, results, reasons and errors by kind, untyped errors."""

    outcomes: int = 0
    results: int = 0
    reasons: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    untyped: list[Outcome] = field(default_factory=list)

    @classmethod
    def of(cls, outcomes: Sequence[Outcome]) -> "Tally":
        tally = cls(outcomes=len(outcomes))
        for o in outcomes:
            if o.kind == RESULT:
                tally.results += 1
            elif o.kind == REASON:
                tally.reasons[o.detail] += 1
            elif o.kind == ERROR:
                tally.errors[o.detail] += 1
            else:
                tally.untyped.append(o)
        return tally

    def to_dict(self) -> dict:
        return {
            "outcomes": self.outcomes,
            "results": self.results,
            "reasons": dict(self.reasons.most_common()),
            "errors": dict(self.errors.most_common()),
            "untyped": [to_plain(o) for o in self.untyped],
        }
