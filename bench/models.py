"""The model corpus side by side: PyTorch eager, torch.compile, onnxruntime, IREE compiled
directly, portkern default and portkern tuned, each on 2 threads.

    python bench/models.py [--models resnet18,bert,gpt2,block,cnn] [--route onnx-dynamo|onnx-ts|pt2]
                           [--rounds 7] [--runs 10] [--tune quick] [--quick] [--processes 3] [--json [FILE]]

Models: `resnet18`, `bert` (MiniLM sizes) and `gpt2` (2 layers), as `bench/export_corpus.py`
defines them (transformers, seeded random weights); `block` (a transformer encoder layer) and
`cnn` (a small CNN), as `portkern.examples.torch_models` defines them (`bench/torch_models.py`);
the small `resnet-tiny`, `bert-tiny` and `gpt2-tiny` of the corpus too.

Each model runs in its own child process with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset and a
fresh portkern cache, on one seeded input. The model is exported to ONNX (`torch.onnx.export`,
`dynamo=True` unless `--route onnx-ts`), which onnxruntime, IREE and portkern read (`--route pt2`:
portkern reads a `torch.export` program instead). Sides:

- `eager`, `torch.compile` (inductor): `torch.set_num_threads(2)`, no grad;
- `onnxruntime`: CPU provider, 2 intra-op threads, 1 inter-op thread;
- `IREE direct`: the ONNX imported by IREE's importer and compiled by `iree-compile` with
  IREE_FLAGS (IREE's recommended CPU flags: this host's CPU, `--iree-opt-level=O2`; `--iree-flags`
  adds more), run through `iree.runtime` on `local-task`;
- `portkern default` / `portkern tuned`: a manifest naming the model, built (`build_file`),
  loaded and called on NumPy arrays with `tune="default"` and with `tune=--tune`; the tuned
  side's time to tune is reported.

IREE's task executor (both IREE sides) runs with `--task_topology_max_group_count=2`, and every
portkern call runs on it (PORTKERN_EXECUTOR_MIN_BYTES=0), so every side uses 2 threads; the
tuned side is tuned with that setting unset, as a user's default settings tune it (tuning then
also decides whether its calls run on the executor, docs/serving.md).
Times are medians over --rounds interleaved rounds (the order reversed every other round) of
the median of --runs calls after one warm-up call; the error is each side's largest absolute
difference from eager PyTorch over all outputs. `--quick`: 3 rounds of 5 calls.

Then, as a user's later processes pay it: onnxruntime and the tuned kernel each in fresh
processes of their own (`--processes` of each, taken in turn; 0: none), with the default
settings (PORTKERN_EXECUTOR_MIN_BYTES unset: the stored tuning choice decides where the calls
run, on IREE's default topology, one worker per core); the tuned kernel is asked for with no
`tune=` from the cache the child filled. Timed as above; medians over the processes.
Needs the corpus tools (`pip install 'portkern[corpus]'`) and onnxruntime; a side that cannot
run is left out of its row with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
CORPUS = ("resnet18", "bert", "gpt2", "resnet-tiny", "bert-tiny", "gpt2-tiny")
EXAMPLES = ("block", "cnn")
MODELS = CORPUS + EXAMPLES
DEFAULT_MODELS = ("resnet18", "bert", "gpt2", "block", "cnn")
ROUTES = ("onnx-dynamo", "onnx-ts", "pt2")
SIDES = ("eager", "torch.compile", "onnxruntime", "IREE direct", "portkern default", "portkern tuned")
THREADS = 2
#: The sides timed again in processes of their own after the child (`later_processes`).
ALONE = ("onnxruntime", "portkern tuned")
#: The setting that sends every portkern call of the child to IREE's task executor.
EXECUTOR_SETTING = "PORTKERN_EXECUTOR_MIN_BYTES"
#: IREE's recommended flags for CPU code (its CPU deployment guide): this host's CPU and features, O2.
IREE_FLAGS = ("--iree-hal-target-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=host", "--iree-opt-level=O2")
UNSET = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def load_model(name: str):
    """The seeded model `name` (eval mode) and its example inputs (a tuple of tensors)."""
    if name in EXAMPLES:
        from portkern.examples.torch_models import example_input, model

        return model(name), (example_input(name, seed=1),)
    sys.path.insert(0, str(BENCH))
    from export_corpus import make

    return make(name)


def outputs(result) -> list:
    """A call's outputs as NumPy arrays, in order (a `ModelOutput`, a tuple or one array/tensor)."""
    import numpy as np

    if hasattr(result, "to_tuple"):
        result = result.to_tuple()
    if not isinstance(result, (tuple, list)):
        result = (result,)
    return [r.detach().numpy() if hasattr(r, "detach") else np.asarray(r) for r in result]


def iree_direct(onnx_path: Path, work: Path, extra: tuple[str, ...]):
    """The ONNX model compiled by IREE alone (its importer, `iree-compile` with IREE_FLAGS + `extra`),
    as a function of NumPy arrays on `local-task`."""
    import iree.runtime as rt

    mlir = work / "iree-direct.mlir"
    vmfb = work / "iree-direct.vmfb"
    done = subprocess.run([sys.executable, "-m", "iree.compiler.tools.import_onnx", str(onnx_path), "--opset-version=17", "-o", str(mlir)],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"iree-import-onnx: {done.stderr.strip()[-400:]}")
    entry = re.search(rb"func\.func @([\w$.-]+)", mlir.read_bytes()[:1 << 20])
    compile_tool = Path(sys.executable).with_name("iree-compile")
    done = subprocess.run([str(compile_tool), str(mlir), *IREE_FLAGS, *extra, "-o", str(vmfb)], capture_output=True, text=True)
    if done.returncode:
        first = next((line for line in done.stderr.splitlines() if "error:" in line), done.stderr.strip()[-400:])
        raise RuntimeError(f"iree-compile: {first[:400]}")
    config = rt.Config("local-task")
    context = rt.SystemContext(config=config)
    context.add_vm_module(rt.VmModule.copy_buffer(config.vm_instance, vmfb.read_bytes()))
    function = context.modules.module[entry.group(1).decode() if entry else "main_graph"]

    def call(*arrays):
        result = function(*arrays)
        return result if isinstance(result, (tuple, list)) else (result,)

    return call


def exported(export, model, inputs: tuple, route: str, where: Path) -> tuple[Path, list]:
    """`export_corpus.export`'s file for the route, and the arrays the exported program takes (the
    TorchScript route may wrap a model whose inputs differ from eager's)."""
    result = export(model, inputs, route, where)
    path, taken = result if isinstance(result, tuple) else (result, inputs)
    return path, [t.numpy() for t in taken]


def child(name: str, route: str, work: Path, rounds: int, runs: int, tune: str, iree_extra: tuple[str, ...]) -> dict:
    """One model on every side, in this process (the child side of `main`)."""
    import iree.runtime as rt
    import numpy as np
    import torch

    rt.flags.parse_flags(f"--task_topology_max_group_count={THREADS}")
    torch.set_num_threads(THREADS)
    torch.set_grad_enabled(False)
    sys.path.insert(0, str(BENCH))
    from export_corpus import export

    import portkern

    model, inputs = load_model(name)
    expected = outputs(model(*inputs))
    notes: list[str] = []
    sides: dict = {"eager": lambda: model(*inputs)}
    tune_s = None
    tuned_config = tuning_note = ""

    def attempt(side: str, make) -> None:
        try:
            sides[side] = make()
        except Exception as exc:  # noqa: BLE001 - a side that cannot run is a note of the row
            notes.append(f"{side}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")

    def compiled():
        function = torch.compile(model)
        function(*inputs)
        return lambda: function(*inputs)

    attempt("torch.compile", compiled)
    onnx_dir = work / "onnx"
    onnx_dir.mkdir()
    onnx_path, onnx_arrays = exported(export, model, inputs, "onnx-ts" if route == "onnx-ts" else "onnx-dynamo", onnx_dir)

    attempt("onnxruntime", lambda: onnxruntime_call(onnx_path, onnx_arrays))

    def direct():
        function = iree_direct(onnx_path, work, iree_extra)
        return lambda: function(*onnx_arrays)

    attempt("IREE direct", direct)
    source, source_arrays = exported(export, model, inputs, "pt2", work) if route == "pt2" else (onnx_path, onnx_arrays)
    manifest = work / "m.yaml"
    manifest.write_text(f"bundle: models\nkernels:\n  - name: model\n    source: {json.dumps(str(source))}\n")
    try:
        from portkern.portable.builder import build_file

        build_file(manifest, work / "m.pkb")
        bundle = portkern.load(work / "m.pkb")
    except Exception as exc:  # noqa: BLE001
        notes.append(f"portkern build: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    else:
        default = bundle.kernel("model", tune="default")
        sides["portkern default"] = lambda: default(*source_arrays)
        start = time.perf_counter()
        given = os.environ.pop(EXECUTOR_SETTING, None)  # tuned as a user's default settings tune it (see the docstring)
        try:
            tuned = bundle.kernel("model", tune=tune)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"portkern tuned: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        else:
            tune_s = time.perf_counter() - start
            tuned_config = tuned.config
            tuning_note = getattr(tuned.tuning, "note", "")
        finally:
            if given is not None:
                os.environ[EXECUTOR_SETTING] = given
        if tune_s is not None:  # asked for again, its calls where the setting now says (every one on the executor)
            del tuned
            again = bundle.kernel("model")
            sides["portkern tuned"] = lambda: again(*source_arrays)
    for label, arrays in (("inputs", source_arrays), ("onnx_inputs", onnx_arrays), ("expected", expected)):
        np.savez(work / f"{label}.npz", *arrays)  # for the processes of their own (`alone`)
    errors: dict[str, float | None] = {}
    for side, call in sides.items():
        got = outputs(call())
        errors[side] = largest_error(got, expected)
        if errors[side] is None:
            notes.append(f"{side}: outputs {[g.shape for g in got]}, eager gives {[e.shape for e in expected]}")
    medians: dict[str, list[float]] = {side: [] for side in sides}
    order = list(sides)
    for r in range(rounds):
        for side in order if r % 2 == 0 else reversed(order):
            medians[side].append(median_call(sides[side], runs))
    return {
        "ms": {side: statistics.median(m) * 1e3 for side, m in medians.items()},
        "max_error": errors, "tune_s": tune_s, "tuned_config": tuned_config, "tuning_note": tuning_note, "notes": notes,
        "onnx": str(onnx_path.relative_to(work)),
    }


def saved(work: Path, label: str) -> list:
    """The arrays `child` saved as `label`, in order."""
    import numpy as np

    with np.load(work / f"{label}.npz") as found:
        return [found[f"arr_{i}"] for i in range(len(found.files))]


def alone(side: str, work: Path, onnx: str, rounds: int, runs: int) -> dict:
    """One side in a process of its own, after `child` (the other side of `run`'s later processes):
    `portkern tuned` loads the bundle `child` built and asks for its kernel with no `tune=` (the
    stored selection, as a later process of the user's gets it), `onnxruntime` opens the ONNX file.
    Its median time (as `child` times it), its largest error against eager, and the kernel's config."""
    expected = saved(work, "expected")
    config = ""
    if side == "portkern tuned":
        import portkern

        arrays = saved(work, "inputs")
        kernel = portkern.load(work / "m.pkb").kernel("model")
        config = kernel.config

        def call():
            return kernel(*arrays)
    else:
        call = onnxruntime_call(work / onnx, saved(work, "onnx_inputs"))
    error = largest_error(outputs(call()), expected)
    medians = [median_call(call, runs) for _ in range(rounds)]
    return {"ms": statistics.median(medians) * 1e3, "max_error": float("inf") if error is None else error, "config": config}


def onnxruntime_call(onnx_path: Path, arrays: list):
    """A call of the ONNX model on `arrays` through onnxruntime's CPU provider, THREADS intra-op threads."""
    import onnxruntime as ort  # type: ignore[import-untyped]

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    feed = dict(zip((i.name for i in session.get_inputs()), arrays))
    return lambda: session.run(None, feed)


def largest_error(got: list, expected: list) -> float | None:
    """The largest absolute difference of `got` from `expected` over all outputs (None: their number or shapes differ)."""
    import numpy as np

    if len(got) != len(expected) or any(g.shape != e.shape for g, e in zip(got, expected)):
        return None
    return max(float(np.max(np.abs(g.astype(np.float64) - e))) if e.size else 0.0 for g, e in zip(got, expected))


def median_call(call, runs: int) -> float:
    """One round: a warm-up call, then the median of `runs` timed calls (seconds)."""
    call()
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def run(name: str, args: argparse.Namespace) -> dict:
    """One model in a fresh child process with a fresh cache; its result, or a note why there is none."""
    with tempfile.TemporaryDirectory(prefix="portkern-models-") as tmp:
        env = {k: v for k, v in os.environ.items() if k not in UNSET}
        env.update(PORTKERN_CACHE_DIR=str(Path(tmp) / "cache"), PORTKERN_EXECUTOR_MIN_BYTES="0")
        command = [sys.executable, __file__, "--child", name, args.route, tmp, str(args.rounds), str(args.runs), args.tune,
                   json.dumps(args.iree_flags.split())]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
        result = last_result(done)
        if "portkern tuned" in result["ms"] and "onnxruntime" in result["ms"] and args.processes:
            result["alone"] = later_processes(Path(tmp), result["onnx"], env, args)
    return result


def last_result(done: subprocess.CompletedProcess) -> dict:
    """A child's RESULT line, or a result with a note why there is none."""
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return {"ms": {}, "max_error": {}, "notes": [f"the child ended without a result: {tail[:300]}"]}
    return json.loads(lines[-1][len("RESULT "):])


def later_processes(work: Path, onnx: str, env: dict, args: argparse.Namespace) -> dict:
    """After the child: the tuned kernel and onnxruntime each in processes of their own, taken in
    turn (`--processes` of each), with the default `PORTKERN_EXECUTOR_MIN_BYTES` (unset): the
    medians over the processes, the largest error, and the config the tuned kernel's process ran."""
    env = {k: v for k, v in env.items() if k != EXECUTOR_SETTING}
    times: dict[str, list[float]] = {side: [] for side in ALONE}
    errors: dict[str, float] = {}
    config = ""
    for p in range(args.processes):
        for side in ALONE if p % 2 == 0 else reversed(ALONE):
            command = [sys.executable, __file__, "--alone", side, str(work), onnx, str(args.rounds), str(args.runs)]
            done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
            result = last_result(done)
            if "notes" in result:
                return {"notes": result["notes"]}
            times[side].append(result["ms"])
            errors[side] = max(errors.get(side, 0.0), result["max_error"])
            config = result["config"] or config
    return {"ms": {side: statistics.median(t) for side, t in times.items()}, "max_error": errors, "config": config}


def table(results: dict) -> str:
    """A markdown table of the results: ms per side, tuned against onnxruntime, errors, tuning time;
    then each of `ALONE` in later processes of their own, and their ratio."""
    later = [f"{side}, own process" for side in ALONE]
    lines = ["| model | " + " | ".join([*SIDES, "tuned vs onnxruntime", "max error (portkern tuned)", "tuning s", *later,
                                        "own processes: tuned vs onnxruntime"]) + " |",
             "|---|" + "---|" * (len(SIDES) + 6)]
    for name, r in results.items():
        ms = r["ms"]
        cells = [f"{ms[s]:.2f}" if s in ms else "-" for s in SIDES]
        error = r["max_error"].get("portkern tuned")
        tune_s = r.get("tune_s")
        own = r.get("alone", {}).get("ms", {})
        cells += [ratio(ms), "-" if error is None else f"{error:.1e}", "-" if tune_s is None else f"{tune_s:.0f}",
                  *(f"{own[s]:.2f}" if s in own else "-" for s in ALONE), ratio(own)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio(ms: dict) -> str:
    """onnxruntime's time over the tuned kernel's ("-" without both)."""
    return f"{ms['onnxruntime'] / ms['portkern tuned']:.2f}x" if "onnxruntime" in ms and "portkern tuned" in ms else "-"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        name, route, work, rounds, runs, tune, extra = argv[1:8]
        result = child(name, route, Path(work), int(rounds), int(runs), tune, tuple(json.loads(extra)))
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    if argv[:1] == ["--alone"]:
        side, work, onnx, rounds, runs = argv[1:6]
        print("RESULT " + json.dumps(alone(side, Path(work), onnx, int(rounds), int(runs))), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"of {', '.join(MODELS)}")
    parser.add_argument("--route", default="onnx-dynamo", choices=ROUTES, help="what portkern reads")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tune", default="quick", help="the tuned side's strategy (tune=)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 5 calls")
    parser.add_argument("--iree-flags", default="", help="flags added to IREE_FLAGS for the IREE direct side")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one model may take")
    parser.add_argument("--processes", type=int, default=3,
                        help="later processes of their own for onnxruntime and the tuned kernel, each (0: none)")
    parser.add_argument("--json", nargs="?", const="-", default=None, help="the results as JSON, to FILE or (no FILE) stdout")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.runs = 3, 5
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model: {', '.join(unknown)}")
    load = os.getloadavg()[0]
    results = {}
    for name in models:
        results[name] = run(name, args)
        if args.json != "-":
            print(f"{name}: " + ", ".join(f"{s} {t:.2f} ms" for s, t in results[name]["ms"].items()), flush=True)
    meta = {"threads": THREADS, "route": args.route, "tune": args.tune, "rounds": args.rounds, "runs": args.runs,
            "iree_flags": list(IREE_FLAGS) + args.iree_flags.split(), "load_average": [load, os.getloadavg()[0]]}
    if args.json == "-":
        print(json.dumps({"meta": meta, "results": results}, indent=1))
        return 0
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"\n{THREADS} threads on every side; route {args.route}; tune={args.tune}; medians of {args.rounds} rounds x "
          f"{args.runs} calls; IREE direct: {' '.join(meta['iree_flags'])}; 1-min load average {load:.1f} -> {meta['load_average'][1]:.1f}\n")
    print(table(results))
    for name, r in results.items():
        errors = ", ".join(f"{s} {'-' if e is None else f'{e:.1e}'}" for s, e in r["max_error"].items())
        print(f"\n{name}: max error vs eager: {errors}")
        if r.get("tuned_config"):
            print(f"  tuned config: {r['tuned_config'][:200]}")
        if r.get("tuning_note"):
            print(f"  tuning note: {r['tuning_note'][:400]}")
        for note in r["notes"] + r.get("alone", {}).get("notes", []):
            print(f"  note: {note}")
        own = r.get("alone", {})
        if own.get("ms"):
            errors = ", ".join(f"{s} {e:.1e}" for s, e in own["max_error"].items())
            print(f"  own processes ({args.processes} of each, default settings): config {own['config'][:200] or '-'}; "
                  f"max error vs eager: {errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
