"""PyTorch programs: eager, torch.compile, portkern default and portkern tuned, side by side.

    python bench/torch_models.py [--rounds 7] [--runs 10] [--json]

The example models (`portkern.examples.torch_models`: a transformer encoder layer and a small
CNN) are exported to `.pt2`, built into one bundle (`kind: torch`), then, in one child process
with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, on the same input: PyTorch eager,
`torch.compile` (inductor), portkern with the compiler's default config and portkern tuned
with `quick` (torch tensors in and out). Times are the best of --rounds interleaved rounds of
the median of --runs calls; the error is the largest absolute difference from eager.
Needs torch and iree-turbine (`pip install 'portkern[torch]'`).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import textwrap
from pathlib import Path

from children import environment, python_report

CHILD = textwrap.dedent(
    """
    import json, statistics, sys, time
    import torch
    import portkern
    from portkern.examples.torch_models import MODELS, example_input, model

    bundle_path, rounds, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_grad_enabled(False)
    loaded = portkern.load(bundle_path)
    out = {}
    for name in MODELS:
        x = example_input(name, seed=1)
        eager = model(name)
        expected = eager(x)
        sides = {"eager": eager}
        try:
            compiled = torch.compile(eager)
            compiled(x)
            sides["torch.compile"] = compiled
        except Exception as exc:
            out.setdefault("notes", []).append(f"{name}: torch.compile unavailable ({type(exc).__name__}: {str(exc)[:200]})")
        sides["portkern default"] = loaded.kernel(name, tune="default")
        start = time.perf_counter()
        sides["portkern tuned"] = loaded.kernel(name, tune="quick")
        tune_s = time.perf_counter() - start
        best = {side: float("inf") for side in sides}
        for r in range(rounds):
            for side in (list(sides) if r % 2 == 0 else list(reversed(sides))):
                call = sides[side]
                call(x)
                samples = []
                for _ in range(runs):
                    t = time.perf_counter()
                    call(x)
                    samples.append(time.perf_counter() - t)
                best[side] = min(best[side], statistics.median(samples))
        errors = {side: float((sides[side](x) - expected).abs().max()) for side in sides}
        tuning = sides["portkern tuned"].tuning
        out[name] = {"ms": {s: v * 1e3 for s, v in best.items()}, "max_error": errors, "tune_s": tune_s,
                     "tuned_config": sides["portkern tuned"].config, "tuning_note": tuning.note if tuning is not None else ""}
    print(json.dumps(out))
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from portkern.examples.torch_models import export_all
    from portkern.portable.builder import build_file

    with tempfile.TemporaryDirectory(prefix="portkern-torch-bench-") as tmp:
        manifest = export_all(Path(tmp))
        build_file(manifest, Path(tmp) / "torch.pkb")
        result = python_report(CHILD, str(Path(tmp) / "torch.pkb"), str(args.rounds), str(args.runs), env=environment(Path(tmp) / "cache"))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for note in result.pop("notes", []):
        print(note)
    for name, r in result.items():
        ms = r["ms"]
        cells = ", ".join(f"{side} {t:.2f} ms (err {r['max_error'][side]:.1e})" for side, t in ms.items())
        ratio = ms["torch.compile"] / ms["portkern tuned"] if "torch.compile" in ms else None
        print(f"{name}: {cells}; tuned vs torch.compile {ratio:.2f}x" if ratio else f"{name}: {cells}")
        print(f"  tuning (quick) {r['tune_s']:.0f} s, config {r['tuned_config'][:160]}")
        if r["tuning_note"]:
            print(f"  {r['tuning_note'][:400]}")


if __name__ == "__main__":
    main()
