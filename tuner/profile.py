"""Per-dispatch profiles: each dispatch of a kernel timed alone, beside the kernel's whole call.

For every dispatch whose sizes are static, IREE makes a benchmark module
(`iree-hal-dump-executable-benchmarks`): the dispatch's executable, configured
as in the kernel, and a function `f(batch)` that runs it `batch` times, with a
barrier after each, on zeroed buffers of the dispatch's sizes. A worker of the
pool lowers the kernel to `executable-configurations` and lists its dispatches
(the tuner's indices and names, `tuner.analysis`), how many places the kernel
dispatches each and their benchmark functions; one job per dispatch then
writes the kernel config on that module, makes the dispatch's benchmark module
and compiles it (`tuner.jobs`). This process times each benchmark on the
kernel's runtime driver and divides by the batch: one call of the dispatch.
A dispatch's time in the kernel is that times its places (none for a dispatch only
the module's initializer runs, once, when the module is loaded); its share is of the
sum over the dispatches timed. The kernel's whole call is timed on random
inputs (`tuner.measure`), the configs side by side; what the dispatches leave
of it is the work between them (copies, fills, the runtime's own).
"""

from __future__ import annotations

import hashlib
import math
import shutil
from dataclasses import field
from functools import partial
from typing import Any

from portkern.base import settings
from portkern.base.errors import CompileForbiddenError, KernelRuntimeError, PortkernError, TuningError, one_line
from portkern.base.records import record, to_plain
from portkern.cache import metrics
from portkern.cache.tuning import TuningDB
from portkern.jit.finalize import CONFIGURED_PHASE, module_options
from portkern.jit.native import NativeCode, check_toolchain, compiler_id, selection_problem
from portkern.jit.target import Target
from portkern.jit.toolchain import toolchain_for
from portkern.jit.workers import Job, Pool, Source
from portkern.portable.bundle import KernelRecord
from portkern.tuner import registry
from portkern.tuner.kernel_config import DEFAULT
from portkern.tuner.measure import Bench, make_inputs, time_calls

#: The worker handlers (`tuner.jobs`): the dispatches with their benchmarks, and one dispatch's benchmark module.
ANALYSE_HANDLER = "portkern.tuner.jobs:profile_dispatches"
BENCHMARK_HANDLER = "portkern.tuner.jobs:dispatch_benchmark"
#: A benchmark runs its dispatch this many times per call at most, and about enough times to take this long.
MAX_BATCH = 256
BATCH_S = 1e-3
#: Round-robin timing of every benchmark (each round: a warm-up call and `ROUND_RUNS` timed ones;
#: the fastest counts, as load from other processes only ever adds time).
ROUNDS, ROUND_RUNS = 5, 4
#: The kernel's whole calls, timed side by side the same way, in this many rounds.
WHOLE_ROUNDS = 8
#: IREE's pass that writes the benchmark modules.
_DUMP_PASS = "builtin.module(iree-hal-dump-executable-benchmarks{{path={path}}})"


@record
class DispatchTime:
    """One dispatch of a kernel under one config, timed alone."""

    index: int
    #: The dispatch function's symbol (the tuner's `Dispatch.name`).
    name: str
    #: Its root op ("" when it has none the tuner reads).
    root: str = ""
    #: Times one call of the kernel runs it (its places; 0: only the module's initializer runs it).
    calls: int = 1
    #: One call of the dispatch (fastest round), None when it was not timed (`note` says why).
    call_s: float | None = None
    #: `call_s` times `calls`: the kernel's time in this dispatch.
    time_s: float | None = None
    #: `time_s` over the sum of every timed dispatch's.
    share: float | None = None
    #: Calls of the dispatch per benchmark call.
    batch: int = 0
    note: str = ""


@record
class ConfigProfile:
    """A kernel's dispatches under one kernel config, and its whole call."""

    #: "default" (the compiler's configs), "tuned" (the stored selection) or "given".
    role: str
    config: str
    #: The kernel's whole call (fastest round, random inputs).
    whole_s: float | None = None
    dispatches: list[DispatchTime] = field(default_factory=list)
    note: str = ""

    @property
    def sum_s(self) -> float | None:
        """The dispatches' times added up (None when none was timed)."""
        times = [d.time_s for d in self.dispatches if d.time_s is not None]
        return sum(times) if times else None

    def to_dict(self) -> dict[str, Any]:
        return {**to_plain(self), "sum_s": self.sum_s}


@record
class KernelProfile:
    """A kernel's per-dispatch profile on a device, for each config profiled."""

    kernel: str
    device: str
    driver: str
    configs: list[ConfigProfile] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel, "device": self.device, "driver": self.driver, "note": self.note,
            "configs": [c.to_dict() for c in self.configs],
        }


def stored_config(natives: NativeCode, record: KernelRecord, target: Target) -> str | None:
    """The config of the kernel's stored, usable selection on the target (None: none stored)."""
    chosen = TuningDB(natives.store, compiler_id(record)).chosen(selection_problem(record, target), target.fingerprint)
    return chosen[0] if chosen is not None else None


def profile_kernel(
    natives: NativeCode, record: KernelRecord, target: Target, config: str | None = None, *, role: str = "given",
    pool: Pool | None = None,
) -> KernelProfile:
    """The kernel's per-dispatch profile at the compiler's default and at `config` (named `role`;
    None: the stored selection's, named "tuned", if any and not the default); its benchmarks
    compiled in `pool` (the bundle's by default). `natives` is a bundle's opened with
    `portkern.load` (which registers the tuner's job handlers). TuningError where it cannot be profiled."""
    if toolchain_for(record).name != "iree" or registry.kernel_family(record) is not None:
        raise TuningError(f"{record.name!r}: {record.kind} kernels are one program, not IREE dispatches: only IREE kernels are profiled per dispatch")
    check_toolchain(record, target)
    if not target.runnable:
        raise TuningError(f"cannot profile {record.name!r} on {target.label} here: {target.reason}")
    inputs = make_inputs(record.signature)  # TuningError for dynamic dimensions
    if settings.compile_mode() == settings.COMPILE_NEVER:
        metrics.refused(natives.store, metrics.COMPILE_FORBIDDEN)
        raise CompileForbiddenError(
            f"profiling {record.name!r} compiles a benchmark of each dispatch, and compiling is turned off here "
            f"({settings.COMPILE}={settings.COMPILE_NEVER})"
        )
    roles = [("default", DEFAULT)]
    other = stored_config(natives, record, target) if config is None else config
    if other is not None and other != DEFAULT:
        roles.append(("tuned" if config is None else role, other))
    profile = KernelProfile(record.name, target.label, target.driver)
    if config is None and other is None:
        profile.note = "no tuned config is stored for this kernel on this device: the compiler's default alone"
    elif len(roles) == 1:
        profile.note = "the tuned config is the compiler's default"
    pool = pool or natives.pool
    configs = [chosen for _, chosen in roles]
    benches = _benchmarks(natives, record, target, configs, pool)
    _time_dispatches(benches, target.driver)
    bench = Bench(record.entry, target.driver, inputs, natives.parameters_for(record))
    wholes = _time_wholes(natives, record, target, bench, configs)
    for named, chosen in roles:
        dispatches = benches[chosen].dispatches
        total = sum(d.time_s for d in dispatches if d.time_s is not None)
        for d in dispatches:
            d.share = d.time_s / total if total and d.time_s is not None else None
        whole_s, note = wholes[chosen]
        profile.configs.append(ConfigProfile(named, chosen, whole_s, dispatches, note))
    return profile


@record
class _Benchmarks:
    """A config's dispatches and, per dispatch index, its benchmarks' native code and functions."""

    dispatches: list[DispatchTime]
    code: dict[int, tuple[bytes, list[str]]] = field(default_factory=dict)


def _benchmarks(natives: NativeCode, record: KernelRecord, target: Target, configs: list[str], pool: Pool) -> dict[str, _Benchmarks]:
    """Per config: its dispatches (read in a worker) and their benchmarks, compiled in the pool."""
    found: dict[str, _Benchmarks] = {}
    analysed: dict[tuple[str, ...], tuple[Target, Source, list[dict]]] = {}
    jobs: list[Job] = []
    wanted: dict[int, tuple[str, int, list[str]]] = {}
    for config in configs:
        options = module_options(config)
        if options not in analysed:
            analysed[options] = _analyse(natives, record, target, ";".join(options) or DEFAULT, pool)
        variant_target, source, listed = analysed[options]
        result = found[config] = _Benchmarks(
            [DispatchTime(int(d["index"]), str(d["name"]), str(d.get("root", "")), _calls(d)) for d in listed]
        )
        for data, dispatch in zip(listed, result.dispatches):
            functions = [str(f) for f in data.get("benchmarks", [])]
            if not functions:
                dispatch.note = "not timed: IREE makes no benchmark of a dispatch with dynamic sizes or operands"
                continue
            if data.get("at_load"):
                dispatch.note = AT_LOAD_NOTE
            elif int(data.get("calls", 1)) < 1:
                dispatch.note = "the kernel's functions do not dispatch it directly; timed once"
            if len(functions) > 1 and not data.get("at_load"):
                dispatch.calls = 1
                dispatch.note = f"dispatched with {len(functions)} workloads: each timed once"
            job_id = len(jobs)
            wanted[job_id] = (config, dispatch.index, functions)
            payload = {"source": source.message(), "config": f"{dispatch.index};{config}", "handler": BENCHMARK_HANDLER}
            jobs.append(Job(job_id, "compile", record.name, variant_target, payload))
    for job_id, compiled in pool.run(jobs, workers=pool.size).items():
        config, index, functions = wanted[job_id]
        if compiled.ok:
            found[config].code[index] = (compiled.data["native"], functions)
            continue
        dispatch = next(d for d in found[config].dispatches if d.index == index)
        dispatch.note = f"not timed: its benchmark did not compile ({compiled.status}: {one_line(compiled.error, limit=300)})"
    return found


#: The note of a dispatch only the module's initializer runs.
AT_LOAD_NOTE = "runs once, when the module is loaded (its initializer): no time in a call"


def _calls(listed: dict) -> int:
    """How many times one call of the kernel runs a listed dispatch: 0 for one only the module's
    initializer runs, else its places (at least 1: a dispatch whose places were not counted runs once)."""
    return 0 if listed.get("at_load") else max(1, int(listed.get("calls", 1)))


def _analyse(natives: NativeCode, record: KernelRecord, target: Target, options: str, pool: Pool) -> tuple[Target, Source, list[dict]]:
    """The kernel (with module `options`) at `executable-configurations`, by a worker: the
    target it was lowered for, the module as a source for further jobs, its dispatches."""
    plan = natives.plan(record, target, options)
    toolchain_for(record).check(plan.stage, plan.name)
    job = Job(0, "analyse", plan.name, plan.target, {"source": natives.source(plan).message(), "handler": ANALYSE_HANDLER})
    result = pool.run([job], workers=1)[0]
    if not result.ok:
        raise result.error_for(plan.name, plan.target)
    code = result.data["configured"]
    return plan.target, Source(hashlib.sha256(code).hexdigest(), code, CONFIGURED_PHASE), list(result.data["dispatches"])


def _time_dispatches(benches: dict[str, _Benchmarks], driver: str) -> None:
    """Every compiled benchmark loaded, its batch chosen, then all timed round-robin."""
    from portkern.jit.runtime import Executable

    # one benchmark per distinct code and function: a dispatch two configs compile alike is timed once
    loaded: dict[tuple[str, str], tuple[Any, int]] = {}  # -> executable, batch
    uses: list[tuple[DispatchTime, tuple[str, str]]] = []
    for found in benches.values():
        for dispatch in found.dispatches:
            if dispatch.index not in found.code:
                continue
            vmfb, functions = found.code[dispatch.index]
            digest = hashlib.sha256(vmfb).hexdigest()
            try:
                for function in functions:
                    if (digest, function) not in loaded:
                        executable = Executable(vmfb, function, driver)
                        once = time_calls(partial(executable.invoke, 1), warmup=2, runs=3).min_s
                        batch = max(1, min(MAX_BATCH, math.ceil(BATCH_S / once))) if once > 0 else MAX_BATCH
                        loaded[digest, function] = (executable, batch)
                    uses.append((dispatch, (digest, function)))
            except KernelRuntimeError as exc:
                dispatch.note = f"not timed: its benchmark did not run ({one_line(exc, limit=300)})"
    best = dict.fromkeys(loaded, math.inf)
    order = list(loaded)
    for round_index in range(ROUNDS):
        for key in order if round_index % 2 == 0 else reversed(order):
            executable, batch = loaded[key]
            seconds = time_calls(partial(executable.invoke, batch), warmup=1, runs=ROUND_RUNS).min_s / batch
            best[key] = min(best[key], seconds)
    for dispatch, key in uses:
        if dispatch.note.startswith("not timed"):
            continue
        dispatch.batch = loaded[key][1]
        dispatch.call_s = (dispatch.call_s or 0.0) + best[key]
        dispatch.time_s = (dispatch.time_s or 0.0) + best[key] * dispatch.calls
    loaded.clear()  # their runtime contexts hold the dispatches' buffers


def _time_wholes(natives: NativeCode, record: KernelRecord, target: Target, bench: Bench, configs: list[str]) -> dict[str, tuple[float | None, str]]:
    """Each config's whole kernel call (native code through the native-code service), timed
    round-robin side by side; the fastest round's fastest call counts."""
    loaded, notes = [], {}
    for config in configs:
        try:
            loaded.append((config, bench.load(natives.native(record, target, config).data, config)))
        except PortkernError as exc:
            notes[config] = f"whole call not timed: {type(exc).__name__}: {one_line(exc, limit=300)}"
    best = [math.inf] * len(loaded)
    for round_index in range(WHOLE_ROUNDS):
        for i in range(len(loaded)) if round_index % 2 == 0 else reversed(range(len(loaded))):
            best[i] = min(best[i], bench.time(loaded[i][1], warmup=1, runs=ROUND_RUNS).min_s)
    found: dict[str, tuple[float | None, str]] = {config: (None, note) for config, note in notes.items()}
    for (config, _), seconds in zip(loaded, best):
        found[config] = (seconds, "")
    return found


# --- in the worker processes (`tuner.jobs`) ---------------------------------------------------


def benchmarked_dispatches(module) -> list[dict]:
    """The dispatches of a module at `executable-configurations`, in the tuner's order: index,
    name, root op, the places the module's functions dispatch each (`calls`), whether only its
    initializer does (`at_load`) and the names of the benchmark functions IREE makes for it
    (`benchmarks`; none where its sizes are dynamic)."""
    from portkern.tuner import analysis

    found = analysis.dispatches(module)
    functions: dict[str, list[str]] = {}
    for dumped in _dumped(module, None):
        for export, names in _benchmark_functions(dumped).items():
            functions.setdefault(export, []).extend(names)
    return [
        {"index": d.index, "name": d.name, "root": d.root, "calls": d.sites, "at_load": d.at_load, "benchmarks": functions.get(d.name, [])}
        for d in found
    ]


def benchmark_module(module, job: str, context):
    """IREE's benchmark module of one dispatch of `module` (at `executable-configurations`) with
    a kernel config written on it; `job` is "<dispatch index>;<kernel config>"."""
    from portkern.tuner import analysis, kernel_config

    index_text, _, config = job.partition(";")
    stamped = analysis.stamp(module, kernel_config.parse(config), context)
    found = {d.index: d.name for d in analysis.dispatches(stamped)}
    if not index_text.isdigit() or int(index_text) not in found:
        raise TuningError(f"no dispatch {index_text!r} to benchmark (the kernel has {len(found)})")
    name = found[int(index_text)]
    for dumped in _dumped(stamped, context):
        if name in _benchmark_functions(dumped):
            return dumped
    raise TuningError(f"dispatch {index_text} ({name}) has no benchmark: IREE makes none for dynamic sizes or operands")


def _dumped(module, context) -> list:
    """The benchmark modules IREE writes for `module`'s dispatches, parsed in `context`."""
    from pathlib import Path

    from iree.compiler import ir
    from iree.compiler.passmanager import PassManager

    from portkern.cache import scratch

    operation = getattr(module, "operation", module)
    context = context or operation.context
    where = scratch.make("profile")
    try:
        try:
            clone = operation.clone()
            PassManager.parse(_DUMP_PASS.format(path=where), context=context).run(clone)
        except ir.MLIRError as exc:
            raise TuningError(f"IREE made no dispatch benchmarks: {one_line(exc, limit=500)}") from None
        return [ir.Module.parse(path.read_text(), context) for path in sorted(Path(where).glob("*.mlir"))]
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _benchmark_functions(dumped) -> dict[str, list[str]]:
    """Per dispatch function (export) of a benchmark module, the names of its benchmark functions
    (IREE names each `<executable>_<variant>_<export>`, then `_<workload>` where it has one)."""
    from portkern.portable.compiler import operations

    executable = variant = ""
    exports: dict[str, str] = {}  # qualified name -> export
    names = []
    for op in operations(dumped):
        symbol = str(op.attributes["sym_name"]).strip('"') if "sym_name" in op.attributes else ""
        if op.name == "hal.executable":
            executable = symbol
        elif op.name == "hal.executable.variant":
            variant = symbol
        elif op.name == "hal.executable.export":
            exports[f"{executable}_{variant}_{symbol}"] = symbol
        elif op.name == "util.func" and "dispatch" in str(op.attributes["iree.reflection"] if "iree.reflection" in op.attributes else ""):
            names.append(symbol)
    functions: dict[str, list[str]] = {}
    for name in names:
        owner = max((q for q in exports if name == q or name.startswith(q + "_")), key=len, default=None)
        if owner is not None:
            functions.setdefault(exports[owner], []).append(name)
    return functions
