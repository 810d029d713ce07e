"""A native-code worker process: `python -m portkern.jit.worker`, driven by `portkern.jit.workers`.

Every byte of bundle content that a compiler reads is read here, never in
the process that loads the bundle: MLIR bytecode is parsed, fitted to its
target, lowered, stamped with kernel configs and compiled to a vmfb; SPIR-V
is built into an OpenCL program binary by the device's driver. The process
keeps its compiler sessions and parsed modules between jobs. Messages are
length-prefixed msgpack frames on stdin/stdout (nothing is pickled); anything
a compiler prints goes to stderr so it cannot corrupt the channel.

    parent -> worker: jobs {"id", "kind", "memory", "threads", ...}
    worker -> parent: {"ready": pid, "cpu_s"} once, then one {"id", "ok", "error", "error_type", "job_s", "cpu_s", ...} per job

Job kinds: "compile" (a vmfb for a kernel config), "analyse" (the module at
`executable-configurations` and its dispatches as plain data), "opencl" (a
program binary), "specialise" (a flow stage with its dynamic sizes fixed),
"build" (a manifest built into a bundle file, for the ONNX backend). What is not
`jit`'s own (a config stamped for "compile", the dispatches read for "analyse")
is done by the handler the job names (`portkern.jit.handlers`: registered by the
package that sends the job, imported here only from a fixed list of modules).
"""

from __future__ import annotations

import errno
import os
import resource
import struct
import sys
import time
from collections import OrderedDict
from typing import IO, Any

_LENGTH = struct.Struct(">I")
#: Largest frame either side accepts (a vmfb of a big kernel is a few MB).
MAX_FRAME_BYTES = 512 << 20


def write_frame(stream: IO[bytes], message: dict) -> None:
    import msgpack

    data = msgpack.packb(message, use_bin_type=True)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: IO[bytes]) -> dict | None:
    """The next message, or None at end of stream or on a frame that breaks the rules."""
    import msgpack

    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(header)
    if size > MAX_FRAME_BYTES:
        return None
    data = stream.read(size)
    if len(data) < size:
        return None
    try:
        message = msgpack.unpackb(data, raw=False, max_ext_len=0)
    except Exception:  # noqa: BLE001 - msgpack raises several unrelated types on bad input
        return None
    return message if isinstance(message, dict) else None


#: Modules a worker keeps parsed (and lowered) between jobs.
KEEP_MODULES = 32


class _State:
    """What this worker keeps between jobs: modules by target and source (compiler sessions
    are kept by `portkern.jit.finalize`)."""

    def __init__(self) -> None:
        self.fitted: OrderedDict[tuple, Any] = OrderedDict()
        self.configured: OrderedDict[tuple, Any] = OrderedDict()
        self._plain = None

    def plain(self):
        """A compiler session without target flags (for rewriting flow stages)."""
        from portkern.portable.compiler import Compiler

        if self._plain is None:
            self._plain = Compiler()
        return self._plain

    def module(self, target, source: dict, name: str):
        """The source parsed (and fitted to the target, for a bundle stage), once per worker."""
        from portkern.jit import finalize
        from portkern.portable.bundle import Stage

        key = (target.identity, source["key"])
        if key not in self.fitted:
            stage = Stage.from_dict(source["stage"]) if source.get("stage") else None
            _keep(self.fitted, key, finalize.fitted(source["blob"], stage, target, name))
        return self.fitted[key]

    def at_configurations(self, target, source: dict, name: str):
        """The source lowered to `executable-configurations`, once per worker."""
        from portkern.jit import finalize

        key = (target.identity, source["key"])
        if key not in self.configured:
            module = self.module(target, source, name)
            _keep(self.configured, key, finalize.to_configurations(module, source["phase"], target, name))
        return self.configured[key]


def _keep(modules: OrderedDict, key: tuple, module: Any) -> None:
    modules[key] = module
    while len(modules) > KEEP_MODULES:
        modules.popitem(last=False)


def _target(message: dict):
    from portkern.cache.device import DeviceFingerprint
    from portkern.jit.target import Target

    return Target(
        DeviceFingerprint.from_dict(message["fingerprint"]),
        tuple(message["flags"]),
        message["family"],
        message["driver"],
        True,
        "",
        message["executable_target"],
    )


def _readable(source: dict, name: str) -> None:
    """Refuse a stage this compiler cannot read, for every job: a module kept from an earlier job
    may have come from the same bytes under another stage record."""
    from portkern.jit import finalize
    from portkern.portable.bundle import Stage

    if source.get("stage"):
        finalize.check_stage(Stage.from_dict(source["stage"]), name)


def _threaded(target, job: dict) -> None:
    """Let the target's compiler session use its own threads for this job, or not (the job's
    "threads", set by the pool from the jobs running beside it; the code is the same either way)."""
    from portkern.jit import finalize

    finalize.compiler_for(target).context.enable_multithreading(job.get("threads", True) is not False)


def _compile(state: _State, job: dict) -> dict:
    from portkern.jit import finalize, handlers

    target, source, name = _target(job["target"]), job["source"], job["name"]
    _readable(source, name)
    start = time.perf_counter()
    _threaded(target, job)  # (the target's compiler session made here on a worker's first job: part of its setup)
    if job["config"] == "default":
        module = state.module(target, source, name)
        setup = time.perf_counter()
        native = finalize.finish(target, module, source["phase"], name)
        return {"native": native, "setup_s": setup - start, "stamp_s": 0.0, "compile_s": time.perf_counter() - setup}
    stamp = handlers.resolve(job.get("handler"))
    configured = state.at_configurations(target, source, name)
    setup = time.perf_counter()
    stamped = stamp(configured, job["config"], finalize.compiler_for(target).context)
    stamped_at = time.perf_counter()
    native = finalize.finish(target, stamped, finalize.CONFIGURED_PHASE, name)
    return {"native": native, "setup_s": setup - start, "stamp_s": stamped_at - setup, "compile_s": time.perf_counter() - stamped_at}


def _analyse(state: _State, job: dict) -> dict:
    from portkern.jit import handlers
    from portkern.portable.compiler import bytecode

    target, name = _target(job["target"]), job["name"]
    _readable(job["source"], name)
    dispatches = handlers.resolve(job.get("handler"))
    start = time.perf_counter()
    _threaded(target, job)
    configured = state.at_configurations(target, job["source"], name)
    found = dispatches(configured)
    return {"configured": bytecode(configured), "dispatches": list(found), "setup_s": time.perf_counter() - start}


def _opencl(state: _State, job: dict) -> dict:
    from portkern.jit import opencl_native
    from portkern.portable.bundle import KernelRecord

    start = time.perf_counter()
    record = KernelRecord.from_dict(job["record"])
    binary = opencl_native.build(record, dict(job["blobs"]), _target(job["target"]), str(job.get("config", "default")))
    return {"native": binary, "compile_s": time.perf_counter() - start}


def _specialise(state: _State, job: dict) -> dict:
    from portkern.base.errors import CompileError
    from portkern.portable.bundle import KernelRecord
    from portkern.portable.specialise import specialise

    start = time.perf_counter()
    record = KernelRecord.from_dict(job["record"])
    contract = record.signature.contract
    if contract is None:
        raise CompileError(f"{record.name}: no shape contract, so its dynamic sizes cannot be fixed")
    stage = specialise(state.plain(), job["blob"], record.entry, contract, dict(job["values"]), record.name)
    return {"stage": stage, "setup_s": time.perf_counter() - start}


def _build(state: _State, job: dict) -> dict:
    """A manifest built into a bundle file; the warnings the build gave, as text."""
    import warnings

    from portkern.portable.builder import build_file

    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_file(str(job["manifest"]), str(job["output"]))
    return {"warnings": [str(w.message) for w in caught], "compile_s": time.perf_counter() - start}


_KINDS = {"compile": _compile, "analyse": _analyse, "opencl": _opencl, "specialise": _specialise, "build": _build}


#: Address space a job needs beyond what the worker holds when it starts: a bound that leaves
#: less is out of memory before the job runs (run under it, the compiler dies wherever an
#: allocation happens to fail, sometimes by a signal that names no cause).
JOB_HEADROOM = 32 << 20


def _bound_memory(limit: int) -> None:
    """Hold the address space of this process to `limit` bytes (0: no bound) for the next job;
    MemoryError where the bound leaves the job less than `JOB_HEADROOM`."""
    if limit > 0:
        try:
            with open("/proc/self/statm", "rb") as f:
                held = int(f.read().split()[0]) * resource.getpagesize()
        except (OSError, ValueError, IndexError):  # no procfs: the bound alone
            held = 0
        if held + JOB_HEADROOM > limit:
            raise MemoryError(f"the worker already holds {held} bytes of address space")
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = hard if limit <= 0 else (limit if hard == resource.RLIM_INFINITY else min(limit, hard))
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_job(state: _State, job: dict) -> dict:
    """One job's result message; errors are reported by type name, never raised."""
    from portkern.base.errors import PortkernError, one_line

    result: dict[str, Any] = {"id": job.get("id"), "ok": False, "error": "", "error_type": ""}
    handler = _KINDS.get(job.get("kind", ""))
    if handler is None:
        result.update(error=f"unknown job kind {job.get('kind')!r}", error_type="FinalizeError")
        return result
    try:
        _bound_memory(int(job.get("memory") or 0))
        result.update(handler(state, job))
        result["ok"] = True
    except PortkernError as exc:
        result.update(error=one_line(exc, limit=2000), error_type=type(exc).__name__)
    except Exception as exc:  # noqa: BLE001 - a job's boundary: any failure (the bindings raise plain
        # RuntimeError on hostile input) is reported to the parent, and the worker takes the next job
        result.update(unexpected_error(exc))
    finally:
        _bound_memory(0)
    return result


def unexpected_error(exc: Exception) -> dict[str, Any]:
    """The result fields of a job that raised `exc`, an error that is not a PortkernError: "out of
    memory" (error type MemoryError) for a refused allocation, else the error with `retire` set
    (the parent replaces the worker)."""
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
        # under the address-space bound, an allocation refused anywhere (a library's own, an import) is out of memory
        return {"error": "out of memory", "error_type": "MemoryError"}
    from portkern.base.errors import one_line

    # the compiler's state is not to be trusted after this: the parent replaces the worker
    return {"error": f"{type(exc).__name__}: {one_line(exc, limit=1000)}", "error_type": "", "retire": True}


def main() -> int:
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    requests = sys.stdin.buffer
    import iree.compiler.api  # noqa: F401  (ready means the compiler is loaded)

    # and the modules every job uses: imported here, not under a job's memory bound
    import portkern.cache.device  # noqa: F401
    import portkern.jit.finalize  # noqa: F401
    import portkern.jit.target  # noqa: F401

    state = _State()
    write_frame(channel, {"ready": os.getpid(), "cpu_s": time.process_time()})
    while (job := read_frame(requests)) is not None:
        start, cpu = time.perf_counter(), time.process_time()
        result = run_job(state, job)
        result["job_s"], result["cpu_s"] = time.perf_counter() - start, time.process_time() - cpu
        write_frame(channel, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
