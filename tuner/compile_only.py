"""Compile-only tuning: a kernel's search spaces compiled and checked for a device that is not here.

Each dispatch's candidates (the compiler's default first) are stamped and
compiled in the worker pool, and each code object is checked for the device
(`jit.codeobject`: the ELF machine and arch of AMD code objects, the PTX
target); what fails either is reported with its reason. Nothing is stored:
without a measured time there is no tuning result.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import field
from typing import Callable

from portkern.base.records import record, to_plain
from portkern.jit import codeobject
from portkern.jit.finalize import CONFIGURED_PHASE
from portkern.jit.native import NativeCode
from portkern.jit.target import Target
from portkern.jit.workers import Pool, Source, cores
from portkern.portable.bundle import KernelRecord
from portkern.tuner import registry
from portkern.tuner.evaluate import Evaluator, IreeCandidates
from portkern.tuner.kernel_config import DEFAULT, KernelConfig


@record
class SpaceReport:
    """One dispatch's space, compiled: how many candidates, how many gave valid code, why the others failed."""

    index: int
    name: str
    #: Candidates compiled: the compiler's default (candidate 0) and the space's.
    candidates: int = 0
    #: Candidates whose code object passed the device check (byte-identical duplicates included).
    compiled: int = 0
    #: Of `compiled`, candidates whose code was byte-identical to an earlier candidate's.
    duplicates: int = 0
    #: Candidates that failed to compile or whose code object failed the check.
    failed: int = 0
    #: Why the dispatch has no space, or what limited it.
    note: str = ""
    #: Per failed candidate: its perf config, status ("failed", "timeout", "crash", "oom", "invalid") and reason.
    failures: list[dict] = field(default_factory=list)
    wall_s: float = 0.0

    def reasons(self) -> Counter:
        """Failure reasons and how often each occurred."""
        return Counter(f["reason"] for f in self.failures)

    def to_dict(self) -> dict:
        return to_plain(self)


def compile_space(
    natives: NativeCode,
    record: KernelRecord,
    target: Target,
    pool: Pool,
    budget: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[SpaceReport]:
    """Every dispatch's space of a kernel on `target`, compiled and checked (at most `budget`
    candidates per dispatch besides the default, the best by the space's cost model)."""
    analysed = natives.analyse(natives.plan(record, target))
    dispatches = [registry.dispatch_from_data(d) for d in analysed.dispatches]
    source = Source(hashlib.sha256(analysed.configured).hexdigest(), analysed.configured, CONFIGURED_PHASE)
    candidates = IreeCandidates(target, record.name, source, record.entry, record.signature)
    evaluator = Evaluator(pool, target, record.name, candidates, target.driver)
    reports = []
    for d in dispatches:
        started = time.perf_counter()
        report = SpaceReport(d.index, d.name)
        space = registry.space_for(d, cores())
        perfs = [] if space is None else space.joint()
        if space is None:
            report.note = registry.no_space_reason(d)
        elif not perfs:
            report.note = "no candidate besides the default passes the space's rules"
        elif budget is not None and len(perfs) > budget:
            report.note = f"{budget} of {len(perfs)} candidates (--budget)"
            perfs = perfs[:budget]
        configs = [DEFAULT] + [str(KernelConfig().with_dispatch(d.index, c)) for c in perfs]
        if progress is not None:
            progress(f"{record.name} dispatch {d.index}", 0, len(configs))
        evaluator.compile(configs)
        for config in configs:
            _count(report, evaluator, config, target)
        report.wall_s = time.perf_counter() - started
        reports.append(report)
        if progress is not None:
            progress(f"{record.name} dispatch {d.index}", len(configs), len(configs))
    return reports


def _count(report: SpaceReport, evaluator: Evaluator, config: str, target: Target) -> None:
    evaluation = evaluator.results[config]
    report.candidates += 1
    perf = config.partition("=")[2] or DEFAULT
    if evaluation.status not in ("compiled", "ok", "duplicate"):
        report.failed += 1
        report.failures.append({"config": perf, "status": evaluation.status, "reason": evaluation.error})
        return
    owner = evaluation.duplicate_of or config
    problem = codeobject.problem(evaluator.vmfbs[owner], target.fingerprint)
    if problem is not None:
        report.failed += 1
        report.failures.append({"config": perf, "status": "invalid", "reason": f"invalid code object: {problem}"})
        return
    report.compiled += 1
    report.duplicates += evaluation.status == "duplicate"


