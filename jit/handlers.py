"""Job handlers other packages give the worker processes.

Some work a worker does belongs to a package above `jit`: reading the dispatches
of a configured module, and stamping a kernel config on it, are the tuner's. The
package registers its handler for such a job kind here (`register`, in the
process that sends the jobs); each job then names its handler as
`module:function`, and the worker imports it (`resolve`) only from the fixed
list of modules in `MODULES`, never anything else a job's payload names.

Kinds and the handlers' signatures:

- `ANALYSE`: `handler(module) -> list[dict]`, the dispatches of a module at
  `executable-configurations` as plain data;
- `STAMP`: `handler(module, config, context) -> module`, the module at
  `executable-configurations` with the kernel config string `config` written on a
  clone (`context`: the compiler's MLIR context); a compile of any config other
  than "default" needs it.
"""

from __future__ import annotations

import importlib
from typing import Callable

from portkern.base.errors import FinalizeError

ANALYSE = "analyse"
STAMP = "stamp"
KINDS = (ANALYSE, STAMP)

#: The only modules a job's handler may come from.
MODULES = frozenset({"portkern.tuner.jobs"})

_registered: dict[str, str] = {}


def register(kind: str, handler: str) -> None:
    """Have the workers run `handler` ("module:function", the module one of `MODULES`) for jobs of `kind`."""
    if kind not in KINDS:
        raise ValueError(f"no job kind {kind!r} takes a handler (kinds: {', '.join(KINDS)})")
    _check(handler)
    _registered[kind] = handler


def handler(kind: str) -> str:
    """The handler registered for `kind`, as a job names it."""
    found = _registered.get(kind)
    if found is None:
        raise FinalizeError(
            f"no handler is registered for {kind!r} jobs (the tuner registers them: "
            "open bundles with `portkern.load`, or call `portkern.tuner.jobs.register()`)"
        )
    return found


def resolve(name: object) -> Callable:
    """The function a job names as its handler (in a worker); FinalizeError for a name outside `MODULES`."""
    module, function = _check(name)
    found = getattr(importlib.import_module(module), function, None)
    if not callable(found):
        raise FinalizeError(f"job handler {name!r} is not a function")
    return found


def _check(name: object) -> tuple[str, str]:
    module, sep, function = name.partition(":") if isinstance(name, str) else ("", "", "")
    if not sep or module not in MODULES or not function.isidentifier() or function.startswith("_"):
        raise FinalizeError(f"job handler {str(name)[:200]!r} is not one the workers run (handlers come from: {', '.join(sorted(MODULES))})")
    return module, function
