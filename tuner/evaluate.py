"""Evaluating kernel configs: compile in the pool, check against the default, time.

Every candidate's outputs are compared with the default config's outputs on
the same inputs before its time counts; a candidate whose code is
byte-identical to an earlier one's is a duplicate and is not timed again.
Benchmarks run in this process after each compile batch, never while our own
compile workers hold the cores. What a config compiles to and how it is run
is the kernel's `Candidates` (IREE modules here, OpenCL programs in
`opencl_family`).
"""

from __future__ import annotations

import functools
import hashlib
import time
from typing import Protocol, Sequence

from portkern.base.errors import KernelRuntimeError, TuningError, gist
from portkern.jit.finalize import module_options
from portkern.jit.native import compile_job
from portkern.jit.target import Target
from portkern.jit.workers import Job, Pool, Source
from portkern.portable.bundle import Signature
from portkern.tuner.kernel_config import DEFAULT
from portkern.tuner.measure import ROUND_RUNS, ROUNDS, Bench, Timing, make_inputs, mismatch, round_robin
from portkern.tuner.results import Evaluation


class Candidates(Protocol):
    """How one kernel's configs become code that can be checked and timed."""

    def job(self, id: int, config: str) -> Job:
        """The worker job that compiles a config (its result's `native` is the code)."""
        ...

    def bench(self, driver: str) -> Bench:
        """A bench that loads this kernel's code on a driver, with the inputs every config is run on."""
        ...

    def digest(self, config: str, code: bytes) -> str:
        """What makes two configs the same program (equal digests: the later one is a duplicate)."""
        ...


class IreeCandidates:
    """Configs of an IREE kernel: stamped on its configured module and compiled to a vmfb."""

    def __init__(
        self, target: Target, name: str, source: Source, entry: str, signature: Signature, seed: int = 0, parameters=None
    ) -> None:
        self.target, self.name, self.source, self.entry = target, name, source, entry
        self.inputs = make_inputs(signature, seed)
        #: The kernel's parameters (candidates are compiled without them and run with them).
        self.parameters = parameters
        #: Per set of module options (`jit.finalize.MODULE_OPTIONS`): the target and configured module
        #: that configs naming them compile from (`add_variant`).
        self.variants: dict[tuple[str, ...], tuple[Target, Source]] = {(): (target, source)}

    def add_variant(self, options: tuple[str, ...], target: Target, source: Source) -> None:
        """Configs naming module `options` compile from `source` (configured for `target`, which has their flags)."""
        self.variants[options] = (target, source)

    def job(self, id: int, config: str) -> Job:
        options = module_options(config)
        if options not in self.variants:
            raise TuningError(f"{self.name}: no module compiled with {', '.join(options)} to stamp {config[:120]!r} on")
        target, source = self.variants[options]
        return compile_job(id, self.name, target, source, config)

    def bench(self, driver: str) -> Bench:
        return Bench(self.entry, driver, self.inputs, self.parameters)

    def digest(self, config: str, code: bytes) -> str:
        return hashlib.sha256(code).hexdigest()


class Evaluator:
    """Compiles, checks and times kernel configs of one kernel on one target."""

    def __init__(self, pool: Pool, target: Target, name: str, candidates: Candidates, deployed: str) -> None:
        self.pool = pool
        self.target = target
        self.name = name
        self.candidates = candidates
        self.deployed = deployed
        self.vmfbs: dict[str, bytes] = {}
        self.results: dict[str, Evaluation] = {}
        self._benches: dict[str, Bench] = {}
        self._loaded: dict[tuple[str, str], object] = {}
        self._by_sha: dict[str, str] = {}
        self._reference: list | None = None
        self._next_job = 0

    # --- compiling ------------------------------------------------------------

    def compile(self, configs: Sequence[str]) -> None:
        """Compile the configs not compiled yet (in parallel); failures are recorded."""
        jobs = []
        for config in dict.fromkeys(configs):
            if config not in self.results:
                jobs.append(self.candidates.job(self._next_job, config))
                self._next_job += 1
        if not jobs:
            return
        by_id = {job.id: job.payload["config"] for job in jobs}
        for config in by_id.values():
            self.results[config] = Evaluation(config=config, status="pending")
        for job_id, compiled in self.pool.run(jobs, workers=self.pool.size).items():
            evaluation = self.results[by_id[job_id]]
            evaluation.setup_s, evaluation.stamp_s, evaluation.compile_s = compiled.setup_s, compiled.stamp_s, compiled.compile_s
            if not compiled.ok:
                evaluation.status, evaluation.error = compiled.status, gist(compiled.error)
                continue
            vmfb = compiled.data["native"]
            evaluation.sha256 = hashlib.sha256(vmfb).hexdigest()
            owner = self._by_sha.setdefault(self.candidates.digest(evaluation.config, vmfb), evaluation.config)
            if owner != evaluation.config:
                evaluation.status, evaluation.duplicate_of = "duplicate", owner
            else:
                self.vmfbs[evaluation.config] = vmfb
                evaluation.status = "compiled"

    # --- checking and timing ---------------------------------------------------

    def bench(self, driver: str) -> Bench:
        if driver not in self._benches:
            self._benches[driver] = self.candidates.bench(driver)
        return self._benches[driver]

    def _executable(self, config: str, driver: str):
        key = (config, driver)
        if key not in self._loaded:
            self._loaded[key] = self.bench(driver).load(self.vmfbs[config], config)
        return self._loaded[key]

    def reference(self) -> list:
        """The default config's outputs on the deployed driver."""
        if self._reference is None:
            self.compile([DEFAULT])
            default = self.results[DEFAULT]
            if default.status not in ("compiled", "ok"):
                raise TuningError(f"{self.name}: the default config does not compile: {default.error}")
            self._reference = self.bench(self.deployed).outputs(self._executable(DEFAULT, self.deployed))
            default.status = "ok"
        return self._reference

    def evaluate(self, configs: Sequence[str], driver: str) -> list[Evaluation]:
        """Compile, check and time configs on a driver; each evaluation in the order given."""
        reference = self.reference()
        self.compile(configs)
        evaluations = []
        for config in configs:
            evaluation = self.results[config]
            if evaluation.status in ("compiled", "ok") and driver not in evaluation.timings:
                start = time.perf_counter()
                self._check_and_time(evaluation, driver, reference)
                evaluation.bench_s += time.perf_counter() - start
            evaluations.append(evaluation)
        return evaluations

    def _check_and_time(self, evaluation: Evaluation, driver: str, reference: list) -> None:
        try:
            executable = self._executable(evaluation.config, driver)
            if evaluation.status == "compiled":
                problem = mismatch(self.bench(driver).outputs(executable), reference)
                if problem is not None:
                    evaluation.status, evaluation.error = "wrong", problem
                    return
                evaluation.status = "ok"
            evaluation.timings[driver] = self.bench(driver).time(executable)
        except KernelRuntimeError as exc:
            evaluation.status, evaluation.error = "unloadable", str(exc)[:200]

    def interleaved(self, configs: Sequence[str], driver: str, rounds: int = ROUNDS) -> dict[str, Timing]:
        """Checked configs re-timed round-robin on a driver (the finalists' comparison)."""
        self.evaluate(configs, driver)
        usable = [c for c in dict.fromkeys(configs) if self.results[c].ok]
        timings = self.bench(driver).interleaved([self._executable(c, driver) for c in usable], rounds=rounds)
        return dict(zip(usable, timings))

    def across(self, config: str, drivers: Sequence[str], rounds: int = ROUNDS) -> dict[str, Timing]:
        """A config checked on each driver and re-timed on them round-robin (where its calls run best)."""
        for driver in drivers:
            self.evaluate([config], driver)
        usable = [d for d in drivers if d in self.results[config].timings]
        timers = [functools.partial(self.bench(d).time, self._executable(config, d), warmup=1, runs=ROUND_RUNS) for d in usable]
        return dict(zip(usable, round_robin(timers, rounds)))

    def release(self) -> None:
        """Drop loaded executables (their runtime contexts hold memory)."""
        self._loaded.clear()
