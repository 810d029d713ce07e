"""Running native IREE code (vmfb) on NumPy arrays, from any thread and in forked children.

Where a CPU call runs (`local-task` kernels; `call_driver`): on the calling thread (IREE's
`local-sync` driver), unless its arguments and the parameters (weights) it reads total
`PORTKERN_EXECUTOR_MIN_BYTES` or more (`settings.executor_min_bytes`, read when the executable
is made), or its kernel's tuning found its calls faster there and the setting is not given:
such a call runs on the process's task executor, spread over the cores. In a forked
child (a pre-fork server's worker, whose siblings share the cores) every call runs on the
calling thread. The rule reads sizes, the setting, the kernel's stored tuning choice and
whether the process was forked, nothing timed at call time, so the same call always runs the same way. The runtime releases the GIL while a call runs, so threads calling kernels
whose native work outweighs their Python work keep several cores busy; calls that are mostly
Python work do not speed up with threads, and processes scale them (docs/serving.md). On the
CPU a call with NumPy arrays is one runtime call (`jit/vmcall.py`).

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
import ctypes
import os
import threading
import weakref
from typing import TYPE_CHECKING, Iterator

import numpy as np

from portkern.base import settings
from portkern.base.errors import DeviceError, ExitingError, ForkError, KernelRuntimeError, one_line
from portkern.jit.vmcall import GPU_DRIVERS, LOCAL_DRIVERS, VmCall, distinct, host_array, native_runtime

if TYPE_CHECKING:
    from portkern.jit.gpucall import GpuCall
    from portkern.jit.parameters import KernelParameters

#: The driver that runs a `local-task` call on the calling thread.
INLINE = {"local-task": "local-sync"}
#: Drivers started afresh in a forked child; others (GPU drivers) do not survive fork.
FORK_SAFE = ("local-task", "local-sync")
#: Longest the exit waits for runtime calls in flight to return (a call always returns; this
#: bounds only a kernel that runs far longer than any call should).
EXIT_WAIT_S = 60.0


class _Process:
    """This process's runtime state; a forked child starts a fresh one."""

    def __init__(self, parent: "_Process | None" = None) -> None:
        self.lock = threading.RLock()
        self.configs: dict[str, RuntimeConfig] = {}
        #: Runtime calls in flight, and whether the runtime still takes calls (not at exit).
        self.calls = _Calls()
        #: Drivers a parent process started before it forked this one.
        self.inherited: frozenset[str] = frozenset(parent.configs).union(parent.inherited) if parent else frozenset()
        #: A forked child: one of a pre-fork server's workers, which share the cores, so its
        #: calls never spread over them on the task executor.
        self.forked = parent is not None
        #: What this process loaded (held weakly): a forked child never releases it.
        self.loaded: weakref.WeakSet[_Loaded] = weakref.WeakSet()


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


def _after_fork_in_child() -> None:
    """A fresh runtime state for the child. The parent's runtime objects (its drivers, devices
    and loaded code) are never released here, not even at exit: their destructors wait for
    the parent's worker threads, which do not exist in a child (a child that exited normally
    hung in them)."""
    global _process
    parent = _process
    _process = _Process(parent)
    if not parent.configs:
        return  # the parent started no driver: nothing of the runtime to keep
    for kept in (parent, *parent.loaded):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(kept))
    native_runtime().disable_leak_checker()  # or the kept objects are listed as leaks at exit


os.register_at_fork(after_in_child=_after_fork_in_child)


def _close_at_exit() -> None:
    """At exit, before the runtime is torn down: no new runtime work, and none left in flight.
    Runtime objects the caller still holds then (a torch result sharing a result buffer's memory)
    are released with the process, not reported as leaks."""
    _process.calls.close(EXIT_WAIT_S)
    native_runtime().disable_leak_checker()


_exit_hook = False


class RuntimeConfig:
    """One driver's device in this process, with a VM instance and the HAL module over them
    (what `iree.runtime.Config` holds)."""

    def __init__(self, driver: str) -> None:
        rt = native_runtime()
        self.driver = driver
        self.device = rt.create_hal_driver(driver).create_default_device()
        self.vm_instance = rt.VmInstance()
        self.hal_module = rt.create_hal_module(self.vm_instance, self.device)


def runtime_config(driver: str) -> RuntimeConfig:
    """One IREE runtime config (instance + device) per driver per process, on a driver of
    its own (IREE's shared driver cache would hand a forked child its parent's executor)."""
    global _exit_hook
    process = _process
    with process.lock:
        if driver not in process.configs:
            native_runtime()
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
                process.configs[driver] = RuntimeConfig(driver)
            except (RuntimeError, ValueError) as exc:
                cause = one_line(exc.__cause__ or exc)
                raise DeviceError(f"IREE runtime driver {driver!r} is not usable here: {cause[:500]}") from None
        return process.configs[driver]


class _Loaded:
    """A vmfb loaded on one driver in one process (with its parameters, read from their mapping)."""

    def __init__(self, vmfb: bytes, entry: str, driver: str, parameters: "KernelParameters | None" = None) -> None:
        rt = native_runtime()
        self.process = _process
        _process.loaded.add(self)
        self.config = config = runtime_config(driver)
        self.entry = entry
        try:
            modules = [config.hal_module]
            if parameters is not None:
                modules.append(_parameters_module(rt, config.vm_instance, parameters))
            module = rt.VmModule.copy_buffer(config.vm_instance, vmfb)
            modules.append(module)
            self.vm_context = rt.VmContext(config.vm_instance, modules=modules)
            self.vm_function = module.lookup_function(entry)
            if self.vm_function is None:
                raise KeyError(f"the module has no function {entry!r}")
        except (RuntimeError, ValueError, KeyError) as exc:
            raise KernelRuntimeError(f"cannot load native code for {entry!r}: {exc}") from None
        self._invoker = None
        #: NumPy in, NumPy out in one runtime call (CPU drivers: in place; GPU drivers: through kept staging buffers).
        self.call: "VmCall | GpuCall | None" = None
        if driver in LOCAL_DRIVERS:
            self.call = VmCall(entry, self.vm_context, self.vm_function, config.device)
        elif driver in GPU_DRIVERS:
            from portkern.jit.gpucall import GpuCall  # loaded with the first GPU kernel

            self.call = GpuCall(entry, self.vm_context, self.vm_function, config.device)

    @property
    def function(self):
        """The entry function with `iree.runtime`'s argument and result conversion (device
        arrays, other array types); `iree.runtime` is imported at its first use."""
        if self._invoker is None:
            from iree.runtime import FunctionInvoker

            self._invoker = FunctionInvoker(self.vm_context, self.config.device, self.vm_function)
        return self._invoker


def _parameters_module(rt, instance, parameters: "KernelParameters"):
    """IREE's io-parameters module serving a kernel's parameters from the bundle's bytes in
    memory (`jit.parameters`: portkern's mapped copy, or the file read; one provider per scope; nothing is copied here)."""
    handle = rt.FileHandle.wrap_memory(parameters.buffer, readable=True, writable=False)
    scopes = parameters.scopes()
    providers = []
    for scope, entries in scopes.items():
        index = rt.ParameterIndex()
        for name, offset, size in entries:
            index.add_from_file_handle(name, handle, size, offset)
        providers.append(index.create_provider(scope=scope))
    return rt.create_io_parameters_module(instance, *providers)


def call_driver(driver: str, nbytes: int, min_bytes: int | None = None) -> str:
    """The driver a call that reads `nbytes` (its arguments and the parameters of its kernel)
    runs on, for code loaded on `driver`: the calling thread's (`local-sync`) for `local-task`
    code unless `nbytes` reaches `min_bytes` (default: `PORTKERN_EXECUTOR_MIN_BYTES`) outside a
    forked child; any other driver as it is."""
    inline = INLINE.get(driver)
    if inline is None or _process.forked:
        return inline or driver
    limit = settings.executor_min_bytes() if min_bytes is None else min_bytes
    return driver if nbytes >= limit else inline


def executor_min_bytes(executor: bool = False) -> int:
    """The size from which a call runs on the task executor: `PORTKERN_EXECUTOR_MIN_BYTES`, or 0
    for a kernel whose tuning found its calls faster there (`executor`) unless the setting is given."""
    if executor and not settings.given(settings.EXECUTOR_MIN_BYTES).given:
        return 0
    return settings.executor_min_bytes()


class Executable:
    """A loaded vmfb whose entry function takes and returns NumPy arrays; `parameters`: the
    named parameters (weights) it reads, from their bundle's bytes in memory; `executor`: its
    kernel's tuning found its calls faster on the task executor (`executor_min_bytes`)."""

    def __init__(
        self, vmfb: bytes, entry: str, driver: str = "local-task", parameters: "KernelParameters | None" = None, executor: bool = False,
    ) -> None:
        self.entry = entry
        self.driver = driver
        self.parameters = parameters
        self._vmfb = vmfb
        self._loaded: dict[str, _Loaded] = {}
        #: Calls whose arguments and parameters total this many bytes or more run on the task executor.
        self.executor_min_bytes = executor_min_bytes(executor)
        #: Bytes of the parameters every call reads.
        self.weight_bytes = parameters.nbytes if parameters is not None else 0
        with _process.calls:  # loaded where most calls run: a CPU kernel's small calls run on the calling thread
            self._load(driver if self.executor_min_bytes == 0 else INLINE.get(driver, driver))

    def _load(self, driver: str) -> _Loaded:
        """The vmfb loaded on `driver` in this process (loaded again after fork)."""
        loaded = self._loaded.get(driver)
        if loaded is not None and loaded.process is _process:
            return loaded
        with _process.lock:
            loaded = self._loaded.get(driver)
            if loaded is None or loaded.process is not _process:
                loaded = self._loaded[driver] = _Loaded(self._vmfb, self.entry, driver, self.parameters)
            return loaded

    def upload(self, arrays: list[np.ndarray]) -> list:
        """The arrays copied to this executable's device once, for repeated calls (benchmarks)."""
        import iree.runtime as rt

        with _process.calls:
            device = self._load(self.driver).config.device
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

    @property
    def hal_device(self):
        """The IREE device this executable's code runs on (on its own driver)."""
        with _process.calls:
            return self._load(self.driver).config.device

    def call_views(self, views: list, results: int) -> list:
        """Run on IREE buffer views already on this executable's device (framework tensors imported
        in place, `jit.device_tensors`); its `results` results as buffer views on the device."""
        hal = native_runtime()
        with _process.calls:
            loaded = self._load(self.driver)
            args = hal.VmVariantList(len(views))
            for view in views:
                args.push_ref(view.ref)
            out = hal.VmVariantList(results)
            with interrupts_deferred():
                try:
                    loaded.vm_context.invoke(loaded.vm_function, args, out)
                except (RuntimeError, ValueError, IndexError) as exc:  # IndexError: IREE's OUT_OF_RANGE
                    raise KernelRuntimeError(f"{self.entry}: {exc}") from None
            return [out.get_as_object(index, hal.HalBufferView) for index in range(len(out))]

    def driver_for(self, arrays) -> str:
        """The driver a call on these arrays runs on (`call_driver`)."""
        size = self.weight_bytes + sum(getattr(array, "nbytes", 0) for array in arrays)
        return call_driver(self.driver, size, self.executor_min_bytes)

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Run on NumPy arrays (or device arrays from `upload`); the results as NumPy arrays."""
        with _process.calls:
            loaded = self._load(self.driver_for(arrays))
            if loaded.call is not None and all(type(array) is np.ndarray for array in arrays):
                return loaded.call(arrays)
            return self._to_host(self._invoke(loaded, arrays))

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
    import signal  # (calls through `iree.runtime`'s conversion only: a NumPy call on the CPU never needs it)

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
