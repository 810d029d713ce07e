"""Fuzz the loader with re-sealed bundle mutations and tally what happens.

    python bench/fuzz.py [--cases 10000] [--seed 1] [--timeout 20] [--source] [--json]

The cases come from tests/fuzzing.py (four kinds: raw bytes, payload bytes re-sealed,
hostile metadata values, mutated MLIR bytecode / SPIR-V blobs with names and digests
recomputed). Each is loaded, every kernel finalised and called, in a child process that
reports one line per case; this process watches it. Allowed outcomes: a PortkernError
("refused") or a correct run ("ran"). Findings: "untyped" (another exception), "wrong",
"caller-crash" (the child died) and "caller-hang" (no answer within the compile bound
plus a margin); after either of the last two a fresh child goes on with the next case.

With `--source` the seed (with a tiny ONNX model too) is re-sealed as built by another IREE
release, so its kernels compile from their source stages, and the cases are mutated source
stages (zlib MLIR text, ONNX protobuf) and hostile metadata values, in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from fuzzing import KINDS, MUTABLE_FORMATS, SOURCE_FORMATS, build_seed  # noqa: E402

#: What `--source` fuzzes, and the release its seed claims to be built with.
SOURCE_KINDS = ("blob", "metadata")
FOREIGN_RELEASE = "3.12.0"

CHILD = """
import json, sys, warnings
from pathlib import Path
warnings.simplefilter("ignore")  # a foreign seed warns at each load
sys.path.insert(0, {tests!r})
from fuzzing import cases, references, run_case
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store

seed, start, count, rng_seed, work = Path({seed!r}), {start}, {count}, {rng_seed}, Path({work!r})
device_for = lambda record: "opencl" if any(s.format == "spirv" for s in record.stages) else "cpu"
store = Store(CacheConfig(work / "cache", 1 << 32, False))
refs = references(seed, store, device_for)
print(json.dumps({{"ready": True}}), flush=True)
for case in cases(seed.read_bytes(), count, rng_seed, {kinds!r}, {formats!r}):
    if case.index < start:
        continue
    print(json.dumps({{"start": case.index}}), flush=True)
    outcome = run_case(case, work / "case.pkb", store, refs, device_for)
    print(json.dumps({{"index": case.index, "kind": case.kind, "what": case.what, "result": outcome.result, "detail": outcome.detail}}), flush=True)
"""


def run(cases: int, rng_seed: int, timeout_s: float, opencl: bool, source: bool, log) -> tuple[list[dict], float]:
    """Every case's outcome, children restarted after a crash or hang; and the wall time."""
    work = Path(tempfile.mkdtemp(prefix="portkern-fuzz-"))
    seed = build_seed(work / "seed", opencl, onnx=source, foreign=FOREIGN_RELEASE if source else "")
    kinds, formats = (SOURCE_KINDS, SOURCE_FORMATS) if source else (KINDS, MUTABLE_FORMATS)
    env = dict(os.environ, PORTKERN_COMPILE_TIMEOUT=str(timeout_s))
    outcomes: list[dict] = []
    started = time.perf_counter()
    next_case = 0
    while next_case < cases:
        code = CHILD.format(tests=str(TESTS), seed=str(seed), start=next_case, count=cases, rng_seed=rng_seed, work=str(work), kinds=kinds, formats=formats)
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        current, deadline = None, time.monotonic() + 600
        buffer = b""
        while True:
            ready, _, _ = select.select([child.stdout], [], [], 0.5)
            chunk = os.read(child.stdout.fileno(), 1 << 16) if ready else b""
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                message = json.loads(line)
                if "start" in message:
                    current, deadline = message["start"], time.monotonic() + timeout_s * 3 + 30
                elif "index" in message:
                    outcomes.append(message)
                    next_case, current = message["index"] + 1, None
                    if len(outcomes) % 500 == 0:
                        log(f"{len(outcomes)} cases, {time.perf_counter() - started:.0f} s: {dict(Counter(o['result'] for o in outcomes))}")
            if ready and not chunk:  # end of output: the child has exited
                child.wait()
                if current is not None:
                    outcomes.append({"index": current, "kind": kinds[current % len(kinds)], "what": "", "result": "caller-crash", "detail": f"exit {child.returncode}"})
                    next_case = current + 1
                elif next_case < cases and child.returncode != 0:
                    raise SystemExit(f"the fuzz child failed before any case (exit {child.returncode})")
                break
            if time.monotonic() > deadline:
                child.kill()
                child.wait()
                if current is not None:
                    outcomes.append({"index": current, "kind": kinds[current % len(kinds)], "what": "", "result": "caller-hang", "detail": ""})
                    next_case = current + 1
                break
    return outcomes, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=20.0, help="PORTKERN_COMPILE_TIMEOUT for the cases (s)")
    parser.add_argument("--no-opencl", action="store_true", help="leave the OpenCL kernel out of the seed bundle")
    parser.add_argument("--source", action="store_true", help="fuzz source stages: a seed of another IREE release, with an ONNX model")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from helpers import opencl_device_missing, opencl_toolchain_missing

    opencl = not args.no_opencl and not (opencl_toolchain_missing() or opencl_device_missing())
    outcomes, wall = run(args.cases, args.seed, args.timeout, opencl, args.source, lambda text: print(text, file=sys.stderr, flush=True))
    table = {kind: dict(Counter(o["result"] for o in outcomes if o["kind"] == kind)) for kind in (SOURCE_KINDS if args.source else KINDS)}
    errors = dict(Counter(o["detail"].split(":")[0] for o in outcomes if o["result"] == "refused"))
    findings = [o for o in outcomes if o["result"] not in ("refused", "ran")]
    summary = {
        "cases": len(outcomes), "seed": args.seed, "opencl": opencl, "source": args.source, "wall_s": round(wall, 1),
        "results": dict(Counter(o["result"] for o in outcomes)), "by_kind": table, "refused_with": errors,
        "findings": findings[:50],
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{summary['cases']} cases (seed {args.seed}, OpenCL kernel {'in' if opencl else 'not in'} the seed{', source stages of another release' if args.source else ''}) in {wall:.0f} s")
        for kind, counts in table.items():
            print(f"  {kind:9s} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        print("  refused with: " + ", ".join(f"{k} {v}" for k, v in sorted(errors.items(), key=lambda kv: -kv[1])))
        print(f"  findings (untyped, wrong, caller crash or hang): {len(findings)}")
        for finding in findings[:20]:
            print(f"    #{finding['index']} {finding['kind']} {finding['what']}: {finding['result']} {finding['detail'][:200]}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
