"""Compile candidates in parallel worker processes that may crash or hang.

Each worker is a separate Python process (`portkern.tuner.worker`) with its
own compiler session. The parent hands one job at a time to each idle worker
and waits on their pipes with a per-job deadline. A worker that dies
(segfault, abort) or overruns is killed, its job is reported as `crash` or
`timeout`, and a fresh worker takes its place: one bad candidate never stops a
tuning run. (A `ProcessPoolExecutor` breaks for good on the first segfault.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Callable, Iterable

from portkern.errors import TuningError, message_lines
from portkern.tuner.results import Compiled
from portkern.tuner.worker import read_frame, write_frame

DEFAULT_TIMEOUT_S = 60.0
#: A worker is replaced after this many jobs (insurance against leaks in the compiler).
RECYCLE_AFTER = 200
#: Give up when this many workers in a row die before they are ready.
MAX_START_FAILURES = 3


@dataclass(frozen=True)
class Source:
    """A kernel's module for the workers: bytecode at `phase` (the tuner sends it configured)."""

    key: str
    blob: bytes
    phase: str
    name: str


@dataclass(frozen=True)
class Job:
    id: int
    source: Source
    #: Kernel config string (`portkern.tuner.kernel_config`).
    config: str


@dataclass(kw_only=True)
class CompileResult(Compiled):
    """A job's outcome: "ok" with its vmfb, or "error", "crash" or "timeout"."""

    id: int
    vmfb: bytes | None = None
    #: From handing out the job to its result, seen by the parent.
    wall_s: float = 0.0


class _Worker:
    def __init__(self, flags: tuple[str, ...]) -> None:
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "portkern.tuner.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
        )
        self.ready = False
        self.job: Job | None = None
        self.deadline = 0.0
        self.started = 0.0
        self.done = 0
        write_frame(self.process.stdin, {"flags": list(flags)})

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, job: Job, timeout_s: float) -> bool:
        self.job, self.started = job, time.perf_counter()
        self.deadline = self.started + timeout_s
        try:
            write_frame(
                self.process.stdin,
                {"id": job.id, "config": job.config, "source": {"key": job.source.key, "blob": job.source.blob, "phase": job.source.phase, "name": job.source.name}},
            )
            return True
        except (BrokenPipeError, OSError):
            return False

    def last_words(self) -> str:
        try:
            self.log.seek(0)
            lines = message_lines(self.log.read().decode(errors="replace"))
        except OSError:
            return ""
        return lines[-1][:200] if lines else ""

    def stop(self, kill: bool = False) -> None:
        try:
            if kill:
                self.process.kill()
            else:
                self.process.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.log.close()


class CompilePool:
    """Worker processes compiling kernel configs for one set of compiler flags."""

    def __init__(self, flags: tuple[str, ...], workers: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.flags = tuple(flags)
        self.size = max(1, workers or default_workers())
        self.timeout_s = timeout_s
        self._workers: list[_Worker] = []
        self._start_failures = 0
        #: Workers started so far (replacements included).
        self.spawned = 0

    def __enter__(self) -> "CompilePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for worker in self._workers:
            worker.stop()
        self._workers = []

    def _spawn(self) -> None:
        self._workers.append(_Worker(self.flags))
        self.spawned += 1

    def _replace(self, worker: _Worker, kill: bool) -> None:
        worker.stop(kill=kill)
        self._workers.remove(worker)
        self._spawn()

    def run(
        self,
        jobs: Iterable[Job],
        on_start: Callable[[Job, int], None] | None = None,
        on_result: Callable[[Job, CompileResult], None] | None = None,
    ) -> dict[int, CompileResult]:
        """Compile every job; results by job id. Failed jobs have a status other than "ok"."""
        todo = deque(jobs)
        results: dict[int, CompileResult] = {}
        while len(self._workers) < self.size:
            self._spawn()

        def finish(worker: _Worker, result: CompileResult) -> None:
            job = worker.job
            worker.job = None
            worker.done += 1
            result.wall_s = time.perf_counter() - worker.started
            results[result.id] = result
            if on_result is not None and job is not None:
                on_result(job, result)

        while todo or any(w.job for w in self._workers):
            for worker in list(self._workers):
                if worker.ready and worker.job is None and worker.done >= RECYCLE_AFTER:
                    self._replace(worker, kill=False)
            for worker in list(self._workers):
                if worker.ready and worker.job is None and todo:
                    job = todo.popleft()
                    if on_start is not None:
                        on_start(job, worker.pid)
                    if not worker.send(job, self.timeout_s):
                        finish(worker, CompileResult(id=job.id, status="crash", error=self._crash_message(worker)))
                        self._replace(worker, kill=True)
            busy = [w for w in self._workers if w.job]
            timeout = max(0.0, min(w.deadline for w in busy) - time.perf_counter()) if busy else 1.0
            readable = wait([w.process.stdout for w in self._workers], timeout=timeout)
            for worker in list(self._workers):
                if worker.process.stdout in readable:
                    self._receive(worker, finish)
                elif worker.job is not None and time.perf_counter() > worker.deadline:
                    finish(worker, CompileResult(id=worker.job.id, status="timeout", error=f"timeout after {self.timeout_s:g} s"))
                    self._replace(worker, kill=True)
        return results

    def _receive(self, worker: _Worker, finish) -> None:
        message = read_frame(worker.process.stdout)
        if message is None:  # the worker died
            if worker.job is not None:
                finish(worker, CompileResult(id=worker.job.id, status="crash", error=self._crash_message(worker)))
            elif not worker.ready:
                self._start_failures += 1
                if self._start_failures >= MAX_START_FAILURES:
                    raise TuningError(f"compile workers die at start-up: {self._crash_message(worker)}")
            self._replace(worker, kill=True)
        elif "ready" in message:
            worker.ready = True
            self._start_failures = 0
        elif "fatal" in message:
            raise TuningError(f"compile worker cannot start: {message['fatal']}")
        elif worker.job is not None and message.get("id") == worker.job.id:
            fields = {k: message[k] for k in ("id", "vmfb", "error", "setup_s", "stamp_s", "compile_s")}
            finish(worker, CompileResult(status="ok" if message["ok"] else "error", **fields))

    def _crash_message(self, worker: _Worker) -> str:
        try:
            code = worker.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            code = worker.process.wait()
        words = worker.last_words()
        return f"compiler crashed (worker exit code {code})" + (f": {words}" if words else "")


def cores() -> int:
    """CPU cores this process may use (IREE's `local-task` runs one worker thread per core)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_workers() -> int:
    """One compile worker per core: compiles are single-threaded."""
    return max(1, min(cores(), 8))
