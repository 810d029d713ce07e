"""The ONNX backend conformance cases through portkern and through IREE directly, side by side.

    python bench/onnx_conformance.py [--models node|pytorch-converted] [--cases N --seed S]
                                     [--filter REGEX] [--shard K/N] [--jobs J] [--timeout S]
                                     [--journal FILE [--only-from-journal KIND,...] [--summary-only]]
                                     [--json FILE]

Every case (default: all 1884 node cases the onnx package generates) runs on both sides in the
same worker process, one after the other:

- portkern: `portkern.onnx.prepare(model, "CPU").run(inputs)`: build -> bundle -> finalise -> run,
  with a fresh cache per run of this script;
- IREE directly, the plain way: `iree-import-onnx model.onnx --opset-version 17 -o model.mlir`
  (its Python entry point, in the worker process), `iree-compile` for the host CPU, and the IREE
  runtime's Python API on the inputs.

Each side's outputs are compared with the case's reference outputs at the case's rtol/atol (dtype and
shape must match too). Printed: counts per outcome (correct / refused at build / failed at finalise /
failed at run / wrong / untyped error / timeout) for each side, the cases where the sides differ, and
every portkern case that is wrong or untyped. The IREE side counts an import failure as refused at
build and a compile failure as failed at finalise. Exit status 1 when portkern has a wrong or untyped
result. `--jobs` worker processes run cases in parallel (default 1); a case that takes longer than
`--timeout` seconds (default 600) is counted as a timeout and its worker replaced.

`--journal FILE` appends one JSON line per side of each finished case and makes a run resumable: a
case's portkern side is skipped when the journal holds it for the same portkern code (a digest of
the package's files; the git commit is recorded beside it), its IREE side when the journal holds it
for the same case (model, inputs, outputs, tolerances) and IREE version, so IREE's side is computed
once. The report is then computed from the journal (the newest result per case and side, preferring
the current code's), and says which commit produced the portkern results. `--only-from-journal
wrong,untyped error` re-runs the portkern side of just the cases whose journalled result is one of
those outcomes; `--summary-only` runs nothing and reports from the journal.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from portkern.base.errors import brief
from portkern.examples import onnx_conformance as conf

SIDES = ("portkern", "iree")
#: The import packages whose files make up the portkern code a result holds for.
PACKAGES = ("portkern", "portkern.portable", "portkern.jit", "portkern.cache", "portkern.tuner", "portkern.schemas", "portkern.examples")
IREE_COMPILE_FLAGS = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=host"]


def iree_direct(case: conf.Case, work: Path) -> conf.Outcome:
    """The case through IREE's own tools and runtime, as its ONNX guide shows."""
    import iree.runtime as rt
    import onnx
    from iree.compiler.tools.binaries import find_tool
    from iree.compiler.tools.import_onnx import __main__ as import_onnx

    model, mlir, vmfb = work / "model.onnx", work / "model.mlir", work / "model.vmfb"
    onnx.save(case.model, str(model))
    try:  # `iree-import-onnx model.onnx --opset-version 17 -o model.mlir`, without a process start
        import_onnx.main(import_onnx.parse_arguments([str(model), "--opset-version", "17", "-o", str(mlir)]))
    except Exception as exc:  # noqa: BLE001 - the importer raises whatever its steps raise
        return conf.Outcome(conf.REFUSED, f"{type(exc).__name__}: {brief(exc, lines=None, sep=' ', limit=400)}")
    compile_cmd = [find_tool("iree-compile"), *IREE_COMPILE_FLAGS, str(mlir), "-o", str(vmfb)]  # the binary the script runs
    done = subprocess.run(compile_cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if "error" in line.lower()] or done.stderr.splitlines()[-1:]
        return conf.Outcome(conf.FINALIZE, brief(lines[0] if lines else "no message", lines=None, sep=" ", limit=400))
    try:
        config = rt.Config("local-task")
        context = rt.SystemContext(config=config)
        module = rt.VmModule.copy_buffer(context.instance, vmfb.read_bytes())
        context.add_vm_module(module)
        function = context.modules[module.name][case.model.graph.name]
        results = function(*case.inputs)
    except Exception as exc:  # noqa: BLE001 - the runtime's errors are RuntimeError/ValueError/KeyError/TypeError
        return conf.Outcome(conf.RUN, f"{type(exc).__name__}: {brief(exc, lines=None, sep=' ', limit=300)}")
    if results is None:
        results = ()
    elif not isinstance(results, (tuple, list)):
        results = (results,)
    return conf.compare(case, [r.to_host() if hasattr(r, "to_host") else r for r in results])


def run_side(case: conf.Case, side: str) -> conf.Outcome:
    """One side's outcome of one case."""
    if side == "portkern":
        return conf.judge(case, conf.run_portkern)
    with tempfile.TemporaryDirectory(prefix="onnx-iree-") as tmp:
        return iree_direct(case, Path(tmp))


def worker(suite: str) -> None:
    """Run the cases asked for on stdin (one JSON request a line: name and sides); print one JSON
    line per side as soon as that side is done."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the compiler or importer prints goes to stderr, not into the replies
    sys.stdout = sys.stderr
    cases = {case.name: case for case in conf.cases_of(suite)}
    print(json.dumps({"ready": len(cases)}), file=out, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        case = cases[request["name"]]
        for side in request["sides"]:
            start = time.perf_counter()
            outcome = run_side(case, side)
            seconds = round(time.perf_counter() - start, 2)
            print(json.dumps({"name": case.name, "side": side, "kind": outcome.kind, "detail": outcome.detail, "s": seconds}), file=out, flush=True)


@dataclass
class Task:
    """One case, and the sides of it still to run."""

    name: str
    sides: list[str]


class Worker:
    """One worker process, fed tasks, with a timeout per side."""

    def __init__(self, suite: str, cache: Path) -> None:
        env = dict(os.environ, PORTKERN_CACHE_DIR=str(cache), PYTHONWARNINGS="ignore")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--models", suite],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True,
        )
        json.loads(self.proc.stdout.readline() or "{}")
        self.task: Task | None = None
        self.started = 0.0
        self._partial = b""

    def read_lines(self) -> list[str] | None:
        """The complete lines the worker has written since the last call (it writes nothing more
        until it is sent a task, so no line waits in a buffer); None when it has died."""
        data = os.read(self.proc.stdout.fileno(), 1 << 20)
        if not data:
            return None
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [line.decode() for line in lines]

    def send(self, task: Task) -> None:
        self.task, self.started = task, time.monotonic()
        self.proc.stdin.write(json.dumps({"name": task.name, "sides": task.sides}) + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait()


class Journal:
    """Finished sides of cases, one JSON line each, in memory and (with a path) appended to a file.
    A side's result holds for its key: the portkern code's digest, or the case's digest and the IREE
    version."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: list[dict] = []
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:  # a line cut short when a run was killed mid-write
                    continue
                if isinstance(entry, dict) and {"name", "side", "key", "kind"} <= entry.keys():
                    self.entries.append(entry)
        self._by_key = {(e["side"], e["name"], e["key"]): e for e in self.entries}
        self._latest = {(e["side"], e["name"]): e for e in self.entries}

    def add(self, entry: dict) -> None:
        self.entries.append(entry)
        self._by_key[entry["side"], entry["name"], entry["key"]] = entry
        self._latest[entry["side"], entry["name"]] = entry
        if self.path is not None:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(entry) + "\n").encode())
            finally:
                os.close(fd)

    def get(self, side: str, name: str, key: str | None = None) -> dict | None:
        """The side's result for `key`; with no key, the newest one whatever its key."""
        return self._latest.get((side, name)) if key is None else self._by_key.get((side, name, key))

    def best(self, side: str, name: str, key: str) -> dict | None:
        """The result for `key`, else the newest one."""
        return self.get(side, name, key) or self.get(side, name)


@dataclass(frozen=True)
class Keys:
    """What a side's result holds for: `portkern` (the code digest, and the commit for reports) and
    `iree` (the IREE and onnx versions, beside each case's digest)."""

    portkern: str
    commit: str
    iree: str
    cases: dict  # name -> case digest

    def of(self, side: str, name: str) -> str:
        return self.portkern if side == "portkern" else f"{self.cases[name]} {self.iree}"


def keys_for(cases: Sequence[conf.Case]) -> Keys:
    code, commit = portkern_code()
    from importlib.metadata import version

    iree = ", ".join(f"{p} {version(p)}" for p in ("iree-base-compiler", "iree-base-runtime", "onnx"))
    return Keys(code, commit, iree, {case.name: case_digest(case) for case in cases})


def portkern_code() -> tuple[str, str]:
    """A digest of the portkern package's files, and the git commit they are at ('+changes' when
    they differ from it; 'unknown' outside git)."""
    dirs = sorted({Path(p) for name in PACKAGES for p in importlib.util.find_spec(name).submodule_search_locations})
    root = Path(os.path.commonpath(dirs))
    digest = hashlib.sha256()
    for path in sorted(p for d in dirs for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"):
        digest.update(f"{path.relative_to(root)}\0{path.stat().st_size}\0".encode())
        digest.update(path.read_bytes())

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise OSError(done.stderr)
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        if git("status", "--porcelain", "--", *map(str, dirs)):
            commit += "+changes"
    except OSError:
        commit = "unknown"
    return digest.hexdigest()[:16], commit


def case_digest(case: conf.Case) -> str:
    """A digest of what a case is: model, inputs, reference outputs, tolerances."""
    digest = hashlib.sha256(case.model.SerializeToString())

    def feed(value) -> None:
        if isinstance(value, np.ndarray):
            digest.update(f"{value.dtype.str}{value.shape}".encode())
            digest.update(repr(value.tolist()).encode() if value.dtype == object else value.tobytes())
        elif isinstance(value, (list, tuple)):
            digest.update(b"[")
            for item in value:
                feed(item)
            digest.update(b"]")
        else:
            digest.update(repr(value).encode())

    feed((case.inputs, case.outputs, case.rtol, case.atol))
    return digest.hexdigest()[:16]


def plan(names: Iterable[str], journal: Journal, keys: Keys, force: frozenset[str] = frozenset()) -> list[Task]:
    """The sides still to run per case: those the journal lacks for their key (portkern always for
    the names in `force`)."""
    tasks = []
    for name in names:
        sides = [s for s in SIDES if (s == "portkern" and name in force) or journal.get(s, name, keys.of(s, name)) is None]
        if sides:
            tasks.append(Task(name, sides))
    return tasks


def run_all(suite: str, tasks: Sequence[Task], jobs: int, timeout: float, cache: Path, journal: Journal, keys: Keys) -> None:
    """Every task on `jobs` workers, in a seeded random order (so that an interrupted run, Ctrl-C or
    SIGTERM, has done a random sample of the cases), each finished side into the journal."""
    import random
    import selectors

    pending = list(tasks)
    random.Random(0).shuffle(pending)
    selector = selectors.DefaultSelector()
    workers: list[Worker] = []
    progress = Progress(len(tasks))

    def record(name: str, side: str, kind: str, detail: str, seconds: float) -> None:
        entry = {"name": name, "side": side, "key": keys.of(side, name), "kind": kind, "detail": detail, "s": seconds}
        entry.update({"commit": keys.commit} if side == "portkern" else {"versions": keys.iree})
        journal.add({**entry, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        progress.side_done(entry)

    def start() -> None:
        w = Worker(suite, cache)
        workers.append(w)
        selector.register(w.proc.stdout, selectors.EVENT_READ, w)
        feed(w)

    def feed(w: Worker) -> None:
        w.task = None
        if pending:
            w.send(pending.pop())

    def retire(w: Worker) -> None:
        selector.unregister(w.proc.stdout)
        workers.remove(w)
        w.stop()

    def lose(w: Worker, why: str, kind: str) -> None:
        """The side `w` was running is lost (counted as `kind`); the case's other sides go back in the queue."""
        side, *rest = w.task.sides
        record(w.task.name, side, kind, why, round(time.monotonic() - w.started, 2))
        if rest:
            pending.append(Task(w.task.name, rest))
        else:
            progress.case_done()
        retire(w)
        start()

    try:
        for _ in range(min(jobs, len(pending))):
            start()
        while any(w.task for w in workers):
            for key, _ in selector.select(timeout=5):
                w: Worker = key.data
                lines = w.read_lines()
                if lines is None:  # the worker died: the side it was running crashed it
                    lose(w, "worker process died", conf.UNTYPED)
                    continue
                for line in lines:
                    done = json.loads(line)
                    record(done["name"], done["side"], done["kind"], done["detail"], done["s"])
                    w.task.sides.remove(done["side"])
                    w.started = time.monotonic()
                if not w.task.sides:
                    progress.case_done()
                    feed(w)
            for w in list(workers):
                if w.task and time.monotonic() - w.started > timeout:
                    lose(w, f"over {timeout:.0f} s", conf.TIMEOUT)
    except KeyboardInterrupt:
        print(f"interrupted: {progress.cases} of {len(tasks)} cases done", file=sys.stderr)
    for w in list(workers):
        retire(w)


class Progress:
    """Progress lines on stderr: every portkern result that is wrong, untyped or a timeout at once,
    and a tally every 25 cases."""

    def __init__(self, total: int) -> None:
        self.total, self.cases = total, 0
        self.tally: Counter = Counter()

    def side_done(self, entry: dict) -> None:
        if entry["side"] != "portkern":
            return
        self.tally[entry["kind"]] += 1
        if entry["kind"] in (conf.WRONG, conf.UNTYPED, conf.TIMEOUT):
            print(f"  {entry['name']}: portkern {entry['kind']}: {entry['detail'][:300]}", file=sys.stderr, flush=True)

    def case_done(self) -> None:
        self.cases += 1
        if self.cases % 25 == 0 or self.cases == self.total:
            tally = ", ".join(f"{k}: {v}" for k, v in self.tally.most_common())
            print(f"  {self.cases}/{self.total} cases (portkern: {tally})", file=sys.stderr, flush=True)


def rows_of(cases: Sequence[conf.Case], journal: Journal, keys: Keys) -> list[dict]:
    """One row per case with each side's result from the journal (the current key's, else the
    newest); a side not run yet is absent from its row."""
    rows = []
    for case in sorted(cases, key=lambda c: c.name):
        row: dict = {"name": case.name, "family": case.family}
        for side in SIDES:
            entry = journal.best(side, case.name, keys.of(side, case.name))
            if entry is not None:
                row[side] = {k: entry[k] for k in ("kind", "detail", "s", "commit", "versions") if k in entry}
        rows.append(row)
    return rows


def summary(rows: list[dict]) -> dict:
    counts = {side: {kind: sum(r.get(side, {}).get("kind") == kind for r in rows) for kind in conf.OUTCOMES} for side in SIDES}
    missing = {side: sum(side not in r for r in rows) for side in SIDES}
    commits = Counter(r["portkern"].get("commit", "unknown") for r in rows if "portkern" in r)
    differ = [r for r in rows if all(s in r for s in SIDES) and r["portkern"]["kind"] != r["iree"]["kind"]]
    return {"cases": len(rows), "counts": counts, "not_run": missing, "portkern_commits": dict(commits), "differ": differ}


def print_report(rows: list[dict], title: str) -> None:
    result = summary(rows)
    print(f"{title}: {result['cases']} cases")
    print(f"  {'outcome':<20} {'portkern':>9} {'IREE directly':>14}")
    for kind in conf.OUTCOMES:
        print(f"  {kind:<20} {result['counts']['portkern'][kind]:>9} {result['counts']['iree'][kind]:>14}")
    if any(result["not_run"].values()):
        print(f"  {'not run yet':<20} {result['not_run']['portkern']:>9} {result['not_run']['iree']:>14}")
    commits = ", ".join(f"{commit}: {count}" for commit, count in sorted(result["portkern_commits"].items()))
    print(f"  portkern results by commit: {commits or 'none'}")
    print(f"\ncases where they differ ({len(result['differ'])}):")
    for r in result["differ"]:
        print(f"  {r['name']:<60} portkern: {r['portkern']['kind']:<18} IREE: {r['iree']['kind']}")
        for side in SIDES:
            if r[side]["kind"] != conf.CORRECT and r[side]["detail"]:
                print(f"      {side}: {r[side]['detail'][:220]}")
    bad = [r for r in rows if r.get("portkern", {}).get("kind") in (conf.WRONG, conf.UNTYPED)]
    if bad:
        print(f"\nportkern wrong or untyped ({len(bad)}):")
        for r in bad:
            print(f"  {r['name']}: {r['portkern']['kind']} ({r['portkern'].get('commit', '?')}): {r['portkern']['detail']}")


def write_expected(rows: list[dict], path: Path) -> None:
    """The cases portkern fails with a typed error, each with its cause, as YAML (merged into `path`)."""
    import yaml

    old = yaml.safe_load(path.read_text()) if path.exists() else {}
    for r in (r for r in rows if "portkern" in r):
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


def shard(cases: Sequence[conf.Case], spec: str) -> list[conf.Case]:
    """Shard K of N (`K/N`, K from 1): every Nth case by name, from the Kth."""
    try:
        k, n = (int(part) for part in spec.split("/"))
        if not 1 <= k <= n:
            raise ValueError
    except ValueError:
        raise SystemExit(f"--shard takes K/N with 1 <= K <= N, not {spec!r}") from None
    return [case for i, case in enumerate(sorted(cases, key=lambda c: c.name)) if i % n == k - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="node", choices=("node", "pytorch-converted"))
    parser.add_argument("--cases", type=int, help="a seeded representative subset of about N cases (every family)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--filter", help="only cases whose name matches this regular expression")
    parser.add_argument("--shard", metavar="K/N", help="only shard K of N of the cases (every Nth by name)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes running cases in parallel")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one side of one case may take")
    parser.add_argument("--journal", type=Path, help="append finished sides here (JSON lines); skip what it holds for the same code")
    parser.add_argument("--only-from-journal", metavar="KIND,...", help="re-run portkern on the cases the journal has as one of these outcomes")
    parser.add_argument("--summary-only", action="store_true", help="run nothing: report from the journal")
    parser.add_argument("--json", type=Path, help="write every case's outcomes here")
    parser.add_argument("--write-expected", type=Path, metavar="YAML", help="write portkern's typed failures as an expected-failures list")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.models)
        return 0
    if (args.only_from_journal or args.summary_only) and not args.journal:
        parser.error("--only-from-journal and --summary-only read the --journal")
    cases = conf.cases_of(args.models)
    if args.filter:
        cases = [c for c in cases if re.search(args.filter, c.name)]
    if args.cases:
        cases = conf.representative(cases, args.cases, args.seed)
    if args.shard:
        cases = shard(cases, args.shard)
    journal, keys = Journal(args.journal), keys_for(cases)
    force: frozenset[str] = frozenset()
    if args.only_from_journal:
        kinds = {kind.strip() for kind in args.only_from_journal.split(",")}
        if kinds - set(conf.OUTCOMES):
            parser.error(f"--only-from-journal takes outcomes among: {', '.join(conf.OUTCOMES)}")
        cases = [c for c in cases if (journal.get("portkern", c.name) or {}).get("kind") in kinds]
        force = frozenset(c.name for c in cases)
    tasks = [] if args.summary_only else plan([c.name for c in cases], journal, keys, force)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(
        f"{len(cases)} {args.models} cases, {len(tasks)} to run on {args.jobs} worker(s) "
        f"(portkern {keys.commit}, code {keys.portkern}; {keys.iree}) ...",
        file=sys.stderr, flush=True,
    )
    start = time.perf_counter()
    if tasks:
        with tempfile.TemporaryDirectory(prefix="onnx-conformance-cache-") as cache:
            run_all(args.models, tasks, args.jobs, args.timeout, Path(cache), journal, keys)
    took = time.perf_counter() - start
    rows = rows_of(cases, journal, keys)
    print_report(rows, f"ONNX {args.models} cases ({len(tasks)} run in {took:.0f} s on {args.jobs} job(s))")
    if args.write_expected:
        write_expected(rows, args.write_expected)
    if args.json:
        args.json.write_text(json.dumps({"suite": args.models, "seconds": took, **summary(rows), "rows": rows}, indent=1))
    return 1 if any(r.get("portkern", {}).get("kind") in (conf.WRONG, conf.UNTYPED) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
