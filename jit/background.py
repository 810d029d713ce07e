"""Background specialisation: a kernel served from baseline code gets its exact code later.

When `kernel()` serves code built for an ISA level or an older CPU model (origin
"baseline"), a `Specialisation` asks the native-code service, on a thread of its own,
for the code of the exact target: a worker of the one pool compiles it and the cache
keeps it. When it is ready the kernel switches executables between two calls. Its setup
(the pool's module, the process's shared pool, a worker's start) begins when the kernel's
first call has returned, or when the kernel is waited for, so that the caller's first result
does not share the interpreter with it, and a process that never calls the kernel starts no
worker.
`PORTKERN_BACKGROUND=0` turns this off (`kernel()` then finalises before it returns).

At exit, pending specialisations are abandoned: the pool's workers are killed (no
compiler outlives the process), their jobs end as "stopped", nothing is installed, and
the exit waits for none of their threads (the runtime refuses their loads from then on,
`jit/runtime.py`). In a forked child, a parent's specialisation is not there: the
child's kernel keeps its baseline and `wait` says so.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Callable, Generic, Protocol, TypeVar

from portkern.base import settings
from portkern.base.errors import FinalizeError, PortkernError
from portkern.base.logs import logger

log = logger(__name__)

ENV = settings.BACKGROUND

T = TypeVar("T")


class Pool(Protocol):
    """What this module needs of a worker pool (`jit.workers.Pool`, which calls `abandon` at exit)."""

    def stop_now(self) -> None: ...


class Specialisation(Generic[T]):
    """`work()` on a thread of its own, then `install(result)` unless the process is exiting."""

    def __init__(self, name: str, pool: Callable[[], Pool], work: Callable[[], T], install: Callable[[T], None]) -> None:
        """`pool()`: the pool `work` compiles on, asked for on the thread before `work` runs."""
        self.name = name
        #: The typed error that stopped it, if any (the kernel then keeps its baseline).
        self.error: PortkernError | None = None
        self._pool: Pool | None = None
        self._pid = os.getpid()
        self._finished = threading.Event()
        self._go = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(pool, work, install), name=f"portkern-specialise-{name}", daemon=True)
        _watch(self)
        self._thread.start()

    def _run(self, pool: Callable[[], Pool], work: Callable[[], T], install: Callable[[T], None]) -> None:
        try:
            self._go.wait()
            if _exiting.is_set():
                return
            found = pool()
            with _lock:  # `abandon` either sees this pool or is seen here
                if _exiting.is_set():
                    return
                self._pool = found
            result = work()
            if not _exiting.is_set():
                install(result)
        except PortkernError as exc:
            self.error = exc
        except Exception as exc:  # noqa: BLE001 - a thread's boundary: nothing escapes a background thread
            self.error = FinalizeError(f"background finalisation of {self.name!r} failed: {type(exc).__name__}: {exc}")
        finally:
            if self.error is not None and not _exiting.is_set():
                log.warning("background finalisation of %r failed; its baseline code keeps serving (%s)", self.name, self.error)
            self._finished.set()
            with _lock:
                _pending.discard(self)

    @property
    def done(self) -> bool:
        """Finished (installed, or failed with `error`) in this process."""
        return self._pid == os.getpid() and self._finished.is_set()

    def start(self) -> None:
        """Let the build begin (the kernel's first call has returned; later calls find it begun)."""
        if not self._go.is_set():
            self._go.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until it has finished; False on timeout, and at once in a forked child."""
        if self._pid != os.getpid():
            return False
        self._go.set()
        return self._finished.wait(timeout)


_lock = threading.Lock()
_pending: set[Specialisation] = set()
_exiting = threading.Event()


def _watch(job: Specialisation) -> None:
    with _lock:
        _pending.add(job)


def abandon() -> None:
    """At exit: nothing pending is installed any more, and its workers are killed; its threads
    are not waited for (each may be waiting on a lock or a worker). Run by whichever exit handler
    comes first, this module's or the worker pools' (`jit.workers`), so that no job stopped there
    counts as a failure here."""
    _exiting.set()
    with _lock:
        mine = [job for job in _pending if job._pid == os.getpid()]
    for job in mine:  # a build not begun returns at once
        job._go.set()
    pools = [job._pool for job in mine if job._pool is not None]
    for pool in {id(pool): pool for pool in pools}.values():
        pool.stop_now()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _pending.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(abandon)
