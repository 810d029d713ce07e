"""The benchmark harness: inputs, timed runs, and the output check every candidate must pass.

Inputs are uploaded to the device once per driver and reused by every
candidate (copying NumPy inputs on each call costs 0.1-0.4 ms on `local-task`,
as much as a whole GEMM). Each measurement is a warm-up followed by timed
calls. Candidates rank by the fastest call (`Timing.min_s`): load from other
processes only ever adds time. The median and the interquartile spread are
reported beside it (`--json`) to show how noisy a measurement was. Finalists
are re-timed interleaved, round by round, so a load spike from another
process hits all of them alike.
"""

from __future__ import annotations

import functools
import time
from typing import Callable, Sequence

import numpy as np

from portkern.base.errors import KernelRuntimeError, TuningError
from portkern.base.records import frozen_record, to_plain
from portkern.portable.bundle import Signature
from portkern.portable.dtypes import numpy_dtype

WARMUP = 3
RUNS = 20
MIN_RUNS = 5
#: A candidate's timed calls stop early past this (slow kernels).
RUN_BUDGET_S = 0.25
#: Interleaved re-timing: many short rounds, so bursts of load from other processes hit every finalist.
ROUNDS, ROUND_RUNS = 15, 4
#: Relative tolerance of a candidate's outputs against the default config's, per dtype;
#: the absolute tolerance is this times the largest magnitude of the default's output.
RTOL = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-4, "float64": 1e-9}
#: The one-thread driver used to rank tiles that govern single-thread speed.
SINGLE_THREAD = {"local-task": "local-sync"}


@frozen_record
class Timing:
    """Seconds per call: median, quartiles and minimum over `runs` timed calls (or rounds)."""

    median_s: float
    q1_s: float
    q3_s: float
    min_s: float
    runs: int

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.q3_s - self.q1_s) / self.median_s if self.median_s else 0.0

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Timing":
        ordered = sorted(samples)
        n = len(ordered)
        return cls(ordered[n // 2], ordered[n // 4], ordered[(3 * n) // 4], ordered[0], n)

    def to_dict(self) -> dict:
        return {**to_plain(self), "spread": self.spread}


def call_driver_of(driver: str, inputs: Sequence[np.ndarray], parameters=None) -> str:
    """The driver a kernel's calls on `inputs` run on, for its code deployed on `driver`
    (`jit.runtime.call_driver`: its arguments and parameters counted): what a user's calls pay."""
    from portkern.jit.runtime import call_driver

    weights = parameters.nbytes if parameters is not None else 0
    return call_driver(driver, weights + sum(int(a.nbytes) for a in inputs))


def driver_for(ranking: str, deployed: str) -> str:
    """The runtime driver a ranking ("single" or "deployed") runs on."""
    return SINGLE_THREAD.get(deployed, deployed) if ranking == "single" else deployed


def make_inputs(signature: Signature, seed: int = 0) -> list[np.ndarray]:
    """Random inputs for a kernel signature: floats uniform in [-1, 1), small integers."""
    rng = np.random.default_rng(seed)
    arrays = []
    for index, spec in enumerate(signature.inputs):
        shape = tuple(d for d in spec.shape if d is not None)
        if len(shape) != len(spec.shape):
            raise TuningError(f"argument {index} has a dynamic dimension ({spec}); inputs need sizes (tune per shape bucket)")
        dtype = numpy_dtype(spec.dtype)
        if dtype.kind == "f":
            arrays.append(rng.uniform(-1.0, 1.0, shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.integers(0, 2, shape).astype(dtype))
        else:
            low = 0 if dtype.kind == "u" else -8
            arrays.append(rng.integers(low, 8, shape).astype(dtype))
    return arrays


def mismatch(outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> str | None:
    """Why outputs differ from the reference beyond the tolerance, None when they agree."""
    if len(outputs) != len(reference):
        return f"{len(outputs)} outputs, expected {len(reference)}"
    for index, (got, want) in enumerate(zip(outputs, reference)):
        if got.shape != want.shape or got.dtype != want.dtype:
            return f"output {index} is {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
        if want.dtype.kind != "f":
            if not np.array_equal(got, want):
                return f"output {index}: {int(np.count_nonzero(got != want))} elements differ"
            continue
        rtol = RTOL.get(want.dtype.name, 1e-4)
        finite = np.isfinite(want)
        if not np.array_equal(finite, np.isfinite(got)) or not np.array_equal(np.isnan(got), np.isnan(want)):
            return f"output {index}: non-finite values differ"
        scale = float(np.max(np.abs(want[finite]))) if finite.any() else 0.0
        error = np.abs(got[finite].astype(np.float64) - want[finite])
        allowed = rtol * scale + rtol * np.abs(want[finite].astype(np.float64))
        if np.any(error > allowed):
            return f"output {index}: max |error| {float(error.max()):.3g} exceeds rtol {rtol:g} (scale {scale:.3g})"
    return None


def time_calls(call: Callable[[], object], warmup: int = WARMUP, runs: int = RUNS, budget_s: float = RUN_BUDGET_S) -> Timing:
    """Median time of `call()` over timed runs after a warm-up."""
    for _ in range(warmup):
        call()
    samples = []
    deadline = time.perf_counter() + budget_s
    for _ in range(runs):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
        if len(samples) >= MIN_RUNS and time.perf_counter() > deadline:
            break
    return Timing.of(samples)


class Bench:
    """Candidates of one kernel, loaded on one runtime driver with the inputs uploaded once."""

    def __init__(self, entry: str, driver: str, inputs: Sequence[np.ndarray], parameters=None) -> None:
        self.entry = entry
        self.driver = driver
        self.inputs = list(inputs)
        #: The kernel's parameters, if it reads any (`portkern.jit.parameters.KernelParameters`).
        self.parameters = parameters
        self._device_inputs: list | None = None

    def load(self, vmfb: bytes, config: str = "default"):
        """An executable for a candidate's vmfb (KernelRuntimeError if it cannot load); the config
        it was compiled with matters only to kernels whose code does not say it (OpenCL points)."""
        from portkern.jit.runtime import Executable

        executable = Executable(vmfb, self.entry, self.driver, self.parameters)
        if self._device_inputs is None:
            self._device_inputs = executable.upload(self.inputs)
        return executable

    def _uploaded(self) -> list:
        """The inputs on the device (uploaded by the first `load`)."""
        if self._device_inputs is None:
            raise KernelRuntimeError("no candidate was loaded on this bench: its inputs are not on the device yet")
        return self._device_inputs

    def outputs(self, executable) -> list[np.ndarray]:
        return executable(*self._uploaded())

    def time(self, executable, **options) -> Timing:
        arguments = self._uploaded()
        return time_calls(lambda: executable.invoke(*arguments), **options)

    def interleaved(self, executables: Sequence, rounds: int = ROUNDS, runs: int = ROUND_RUNS) -> list[Timing]:
        """Per executable, the timing over rounds of its per-round median, all timed round-robin.

        Compare finalists on `min_s`, their best round: other load on the
        machine only ever adds time, and every finalist gets the same rounds.
        """
        return round_robin([functools.partial(self.time, e, warmup=1, runs=runs) for e in executables], rounds)


def round_robin(timers: Sequence[Callable[[], Timing]], rounds: int = ROUNDS) -> list[Timing]:
    """Per timer (one side of a comparison), the timing over rounds of its per-round median: every
    side timed once a round, in turn, the order reversed every other round."""
    per_round: list[list[float]] = [[] for _ in timers]
    order = list(range(len(timers)))
    for round_index in range(rounds):
        for i in order if round_index % 2 == 0 else reversed(order):
            per_round[i].append(timers[i]().median_s)
    return [Timing.of(samples) for samples in per_round]

