"""A compile worker process: `python -m portkern.tuner.worker`, driven by `CompilePool`.

It owns one IREE compiler session. Each kernel it is sent is parsed and
lowered to `executable-configurations` once; every job then clones that
module, stamps the job's kernel config and compiles it to a vmfb. Messages are
length-prefixed msgpack frames on stdin/stdout (nothing is pickled); anything
the compiler prints goes to stderr so it cannot corrupt the channel.

    parent -> worker: {"flags": [...]}, then jobs {"id", "source": {...}, "config"}
    worker -> parent: {"ready": pid} or {"fatal": message}, then one result per job
"""

from __future__ import annotations

import os
import re
import struct
import sys
import time
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
    """The next message, or None at end of stream (the other side is gone)."""
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
    return msgpack.unpackb(data, raw=False)


_LOCATION = re.compile(r" [^\s:]*:\d+:\d+: ")
_NOISE = re.compile(r"^.*?IREE failed between phases \S+ and \S+: |^[^\s:]*:\d+:\d+: ")


def first_line(message: str, limit: int = 200) -> str:
    """The gist of a compiler error: its first line without phase and location prefixes."""
    for line in message.splitlines():
        line = line.strip()
        if line:
            while (trimmed := _NOISE.sub("", line, count=1)) != line:
                line = trimmed
            return _LOCATION.split(line, maxsplit=1)[0][:limit]
    return "failed without a diagnostic"


class _Kernels:
    """Configured modules of the kernels this worker has been sent, by source key."""

    def __init__(self, compiler) -> None:
        self.compiler = compiler
        self.modules: dict[str, Any] = {}

    def configured(self, source: dict) -> tuple[Any, float]:
        from portkern.jit.finalize import CONFIGURED_PHASE
        from portkern.tuner import analysis

        key = source["key"]
        if key in self.modules:
            return self.modules[key], 0.0
        start = time.perf_counter()
        module = self.compiler.parse(source["blob"], name=source["name"])
        if source["phase"] != CONFIGURED_PHASE:
            module = self.compiler.lower(module, from_phase=source["phase"], to_phase=CONFIGURED_PHASE, name=source["name"])
        analysis.dispatches(module)  # the first analysis loads dialect bindings: setup, not stamping
        self.modules[key] = module
        return module, time.perf_counter() - start


def _compile(kernels: _Kernels, job: dict) -> dict:
    from portkern.errors import PortkernError
    from portkern.jit.finalize import CONFIGURED_PHASE
    from portkern.tuner import analysis, kernel_config

    result: dict[str, Any] = {"id": job["id"], "ok": False, "vmfb": None, "error": "", "setup_s": 0.0, "stamp_s": 0.0, "compile_s": 0.0}
    try:
        module, result["setup_s"] = kernels.configured(job["source"])
        start = time.perf_counter()
        stamped = analysis.stamp(module, kernel_config.parse(job["config"]), kernels.compiler.context)
        stamped_at = time.perf_counter()
        result["stamp_s"] = stamped_at - start
        result["vmfb"] = kernels.compiler.to_vmfb(stamped, from_phase=CONFIGURED_PHASE, name=job["source"]["name"])
        result["compile_s"] = time.perf_counter() - stamped_at
        result["ok"] = True
    except PortkernError as exc:
        result["error"] = first_line(str(exc))
    return result


def main() -> int:
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    requests = sys.stdin.buffer
    hello = read_frame(requests)
    if hello is None:
        return 0
    from portkern.errors import PortkernError
    from portkern.portable.compiler import Compiler

    try:
        kernels = _Kernels(Compiler(tuple(hello["flags"])))
    except PortkernError as exc:
        write_frame(channel, {"fatal": first_line(str(exc))})
        return 1
    write_frame(channel, {"ready": os.getpid()})
    while (job := read_frame(requests)) is not None:
        write_frame(channel, _compile(kernels, job))
    return 0


if __name__ == "__main__":
    sys.exit(main())
