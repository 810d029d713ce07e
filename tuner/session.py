"""Tuning a kernel on a target: the entry points behind `tune=` and the `Tuner` that runs searches.

`tune_kernel` answers from the tuning DB when it can (this kernel's stored
selection, else stored results for each of its dispatches' problems) and
searches otherwise: first the module options the kernel compiles with (an
optimisation level, data tiling, attention decomposed: `OPTION_VARIANTS`, timed
whole against the default), then, in the module compiled with the winner, each
dispatch the strategy picks, in turn, with the dispatches before it fixed at
their winners. A dispatch's winner must beat
its default by `MIN_GAIN` when the finalists are re-timed side by side on the
deployed driver, else the default stays. The kernel config chosen is checked
once more as a whole against the default's outputs, stored as the kernel's
selection, and its native code is put in the cache for the loader.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any, Callable, Literal, TypeGuard

from portkern.base import settings
from portkern.base.errors import (
    CompileForbiddenError,
    DispatchTuningError,
    PerfConfigError,
    PortkernError,
    TuningError,
    one_line,
)
from portkern.cache import keys, metrics
from portkern.cache.store import UNUSABLE
from portkern.cache.tuning import TuningDB
from portkern.jit.finalize import CONFIGURED_PHASE, OPTION_DRIVERS
from portkern.jit.native import NativeCode, check_toolchain, compiler_id, selection_problem
from portkern.jit.target import Target
from portkern.jit.toolchain import toolchain_for
from portkern.jit.workers import Pool, Source, cores, shared_pool
from portkern.portable.bundle import KernelRecord
from portkern.tuner import jobs, kernel_config, perfconfig, registry, strategies
from portkern.tuner.buckets import tune_shapes
from portkern.tuner.dispatch import Dispatch
from portkern.tuner.evaluate import Evaluator, IreeCandidates
from portkern.tuner.kernel_config import DEFAULT, KernelConfig
from portkern.tuner.measure import ROUNDS, call_driver_of
from portkern.tuner.perfconfig import PerfConfig
from portkern.tuner.results import DispatchResult, TuneResult
from portkern.tuner.search import Budget, Progress, Search

#: A winner must be this much faster than the default (relative), beyond timing noise.
MIN_GAIN = 0.03
#: A kernel whose calls run on the calling thread by their size runs them on the task executor
#: when that was this much faster, timed side by side (the executor costs CPU time beside).
EXECUTOR_GAIN = 0.10
#: Best candidates per ranking driver that are re-timed side by side with the default.
FINALISTS = 3
#: Module-option variants (names in `jit.finalize.MODULE_OPTIONS`) a kernel is timed with whole
#: before its tile search, in the order tried (a budget takes the first ones), each with what the
#: root op name of a dispatch the strategy tunes must hold for it to apply ("": any). Measured on the
#: examples (docs/tuning.md, "Module options"): what never won is not listed.
OPTION_VARIANTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("attention-decomposed",), "attention"),
    (("data-tiling",), "matmul"),
    (("data-tiling", "attention-decomposed"), "attention"),
    (("O2",), ""),
    (("O2", "data-tiling"), "matmul"),
    (("O2", "attention-decomposed"), "attention"),
)


class Tuner:
    """Runs tuning searches on the worker pool (its own pool of `workers`, else the process's)."""

    def __init__(self, workers: int | None = None) -> None:
        jobs.register()  # the workers read dispatches and stamp configs with the tuner's handlers
        self.workers = workers
        self._pool: Pool | None = Pool(workers) if workers else None
        #: One search at a time: the pool and the benchmarks need the cores to themselves.
        self._busy = threading.Lock()

    def __enter__(self) -> "Tuner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    @property
    def pool(self) -> Pool:
        return self._pool if self._pool is not None else shared_pool()

    def tune(
        self,
        natives: NativeCode,
        record: KernelRecord,
        target: Target,
        strategy: str = "quick",
        *,
        budget: int | None = None,
        time_limit: float | None = None,
        retune: bool = False,
        progress: Callable[[Progress], None] | None = None,
    ) -> TuneResult:
        """The best config of a kernel (of the bundle `natives` serves) on a target: stored,
        or searched now and stored."""
        module = strategies.get(strategy)
        Budget(budget, time_limit)  # validates
        start = time.perf_counter()
        if not toolchain_for(record).tunable(record):
            note = f"{record.kind} kernels without a parameter space (`tune: params:`) are not tuned"
            return TuneResult(record.name, target.label, strategy, DEFAULT, "default", note=note)
        check_toolchain(record, target)
        db = TuningDB(natives.store, compiler_id(record))
        problem = selection_problem(record, target)
        if module.LEVEL == 0:
            result = TuneResult(record.name, target.label, strategy, DEFAULT, "default", note="the compiler's default, stored as the kernel's selection")
            _put_selection(db, problem, target, natives.bundle.name, result)
            return result
        dynamic = "" if registry.kernel_family(record) else _dynamic_dimension(record)
        if dynamic:
            note = f"{dynamic} is dynamic: the dynamic default runs; tune per shape bucket with shapes=[...] (portkern tune --shapes)"
            return TuneResult(record.name, target.label, strategy, DEFAULT, "default", note=note)
        limited = budget is not None or time_limit is not None
        stored = None if retune else db.selection(problem, target.fingerprint)
        if satisfies(stored, strategy, limited) and _valid(stored["config"]):
            return TuneResult.from_selection(stored, record.name, target.label)
        _refuse_search(natives, record, target, strategy)
        with self._busy, db.lock(problem, target.fingerprint):
            stored = None if retune else db.selection(problem, target.fingerprint)
            if satisfies(stored, strategy, limited) and _valid(stored["config"]):
                return TuneResult.from_selection(stored, record.name, target.label)
            run = _Run(self, natives, record, target, module, db, budget, time_limit, retune, progress)
            result = run.execute()
        result.wall_s = time.perf_counter() - start
        if result.source == "search":
            metrics.tuned(natives.store, result.wall_s)
        # Stored even when nothing was worth tuning, so the next call need not analyse the kernel again.
        _put_selection(db, problem, target, natives.bundle.name, result)
        return result


def _refuse_search(natives: NativeCode, record: KernelRecord, target: Target, strategy: str) -> None:
    """A search compiles candidates: under `PORTKERN_COMPILE=never` it is a `CompileForbiddenError`."""
    if settings.compile_mode() != settings.COMPILE_NEVER:
        return
    metrics.refused(natives.store, metrics.COMPILE_FORBIDDEN)
    raise CompileForbiddenError(
        f"{record.name!r} on {target.label}: tune={strategy!r} has no stored result to serve and would compile "
        f"candidates, and compiling is turned off ({settings.COMPILE}={settings.COMPILE_NEVER}): tune on a build "
        "farm and import or publish the results, or leave tune= out to serve the stored selection"
    )


def satisfies(record: dict[str, Any] | None, strategy: str, limited: bool = False) -> TypeGuard[dict[str, Any]]:
    """Whether a stored result answers a request for `strategy`: its strategy was at least as
    thorough (`strategies.level`) and, unless the request is `limited` (its own budget or time
    limit), its search was complete; never one marked unusable."""
    if not record or not isinstance(record.get("config"), str) or not isinstance(record.get("strategy"), str):
        return False
    if record.get(UNUSABLE):
        return False
    if record.get("complete", True) is not True and not limited:
        return False
    return strategies.level(record["strategy"]) >= strategies.level(strategy)


def dispatch_problem(dispatch: Dispatch, target: Target) -> str:
    """The tuning problem of a dispatch run on a target (by its driver, with this host's cores)."""
    return keys.dispatch_problem(dispatch.problem, target.driver, cores())


def _put_selection(db: TuningDB, problem: str, target: Target, bundle: str, result: TuneResult) -> None:
    fields = {k: v for k, v in result.to_dict().items() if k not in ("device", "source", "wall_s", "failed_candidates")}
    db.put_selection(problem, target.fingerprint, target.label, bundle, fields)


def _dynamic_dimension(record: KernelRecord) -> str:
    """The first dynamic argument dimension, described ("" when every dimension is static)."""
    contract = record.signature.contract
    for index, spec in enumerate(record.signature.inputs):
        for axis, size in enumerate(spec.shape):
            if size is None:
                symbol = f" ({contract.inputs[index][axis]})" if contract is not None else ""
                return f"argument {index} dimension {axis}{symbol}"
    return ""


def _valid(config: str) -> bool:
    try:
        kernel_config.parse(config)
    except PerfConfigError:
        return False
    return True


class _Run:
    """One tuning run of one kernel."""

    def __init__(self, tuner: Tuner, natives: NativeCode, record: KernelRecord, target: Target, module, db: TuningDB,
                 budget: int | None, time_limit: float | None, retune: bool, progress) -> None:
        self.natives, self.record, self.target, self.module, self.db = natives, record, target, module, db
        #: Seconds a worker took to configure the kernel (part of what trying a module option costs).
        self.analyse_s = 0.0
        self.budget = budget if budget is not None else module.BUDGET.evaluations
        #: A request with its own budget or time limit: incomplete stored results of its strategy answer it.
        self.limited = budget is not None or time_limit is not None
        self.user_budget = budget is not None
        self.deadline = time.perf_counter() + time_limit if time_limit else None
        self.retune = retune
        self.progress = progress
        family = registry.kernel_family(record)
        if family is not None:
            self.found, candidates = family.kernel_tuning(natives, record, target)
        else:
            # a worker configures the module (fitted to the target); the others only stamp and finish it
            started = time.perf_counter()
            analysed = natives.analyse(natives.plan(record, target))
            self.analyse_s = time.perf_counter() - started
            self.found = [registry.dispatch_from_data(d) for d in analysed.dispatches]
            code = analysed.configured
            source = Source(hashlib.sha256(code).hexdigest(), code, CONFIGURED_PHASE)
            candidates = IreeCandidates(
                target, record.name, source, record.entry, record.signature, parameters=natives.parameters_for(record)
            )
        self.candidates = candidates
        #: The driver the kernel's calls run on (a small kernel's: the calling thread's); its timings decide.
        self.driver = call_driver_of(target.driver, getattr(candidates, "inputs", ()), getattr(candidates, "parameters", None))
        self.evaluator = Evaluator(tuner.pool, target, record.name, candidates, self.driver)
        #: What trying module options found (see `_module_options`), whether a budget or the time
        #: limit left some untried, and whether any was compiled and timed.
        self.options_note = ""
        self.options_cut = self.options_tried = False

    def execute(self) -> TuneResult:
        try:
            base = self._module_options()
            found = self.found
            chosen = {d.index for d in self.module.choose(found)}
            results = {d.index: DispatchResult(d.index, d.name, d.problem, note=registry.no_space_reason(d) if not d.tunable else "left at default by the strategy") for d in found}
            to_search: list[Dispatch] = []
            for d in found:
                if d.index not in chosen:
                    continue
                stored = None if self.retune else self.db.dispatch(dispatch_problem(d, self.target), self.target.fingerprint)
                config = _stored_config(stored, d, self.module.NAME, self.limited)
                if stored is None or config is False:  # nothing stored answers
                    to_search.append(d)
                    continue
                base = base.with_dispatch(d.index, config)
                results[d.index] = DispatchResult.from_dict({**stored, "index": d.index, "name": d.name, "problem": d.problem, "source": "db"})
            searched = False
            if not chosen and not base.options and not self.options_tried:
                note = "; ".join(n for n in (self.options_note, self._none_chosen_note()) if n)
                return TuneResult(self.record.name, self.target.label, self.module.NAME, DEFAULT, "default", list(results.values()), note=note)
            for position, d in enumerate(to_search):
                try:
                    results[d.index], config = self._search(d, base, len(to_search) - position)
                except PortkernError as exc:
                    raise DispatchTuningError(self.record.name, d.label, f"{type(exc).__name__}: {exc}") from exc
                base = base.with_dispatch(d.index, config)
                searched = searched or results[d.index].source == "search"
            if self.options_cut:
                for r in results.values():  # the kernel's search was cut short, whatever its dispatches did
                    r.complete = False
            result = self._conclude(base, list(results.values()), "search" if searched or self.options_tried else "db")
            result.note = "; ".join(n for n in (result.note, self.options_note, "" if chosen else self._none_chosen_note()) if n)
            return result
        finally:
            self.evaluator.release()

    def _none_chosen_note(self) -> str:
        """Why the strategy tuned no dispatch's tiles (its `choose` took none)."""
        if not any(d.tunable for d in self.found):
            return "no dispatch has a tile space: the compiler's defaults stay"
        return (f"no dispatch carries {strategies.SIGNIFICANT_SHARE:.0%} of the kernel's work by itself: {self.module.NAME!r} "
                "tunes no dispatch's tiles (`full` tunes every dispatch)")

    def _module_options(self) -> KernelConfig:
        """The module options the kernel's tile search runs under: the variants of `OPTION_VARIANTS`
        that apply (CPU kernels with a source stage, strategies with `OPTIONS`, a dispatch the
        strategy tunes with a root op of the variant's kind, or dispatches of that kind that carry
        the kernel's work together: `strategies.carries`), in order, as many as
        the budget allows, compiled whole at the compiler's default configs, checked against the
        default's outputs and timed side by side with it; the fastest is kept when it beats the
        default by `MIN_GAIN`. `self.found` becomes the dispatches of the module compiled with it."""
        none = KernelConfig()
        if not getattr(self.module, "OPTIONS", False) or not isinstance(self.candidates, IreeCandidates):
            return none
        if self.target.driver not in OPTION_DRIVERS:
            return none
        # a variant applies where the dispatches the strategy would tune have its root op, or where those
        # of that root op carry the kernel's work together (a network of many like-sized convolutions):
        # a kernel of small ones only is within timing noise as a whole
        roots = [d.root for d in self.module.choose(self.found)]
        variants = [options for options, root in OPTION_VARIANTS if any(root in r for r in roots) or strategies.carries(self.found, root)]
        if not variants:
            return none
        if self.record.source_stage() is None:
            self.options_note = "module options not tried: the kernel has no source stage"
            return none
        problem = options_problem(self.found, self.target)
        stored = None if self.retune else self.db.dispatch(problem, self.target.fingerprint)
        if satisfies(stored, self.module.NAME, self.limited):
            reused = self._stored_options(stored["config"])
            if reused is not None:
                return reused
        if self.user_budget and self.budget < len(variants):
            variants, self.options_cut = variants[: self.budget], True
        deadline, cost = None, 0.0
        if self.deadline is not None:  # at most half of the time left: the tile search needs the rest
            deadline = time.perf_counter() + (self.deadline - time.perf_counter()) / 2
            # a variant costs about what configuring the kernel and compiling its default did
            self.evaluator.reference()
            cost = self.analyse_s + self.evaluator.results[DEFAULT].compile_s
        found: dict[str, list[Dispatch]] = {}
        problems = []
        for position, options in enumerate(variants):
            if deadline is not None and time.perf_counter() + cost >= deadline:
                self.options_cut = True
                problems.append(f"{len(variants) - position} variant(s) not tried: time limit")
                break
            config = str(KernelConfig.of({}, options))
            try:
                plan = self.natives.plan(self.record, self.target, config)
                analysed = self.natives.analyse(plan)
            except PortkernError as exc:
                problems.append(f"{config} does not build: {type(exc).__name__}: {one_line(exc, limit=200)}")
                continue
            code = analysed.configured
            self.candidates.add_variant(options, plan.target, Source(hashlib.sha256(code).hexdigest(), code, CONFIGURED_PHASE))
            found[config] = [registry.dispatch_from_data(d) for d in analysed.dispatches]
        driver = self.driver
        self.options_tried = bool(found)
        evaluations = self.evaluator.evaluate(list(found), driver) if found else []
        for e in evaluations:
            if e.status == "duplicate":
                problems.append(f"{e.config} compiles to the same code as {_option_label(e.duplicate_of)}")
            elif not e.ok:
                problems.append(f"{e.config} {e.status}: {one_line(e.error, limit=160)}")
        timed = sorted((e.timings[driver].min_s, e.config) for e in evaluations if e.ok and driver in e.timings)
        finalists = [config for _, config in timed[:FINALISTS]]
        if not finalists:
            self.options_note = "module options: " + "; ".join(problems) if problems else ""
            self._put_options(problem, DEFAULT, None, None)
            return none
        timings = self.evaluator.interleaved([DEFAULT, *finalists], driver)
        if DEFAULT not in timings:
            return none
        described = ", ".join(f"{_option_label(n)} {timings[n].min_s * 1e3:.3g} ms" for n in [DEFAULT, *finalists] if n in timings)
        ranked = sorted((timings[n].min_s, n) for n in finalists if n in timings)
        taken = bool(ranked) and ranked[0][0] < timings[DEFAULT].min_s * (1 - MIN_GAIN)
        best = ranked[0][1] if taken else DEFAULT
        verdict = f"took {best}" if taken else f"none faster by {MIN_GAIN:.0%}: the compiler's defaults stay"
        self.options_note = "; ".join([f"module options timed whole: {described}; {verdict}", *problems])
        self._put_options(problem, best, timings[DEFAULT].min_s, timings[best].min_s)
        if not taken:
            return none
        self.found = found[best]
        return kernel_config.parse(best)

    def _put_options(self, problem: str, config: str, default_s: float | None, best_s: float | None) -> None:
        """Store the module options chosen for the kernel's dispatches (any kernel of the same dispatches reuses them)."""
        fields = {"config": config, "strategy": self.module.NAME, "complete": not self.options_cut, "note": self.options_note,
                  "default_s": default_s, "best_s": best_s}
        self.db.put_dispatch(problem, self.target.fingerprint, self.target.label, fields)

    def _stored_options(self, config: str) -> KernelConfig | None:
        """The stored module options `config` (a module-options-only kernel config), with `self.found`
        the dispatches of the module compiled with them; None when it is not usable."""
        try:
            chosen = kernel_config.parse(config)
        except PerfConfigError:
            return None
        if chosen.dispatches or not isinstance(self.candidates, IreeCandidates):
            return None
        if chosen.options:
            try:
                plan = self.natives.plan(self.record, self.target, config)
                analysed = self.natives.analyse(plan)
            except PortkernError:
                return None  # searched again
            code = analysed.configured
            self.candidates.add_variant(chosen.options, plan.target, Source(hashlib.sha256(code).hexdigest(), code, CONFIGURED_PHASE))
            self.found = [registry.dispatch_from_data(d) for d in analysed.dispatches]
        self.options_note = f"module options from the tuning DB: {_option_label(config)}"
        return chosen

    def _search(self, d: Dispatch, base: KernelConfig, left: int) -> tuple[DispatchResult, PerfConfig | None]:
        result = DispatchResult(d.index, d.name, d.problem, source="search", strategy=self.module.NAME)
        seconds = None
        if self.deadline is not None:
            seconds = (self.deadline - time.perf_counter()) / left
            if seconds <= 0:
                result.source, result.note, result.complete = "skipped", "time limit reached before this dispatch", False
                return result, None
        space = registry.space_for(d, cores())
        if space is None:
            result.source, result.note = "skipped", registry.no_space_reason(d)
            return result, None
        search = Search(self.evaluator, space, base, d.index, Budget(self.budget, seconds), self.record.name, self.progress)
        started = time.perf_counter()
        self.module.search(search)
        config, timings = self._decide(search)
        counts = search.counts()
        result.evaluated, result.failed, result.wrong, result.duplicates = (counts[k] for k in ("evaluated", "failed", "wrong", "duplicates"))
        stopped = search.stopped_by()
        if stopped == "time limit" or stopped == "budget" and self.user_budget:
            result.complete = False
            result.note = f"stopped by the {stopped} after {result.evaluated} candidates: incomplete"
        elif not result.evaluated:
            result.note = f"the {self.module.NAME} strategy has no candidate besides the compiler's default in this dispatch's space"
        elif result.evaluated == result.failed + result.wrong + result.duplicates:
            result.note = "no candidate compiled, checked and timed: the default stays"
        result.default_s, result.best_s = timings
        result.config = perfconfig.to_string(config) if config is not None else DEFAULT
        result.wall_s = time.perf_counter() - started
        fields = {k: v for k, v in result.to_dict().items() if k not in ("index", "name", "source")}
        self.db.put_dispatch(dispatch_problem(d, self.target), self.target.fingerprint, self.target.label, fields)
        return result, config

    def _decide(self, search: Search) -> tuple[PerfConfig | None, tuple[float | None, float | None]]:
        """The dispatch's winner after re-timing finalists with the default side by side."""
        default = str(search.base)
        finalists = [c for c in search.finalists(FINALISTS) if c != default]
        timings = self.evaluator.interleaved([default, *finalists], self.driver)
        default_s = timings[default].min_s if default in timings else None
        ranked = sorted((timings[c].min_s, c) for c in finalists if c in timings)
        if ranked and default_s and ranked[0][0] < default_s * (1 - MIN_GAIN):
            winner = kernel_config.parse(ranked[0][1]).get(search.index)
            return winner, (default_s, ranked[0][0])
        return None, (default_s, default_s)

    def _conclude(self, config: KernelConfig, results: list[DispatchResult], source: str) -> TuneResult:
        results = sorted(results, key=lambda r: r.index)
        result = TuneResult(self.record.name, self.target.label, self.module.NAME, DEFAULT, source, results)
        if config.is_default and source != "search":
            return result  # nothing to check or time: the compiler's default everywhere
        final = str(config)
        evaluation = self.evaluator.evaluate([final], self.driver)[0]
        timed = evaluation.duplicate_of if evaluation.status == "duplicate" else final
        if not self.evaluator.results[timed].ok:
            for r in results:
                if r.config != DEFAULT:
                    r.config, r.note = DEFAULT, f"dropped: the combined config failed its check ({evaluation.error})"
            result.note = f"{final} failed its check as a whole: {evaluation.error}"
            final = timed = DEFAULT
        timings = self.evaluator.interleaved(list(dict.fromkeys([DEFAULT, timed])), self.driver)
        if timed != DEFAULT and timings[timed].min_s >= timings[DEFAULT].min_s:
            # the dispatches won one by one but not together, or a burst of load hit this check: look again, longer
            timings = self.evaluator.interleaved([DEFAULT, timed], self.driver, rounds=3 * ROUNDS)
            if timings[timed].min_s >= timings[DEFAULT].min_s:
                result.note = f"{final} was not faster than the default as a whole; kept the default"
                final = timed = DEFAULT
        if final != DEFAULT:
            self.natives.put_native(
                self.record, self.target, final, self.evaluator.vmfbs[timed], self.evaluator.results[timed].compile_s, timings[timed].min_s
            )
        result.config = final
        result.default_s, result.best_s = timings[DEFAULT].min_s, timings[timed].min_s
        result.executor = self._on_executor(timed, result)
        result.evaluations = [e for e in self.evaluator.results.values() if e.config != DEFAULT]
        return result

    def _on_executor(self, config: str, result: TuneResult) -> bool:
        """Whether the calls of the kernel at `config`, which run on the calling thread by their size,
        run on the task executor: timed side by side, it was EXECUTOR_GAIN faster there (said in the
        note). Not asked where `PORTKERN_EXECUTOR_MIN_BYTES` is given: the setting decides then."""
        executor = self.target.driver
        if self.driver == executor or executor not in OPTION_DRIVERS or settings.given(settings.EXECUTOR_MIN_BYTES).given:
            return False
        timings = self.evaluator.across(config, [self.driver, executor])
        if self.driver not in timings or executor not in timings:
            return False
        here, there = timings[self.driver].min_s, timings[executor].min_s
        if there >= here * (1 - EXECUTOR_GAIN):
            return False
        said = f"its calls run on the task executor: {there * 1e3:.3g} ms against {here * 1e3:.3g} ms on the calling thread"
        result.note = "; ".join(n for n in (result.note, said) if n)
        return True


def options_problem(found: list[Dispatch], target: Target) -> str:
    """The tuning problem "which module options" of a kernel whose default module has the dispatches
    `found`, run on a target (kernels of the same dispatches share it)."""
    digest = hashlib.sha256("\n".join(d.problem for d in found).encode()).hexdigest()
    return keys.dispatch_problem(f"module options of dispatches sha256:{digest}", target.driver, cores())


def _option_label(config: str) -> str:
    """A module-options variant, named for a note."""
    return "without options" if config == DEFAULT else config


def _stored_config(stored: dict[str, Any] | None, d: Dispatch, strategy: str, limited: bool) -> PerfConfig | None | Literal[False]:
    """A stored dispatch result's config (None: the default), or False when it does not answer."""
    if not satisfies(stored, strategy, limited):
        return False
    if stored["config"] == DEFAULT:
        return None
    try:
        config = registry.parse(stored["config"], d.family)
    except PerfConfigError:
        return False
    return config if config.rank == len(d.sizes) else False


# --- entry points for `tune=` (`portkern.bundle`: the tuner behind the loader) ------------

#: The process-wide tuner used by `bundle.kernel(..., tune=...)`: it runs on the shared worker pool.
_shared = Tuner()


def shared_tuner() -> Tuner:
    return _shared


def tune_kernel(natives: NativeCode, record: KernelRecord, target: Target, strategy: str = "quick", **options) -> TuneResult:
    """Tune (or look up) a kernel's config on a target; `result.config` is its config string."""
    return shared_tuner().tune(natives, record, target, strategy, **options)


def tune_kernel_shapes(natives: NativeCode, record: KernelRecord, target: Target, strategy: str, shapes, tuner: Tuner | None = None, **options):
    """Tune a kernel with dynamic dimensions for each of `shapes`, per bucket (see `tuner.buckets`)."""
    tuner = tuner or shared_tuner()
    if not strategies.get(strategy).LEVEL:
        raise TuningError(f"strategy {strategy!r} does not search; tuning for shapes needs one that does (e.g. quick)")
    return tune_shapes(
        natives, record, target, strategy, shapes, tune=tuner.tune, compile_dynamic=_compile_dynamic(natives),
        problem=selection_problem(record, target),
        compiler=compiler_id(record), **{"min_gain": MIN_GAIN, **options},
    )


def _compile_dynamic(natives: NativeCode):
    """`compile_dynamic(bundle, record, target, config)` for `tune_shapes`: the dynamic kernel's
    native code for a config, through the native-code service (its workers)."""

    def compile_dynamic(bundle, record: KernelRecord, target: Target, config: str) -> bytes:
        return natives.native(record, target, config).data

    return compile_dynamic
