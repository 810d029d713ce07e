"""The outside ONNX corpus: models nobody here wrote (the onnx package's shipped `pytorch-converted`
and `light` models), each run the two ways users run an ONNX model, in a fresh process with a fresh
cache, and compared with onnx's reference outputs.

Routes: `manifest` (a manifest naming the `.onnx` file as shipped, `portkern build`, `portkern.load`,
the kernel called on the inputs) and `backend` (`portkern.onnx.prepare(model, "CPU").run(inputs)`).
`light` models ship reference outputs only; their inputs are what onnx's backend test runner feeds
them (`generate_dummy_data(random=False)`: `arange(n) / n` in the input's shape).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from portkern.base.records import frozen_record

#: Tolerances every output is judged at (as onnx's backend tests judge them).
RTOL, ATOL = 1e-3, 1e-5
ROUTES = ("manifest", "backend")
SUITES = ("pytorch-converted", "light")


@frozen_record
class Model:
    """One corpus model: its suite, name and `.onnx` file."""

    suite: str
    name: str
    path: Path


@frozen_record
class Result:
    """One model through one route: built, correct, the largest error, why not (empty when correct)."""

    model: str
    route: str
    built: bool
    correct: bool
    max_error: float | None
    reason: str
    seconds: float


def data_dir() -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data"


def models(suites: tuple[str, ...] = SUITES) -> list[Model]:
    """Every corpus model of the suites, sorted by suite and name."""
    found = []
    if "pytorch-converted" in suites:
        for path in sorted((data_dir() / "pytorch-converted").glob("*/model.onnx")):
            if sorted(path.parent.glob("test_data_set_*")):
                found.append(Model("pytorch-converted", path.parent.name, path))
    if "light" in suites:
        for path in sorted((data_dir() / "light").glob("*.onnx")):
            found.append(Model("light", path.stem, path))
    return found


def by_name(name: str) -> Model:
    """The corpus model called `name` (LookupError when none)."""
    for model in models():
        if model.name == name:
            return model
    raise LookupError(f"no corpus model {name!r}")


def sample(count_per_suite: dict[str, int], seed: int, always: tuple[str, ...] = ()) -> list[Model]:
    """The models named in `always`, then per suite `count` others drawn with `seed` (the same for the same seed)."""
    everything = models()
    chosen = [m for name in always for m in everything if m.name == name]
    rng = random.Random(seed)
    for suite, count in count_per_suite.items():
        pool = [m for m in everything if m.suite == suite and m not in chosen]
        chosen += rng.sample(pool, min(count, len(pool)))
    return chosen


def reference(model: Model) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The model's inputs (in graph order, initializers left out) and onnx's reference outputs."""
    import onnx
    from onnx import numpy_helper

    def tensor(path: Path) -> np.ndarray:
        return numpy_helper.to_array(onnx.load_tensor(str(path)))

    if model.suite == "pytorch-converted":
        case = sorted(model.path.parent.glob("test_data_set_*"))[0]

        def listed(kind: str) -> list[np.ndarray]:
            return [tensor(p) for p in sorted(case.glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))]

        return listed("input"), listed("output")
    proto = onnx.load(str(model.path), load_external_data=False)
    initializers = {t.name for t in proto.graph.initializer}
    inputs = []
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in value.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        inputs.append((np.arange(n).reshape(shape) / n).astype(np.float32))
    outputs = [tensor(model.path.with_name(f"{model.path.stem}_output_{i}.pb")) for i in range(len(proto.graph.output))]
    return inputs, outputs


def input_names(model: Model) -> list[str]:
    """The names of the inputs a caller passes, as the model writes them."""
    import onnx

    proto = onnx.load(str(model.path), load_external_data=False)
    initializers = {t.name for t in proto.graph.initializer}
    return [v.name for v in proto.graph.input if v.name not in initializers]


def judge(got, want: list[np.ndarray]) -> tuple[bool, float | None, str]:
    """(correct, the largest absolute error, why not) of outputs against the reference."""
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    if len(got) != len(want):
        return False, None, f"{len(got)} outputs, expected {len(want)}"
    worst = 0.0
    for index, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.shape != w.shape:
            return False, None, f"output {index}: shape {g.shape}, expected {w.shape}"
        error = float(np.nanmax(np.abs(g.astype(np.float64) - w.astype(np.float64)))) if g.size else 0.0
        worst = max(worst, error)
        if not np.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True):
            return False, worst, f"output {index}: max error {error:.3g} beyond rtol {RTOL}, atol {ATOL}"
    return True, worst, ""


def run_route(model: Model, route: str, work: Path, by_names: bool = False) -> dict:
    """Run one model one way in this process (the child side of `run`); `work`: a fresh directory
    (it holds the manifest and bundle). A dict: built, correct, max_error, reason."""
    import onnx

    import portkern
    from portkern import onnx as backend
    from portkern.base.errors import PortkernError, brief

    inputs, outputs = reference(model)
    got: np.ndarray | tuple[np.ndarray, ...]
    if route == "backend":
        try:
            rep = backend.prepare(onnx.load(str(model.path)), "CPU")
        except PortkernError as exc:
            return {"built": False, "correct": False, "max_error": None, "reason": f"{type(exc).__name__}: {brief(str(exc))}"}
        try:
            got = rep.run(dict(zip(input_names(model), inputs)) if by_names else inputs)
        except PortkernError as exc:
            return {"built": True, "correct": False, "max_error": None, "reason": f"{type(exc).__name__}: {brief(str(exc))}"}
    else:
        manifest = work / "m.yaml"
        manifest.write_text(f"bundle: corpus\nkernels:\n  - name: model\n    source: {json.dumps(str(model.path))}\n")
        cli = Path(sys.executable).with_name("portkern")
        done = subprocess.run([str(cli), "build", str(manifest), "-o", str(work / "m.pkb")], capture_output=True, text=True)
        if done.returncode:
            return {"built": False, "correct": False, "max_error": None, "reason": brief(done.stderr or f"exit {done.returncode}", last=True)}
        try:
            kernel = portkern.load(work / "m.pkb").kernel("model", device="cpu")
            got = kernel(**dict(zip(input_names(model), inputs))) if by_names else kernel(*inputs)
        except PortkernError as exc:
            return {"built": True, "correct": False, "max_error": None, "reason": f"{type(exc).__name__}: {brief(str(exc))}"}
    correct, error, reason = judge(got, outputs)
    return {"built": True, "correct": correct, "max_error": error, "reason": reason}


def run(model: Model, route: str, timeout_s: float = 600, by_names: bool = False, python: str = sys.executable) -> Result:
    """One model through one route in a fresh process with a fresh cache directory."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="portkern-corpus-") as tmp:
        env = dict(os.environ, PORTKERN_CACHE_DIR=str(Path(tmp) / "cache"))
        code = (
            "import json, sys; from pathlib import Path; from portkern.examples import onnx_corpus as c; "
            "print('RESULT ' + json.dumps(c.run_route(c.by_name(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4] == '1')))"
        )
        try:
            done = subprocess.run(
                [python, "-c", code, model.name, route, tmp, "1" if by_names else "0"],
                capture_output=True, text=True, env=env, timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            return Result(model.name, route, False, False, None, f"no result within {timeout_s:.0f} s", time.monotonic() - start)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return Result(model.name, route, False, False, None, f"the process ended without a result ({tail[:240]})", time.monotonic() - start)
    data = json.loads(lines[-1][len("RESULT "):])
    return Result(model.name, route, data["built"], data["correct"], data["max_error"], data["reason"], time.monotonic() - start)
