"""The one worker pool: bounded processes that parse and compile bundle content.

Finalisation and tuning both hand their compiler work to this pool. Each
worker is a persistent Python process (`portkern.jit.worker`) with the
compiler already imported; the parent hands one job at a time to each idle
worker and waits on their pipes with a per-job deadline. Every job runs
under two bounds read from the settings (`portkern.base.settings`) when it is handed out:

- `PORTKERN_COMPILE_TIMEOUT`: wall time, a duration (default 120 s);
- `PORTKERN_COMPILE_MEMORY`: address space of the worker, a size such as `4GiB`
  (default 8 GiB; 0 for none).

A worker that dies (segfault, abort, out of memory) or overruns is killed,
its job is reported as "crash", "oom" or "timeout", and a fresh worker takes
its place. (A `ProcessPoolExecutor` breaks for good on the first segfault.)
Workers start only when there is a job for them. A job that runs beside others
filling the cores compiles on one thread, a job with cores to spare on the
compiler's own threads (`compiler_threads`); the code is the same.

At exit every pool's workers are killed and reaped, and no worker starts again: jobs in
hand and jobs not yet handed out end as "stopped", and the exit waits for no job and
for no thread that may be running one.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from dataclasses import field
from multiprocessing.connection import wait
from typing import IO, Any, Callable, Iterable

from portkern.base import errors, settings
from portkern.base.errors import FinalizeError, PortkernError, brief
from portkern.base.records import frozen_record, record
from portkern.cache import scratch
from portkern.jit import background, handlers
from portkern.jit.target import Target
from portkern.jit.worker import read_frame, write_frame

log = logging.getLogger(__name__)
TIMEOUT_ENV = settings.COMPILE_TIMEOUT
MEMORY_ENV = settings.COMPILE_MEMORY
#: A worker is replaced after this many jobs (insurance against leaks in the compiler).
RECYCLE_AFTER = 200
#: Give up when this many workers in a row die before they are ready.
MAX_START_FAILURES = 3
#: Longest a worker may take to start (import the compiler).
START_TIMEOUT_S = 120.0


def timeout_s() -> float:
    """The per-job wall-time bound now in force (`portkern.base.settings.compile_timeout_s`)."""
    return settings.compile_timeout_s()


def memory_bytes() -> int:
    """The per-job address-space bound now in force (0: none; `portkern.base.settings.compile_memory`)."""
    return settings.compile_memory()


def target_message(target: Target) -> dict:
    """A target as the workers read it."""
    return {
        "fingerprint": target.fingerprint.to_dict(),
        "flags": list(target.flags),
        "family": target.family,
        "driver": target.driver,
        "executable_target": target.executable_target,
    }


@frozen_record
class Source:
    """MLIR for the workers: a bundle stage (fitted to the target in the worker) or a
    module already fitted (`stage` None), with the phase it is at. `key` names it."""

    key: str
    blob: bytes
    phase: str
    stage: dict | None = None

    def message(self) -> dict:
        return {"key": self.key, "blob": self.blob, "phase": self.phase, "stage": self.stage}


@frozen_record
class Job:
    """One unit of work for a worker; `name` is the kernel it is for (in messages)."""

    id: int
    kind: str
    name: str
    target: Target | None
    payload: dict
    #: Wall-time bound in seconds for this job (None: the one in force, `PORTKERN_COMPILE_TIMEOUT`).
    timeout: float | None = None

    @property
    def size(self) -> int:
        """Bytes of kernel code the job reads (MLIR or SPIR-V): what `Pool.run` orders jobs by."""
        source = self.payload.get("source")
        if isinstance(source, dict):
            return len(source.get("blob") or b"")
        blobs = self.payload.get("blobs")
        if isinstance(blobs, dict):
            return sum(len(blob) for blob in blobs.values())
        return len(self.payload.get("blob") or b"")

    @classmethod
    def compile(cls, id: int, name: str, target: Target, source: Source, config: str = "default") -> "Job":
        """A vmfb of `source` with a kernel config ("default": the compiler's own; any other is
        written on the module by the handler registered for `handlers.STAMP`)."""
        payload = {"source": source.message(), "config": config}
        if config != "default":
            payload["handler"] = handlers.handler(handlers.STAMP)
        return cls(id, "compile", name, target, payload)

    @classmethod
    def analyse(cls, id: int, name: str, target: Target, source: Source) -> "Job":
        """The module at `executable-configurations` as bytecode, and its dispatches (read by the
        handler registered for `handlers.ANALYSE`)."""
        return cls(id, "analyse", name, target, {"source": source.message(), "handler": handlers.handler(handlers.ANALYSE)})

    @classmethod
    def specialise(cls, id: int, name: str, record: dict, blob: bytes, values: dict[str, int]) -> "Job":
        """A kernel's flow stage (`blob`) with its dynamic sizes fixed to `values` (no target)."""
        return cls(id, "specialise", name, None, {"record": record, "blob": blob, "values": values})

    @classmethod
    def build(cls, id: int, name: str, manifest: str, output: str, timeout: float) -> "Job":
        """The bundle a manifest describes, written to `output`, as `portkern build` writes it."""
        return cls(id, "build", name, None, {"manifest": manifest, "output": output}, timeout)

    @classmethod
    def opencl(cls, id: int, name: str, target: Target, record: dict, blobs: dict[str, bytes], config: str = "default") -> "Job":
        """An OpenCL program binary built (and launched once) by the device's driver, for the point `config` names."""
        return cls(id, "opencl", name, target, {"record": record, "blobs": blobs, "config": config})


@record(kw_only=True)
class Compiled:
    """How far a compile got, and what it cost."""

    #: "ok", or what went wrong: "error" (the compiler rejected it), "crash", "oom", "timeout", ...
    status: str = "ok"
    error: str = ""
    #: Parse (+ lowering to where configs are stamped), paid by a kernel's first job on a worker.
    setup_s: float = 0.0
    #: Clone + stamp, and compile, inside the worker.
    stamp_s: float = 0.0
    compile_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@record(kw_only=True)
class Result(Compiled):
    """A job's outcome: status "ok" with its `data`, or "error", "crash", "oom" or "timeout"."""

    id: int
    #: The `PortkernError` subclass the worker raised ("" for other failures).
    error_type: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    #: From handing out the job to its result, seen by the parent.
    wall_s: float = 0.0
    #: From the job's message read to its result ready, in the worker (the rest of `wall_s`: the messages).
    job_s: float = 0.0
    #: CPU time of the worker process (all its threads) over `job_s`.
    cpu_s: float = 0.0

    def error_for(self, name: str, target: Target | None = None) -> PortkernError:
        """The typed error this failure stands for: the worker's own type, else `FinalizeError`
        naming the kernel and the cause."""
        kind = getattr(errors, self.error_type, None) if self.error_type else None
        if isinstance(kind, type) and issubclass(kind, PortkernError) and self.status == "error":
            return kind(self.error)
        where = f" for {target.label}" if target is not None else ""
        return FinalizeError(f"finalising {name!r}{where} failed: {self.error}")


class _Worker:
    def __init__(self) -> None:
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "portkern.jit.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            start_new_session=True,
        )
        if self.process.stdin is None or self.process.stdout is None:  # both are PIPE above
            self.process.kill()
            raise FinalizeError("a compiler worker started without its pipes")
        #: The job channel: frames to the worker, and from it.
        self.stdin: IO[bytes] = self.process.stdin
        self.stdout: IO[bytes] = self.process.stdout
        self.ready = False
        self.job: Job | None = None
        self.spawned = time.perf_counter()
        self.deadline = self.spawned + START_TIMEOUT_S
        self.started = 0.0
        self.timeout = 0.0
        self.memory = 0
        #: Whether the job in hand may use the compiler's own threads (`compiler_threads`).
        self.threads = True
        self.done = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, job: Job, timeout: float, memory: int, threads: bool = True) -> bool:
        self.job, self.started, self.timeout, self.memory, self.threads = job, time.perf_counter(), timeout, memory, threads
        self.deadline = self.started + timeout
        target = target_message(job.target) if job.target is not None else None
        message = {"id": job.id, "kind": job.kind, "name": job.name, "memory": memory, "threads": threads, "target": target, **job.payload}
        try:
            write_frame(self.stdin, message)
            return True
        except (BrokenPipeError, OSError):
            return False

    def last_words(self) -> str:
        """The last line the worker printed on stderr."""
        try:
            self.log.seek(0, os.SEEK_END)
            size = self.log.tell()
            self.log.seek(max(0, size - 8192))
            return brief(self.log.read().decode(errors="replace"), last=True, limit=300)
        except OSError:
            return ""

    def kill(self) -> None:
        """Kill the process and reap it, without waiting for anything else (its pipes stay open:
        a thread may be reading them)."""
        try:
            self.process.kill()
            self.process.wait(timeout=5)  # a killed process ends at once; this only reaps it
        except (OSError, subprocess.TimeoutExpired):
            return
        scratch.remove_of(self.process.pid)

    def stop(self, kill: bool = False) -> None:
        try:
            if kill:
                self.process.kill()
            else:
                self.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        if self.process.returncode != 0:  # killed or crashed: its exit handlers did not run
            scratch.remove_of(self.process.pid)
        for stream in (self.stdin, self.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.log.close()


class Pool:
    """Worker processes for compiler jobs; `run` hands out jobs and collects their results."""

    def __init__(self, workers: int | None = None) -> None:
        self.size = max(1, workers or default_workers())
        self._workers: list[_Worker] = []
        self._start_failures = 0
        #: Held by `run` for as long as it runs jobs (a thread inside may wait on its workers).
        self._lock = threading.RLock()
        #: Held only for a step that never waits: a worker joining `_workers`, `_stopping` changing.
        self._members = threading.Lock()
        self._pid = os.getpid()
        #: Workers started so far (replacements included).
        self.spawned = 0
        self._stopping = False
        _pools.add(self)
        self._stopping = _exiting  # made while the process exits: it starts no worker

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """The worker processes alive now."""
        return [w.pid for w in self._workers]

    def close(self) -> None:
        """Stop every worker (a later `run` starts fresh ones, except once the process is exiting)."""
        with self._lock:
            with self._members:
                self._stopping = _exiting
                workers, self._workers = self._workers, []
            for worker in workers:
                worker.stop()

    def start(self, workers: int | None = None, wait_ready: bool = False) -> None:
        """Start workers up to `workers` (default: the pool's size): a caller that knows it will
        compile starts them while it does other work, and `run` hands them jobs once they are
        ready. `wait_ready`: return once every worker has its compiler loaded (FinalizeError if
        workers keep dying at start-up)."""
        with self._lock:
            if self._pid != os.getpid():
                self._workers, self._pid = [], os.getpid()
            for _ in range(max(1, workers or self.size) - len(self._workers)):
                if not self._spawn():
                    break
            while wait_ready and not self._stopping:
                starting = [w for w in self._workers if not w.ready]
                if not starting:
                    break
                readable = wait([w.stdout.fileno() for w in starting], timeout=max(0.0, min(w.deadline for w in starting) - time.perf_counter()))
                for worker in starting:
                    if worker.stdout.fileno() in readable:
                        self._receive(worker, lambda worker, result: None)
                    elif time.perf_counter() > worker.deadline:
                        self._start_failed(worker, f"a worker did not start within {START_TIMEOUT_S:g} s")

    def stop_now(self) -> None:
        """Kill and reap the workers without waiting for the jobs in hand or for a thread running
        them (those jobs, and those not yet handed out, end as "stopped"), and start none until
        `close`; for the process's exit while a job is in hand elsewhere."""
        with self._members:
            self._stopping = True
            workers = list(self._workers)
        for worker in workers:
            worker.kill()

    def _forked(self) -> None:
        """In a forked child: the workers and a lock a parent's thread may hold are the parent's."""
        self._lock = threading.RLock()
        self._members = threading.Lock()
        self._workers, self._pid, self._stopping = [], os.getpid(), False

    def _spawn(self) -> bool:
        """Start a worker; False (and none started) while the pool is stopping."""
        if self._stopping:
            return False
        worker = _Worker()
        with self._members:
            if not self._stopping:
                self._workers.append(worker)
                self.spawned += 1
                return True
        worker.stop(kill=True)  # `stop_now` came while it started: it never joins
        return False

    def _replace(self, worker: _Worker, kill: bool, spawn: bool = True) -> None:
        worker.stop(kill=kill)
        self._workers.remove(worker)
        if spawn:
            self._spawn()

    def run(
        self,
        jobs: Iterable[Job],
        on_start: Callable[[Job, int], None] | None = None,
        on_result: Callable[[Job, Result], None] | None = None,
        workers: int | None = None,
    ) -> dict[int, Result]:
        """Run every job on up to `workers` processes (default: the pool's size); results by
        job id. Failed jobs have a status other than "ok"; this never raises for a job. The
        largest jobs (`Job.size`) are handed out first, jobs of equal size in the order given,
        so that a long compile does not start last while the other workers idle."""
        todo = deque(sorted(jobs, key=lambda job: -job.size))
        if not todo:
            return {}
        if self._stopping:  # at exit: not even a wait for the lock of a run still ending
            return self._stopped(todo, {})
        timeout, memory = timeout_s(), memory_bytes()
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the workers are the parent's
                self._workers, self._pid = [], os.getpid()
            return self._run(todo, on_start, on_result, max(1, workers or self.size), timeout, memory)

    def _run(self, todo: deque, on_start, on_result, size: int, timeout: float, memory: int) -> dict[int, Result]:
        results: dict[int, Result] = {}
        for _ in range(min(size, len(todo)) - len(self._workers)):
            if not self._spawn():
                break

        def finish(worker: _Worker, result: Result) -> None:
            job = worker.job
            worker.job = None
            worker.done += 1
            result.wall_s = time.perf_counter() - worker.started
            results[result.id] = result
            if on_result is not None and job is not None:
                on_result(job, result)

        while todo or any(w.job for w in self._workers):
            if self._stopping and not any(w.job for w in self._workers):
                return self._stopped(todo, results)
            for worker in list(self._workers):
                if worker.ready and worker.job is None and worker.done >= RECYCLE_AFTER:
                    self._replace(worker, kill=False)
            for worker in list(self._workers[:size]):
                if worker.ready and worker.job is None and todo:
                    job = todo.popleft()
                    if on_start is not None:
                        on_start(job, worker.pid)
                    # the jobs that will run beside this one: those in hand, and those left for the run's other workers
                    beside = min(size, sum(w.job is not None for w in self._workers) + 1 + len(todo))
                    if not worker.send(job, job.timeout or timeout, memory, compiler_threads(beside)):
                        if self._stopping:  # killed by `stop_now`
                            finish(worker, Result(id=job.id, status="stopped", error="the process is exiting; the job was stopped"))
                        else:
                            finish(worker, self._died(worker, job))
                        self._replace(worker, kill=True)
            waiting = [w for w in self._workers if w.job or not w.ready]
            left = max(0.0, min(w.deadline for w in waiting) - time.perf_counter()) if waiting else 1.0
            polled = [(w, w.stdout.fileno()) for w in self._workers]
            readable = wait([fd for _, fd in polled], timeout=left)
            for worker, fd in polled:
                if fd in readable:
                    self._receive(worker, finish)
                elif time.perf_counter() > worker.deadline and (worker.job is not None or not worker.ready):
                    if worker.job is not None:
                        error = f"the compiler ran past {TIMEOUT_ENV}={worker.timeout:g} s; its worker was stopped"
                        finish(worker, Result(id=worker.job.id, status="timeout", error=error))
                        self._replace(worker, kill=True)
                    else:
                        self._start_failed(worker, f"a worker did not start within {START_TIMEOUT_S:g} s")
        return results

    @staticmethod
    def _stopped(todo: Iterable[Job], results: dict[int, Result]) -> dict[int, Result]:
        """`results`, with every job of `todo` ended as "stopped"."""
        for job in todo:
            results[job.id] = Result(id=job.id, status="stopped", error="the process is exiting; the job was not run")
        return results

    def _start_failed(self, worker: _Worker, why: str) -> None:
        self._start_failures += 1
        self._replace(worker, kill=True, spawn=self._start_failures < MAX_START_FAILURES)
        if self._start_failures >= MAX_START_FAILURES:
            self._start_failures = 0
            for other in list(self._workers):
                self._replace(other, kill=True, spawn=False)
            raise FinalizeError(f"compiler workers die at start-up: {why}")

    def _receive(self, worker: _Worker, finish) -> None:
        message = read_frame(worker.stdout)
        if message is None and self._stopping:  # killed by `stop_now`
            if worker.job is not None:
                finish(worker, Result(id=worker.job.id, status="stopped", error="the process is exiting; the job was stopped"))
            self._replace(worker, kill=True, spawn=False)
        elif message is None:  # the worker died, or broke the protocol
            if worker.job is not None:
                finish(worker, self._died(worker, worker.job))
                self._replace(worker, kill=True)
            elif not worker.ready:
                self._start_failed(worker, self._exit_message(worker))
            else:
                self._replace(worker, kill=True)
        elif "ready" in message and not worker.ready:
            worker.ready = True
            self._start_failures = 0
            log.debug("worker %d ready %.3f s after its start (CPU %.3f s)", worker.pid, time.perf_counter() - worker.spawned,
                      float(message.get("cpu_s") or 0.0))
        elif worker.job is not None and message.get("id") == worker.job.id:
            ok = bool(message.get("ok"))
            error_type = str(message.get("error_type") or "")
            status = "ok" if ok else ("oom" if error_type == "MemoryError" else "error")
            error = str(message.get("error") or "")
            if status == "oom":
                error, error_type = self._oom_message(worker), ""
            times = {k: float(message.get(k) or 0.0) for k in ("setup_s", "stamp_s", "compile_s", "job_s", "cpu_s")}
            data = {k: v for k, v in message.items() if k not in ("id", "ok", "error", "error_type", "retire", *times)}
            job = worker.job
            result = Result(id=job.id, status=status, error=error, error_type=error_type, data=data, **times)
            finish(worker, result)
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "%s job %d (%s) on worker %d: %s, %.3f s (in the worker %.3f s: setup %.3f, stamp %.3f, compile %.3f; "
                    "CPU %.3f s%s; messages %.3f s)", job.kind, job.id, job.name, worker.pid, status, result.wall_s, result.job_s,
                    result.setup_s, result.stamp_s, result.compile_s, result.cpu_s, "" if worker.threads else ", one thread",
                    result.wall_s - result.job_s,
                )
            if message.get("retire") or status == "oom":
                self._replace(worker, kill=True)
        else:
            self._replace(worker, kill=True)

    def _died(self, worker: _Worker, job: Job) -> Result:
        words = worker.last_words()
        # the signs an allocation refused under the address-space bound leaves (Python, libstdc++, LLVM's buffers, threads)
        signs = ("bad_alloc", "out of memory", "MemoryError", "Cannot allocate memory", "allocation failed", "pthread_create failed")
        if any(sign in words for sign in signs):
            return Result(id=job.id, status="oom", error=self._oom_message(worker))
        return Result(id=job.id, status="crash", error=self._exit_message(worker))

    def _oom_message(self, worker: _Worker) -> str:
        return f"the compiler ran out of memory ({MEMORY_ENV}={worker.memory} bytes); its worker was stopped"

    def _exit_message(self, worker: _Worker) -> str:
        try:
            code = worker.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            code = worker.process.wait()
        words = worker.last_words()
        how = f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exit code {code}"
        return f"the compiler crashed ({how})" + (f": {words}" if words else "")


def cores() -> int:
    """CPU cores this process may use (IREE's `local-task` runs one worker thread per core)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_workers() -> int:
    """One worker per core (a compile beside others runs on one thread: `compiler_threads`)."""
    return max(1, min(cores(), 8))


def compiler_threads(running: int) -> bool:
    """Whether a job may use the compiler's own threads (MLIR's, for IREE's parallel passes and
    code generation) when `running` jobs, itself included, run at once: only while they leave a
    core free beside each; jobs that fill the cores compile on one thread each. The code is the
    same either way."""
    return 2 * running <= cores()


_shared: Pool | None = None
_shared_lock = threading.Lock()
_pools: "weakref.WeakSet[Pool]" = weakref.WeakSet()
#: The process is exiting: no pool starts a worker again.
_exiting = False


def _after_fork_in_child() -> None:
    global _shared_lock, _exiting
    _shared_lock = threading.Lock()
    _exiting = False
    for pool in list(_pools):
        pool._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _stop_at_exit() -> None:
    """At exit: every pool's workers killed and reaped, and none started again."""
    global _exiting
    _exiting = True
    background.abandon()  # first: a background build whose job is stopped below is abandoned, not failed
    for pool in list(_pools):
        if pool._pid == os.getpid():
            pool.stop_now()


atexit.register(_stop_at_exit)


def shared_pool() -> Pool:
    """The process's pool (finalisation and tuning share it); its workers stop at exit."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Pool()
        return _shared
