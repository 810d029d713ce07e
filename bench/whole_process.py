"""Whole fresh processes, from interpreter start to a checked result: portkern against a
process that compiles the same kernel from source with IREE and runs it.

Shared by `bench/cold_start.py` (fresh device: an empty cache, a bundle with a prebuilt
ISA-level baseline tier) and `bench/warm_start.py` (every kernel already cached). Each
measured process is a fresh interpreter with Python's default .pyc caching; the parent
times it from spawn to exit (wall) and reads its CPU time (user + sys, its own children
included) from the kernel. The child reports when each part ended on the same monotonic
clock, so each part is shown beside the whole:

    python    interpreter start until the child's first line runs
    numpy     `import numpy`
    import    `import portkern` (source: `import iree.compiler, iree.runtime`)
    load      `portkern.load(path)`
    kernel    the first `bundle.kernel(name)` (source: the compile, with the flags portkern
              finalises with for this CPU)
    call      its first call
    further   each further kernel of the bundle, `bundle.kernel(name)` (warm only)
    exit      from the result (checked) until the process is gone

Results are checked against NumPy after the clock stops; a wrong result fails the bench. Beside
the ratio, both benches print what portkern's own part could take for the whole process to be
GOAL_RATIO of the source process, the rest of its process as measured (`part_at`).
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from children import environment, last_json

PORTKERN_CHILD = textwrap.dedent(
    """
    import time
    began = time.perf_counter()
    import json, sys
    import numpy as np
    numpy_at = time.perf_counter()
    import portkern
    import_at = time.perf_counter()
    path, names, shapes = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3])
    rng = np.random.default_rng(0)
    inputs = {n: [rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n_), dtype=np.float32),
                  rng.standard_normal(n_, dtype=np.float32)] for n, (m, k, n_) in shapes.items()}
    start = time.perf_counter()
    bundle = portkern.load(path)
    load_at = time.perf_counter()
    kernel = bundle.kernel(names[0])
    kernel_at = time.perf_counter()
    out = kernel(*inputs[names[0]])
    call_at = time.perf_counter()
    further = []
    for name in names[1:]:
        before = time.perf_counter()
        bundle.kernel(name)
        further.append(time.perf_counter() - before)
    a, b, bias = (x.astype(np.float64) for x in inputs[names[0]])
    ok = bool(np.allclose(out, np.maximum(a @ b + bias, 0), rtol=1e-4, atol=1e-4))
    print(json.dumps({"began": began, "numpy_at": numpy_at, "import_at": import_at, "setup_s": start - import_at,
                      "load_s": load_at - start, "kernel_s": kernel_at - load_at, "call_s": call_at - kernel_at,
                      "further_s": further, "ok": ok, "origin": kernel.origin, "end": time.perf_counter()}))
    """
)

SOURCE_CHILD = textwrap.dedent(
    """
    import time
    began = time.perf_counter()
    import json, sys
    import numpy as np
    numpy_at = time.perf_counter()
    import iree.compiler, iree.runtime
    import_at = time.perf_counter()
    source_path, name, (m, k, n), flags = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32),
            rng.standard_normal(n, dtype=np.float32)]
    start = time.perf_counter()
    vmfb = iree.compiler.compile_file(source_path, extra_args=flags)
    kernel_at = time.perf_counter()
    module = iree.runtime.load_vm_flatbuffer(vmfb, driver="local-task")
    out = np.asarray(module[name](*args))
    call_at = time.perf_counter()
    a, b, bias = (x.astype(np.float64) for x in args)
    ok = bool(np.allclose(out, np.maximum(a @ b + bias, 0), rtol=1e-4, atol=1e-4))
    print(json.dumps({"began": began, "numpy_at": numpy_at, "import_at": import_at, "setup_s": start - import_at,
                      "load_s": 0.0, "kernel_s": kernel_at - start, "call_s": call_at - kernel_at,
                      "further_s": [], "ok": ok, "origin": "source", "end": time.perf_counter()}))
    """
)

PARTS = ("python", "numpy", "import", "load", "kernel", "call", "exit")
#: The whole-process ratio the benches are held to (portkern's process against the source process).
GOAL_RATIO = 0.25


def run(argv: list[str], env: dict[str, str]) -> dict:
    """One fresh process in `env` (`children.environment`): its report, with `whole_s` (spawn to
    exit), `cpu_s` and each part's seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawned = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = process.communicate(timeout=600)
    whole = time.perf_counter() - spawned
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # this child and the processes it waited for
    if process.returncode != 0:
        raise SystemExit(f"a measured process failed (exit {process.returncode}): {stderr[-2000:]}")
    report = last_json(stdout)
    report["whole_s"] = whole
    report["python_s"] = report["began"] - spawned
    report["numpy_s"] = report["numpy_at"] - report["began"]
    report["import_s"] = report["import_at"] - report["numpy_at"]
    report["exit_s"] = spawned + whole - report["end"]
    report["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return report


def portkern_process(bundle: Path, names: list[str], shapes: dict, cache: Path) -> dict:
    return run([PORTKERN_CHILD, str(bundle), ",".join(names), json.dumps({n: shapes[n] for n in names})], environment(cache))


def source_process(source: Path, name: str, shape) -> dict:
    """A process that compiles `source` with the flags portkern finalises with for this CPU (and the
    front-end flags of a bundle's stage) and runs it."""
    return run([SOURCE_CHILD, str(source), name, json.dumps(list(shape)), json.dumps(source_flags())], environment())


def source_flags() -> list[str]:
    from portkern.jit import cpu
    from portkern.portable.lower import BUILD_FLAGS

    return [*cpu.flags(cpu.host()), *BUILD_FLAGS]


def median_row(reports: list[dict]) -> dict:
    """Medians of each figure over processes (further kernels: the median over all of them)."""
    row = {f"{part}_s": statistics.median(r[f"{part}_s"] for r in reports) for part in (*PARTS, "whole", "cpu")}
    further = [s for r in reports for s in r["further_s"]]
    row["further_s"] = statistics.median(further) if further else None
    row["ok"] = all(r["ok"] for r in reports)
    row["origins"] = sorted({r["origin"] for r in reports})
    row["processes"] = len(reports)
    return row


def own_part(report: dict) -> float:
    """Portkern's own part of one process (seconds): `import portkern`, `load`, `kernel()`, the first call."""
    return report["import_s"] + report["load_s"] + report["kernel_s"] + report["call_s"]


def part_at(reports: list[dict], source: dict) -> tuple[float, float, float]:
    """Medians in seconds over `reports`: portkern's own part (`own_part`), the rest of its process
    (Python's start, NumPy, the inputs, the further kernels, the check, the exit), and what the own
    part could take, the rest unchanged, for the whole process to be GOAL_RATIO of the source
    process (`source`: its `median_row`)."""
    own = statistics.median(own_part(r) for r in reports)
    rest = statistics.median(r["whole_s"] - own_part(r) for r in reports)
    return own, rest, GOAL_RATIO * source["whole_s"] - rest


def at_goal(figures: dict) -> str:
    """The line that says what `part_at` found (figures in ms)."""
    return (f"at {GOAL_RATIO} of the source process, portkern's part (import portkern + load + kernel() + first call) could "
            f"take {figures['part_at_goal_ms']:.1f} ms; it took {figures['portkern_part_ms']:.1f} ms, and the rest of its "
            f"process (Python, NumPy, inputs, further kernels, check, exit) {figures['rest_of_process_ms']:.1f} ms")


def print_table(rows: dict[str, dict]) -> None:
    """One line per kind of process: each part and the whole, in ms."""
    head = "".join(f"{part:>9}" for part in PARTS)
    print(f"{'process':<24}{head}{'further':>9}{'whole':>9}{'CPU':>9}  origin, result")
    for label, row in rows.items():
        parts = "".join(f"{row[f'{part}_s'] * 1e3:>9.1f}" for part in PARTS)
        further = f"{row['further_s'] * 1e3:>9.2f}" if row["further_s"] is not None else f"{'-':>9}"
        print(f"{label:<24}{parts}{further}{row['whole_s'] * 1e3:>9.1f}{row['cpu_s'] * 1e3:>9.1f}  "
              f"{'/'.join(row['origins'])}, {'correct' if row['ok'] else 'WRONG'}")
