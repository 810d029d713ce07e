"""`portkern.onnx.prepare` keeps the bundle it built in the cache directory (`bundles/<digest>.pkb`)
and a later `prepare` of the same model bytes and options, in another process too, loads it instead
of building; different bytes or options build their own, and a kept bundle the loader refuses is
built anew. Every result is compared with onnx's reference evaluator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX backend needs the onnx package (portkern[onnx])")

from helpers import last_json, logged, run_past_a_pipe  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import portkern.onnx as backend  # noqa: E402
from portkern.cache.layout import BUNDLES  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5
X = np.random.default_rng(3).standard_normal((5, 32)).astype(np.float32)

#: Prepares the model at argv[1] in a fresh process; prints where its bundle came from and the outputs.
CHILD = """
import json, sys
import numpy as np, onnx
import portkern.onnx as backend
rep = backend.prepare(onnx.load(sys.argv[1]), "CPU")
y = rep.run([np.load(sys.argv[2])]).y
print(json.dumps({"origin": rep.bundle_origin, "y": y.tolist()}))
"""


def dense(seed: int) -> onnx.ModelProto:
    """y = Tanh(x @ W + B) with a 32 x 24 weight (a parameter) and a 24-element bias."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((32, 24)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "B")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["a"]),
             helper.make_node("Tanh", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 24])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def reference(model: onnx.ModelProto) -> np.ndarray:
    return ReferenceEvaluator(model).run(None, {"x": X})[0]


def kept(store) -> list[Path]:
    return sorted((store.directory / BUNDLES).glob("*.pkb"))


def test_a_second_prepare_in_a_fresh_process_loads_the_kept_bundle(tmp_path):
    model = dense(1)
    onnx.save_model(model, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", X)
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "m.onnx"), str(tmp_path / "x.npy")],
                              capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [r["origin"] for r in runs] == ["built", "cache"]
    for run in runs:
        np.testing.assert_allclose(np.array(run["y"], np.float32), reference(model), rtol=RTOL, atol=ATOL)
    assert len(list((tmp_path / "cache").rglob(f"{BUNDLES}/*.pkb"))) == 1
    assert not list((tmp_path / "cache").rglob(f"{BUNDLES}/.*.part"))


def test_other_weights_or_another_name_build_their_own_bundle(store):
    first, other = dense(2), dense(3)
    reps = [backend.prepare(first, "CPU", store=store), backend.prepare(other, "CPU", store=store),
            backend.prepare(first, "CPU", store=store, name="renamed"), backend.prepare(first, "CPU", store=store)]
    assert [r.bundle_origin for r in reps] == ["built", "built", "built", "cache"]
    assert len(kept(store)) == 3
    for rep, model in zip(reps, (first, other, first, first)):
        np.testing.assert_allclose(rep.run([X]).y, reference(model), rtol=RTOL, atol=ATOL)
    assert not np.allclose(reference(first), reference(other))  # the two models differ in what they compute


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_a_kept_bundle_the_loader_refuses_is_built_anew(store, caplog, damage):
    model = dense(4)
    assert backend.prepare(model, "CPU", store=store).bundle_origin == "built"
    [path] = kept(store)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else data[:64] + bytes(len(data) - 64))
    rep = backend.prepare(model, "CPU", store=store)
    assert logged(caplog, "kept ONNX bundle was refused and is built anew")
    assert rep.bundle_origin == "built"
    np.testing.assert_allclose(rep.run([X]).y, reference(model), rtol=RTOL, atol=ATOL)
    assert backend.prepare(model, "CPU", store=store).bundle_origin == "cache"


def test_cache_verify_keeps_the_bundles_and_clear_removes_them(store):
    model = dense(5)
    assert backend.prepare(model, "CPU", store=store).bundle_origin == "built"
    assert not [f for f in store.verify() if BUNDLES in f.name]
    assert len(kept(store)) == 1
    assert backend.prepare(model, "CPU", store=store).bundle_origin == "cache"
    store.clear()
    assert not kept(store)
    rep = backend.prepare(model, "CPU", store=store)
    assert rep.bundle_origin == "built"
    np.testing.assert_allclose(rep.run([X]).y, reference(model), rtol=RTOL, atol=ATOL)


def test_a_named_pipe_in_place_of_a_kept_bundles_notes_is_passed_over(tmp_path):
    """Whoever can write in the cache directory swaps the build notes kept beside a bundle
    (`<digest>.json`) for a named pipe: a later `prepare` in a fresh process neither waits on it
    nor fails; it loads the kept bundle and computes the same numbers."""
    model = dense(6)
    onnx.save_model(model, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", X)
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-c", CHILD, str(tmp_path / "m.onnx"), str(tmp_path / "x.npy")]
    assert subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600).returncode == 0
    (notes,) = (tmp_path / "cache").rglob(f"{BUNDLES}/*.json")
    run = last_json(run_past_a_pipe(notes, argv, "prepare", env))
    assert run["origin"] == "cache"
    np.testing.assert_allclose(np.array(run["y"], np.float32), reference(model), rtol=RTOL, atol=ATOL)
