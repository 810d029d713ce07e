"""GEMM+bias+ReLU on an NVIDIA GPU: the compiler's default and the tuned code against torch, same tensors.

    python bench/gpu_gemm.py [--sizes 768x640x384,2048x2048x2048] [--strategy full] [--budget 48] [--repeat 50] [--json]

Builds one bundle of GEMM+bias+ReLU kernels (M x K x N, f32), tunes them for `cuda` with
`portkern tune --strategy S --budget N` in a child process (as a user would) into a fresh
cache, then in this process times, on torch tensors already on the GPU: the default code, the
tuned code, and torch's `relu(a @ b + bias)` with TF32 off (the same f32 arithmetic) and on.
Each call is timed to its end (`torch.cuda.synchronize`); medians of --repeat calls, in ms and
TFLOP/s. Each portkern result is checked against a float64 NumPy reference (max abs error shown,
rtol 1e-4 / atol 1e-4 required). Also shown per kernel: where one call on torch tensors goes
(importing the arguments, IREE's invocation, copying the results into torch tensors), each
step timed alone. Needs torch with CUDA and an NVIDIA GPU; exits 2 where there is none.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from children import environment
from gemms import GEMM, manifest_lines

RTOL = ATOL = 1e-4


def sizes(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(v) for v in item.split("x")) for item in text.split(",")]  # type: ignore[misc]


def median_ms(call, repeat: int) -> float:
    import torch

    call()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def portkern_json(args: list[str], env: dict[str, str]) -> dict:
    """A `portkern ... --json` command's report; SystemExit with the end of its output when it fails."""
    done = subprocess.run([sys.executable, "-m", "portkern", *args, "--json"], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"portkern {args[0]} failed: {done.stderr.strip()[-2000:] or done.stdout.strip()[-2000:]}")
    return json.loads(done.stdout)


def build_and_tune(where: Path, shapes: list[tuple[int, int, int]], strategy: str, budget: int | None) -> tuple[Path, dict]:
    """The bundle, tuned for cuda into `where/cache`; the tune command's JSON report."""
    names = []
    for m, k, n in shapes:
        names.append(f"gemm_{m}x{k}x{n}")
        (where / f"{names[-1]}.mlir").write_text(GEMM.format(name=names[-1], m=m, k=k, n=n))
    (where / "manifest.yaml").write_text("\n".join(["bundle: gpu_gemm", "kernels:", *manifest_lines(names)]) + "\n")
    bundle = where / "gpu_gemm.pkb"
    env = environment(where / "cache")
    portkern_json(["build", str(where / "manifest.yaml"), "-o", str(bundle)], env)
    budget_args = ["--budget", str(budget)] if budget else []
    return bundle, portkern_json(["tune", str(bundle), "--device", "cuda", "--strategy", strategy, *budget_args], env)


def steps(kernel, tensors, repeat: int) -> dict[str, float]:
    """One call on torch tensors, step by step (`jit.device_tensors`), each step timed alone."""
    from portkern.jit import device_tensors
    from portkern.jit.vmcall import native_runtime

    hal = native_runtime()
    executable = kernel.executable
    device, signature = executable.hal_device, kernel.signature
    views = device_tensors.import_arguments(kernel.name, signature, tensors, "cuda", device, hal)
    out = executable.call_views(views, len(signature.results))
    return {
        "import_ms": median_ms(lambda: device_tensors.import_arguments(kernel.name, signature, tensors, "cuda", device, hal), repeat),
        "invoke_ms": median_ms(lambda: executable.call_views(views, len(signature.results)), repeat),
        "export_ms": median_ms(lambda: device_tensors.export_results(out, signature, device, hal), repeat),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=sizes, default=sizes("768x640x384,2048x2048x2048"))
    parser.add_argument("--strategy", default="full", help="the tuning strategy (default: full)")
    parser.add_argument("--budget", type=int, help="candidates per dispatch (default: 48 for full, else the strategy's)")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.budget is None and args.strategy == "full":
        args.budget = 48
    try:
        import torch
    except ImportError:
        print("gpu_gemm: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_gemm: no CUDA GPU here", file=sys.stderr)
        return 2
    import portkern

    rows, failed = [], False
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        start = time.perf_counter()
        bundle_path, report = build_and_tune(where, args.sizes, args.strategy, args.budget)
        tune_s = time.perf_counter() - start
        os.environ["PORTKERN_CACHE_DIR"] = str(where / "cache")  # the cache the tune process filled
        bundle = portkern.load(bundle_path)
        rng = np.random.default_rng(0)
        for (m, k, n), tuning in zip(args.sizes, report["kernels"]):
            a = (rng.uniform(-1, 1, (m, k)) * np.sqrt(3 / k)).astype(np.float32)
            b = (rng.uniform(-1, 1, (k, n)) * np.sqrt(3)).astype(np.float32)
            bias = rng.uniform(-1, 1, n).astype(np.float32)
            reference = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)
            tensors = [torch.from_numpy(x).cuda() for x in (a, b, bias)]
            tflop = 2 * m * k * n / 1e9
            row = {"kernel": tuning["kernel"], "m": m, "k": k, "n": n, "config": tuning["config"], "search_speedup": tuning["speedup"]}
            served = bundle.kernel(tuning["kernel"], device="cuda").config
            if served != tuning["config"]:
                raise SystemExit(f"{tuning['kernel']}: served config {served!r}, but tune stored {tuning['config']!r}")
            for label, tune in (("default", "default"), ("tuned", None)):
                kernel = bundle.kernel(tuning["kernel"], device="cuda", tune=tune)
                result = kernel(*tensors).cpu().numpy()
                error = float(np.max(np.abs(result - reference)))
                failed |= not np.allclose(result, reference, rtol=RTOL, atol=ATOL)
                row[f"{label}_ms"] = median_ms(lambda: kernel(*tensors), args.repeat)
                row[f"{label}_max_abs_error"] = error
                if label == "tuned":
                    row.update({f"tuned_{key}": value for key, value in steps(kernel, tensors, args.repeat).items()})
            for tf32 in (False, True):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                row[f"torch_{'tf32' if tf32 else 'f32'}_ms"] = median_ms(
                    lambda: torch.relu(tensors[0] @ tensors[1] + tensors[2]), args.repeat
                )
            torch.backends.cuda.matmul.allow_tf32 = False
            for key in ("default", "tuned", "torch_f32", "torch_tf32"):
                row[f"{key}_tflops"] = tflop / row[f"{key}_ms"]
            rows.append(row)
    summary = {
        "gpu": torch.cuda.get_device_name(0),
        "tune_s": tune_s,
        "strategy": args.strategy,
        "budget": args.budget,
        "repeat": args.repeat,
        "rows": rows,
        "ok": not failed,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{summary['gpu']}; tune --strategy {args.strategy} --budget {args.budget or 'default'}: {tune_s:.1f} s for {len(rows)} kernels (build included)"
        )
        for r in rows:
            print(f"  {r['kernel']}: {r['config']} ({r['search_speedup'] or 1:.2f}x in the search)")
        print(
            f"{'M x K x N':>16} {'default':>16} {'tuned':>16} {'torch f32':>16} {'torch tf32':>16}  tuned call: import + IREE invoke + export"
        )
        for r in rows:
            cells = [f"{r[f'{key}_ms']:7.3f} ms {r[f'{key}_tflops']:5.1f}T" for key in ("default", "tuned", "torch_f32", "torch_tf32")]
            print(
                f"{r['m']:>5}x{r['k']}x{r['n']:<5} "
                + " ".join(f"{c:>16}" for c in cells)
                + f"  {r['tuned_import_ms']:.3f} + {r['tuned_invoke_ms']:.3f} + {r['tuned_export_ms']:.3f} ms"
                + f"  (max|err| {r['tuned_max_abs_error']:.1e})"
            )
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
