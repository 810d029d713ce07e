"""On a machine with a GPU: the examples and the GPU tuning spaces run for real, each step a fresh process.

    python bench/gpu_device.py [--device cuda] [--out FILE.json] [--time-limit S] [--quick]

Steps, each a fresh `portkern` process with a timeout (a hang is a failure, and so is a
process that does not exit):
1. `portkern devices --json`: what was found;
2. `portkern demo --device D --tune default`: the example bundle built, finalised for the GPU,
   run and checked against NumPy, on an empty cache; then again in a second process, served
   from the cache;
3. `portkern demo --device D --tune quick`: the same with each kernel tuned on the GPU first;
4. the 768x384x640 GEMM+ReLU, built with the GPU families' placeholder stages, tuned on the
   GPU with the whole space (`portkern tune --strategy full --time-limit S`), then run and
   checked against NumPy, and timed beside torch's (cuBLAS) when torch sees the GPU;
5. the same kernel called with torch GPU tensors (DLPack, results on the GPU) and checked,
   timed beside torch's own transfers of its arguments and result.
`--quick`: no tuning (steps 1, 2 on an empty cache, 4's build and run, 5). A summary is
printed; --out FILE keeps each step's record and output. Exits 1 when a step fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from portkern.examples import GEMM_RELU_768

STEP5 = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import portkern
    bundle, device, cache = sys.argv[1:4]
    rng = np.random.default_rng(0)
    a = (rng.uniform(-1, 1, (768, 640)) * np.sqrt(3 / 640)).astype(np.float32)
    b = (rng.uniform(-1, 1, (640, 384)) * np.sqrt(3)).astype(np.float32)
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64), 0)
    kernel = portkern.load(bundle).kernel("gemm_relu_768", device=device)
    out = np.asarray(kernel(a, b))
    report = {"config": kernel.config, "origin": kernel.origin,
              "numpy_max_abs_error": float(np.max(np.abs(out - ref))),
              "numpy_ok": bool(np.allclose(out, ref, rtol=1e-4, atol=1e-4))}
    def median_ms(fn, n=50):
        fn()
        times = []
        for _ in range(n):
            t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
        return sorted(times)[n // 2] * 1e3
    report["portkern_numpy_call_ms"] = median_ms(lambda: kernel(a, b))
    if device != "cpu":  # where a host-array call's time goes: uploads, the call on device arrays, the download
        code = kernel.executable
        on_device = code.upload([a, b])
        report["parts_upload_ms"] = median_ms(lambda: code.upload([a, b]))
        report["parts_call_on_device_arrays_ms"] = median_ms(lambda: code.invoke(*on_device))
        report["parts_call_and_download_ms"] = median_ms(lambda: code.invoke(*on_device).to_host())
        report["iree_runtime_glue_call_ms"] = median_ms(lambda: code.invoke(a, b).to_host())  # iree.runtime's own host path
    try:
        import torch
        if torch.cuda.is_available():
            ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            def torch_call():
                torch.relu(ta @ tb); torch.cuda.synchronize()
            report["torch_cuda_call_ms"] = median_ms(torch_call)
            report["torch_device"] = torch.cuda.get_device_name(0)
            def transfers():
                torch.from_numpy(a).cuda(); torch.from_numpy(b).cuda(); torch.cuda.synchronize()
            report["torch_upload_inputs_ms"] = median_ms(transfers)
            result = torch.relu(ta @ tb)
            report["torch_download_result_ms"] = median_ms(lambda: result.cpu())
            try:
                tout = kernel(ta, tb)
                report["dlpack_result"] = f"{type(tout).__module__}.{type(tout).__name__} on {getattr(tout, 'device', 'host')}"
                tout = tout.cpu().numpy() if hasattr(tout, "cpu") else np.asarray(tout)
                report["dlpack_max_abs_error"] = float(np.max(np.abs(tout - ref)))
                report["dlpack_ok"] = bool(np.allclose(tout, ref, rtol=1e-4, atol=1e-4))
                def pk_torch():
                    kernel(ta, tb); torch.cuda.synchronize()
                report["portkern_torch_call_ms"] = median_ms(pk_torch)
            except Exception as error:
                report["dlpack_error"] = f"{type(error).__name__}: {error}"
    except ImportError as error:
        report["torch"] = str(error)
    print(json.dumps(report))
    """
)


def step(name: str, argv: list[str], timeout: float, env: dict, keep: Path | None = None) -> dict:
    """One fresh process: its exit status, wall time and output (added to the JSON list in KEEP)."""
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        rc, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        rc, stdout, stderr = "timeout", expired.stdout or "", expired.stderr or ""
        stdout, stderr = (s.decode() if isinstance(s, bytes) else s for s in (stdout, stderr))
    wall = time.perf_counter() - started
    row = {"step": name, "rc": rc, "wall_s": round(wall, 2), "stdout": stdout[-200_000:], "stderr": stderr[-200_000:]}
    try:
        row["json"] = json.loads(stdout)
    except ValueError:
        row["stderr_tail"] = stderr[-1500:]
    print(f"--- {name}: rc {rc}, {wall:.1f} s", flush=True)
    if keep is not None:
        kept = json.loads(keep.read_text()) if keep.exists() else []
        keep.write_text(json.dumps([*kept, row], indent=1, default=str))
    return row


def demo_summary(data: dict) -> list[str]:
    """One line per example kernel of a demo's JSON."""
    lines = []
    for r in data.get("results", []):
        gain = f" tuned {r['default_s'] * 1e3:.3f}->{r['tuned_s'] * 1e3:.3f} ms" if r.get("speedup") else ""
        lines.append(
            f"  {'ok  ' if r['ok'] else 'FAIL'} {r['kernel']:<20} {r['device']:<12} err {r['max_abs_error']:.1e} "
            f"{r['origin']} {r['ready_s'] * 1e3:.0f} ms config {r['config']}{gain}"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, help="write every step's record and output to this JSON file")
    parser.add_argument("--time-limit", type=float, default=90.0, help="seconds for the whole-space tuning of step 4")
    parser.add_argument("--quick", action="store_true", help="no tuning: steps 1, 2 (cold only), 4's build and run, and 5")
    args = parser.parse_args()
    if args.out and args.out.exists():
        args.out.unlink()
    work = Path(tempfile.mkdtemp(prefix="gpu-work-"))
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(work / "cache")}
    cli = [sys.executable, "-m", "portkern.cli.main"]
    rows = [step("devices", [*cli, "devices", "--json"], 60, env, args.out)]
    kind = args.device.partition(":")[0]
    found = {entry["kind"]: entry for entry in rows[0].get("json") or []}.get(kind, {})
    if kind != "cpu" and not found.get("found"):
        print(f"no {args.device} device here ({found.get('reason', 'not probed')}): nothing to run")
        return 0
    demo = [*cli, "demo", "--device", args.device, "-o", str(work / "examples.pkb"), "--json"]
    rows.append(step("demo_cold", [*demo, "--tune", "default"], 240, env, args.out))
    if not args.quick:
        rows.append(step("demo_warm", [*demo, "--tune", "default"], 60, env, args.out))
        rows.append(step("demo_tuned", [*demo, "--tune", "quick"], 240, env, args.out))
    manifest = work / "g768.yaml"
    manifest.write_text(f"bundle: gemm768\ntargets: [cpu, amdgpu, cuda]\nkernels:\n  - name: gemm_relu_768\n    source: {GEMM_RELU_768}\n")
    rows.append(step("build_768", [*cli, "build", str(manifest), "-o", str(work / "g768.pkb"), "--json"], 240, env, args.out))
    rows += [] if args.quick else [
        step(
            "tune_768_full",
            [*cli, "tune", str(work / "g768.pkb"), "--device", args.device, "--strategy", "full",
             "--time-limit", str(args.time_limit), "--json"],
            args.time_limit + 120, env, args.out,
        )
    ]
    rows.append(step("run_768", [sys.executable, "-c", STEP5, str(work / "g768.pkb"), args.device, str(work / "cache")], 120, env, args.out))
    failed = []
    for row in rows:
        data = row.get("json")
        print(f"{row['step']}: rc {row['rc']}, {row['wall_s']} s")
        if row["rc"] != 0:
            failed.append(row["step"])
            print(textwrap.indent(row.get("stderr_tail", json.dumps(data)[-1500:]), "  "))
        if isinstance(data, dict) and row["step"].startswith("demo"):
            print("\n".join(demo_summary(data)))
            failed += [f"{row['step']}:{r['kernel']}" for r in data.get("results", []) if not r["ok"]]
        elif row["step"] in ("devices", "run_768"):
            print("  " + json.dumps(data)[:1500])
        elif row["step"] == "tune_768_full" and isinstance(data, dict):
            print("  " + json.dumps({k: v for k, v in data.items() if k != "json_format"})[:2500])
    print("FAILED: " + ", ".join(failed) if failed else "all steps passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
