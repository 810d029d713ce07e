"""What finalisation needs to know about a device: fingerprint, compile flags, runtime."""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping

from portkern.base.errors import CompileError, DeviceError
from portkern.base.records import frozen_record
from portkern.cache.device import DeviceFingerprint
from portkern.cache.keys import probe_key
from portkern.portable.producer import installed_compiler

if TYPE_CHECKING:
    from portkern.cache.store import Store

#: A module with one dispatch: lowered to `preprocessing`, its device global already
#: carries the `#hal.executable.target` IREE resolves for the compiler flags (the same
#: text the dispatch's variant gets at `executable-sources`, in a tenth of the time).
PROBE_MODULE = """func.func @probe(%a: tensor<16xf32>, %b: tensor<16xf32>) -> tensor<16xf32> {
  %0 = arith.addf %a, %b : tensor<16xf32>
  return %0 : tensor<16xf32>
}"""

_memo: dict[str, dict] = {}
_memo_lock = threading.Lock()


@frozen_record
class Target:
    """A device to finalise for, and whether this host can run the result."""

    fingerprint: DeviceFingerprint
    #: Compiler flags that select this target (for IREE: the HAL target flags).
    flags: tuple[str, ...]
    #: The bundle stage family to finalise from ("any": the device-independent stage).
    family: str = "any"
    #: The IREE runtime driver that runs the code ("local-task", "hip", "cuda"), or "opencl".
    driver: str = "local-task"
    #: Whether a device of this kind is present here to run the code.
    runnable: bool = True
    #: Why it is not runnable, when it is not.
    reason: str = ""
    #: GPU targets are selected by attribute, not by flags: the `#hal.executable.target`
    #: written into the module in place of a placeholder (empty for flag-selected targets).
    executable_target: str = ""

    @property
    def label(self) -> str:
        return self.fingerprint.label

    @property
    def identity(self) -> tuple[str, ...]:
        """What selects the code besides the fingerprint: the flags, and the written target attribute."""
        if not self.executable_target:
            return self.flags
        digest = hashlib.sha256(self.executable_target.encode()).hexdigest()
        return self.flags + (f"executable-target-sha256={digest}",)


@frozen_record
class Probe:
    """What a backend found on this machine: devices, or why there are none."""

    kind: str
    devices: tuple[DeviceFingerprint, ...] = ()
    reason: str = ""
    #: Per device, in the order of `devices`: what the probe read that does not
    #: change native code and so is not in the fingerprint (name, CU count, memory).
    details: tuple[Mapping[str, Any], ...] = ()


def resolve_executable_target(flags: tuple[str, ...]) -> str:
    """The `#hal.executable.target` IREE resolves for target flags (validate names first:
    some unknown ones crash the compiler)."""
    from portkern.portable.compiler import Compiler
    from portkern.portable.family import target_sites

    try:
        compiler = Compiler(flags)
        module = compiler.lower(compiler.parse(PROBE_MODULE), from_phase="start", to_phase=PROBE_PHASE, name="probe")
    except CompileError as exc:
        raise DeviceError(f"IREE cannot target {' '.join(flags)}: {exc}") from None
    targets = [target for op, name in target_sites(module) for target in executable_targets_in(str(op.attributes[name]))]
    if not targets:
        raise DeviceError(f"IREE resolved no executable target for {' '.join(flags)}")
    return targets[0]


#: The first phase after which IREE has resolved the device's executable targets.
PROBE_PHASE = "preprocessing"


def executable_targets_in(text: str) -> list[str]:
    """The `#hal.executable.target<...>` attributes written in an attribute's text."""
    found, start = [], text.find(_EXECUTABLE_TARGET)
    while start >= 0:
        depth, quoted, index = 0, False, start + len(_EXECUTABLE_TARGET) - 1
        while index < len(text):
            char = text[index]
            if quoted:
                quoted = char != '"' or text[index - 1] == "\\"
            elif char == '"':
                quoted = True
            elif char == "<":
                depth += 1
            elif char == ">" and text[index - 1] != "-":
                depth -= 1
                if depth == 0:
                    found.append(text[start:index + 1])
                    break
            index += 1
        start = text.find(_EXECUTABLE_TARGET, index)
    return found


_EXECUTABLE_TARGET = "#hal.executable.target<"


def memoised(parts: tuple[str, ...], make: Callable[[], dict], store: "Store | None") -> dict:
    """`make()` once per `parts` and installed compiler: in this process, and in the
    store's probe records ("p") across processes."""
    compiler = installed_compiler()
    key = probe_key(parts, compiler.version, compiler.revision)
    with _memo_lock:
        value = _memo.get(key)
    stored = store.get_record("p", key) if store is not None else None
    if value is None:
        value = stored if isinstance(stored, dict) else make()
    if store is not None and stored != value:
        store.put_record("p", key, value, memo=True)
    with _memo_lock:
        _memo[key] = value
    return value
