"""`portkern inspect` shows, per kernel, what this device's tuning DB holds for it: the config the
kernel is served with, its module options (a compiler-level choice) and tuned dispatches."""

from __future__ import annotations

import numpy as np
from helpers import attention_mlir, build_mlir, cli_json

import portkern
from portkern.cache.config import from_env
from portkern.cache.store import Store
from portkern.cache.tuning import TuningDB
from portkern.jit import devices
from portkern.jit.native import compiler_id, selection_problem
from portkern.tuner import kernel_config, perfconfig


def attention_reference(q, k, v):
    s = q.astype(np.float64) @ k.transpose(0, 2, 1) * 0.125
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def test_inspect_shows_the_stored_module_options_a_budgeted_tune_chose(tmp_path, capsys):
    """`tune --budget 1` compiles the first module-option variant that applies (attention
    decomposed), checks and times it, and stores the kernel's choice; `inspect --json` reports
    the choice the tuning DB holds (config, module options, tuned dispatches), the kernel is
    served with it, and it computes what NumPy does."""
    path = build_mlir(tmp_path, "att", attention=attention_mlir(2, 64, 32), plain="func.func @plain(%a: tensor<8xf32>) -> tensor<8xf32> {\n  return %a : tensor<8xf32>\n}\n")
    cache = str(tmp_path / "cache")
    store = Store(from_env(cache))  # the store the commands use
    status, tuned = cli_json(capsys, "tune", path, "--kernel", "attention", "--budget", "1", "--cache-dir", cache)
    assert status == 0, tuned
    (result,) = tuned["kernels"]
    assert "attention-decomposed" in {e["config"] for e in result["evaluations"]}, result["note"]

    status, shown = cli_json(capsys, "inspect", path, "--cache-dir", cache)
    assert status == 0
    target = devices.resolve("cpu", store)
    assert (shown["tuning_device"], shown["cache_dir"]) == (target.label, str(store.directory))
    kernels = {k["name"]: k["tuning"] for k in shown["kernels"]}
    record = portkern.load(path, store=store).record("attention")
    stored = TuningDB(store, compiler_id(record)).selection(selection_problem(record, target), target.fingerprint)
    assert stored is not None and stored["config"] == result["config"]
    held = kernel_config.parse(stored["config"])
    assert kernels["attention"]["stored"] and kernels["attention"]["config"] == stored["config"]
    assert kernels["attention"]["options"] == list(held.options)
    assert kernels["attention"]["dispatches"] == [{"index": i, "config": perfconfig.to_string(c)} for i, c in held.dispatches]
    assert (kernels["attention"]["strategy"], kernels["attention"]["complete"]) == ("quick", False)
    # never tuned: the compiler's default, nothing stored
    assert (kernels["plain"]["config"], kernels["plain"]["stored"], kernels["plain"]["options"]) == ("default", False, [])

    kernel = portkern.load(path, store=store).kernel("attention")
    assert kernel.config == kernels["attention"]["config"]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 64, 32), dtype=np.float32) for _ in range(3))
    np.testing.assert_allclose(kernel(q, k, v), attention_reference(q, k, v), rtol=1e-5, atol=1e-6)

    # the text form names the choice too
    from portkern.cli.main import main

    assert main(["inspect", str(path), "--cache-dir", cache]) == 0
    text = capsys.readouterr().out
    assert f"tuning on {target.label}" in text
    assert ("attention-decomposed" in text) == ("attention-decomposed" in held.options)
