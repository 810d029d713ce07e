"""Running native IREE code (vmfb) on NumPy arrays, from any thread and in forked children.

Threads: the runtime releases the GIL while a call runs. On `local-task` a lone
call runs on the process's task executor (one worker per core) when that pays: the
kernel takes `SMALL_CALL_S` or more on the calling thread, and its first lone calls
on the executor ran at least `EXECUTOR_GAIN` times faster than on the calling thread
(spreading a call over cores costs CPU time: a 1 ms GEMM took 1.8 ms of CPU on two
executor workers against 1.0 ms inline). Otherwise, and always while calls overlap
(and for `OVERLAP_WINDOW_S` after), calls run on the calling thread (`local-sync`):
concurrent callers then each keep a core busy rather than queue on, or preempt, the
executor. A forked child (a pre-fork server's worker: its siblings share the cores) runs
every call on the calling thread. On the CPU a call with NumPy arrays is one runtime call (`jit/vmcall.py`), which
releases the GIL once, for the invocation. Of a short call, much is still Python work:
side by side, threads pass the GIL to and fro with a wake-up each time (two threads made
half the calls of one with a 30 us kernel, while a 90 us one, two thirds native work, made
1.8 times as many). So calls shorter than `SMALL_CALL_S` take turns at the process's gate
(`jit/gate.py`: one thread at a time runs them back to back, the others sleep off the GIL
until their turn) when their native part is shorter than two GIL hand-offs; longer ones
take turns or run side by side, whichever made more calls a second when the kernel's own
calls tried both. A call is judged short or long on the calling thread's own time
(`time.thread_time`), so a kernel first called from busy threads is judged as if alone. On
a free-threaded interpreter (no GIL) calls always run side by side.

Fork: runtime objects inherited from the parent are never used nor released in a
child (their worker threads do not exist there); each executable loads again, from
the native code it holds, at its first call in the child.

Exit: once the interpreter starts to shut down (its exit handlers run), the runtime takes
no new call, load or upload (`ExitingError`), and the exit waits for those in flight to
return, so that no thread (a daemon thread still calling kernels) is inside the runtime when
it is torn down: a thread that comes back from the runtime into a finalising interpreter
aborts the process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Iterator

import numpy as np

from portkern.base.errors import DeviceError, ExitingError, ForkError, KernelRuntimeError, brief
from portkern.jit.gate import TURNS, Choice, Gate, Turns, choose
from portkern.jit.vmcall import LOCAL_DRIVERS, VmCall, distinct, host_array
from portkern.portable.interpreter import gil_enabled

if TYPE_CHECKING:
    from portkern.jit.parameters import KernelParameters

#: The driver that runs a `local-task` call on the calling thread.
INLINE = {"local-task": "local-sync"}
#: A kernel whose inline call takes less than this never goes to the task executor.
SMALL_CALL_S = 2e-4
#: Inline calls timed before a kernel is judged small or not.
INLINE_PROBES = 3
#: Lone calls timed on the task executor (after the inline probes) before it is chosen or not.
EXECUTOR_PROBES = 3
#: Lone calls use the task executor only when it runs them this many times faster than inline.
EXECUTOR_GAIN = 1.25
#: After two calls overlapped, every call runs inline for this long.
OVERLAP_WINDOW_S = 0.1
#: Drivers started afresh in a forked child; others (GPU drivers) do not survive fork.
FORK_SAFE = ("local-task", "local-sync")
#: Longest the exit waits for runtime calls in flight to return (a call always returns; this
#: bounds only a kernel that runs far longer than any call should).
EXIT_WAIT_S = 60.0


class _Process:
    """This process's runtime state; a forked child starts a fresh one."""

    def __init__(self, parent: "_Process | None" = None) -> None:
        self.lock = threading.RLock()
        self.configs: dict[str, object] = {}
        self.traffic = _Traffic()
        #: Runtime calls in flight, and whether the runtime still takes calls (not at exit).
        self.calls = _Calls()
        #: Small calls from several threads take turns here (see `Executable.__call__`).
        self.gate = Gate()
        #: Drivers a parent process started before it forked this one.
        self.inherited: frozenset[str] = frozenset(parent.configs).union(parent.inherited) if parent else frozenset()
        #: A forked child: one of a pre-fork server's workers, which share the cores, so its
        #: lone calls never spread over them on the task executor (two children doing so
        #: made 1.1 times the calls of one, against 2.0 times on their own threads).
        self.forked = parent is not None


class _Traffic:
    """Calls in flight in this process, and when two last overlapped."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.overlap_at = -float("inf")

    def enter(self) -> bool:
        """Count a call in; True when it runs alone and no calls overlapped lately."""
        now = time.monotonic()
        with self.lock:
            self.in_flight += 1
            if self.in_flight > 1:
                self.overlap_at = now
            return now - self.overlap_at > OVERLAP_WINDOW_S

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1


class _Calls:
    """Runtime work in flight in this process (calls, loads, uploads; each inside `with calls:`);
    none starts after `close`."""

    # No lock on a call's path: `enter` counts itself in, then looks whether the runtime is
    # closed; `close` marks it closed, then looks whether any is in. Whichever comes second sees
    # the other (list appends and pops are atomic), so no work starts unseen after `close`.

    def __init__(self) -> None:
        #: One item per piece of work in flight.
        self._inside: list[None] = []
        self._closed = False
        self._idle = threading.Event()

    def __enter__(self) -> None:
        """Count one in; ExitingError once the process is exiting."""
        self._inside.append(None)
        if self._closed:
            self.__exit__()
            raise ExitingError("the process is exiting: the IREE runtime takes no more calls")

    def __exit__(self, *exc) -> None:
        self._inside.pop()
        if self._closed and not self._inside:
            self._idle.set()

    def close(self, timeout: float) -> bool:
        """Take no more work; wait (at most `timeout` s) until none is in flight. True when none is."""
        self._closed = True
        return not self._inside or self._idle.wait(timeout)


_process = _Process()
#: Runtime objects inherited across fork: kept referenced, so that no destructor
#: waits in the child for the parent's worker threads.
_inherited: list[object] = []


def _after_fork_in_child() -> None:
    global _process
    _inherited.append(_process)
    _process = _Process(_process)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _close_at_exit() -> None:
    """At exit, before the runtime is torn down: no new runtime work, and none left in flight."""
    _process.calls.close(EXIT_WAIT_S)


_exit_hook = False


def runtime_config(driver: str):
    """One IREE runtime config (instance + device) per driver per process, on a driver of
    its own (IREE's shared driver cache would hand a forked child its parent's executor)."""
    global _exit_hook
    process = _process
    with process.lock:
        if driver not in process.configs:
            import iree.runtime as rt
            from iree.runtime import _binding

            if not _exit_hook:  # registered after the runtime's import: it runs before anything the runtime registered
                atexit.register(_close_at_exit)
                _exit_hook = True

            if driver in process.inherited and driver not in FORK_SAFE:
                raise ForkError(
                    f"the IREE {driver!r} driver was started before this process was forked and does not work "
                    "after fork(); start worker processes with the 'spawn' or 'forkserver' method, "
                    "or fork before the first kernel is loaded on it"
                )
            try:
                process.configs[driver] = rt.Config(device=_binding.create_hal_driver(driver).create_default_device())
            except (RuntimeError, ValueError) as exc:
                # rt.Config hides the driver's own message in __cause__.
                cause = brief(exc.__cause__ or exc, lines=None, sep=" ", limit=None)
                raise DeviceError(f"IREE runtime driver {driver!r} is not usable here: {cause[:500]}") from None
        return process.configs[driver]


class _Loaded:
    """A vmfb loaded on one driver in one process (with its parameters, read from their mapping)."""

    def __init__(self, vmfb: bytes, entry: str, driver: str, parameters: "KernelParameters | None" = None) -> None:
        import iree.runtime as rt

        self.process = _process
        config = runtime_config(driver)
        try:
            self.context = rt.SystemContext(config=config)
            if parameters is not None:
                self.context.add_vm_module(_parameters_module(self.context.instance, parameters))
            module = rt.VmModule.copy_buffer(self.context.instance, vmfb)
            self.context.add_vm_module(module)
            self.function = self.context.modules[module.name][entry]
        except (RuntimeError, ValueError, KeyError) as exc:
            raise KernelRuntimeError(f"cannot load native code for {entry!r}: {exc}") from None
        #: NumPy in, NumPy out in one runtime call (on drivers whose device memory is host memory).
        self.call = VmCall(entry, self.context.vm_context, self.function.vm_function, config.device) if driver in LOCAL_DRIVERS else None


def _parameters_module(instance, parameters: "KernelParameters"):
    """IREE's io-parameters module serving a kernel's parameters from the mapped bundle file
    (one provider per scope; nothing is copied here)."""
    import iree.runtime as rt

    handle = rt.FileHandle.wrap_memory(parameters.buffer, readable=True, writable=False)
    scopes = parameters.scopes()
    providers = []
    for scope, entries in scopes.items():
        index = rt.ParameterIndex()
        for name, offset, size in entries:
            index.add_from_file_handle(name, handle, size, offset)
        providers.append(index.create_provider(scope=scope))
    return rt.create_io_parameters_module(instance, *providers)


class Executable:
    """A loaded vmfb whose entry function takes and returns NumPy arrays; `parameters`: the
    named parameters (weights) it reads, from their mapped bundle file."""

    def __init__(self, vmfb: bytes, entry: str, driver: str = "local-task", parameters: "KernelParameters | None" = None) -> None:
        self.entry = entry
        self.driver = driver
        self.parameters = parameters
        self._vmfb = vmfb
        self._loaded: dict[str, _Loaded] = {}
        self._inline_s = float("inf")
        self._inline_probes = 0
        #: For calls that always run inline (set once the probes found them short): whether
        #: they take turns at the gate (`TURNS`), or run side by side (None), or try both (`Choice`).
        self._choice: Choice | Turns | None = None
        self._executor_s = float("inf")
        self._executor_probes = 0
        with _process.calls:
            self._load(driver)

    def _load(self, driver: str) -> _Loaded:
        """The vmfb loaded on `driver` in this process (loaded again after fork)."""
        loaded = self._loaded.get(driver)
        if loaded is not None and loaded.process is _process:
            return loaded
        with _process.lock:
            loaded = self._loaded.get(driver)
            if loaded is None or loaded.process is not _process:
                if loaded is not None:
                    _inherited.append(loaded)
                loaded = self._loaded[driver] = _Loaded(self._vmfb, self.entry, driver, self.parameters)
            return loaded

    def upload(self, arrays: list[np.ndarray]) -> list:
        """The arrays copied to this executable's device once, for repeated calls (benchmarks)."""
        import iree.runtime as rt

        with _process.calls:
            device = self._load(self.driver).context.config.device
            return [rt.asdevicearray(device, a) for a in arrays]

    def invoke(self, *arrays):
        """Run on device arrays (from `upload`) or NumPy arrays; results stay on the device.

        A Ctrl-C during the call is raised as KeyboardInterrupt once the call returns.
        """
        with _process.calls:
            return self._invoke(self._load(self.driver), arrays)

    def _invoke(self, loaded: _Loaded, arrays):
        with interrupts_deferred():
            try:
                return loaded.function(*arrays)
            except (RuntimeError, ValueError, IndexError) as exc:  # IndexError: IREE's OUT_OF_RANGE
                raise KernelRuntimeError(f"{self.entry}: {exc}") from None

    def _host_call(self, driver: str, arrays, contended: bool = False, timed: bool = False) -> list[np.ndarray]:
        """NumPy arrays (or device arrays from `upload`) in, NumPy arrays out, on `driver`;
        `contended`: other threads' calls overlap this one; `timed`: time its native part."""
        loaded = self._load(driver)
        if loaded.call is not None and all(type(array) is np.ndarray for array in arrays):
            return loaded.call(arrays, contended, timed)
        return self._to_host(self._invoke(loaded, arrays))

    def _run(self, arrays) -> list[np.ndarray]:
        """Run NumPy arrays on the task executor when the call is alone and that pays, else inline."""
        inline = INLINE.get(self.driver)
        if inline is None:
            return self._host_call(self.driver, arrays)
        traffic = _process.traffic
        alone = traffic.enter()
        try:
            if alone and not _process.forked and self._inline_probes >= INLINE_PROBES and self._inline_s >= SMALL_CALL_S:
                if self._executor_probes < EXECUTOR_PROBES:
                    start = time.perf_counter()
                    results = self._host_call(self.driver, arrays)
                    self._executor_s = min(self._executor_s, time.perf_counter() - start)
                    self._executor_probes += 1
                    return results
                if self._executor_s * EXECUTOR_GAIN <= self._inline_s:
                    return self._host_call(self.driver, arrays)
            probe = self._inline_probes < INLINE_PROBES
            # The calling thread's own time: other threads' calls, and waits for the GIL, do
            # not count (a kernel first called from busy threads would pass for a large one).
            start = time.thread_time() if probe else 0.0
            results = self._host_call(inline, arrays, not alone, probe)
            if probe:
                self._inline_s = min(self._inline_s, time.thread_time() - start)
                self._inline_probes += 1
                if self._inline_probes >= INLINE_PROBES and self._inline_s < SMALL_CALL_S and gil_enabled():
                    call = self._load(inline).call
                    self._choice = choose(call.native_s if call is not None and call.native_s < self._inline_s else None)
            return results
        finally:
            traffic.leave()

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        with _process.calls:
            return self._call(arrays)

    def _call(self, arrays) -> list[np.ndarray]:
        choice = self._choice
        if choice is None:
            return self._run(arrays)
        if choice is TURNS:
            return self._take_turn(arrays)
        start = time.monotonic()
        if not choice.gated:
            callers = _process.traffic.in_flight + 1
            try:
                return self._run(arrays)
            finally:
                choice.record(start, time.monotonic(), callers)
        try:
            return self._take_turn(arrays)
        finally:
            choice.record(start, time.monotonic(), _process.gate.waiting + 1)

    def _take_turn(self, arrays) -> list[np.ndarray]:
        """Run inline (a call this short never pays its way on the task executor), one thread
        at a time through the process's gate."""
        gate = _process.gate
        gate.enter(self._inline_s)
        try:
            return self._host_call(INLINE[self.driver], arrays)
        finally:
            gate.leave()

    @staticmethod
    def _to_host(results) -> list[np.ndarray]:
        if results is None:
            return []
        if not isinstance(results, (tuple, list)):
            results = (results,)
        return distinct([_host(r) for r in results])


def _host(result) -> np.ndarray:
    """A runtime result (a DeviceArray, or a plain value) on the host, kept valid by every view of it."""
    if not hasattr(result, "to_host"):
        return np.asarray(result)
    return host_array(result.to_host())


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT while the body runs, then deliver it to the handler that was in place.

    IREE's argument and result conversion runs Python code that turns an
    interrupt raised inside it into a ValueError; holding the signal keeps an
    interrupt an interrupt. Only the main thread receives signals, so other
    threads (and a handler installed outside Python, which could not be put
    back) run the body as it is.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            signal.raise_signal(signal.SIGINT)
