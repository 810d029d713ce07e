"""The ONNX backend conformance cases through portkern and through IREE directly, side by side.

    python bench/onnx_conformance.py [--models node|pytorch-converted] [--cases N --seed S]
                                     [--filter REGEX] [--jobs J] [--timeout S] [--json FILE]

Every case (default: all 1884 node cases the onnx package generates) runs on both sides in the
same worker process, one after the other:

- portkern: `portkern.onnx.prepare(model, "CPU").run(inputs)`: build -> bundle -> finalise -> run,
  with a fresh cache per run of this script;
- IREE directly, the plain way: `iree-import-onnx model.onnx --opset-version 17 -o model.mlir`,
  `iree-compile` for the host CPU, and the IREE runtime's Python API on the inputs.

Each side's outputs are compared with the case's reference outputs at the case's rtol/atol (dtype and
shape must match too). Printed: counts per outcome (correct / refused at build / failed at finalise /
failed at run / wrong / untyped error / timeout) for each side, the cases where the sides differ, and
every portkern case that is wrong or untyped. The IREE side counts an import failure as refused at
build and a compile failure as failed at finalise. Exit status 1 when portkern has a wrong or untyped
result. `--jobs` worker processes run cases in parallel (default 1); a case that takes longer than
`--timeout` seconds (default 600) is counted as a timeout and its worker replaced.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

from portkern.examples import onnx_conformance as conf

SIDES = ("portkern", "iree")
IREE_COMPILE_FLAGS = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=host"]


def iree_direct(case: conf.Case, work: Path) -> conf.Outcome:
    """The case through IREE's own tools and runtime, as its ONNX guide shows."""
    import iree.runtime as rt
    import onnx

    model, mlir, vmfb = work / "model.onnx", work / "model.mlir", work / "model.vmfb"
    onnx.save(case.model, str(model))
    steps = [
        (conf.REFUSED, [sys.executable, "-m", "iree.compiler.tools.import_onnx", str(model), "--opset-version", "17", "-o", str(mlir)]),
        (conf.FINALIZE, [str(Path(sys.executable).parent / "iree-compile"), *IREE_COMPILE_FLAGS, str(mlir), "-o", str(vmfb)]),
    ]
    for failure, cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if "error" in line.lower()] or done.stderr.splitlines()[-1:]
            return conf.Outcome(failure, " ".join((lines[0] if lines else "no message").split())[:400])
    try:
        config = rt.Config("local-task")
        context = rt.SystemContext(config=config)
        module = rt.VmModule.copy_buffer(context.instance, vmfb.read_bytes())
        context.add_vm_module(module)
        function = context.modules[module.name][case.model.graph.name]
        results = function(*case.inputs)
    except Exception as exc:  # noqa: BLE001 - the runtime's errors are RuntimeError/ValueError/KeyError/TypeError
        return conf.Outcome(conf.RUN, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    if results is None:
        results = ()
    elif not isinstance(results, (tuple, list)):
        results = (results,)
    return conf.compare(case, [r.to_host() if hasattr(r, "to_host") else r for r in results])


def worker(suite: str) -> None:
    """Run the cases named on stdin (one per line); print one JSON line per case."""
    cases = {case.name: case for case in conf.cases_of(suite)}
    print(json.dumps({"ready": len(cases)}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        case = cases[name]
        row: dict = {"name": name, "family": case.family}
        for side in SIDES:
            start = time.perf_counter()
            if side == "portkern":
                outcome = conf.judge(case, conf.run_portkern)
            else:
                with tempfile.TemporaryDirectory(prefix="onnx-iree-") as tmp:
                    outcome = iree_direct(case, Path(tmp))
            row[side] = {"kind": outcome.kind, "detail": outcome.detail, "s": round(time.perf_counter() - start, 2)}
        print(json.dumps(row), flush=True)


class Worker:
    """One worker process, fed case names, with a timeout per case."""

    def __init__(self, suite: str, cache: Path) -> None:
        env = dict(os.environ, PORTKERN_CACHE_DIR=str(cache), PYTHONWARNINGS="ignore")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--models", suite],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True,
        )
        json.loads(self.proc.stdout.readline() or "{}")
        self.name: str | None = None
        self.started = 0.0

    def send(self, name: str) -> None:
        self.name, self.started = name, time.monotonic()
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait()


def run_all(suite: str, names: Sequence[str], jobs: int, timeout: float, cache: Path) -> list[dict]:
    """Every named case through both sides on `jobs` workers, in a seeded random order (so that an
    interrupted run, Ctrl-C or SIGTERM, reports a random sample of the cases)."""
    import random
    import selectors

    pending, rows = list(names), []
    random.Random(0).shuffle(pending)
    selector = selectors.DefaultSelector()
    workers: list[Worker] = []

    def start() -> None:
        w = Worker(suite, cache)
        workers.append(w)
        selector.register(w.proc.stdout, selectors.EVENT_READ, w)
        feed(w)

    def feed(w: Worker) -> None:
        if pending:
            w.send(pending.pop())
        else:
            w.name = None

    def retire(w: Worker) -> None:
        selector.unregister(w.proc.stdout)
        workers.remove(w)
        w.stop()

    try:
        for _ in range(min(jobs, len(names))):
            start()
        serve(workers, selector, rows, len(names), timeout, start, feed, retire)
    except KeyboardInterrupt:
        print(f"interrupted: {len(rows)} of {len(names)} cases done", file=sys.stderr)
    for w in list(workers):
        retire(w)
    return sorted(rows, key=lambda r: r["name"])


def serve(workers, selector, rows, total, timeout, start, feed, retire) -> None:
    """Hand out cases until every worker is idle."""
    while any(w.name for w in workers):
        for key, _ in selector.select(timeout=5):
            w: Worker = key.data
            line = w.proc.stdout.readline()
            if not line:  # the worker died: the case crashed it
                rows.append(lost(w.name, "worker process died"))
                retire(w)
                start()
                continue
            rows.append(json.loads(line))
            report_progress(rows, total)
            feed(w)
        for w in list(workers):
            if w.name and time.monotonic() - w.started > timeout:
                rows.append(lost(w.name, f"over {timeout:.0f} s", conf.TIMEOUT))
                retire(w)
                start()


def lost(name: str, why: str, kind: str = conf.UNTYPED) -> dict:
    return {"name": name, "family": "?", **{side: {"kind": kind, "detail": why, "s": 0} for side in SIDES}}


def report_progress(rows: list[dict], total: int) -> None:
    last = rows[-1]
    if last["portkern"]["kind"] in (conf.WRONG, conf.UNTYPED, conf.TIMEOUT):
        print(f"  {last['name']}: portkern {last['portkern']['kind']}: {last['portkern']['detail'][:300]}", file=sys.stderr, flush=True)
    if len(rows) % 25 == 0 or len(rows) == total:
        tally = Counter(r["portkern"]["kind"] for r in rows)
        print(f"  {len(rows)}/{total} cases ({', '.join(f'{k}: {v}' for k, v in tally.most_common())})", file=sys.stderr, flush=True)


def summary(rows: list[dict]) -> dict:
    counts = {side: {kind: sum(r[side]["kind"] == kind for r in rows) for kind in conf.OUTCOMES} for side in SIDES}
    differ = [r for r in rows if r["portkern"]["kind"] != r["iree"]["kind"]]
    return {"cases": len(rows), "counts": counts, "differ": differ}


def print_report(rows: list[dict], title: str) -> None:
    result = summary(rows)
    print(f"{title}: {result['cases']} cases")
    print(f"  {'outcome':<20} {'portkern':>9} {'IREE directly':>14}")
    for kind in conf.OUTCOMES:
        print(f"  {kind:<20} {result['counts']['portkern'][kind]:>9} {result['counts']['iree'][kind]:>14}")
    print(f"\ncases where they differ ({len(result['differ'])}):")
    for r in result["differ"]:
        print(f"  {r['name']:<60} portkern: {r['portkern']['kind']:<18} IREE: {r['iree']['kind']}")
        for side in SIDES:
            if r[side]["kind"] != conf.CORRECT and r[side]["detail"]:
                print(f"      {side}: {r[side]['detail'][:220]}")
    bad = [r for r in rows if r["portkern"]["kind"] in (conf.WRONG, conf.UNTYPED)]
    if bad:
        print(f"\nportkern wrong or untyped ({len(bad)}):")
        for r in bad:
            print(f"  {r['name']}: {r['portkern']['kind']}: {r['portkern']['detail']}")


def write_expected(rows: list[dict], path: Path) -> None:
    """The cases portkern fails with a typed error, each with its cause, as YAML (merged into `path`)."""
    import yaml

    old = yaml.safe_load(path.read_text()) if path.exists() else {}
    for r in rows:
        outcome = conf.Outcome(r["portkern"]["kind"], r["portkern"]["detail"])
        if outcome.kind in (conf.REFUSED, conf.FINALIZE, conf.RUN):
            reason = re.sub(r"^ONNX model '[^']*' \([^)]*\): ", "", re.sub(r"/tmp/\S+", "", outcome.detail))
            old[r["name"]] = {"cause": conf.cause_of(outcome), "reason": reason[:160]}
        else:
            old.pop(r["name"], None)
    header = (
        "# ONNX node cases portkern refuses or fails with a typed error (never a wrong result), each with its\n"
        "# cause (IREE import, IREE compile, portkern) and the start of the message. Written by\n"
        "# `python bench/onnx_conformance.py --write-expected tests/onnx_expected_failures.yaml`;\n"
        "# tests/test_onnx_conformance.py holds a representative subset to it.\n"
    )
    path.write_text(header + yaml.safe_dump(dict(sorted(old.items())), width=200, sort_keys=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="node", choices=("node", "pytorch-converted"))
    parser.add_argument("--cases", type=int, help="a seeded representative subset of about N cases (every family)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--filter", help="only cases whose name matches this regular expression")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes running cases in parallel")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one case may take on both sides")
    parser.add_argument("--json", type=Path, help="write every case's outcomes here")
    parser.add_argument("--write-expected", type=Path, metavar="YAML", help="write portkern's typed failures as an expected-failures list")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.models)
        return 0
    cases = conf.cases_of(args.models)
    if args.filter:
        cases = [c for c in cases if re.search(args.filter, c.name)]
    if args.cases:
        cases = conf.representative(cases, args.cases, args.seed)
    names = [c.name for c in cases]
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(f"{len(names)} {args.models} cases on {args.jobs} worker(s) ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="onnx-conformance-cache-") as cache:
        rows = run_all(args.models, names, args.jobs, args.timeout, Path(cache))
    took = time.perf_counter() - start
    done = "" if len(rows) == len(names) else f", INTERRUPTED after {len(rows)} of {len(names)}"
    print_report(rows, f"ONNX {args.models} cases ({took:.0f} s, {args.jobs} job(s){done})")
    if args.write_expected:
        write_expected(rows, args.write_expected)
    if args.json:
        args.json.write_text(json.dumps({"suite": args.models, "seconds": took, **summary(rows), "rows": rows}, indent=1))
    return 1 if any(r["portkern"]["kind"] in (conf.WRONG, conf.UNTYPED) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
