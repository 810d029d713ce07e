"""The IREE runtime's levers on the example kernels: task-executor workers and `local-sync`.

    python bench/runtime_levers.py [--suites examples,gemm768,torch] [--configs default,data-tiling]
                                   [--rounds 15] [--passes 3] [--json]

Per kernel and kernel config, the same code (and, at the default config on `local-sync`, the
code compiled with `--iree-llvmcpu-disable-distribution` too: one workgroup per dispatch) is called through
portkern's one-call path (`jit.vmcall.VmCall`, NumPy in and out) on:

- `task`: `local-task` with IREE's default topology (one worker per physical core), what
  portkern's executor runs;
- `task/N`: `local-task` with N workers (`--task_topology_group_count=N`), for every N below
  the default;
- `sync`: `local-sync`, the calling thread, what portkern runs calls below
  `PORTKERN_EXECUTOR_MIN_BYTES` on;
- `sync+nodist`: `local-sync` running the default code compiled without thread distribution
  (`iree-compile` from the flow stage: the flag is not taken in a compiler session).

Every lever is checked against `task`'s outputs, then timed interleaved (wall time, best
call of --rounds rounds of 3, order reversed every other round; `sync+nodist` against `sync`
also in the calling thread's CPU time, which other processes' load does not count); --passes repeats the whole
measurement so a busy machine's noise shows as the spread between passes. Prints each
lever's speed over `task` per pass (the table in docs/tuning.md, "Module options").
`torch` needs torch and iree-turbine.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from module_options import bundles  # noqa: E402

NO_DISTRIBUTION = "--iree-llvmcpu-disable-distribution"
#: Every device and loaded module made, kept for the process's life (the runtime releases them at exit).
KEPT: list = []


def device(driver: str, workers: int):
    """A fresh device on its own driver (`workers`: the task topology's group count, 0: IREE's default)."""
    import iree.runtime as rt

    from portkern.jit.vmcall import native_runtime

    if driver == "local-task":
        rt.flags.parse_flags(f"--task_topology_group_count={workers}")
    made = native_runtime().create_hal_driver(driver).create_default_device()
    rt.flags.parse_flags("--task_topology_group_count=0")
    return made


def callable_on(made, vmfb: bytes, entry: str, parameters):
    """The entry function of `vmfb` loaded on device `made`, as a NumPy-in, NumPy-out call."""
    import iree.runtime as rt

    from portkern.jit.vmcall import VmCall

    instance = rt.VmInstance()
    modules = [rt.create_hal_module(instance, made)]
    if parameters is not None:
        handle = rt.FileHandle.wrap_memory(parameters.buffer, readable=True, writable=False)
        providers = []
        for scope, entries in parameters.scopes().items():
            index = rt.ParameterIndex()
            for name, offset, size in entries:
                index.add_from_file_handle(name, handle, size, offset)
            providers.append(index.create_provider(scope=scope))
        modules.append(rt.create_io_parameters_module(instance, *providers))
    module = rt.VmModule.copy_buffer(instance, vmfb)
    modules.append(module)
    context = rt.VmContext(instance, modules=modules)
    return VmCall(entry, context, module.lookup_function(entry), made), (instance, modules, context)


def without_distribution(loaded, record, target) -> bytes:
    """The kernel's default code compiled with `NO_DISTRIBUTION` (a flag IREE reads on its command
    line only, not in a compiler session): `iree-compile` from the flow stage portkern finalises."""
    import subprocess

    from portkern.portable.lower import BUILD_FLAGS

    with tempfile.TemporaryDirectory() as where:
        source, out = Path(where) / "flow.mlirbc", Path(where) / "out.vmfb"
        source.write_bytes(loaded.bundle.blob(record.stage(target.family).blob))
        command = [str(Path(sys.executable).parent / "iree-compile"), "--compile-from=flow", *BUILD_FLAGS, *target.flags,
                   NO_DISTRIBUTION, str(source), "-o", str(out)]
        subprocess.run(command, check=True, capture_output=True)
        return out.read_bytes()


def measure(path: Path, configs: list[str], rounds: int, passes: int) -> list[dict]:
    import os

    import portkern
    from portkern.base.errors import PortkernError
    from portkern.jit import devices
    from portkern.tuner.measure import make_inputs, mismatch

    loaded = portkern.load(path)
    target = devices.resolve("cpu", loaded.store)
    workers = os.cpu_count() or 1
    made = {"task": device("local-task", 0), "sync": device("local-sync", 0)}
    made.update({f"task/{n}": device("local-task", n) for n in range(1, workers)})
    KEPT.append(made)
    rows = []
    for record in loaded.bundle.kernels:
        parameters = loaded.natives.parameters_for(record)
        for config in configs:
            row: dict = {"kernel": record.name, "config": config}
            try:
                code = loaded.native(record, target, config).data
                flat = without_distribution(loaded, record, target) if config == "default" else None
            except PortkernError as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                rows.append(row)
                continue
            calls = {name: callable_on(d, code, record.entry, parameters) for name, d in made.items()}
            if flat is not None:
                calls["sync+nodist"] = callable_on(made["sync"], flat, record.entry, parameters)
            KEPT.append(calls)
            levers = list(calls)
            inputs = make_inputs(record.signature)
            reference = calls["task"][0](inputs)
            row["wrong"] = {n: problem for n in levers if (problem := mismatch(calls[n][0](inputs), reference))}
            row["same_code"] = flat is not None and code == flat
            row["passes"] = []
            for _ in range(passes):
                best = dict.fromkeys(levers, float("inf"))
                cpu = dict.fromkeys(levers, float("inf"))  # the calling thread's CPU time (sync levers)
                for r in range(rounds):
                    for name in levers if r % 2 == 0 else reversed(levers):
                        call = calls[name][0]
                        call(inputs)
                        for _ in range(3):
                            start, started = time.perf_counter(), time.thread_time()
                            call(inputs)
                            cpu[name] = min(cpu[name], time.thread_time() - started)
                            best[name] = min(best[name], time.perf_counter() - start)
                timed = {"task_ms": best["task"] * 1e3, "speedup": {n: best["task"] / best[n] for n in levers}}
                if "sync+nodist" in levers:
                    timed["nodist_cpu_speedup"] = cpu["sync"] / cpu["sync+nodist"]
                row["passes"].append(timed)
            rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suites", default="examples,gemm768,torch")
    parser.add_argument("--configs", default="default,data-tiling", help="kernel configs to time each lever with")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        rows = [
            row for path in bundles(args.suites.split(","), Path(where))
            for row in measure(path, args.configs.split(","), args.rounds, args.passes)
        ]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for row in rows:
        head = f"{row['kernel']} [{row['config']}]"
        if "error" in row:
            print(f"{head}: {row['error']}")
            continue
        for number, data in enumerate(row["passes"]):
            cells = "  ".join(f"{n}={s:.2f}x" for n, s in data["speedup"].items())
            if "nodist_cpu_speedup" in data:
                cells += f"  (sync+nodist over sync in thread CPU time: {data['nodist_cpu_speedup']:.2f}x)"
            print(f"{head} pass {number + 1}: task {data['task_ms']:.3f} ms; {cells}")
        if row["same_code"]:
            print(f"  {NO_DISTRIBUTION} compiled to the same code")
        for name, problem in row["wrong"].items():
            print(f"  {name}: WRONG {problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
