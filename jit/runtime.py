"""Running native IREE code (vmfb) on NumPy arrays."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

import numpy as np

from portkern.errors import DeviceError, KernelRuntimeError

_configs: dict[str, object] = {}
_configs_lock = threading.Lock()


def runtime_config(driver: str):
    """One IREE runtime config (instance + device) per driver per process."""
    with _configs_lock:
        if driver not in _configs:
            import iree.runtime as rt

            try:
                _configs[driver] = rt.Config(driver)
            except (RuntimeError, ValueError) as exc:
                # rt.Config hides the driver's own message in __cause__.
                cause = " ".join(str(exc.__cause__ or exc).split())
                raise DeviceError(f"IREE runtime driver {driver!r} is not usable here: {cause[:500]}") from None
        return _configs[driver]


class Executable:
    """A loaded vmfb whose entry function takes and returns NumPy arrays."""

    def __init__(self, vmfb: bytes, entry: str, driver: str = "local-task") -> None:
        import iree.runtime as rt

        config = runtime_config(driver)
        self._device = config.device
        try:
            self._context = rt.SystemContext(config=config)
            module = rt.VmModule.copy_buffer(self._context.instance, vmfb)
            self._context.add_vm_module(module)
            self._function = self._context.modules[module.name][entry]
        except (RuntimeError, ValueError, KeyError) as exc:
            raise KernelRuntimeError(f"cannot load native code for {entry!r}: {exc}") from None
        self.entry = entry
        self.driver = driver

    def upload(self, arrays: list[np.ndarray]) -> list:
        """The arrays copied to this executable's device once, for repeated calls (benchmarks)."""
        import iree.runtime as rt

        return [rt.asdevicearray(self._context.config.device, a) for a in arrays]

    def invoke(self, *arrays):
        """Run on device arrays (from `upload`) or NumPy arrays; results stay on the device.

        A Ctrl-C during the call is raised as KeyboardInterrupt once the call returns.
        """
        with interrupts_deferred():
            try:
                return self._function(*arrays)
            except (RuntimeError, ValueError) as exc:
                raise KernelRuntimeError(f"{self.entry}: {exc}") from None

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        results = self.invoke(*arrays)
        if results is None:
            return []
        if not isinstance(results, (tuple, list)):
            results = (results,)
        return distinct([np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results])


def distinct(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The arrays, each one copied if it shares memory with an earlier one."""
    out: list[np.ndarray] = []
    for array in arrays:
        out.append(array.copy() if any(np.may_share_memory(array, seen) for seen in out) else array)
    return out


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
