"""What a tuning run reports: per candidate, per dispatch and per kernel."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from portkern.base.records import from_plain, record, to_plain, wire
from portkern.jit.workers import Compiled
from portkern.tuner.measure import Timing

#: Candidate outcomes that count as failures (the candidate never produced a usable kernel).
FAILED = ("error", "crash", "oom", "timeout", "unloadable")


@record(kw_only=True)
class Evaluation(Compiled):
    """One candidate kernel config: compiled, checked against the default, timed.

    Beyond the compile outcomes, `status` may be "wrong" (outputs differ from the
    default's), "duplicate" (the same code as an earlier candidate) or "unloadable".
    """

    config: str
    #: Timings by runtime driver.
    timings: dict[str, Timing] = field(default_factory=dict, metadata=wire(encode=lambda timings: {k: t.to_dict() for k, t in timings.items()}))
    sha256: str = ""
    duplicate_of: str = ""
    bench_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


@record
class DispatchResult:
    """The config chosen for one dispatch, and how it was found."""

    index: int
    name: str
    problem: str
    #: The dispatch's perf config string, or "default".
    config: str = "default"
    #: "search", "db" (a stored result for the same problem), or "skipped".
    source: str = "skipped"
    strategy: str = ""
    #: Kernel time with this dispatch at its default and at the chosen config
    #: (best of interleaved rounds on the deployed driver).
    default_s: float | None = None
    best_s: float | None = None
    evaluated: int = 0
    failed: int = 0
    wrong: int = 0
    duplicates: int = 0
    #: Why the dispatch was not searched, or notes on the outcome.
    note: str = ""
    #: Search wall time for this dispatch.
    wall_s: float = 0.0
    #: False when a time limit or a budget stopped the search before the strategy's end.
    complete: bool = True

    @property
    def speedup(self) -> float | None:
        if self.default_s and self.best_s:
            return self.default_s / self.best_s
        return None

    def to_dict(self) -> dict[str, Any]:
        return {**to_plain(self), "speedup": self.speedup}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DispatchResult":
        """A result from plain data (unknown keys ignored); TypeError when a field is missing."""
        return from_plain(cls, data)


@record
class TuneResult:
    """The config chosen for one kernel on one device."""

    kernel: str
    device: str
    strategy: str
    #: The kernel config string the loader uses ("default" when nothing beat the compiler).
    config: str = "default"
    #: "search" (tuned now), "db" (composed from stored per-dispatch results),
    #: "selection" (this kernel's stored choice), or "default" (nothing to tune).
    source: str = "search"
    dispatches: list[DispatchResult] = field(default_factory=list)
    #: Whole-kernel time at the compiler's default and at `config` (deployed driver).
    default_s: float | None = None
    best_s: float | None = None
    wall_s: float = 0.0
    #: Why the result is what it is, when that needs saying.
    note: str = ""
    #: Every candidate evaluated in this run (not stored).
    evaluations: list[Evaluation] = field(default_factory=list)
    #: Whether the kernel's calls run on the task executor whatever their size: they would run on
    #: the calling thread by their size, and `config` was timed faster on the executor.
    executor: bool = False

    @property
    def speedup(self) -> float | None:
        """Kernel call time at the compiler's default over that at `config`, timed side by side."""
        if self.default_s and self.best_s:
            return self.default_s / self.best_s
        return None

    @property
    def complete(self) -> bool:
        """Whether every searched dispatch ran its strategy to the end (no time limit or budget cut it short)."""
        return all(d.complete for d in self.dispatches)

    @classmethod
    def from_selection(cls, stored: dict[str, Any], kernel: str, device: str) -> "TuneResult":
        """The result a kernel's stored selection (a tuning-DB record) describes."""
        dispatches = []
        for data in stored.get("dispatches", []):
            if not isinstance(data, dict):
                continue
            try:
                searched = data.get("source") == "search"
                dispatches.append(DispatchResult.from_dict({**data, "source": "db" if searched else data.get("source", "db")}))
            except TypeError:  # a record from another version: the selection itself still holds
                continue
        return cls(
            kernel, device, str(stored.get("strategy", "")), str(stored["config"]), "selection", dispatches,
            stored.get("default_s"), stored.get("best_s"), executor=stored.get("executor") is True,
        )

    def to_dict(self, evaluations: bool = False) -> dict[str, Any]:
        data = {
            "kernel": self.kernel,
            "device": self.device,
            "strategy": self.strategy,
            "config": self.config,
            "source": self.source,
            "default_s": self.default_s,
            "best_s": self.best_s,
            "speedup": self.speedup,
            "wall_s": self.wall_s,
            "note": self.note,
            "complete": self.complete,
            "executor": self.executor,
            "dispatches": [d.to_dict() for d in self.dispatches],
        }
        data["failed_candidates"] = [
            {"config": e.config, "status": e.status, "reason": e.error} for e in self.evaluations if e.status in (*FAILED, "wrong")
        ]
        if evaluations:
            data["evaluations"] = [e.to_dict() for e in self.evaluations]
        return data
