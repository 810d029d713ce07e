"""Serving: kernels made in a parent work in forked children and from many threads at once."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import portkern
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.examples.reference import EXAMPLES
from portkern.jit import gate, runtime

from helpers import assert_matches, opencl_device_missing

#: Seconds a forked child may take for its calls before the test fails (it used to hang).
CHILD_BOUND_S = 120
FORK = multiprocessing.get_context("fork")

#: The kernel the fork-started pool's workers call (inherited from the parent, never pickled).
_inherited_kernel = None


def _check_calls(kernel, seed: int, calls: int = 3) -> str:
    """'' when `calls` calls of an example kernel match NumPy, else what went wrong."""
    example = EXAMPLES[kernel.name]
    rng = np.random.default_rng(seed)
    try:
        for _ in range(calls):
            inputs = example.inputs(rng)
            assert_matches(kernel(*inputs), example.reference(*inputs), example.rtol, example.atol)
    except Exception as exc:  # reported to the parent, which fails the test
        return f"{type(exc).__name__}: {exc}"
    return ""


def _pool_task(seed: int) -> str:
    return _check_calls(_inherited_kernel, seed)


def _child(kernel, seed: int, queue) -> None:
    queue.put((seed, _check_calls(kernel, seed)))


@pytest.fixture(scope="module")
def served(examples_bundle, tmp_path_factory):
    """The example bundle on a cache shared by this module's tests (each kernel finalised once)."""
    return portkern.load(examples_bundle, store=Store(CacheConfig(tmp_path_factory.mktemp("serving-cache"), 1 << 30, False)))


@pytest.mark.parametrize(("name", "called_in_parent"), [("mlp", False), ("gemm_bias_relu", True)])
def test_kernel_from_parent_runs_in_forked_children(served, name, called_in_parent):
    kernel = served.kernel(name)
    if called_in_parent:  # past the inline probes, so the parent has used the task executor
        assert _check_calls(kernel, 0, calls=runtime.INLINE_PROBES + 2) == ""
    queue = FORK.Queue()
    children = [FORK.Process(target=_child, args=(kernel, seed, queue)) for seed in range(1, 5)]
    for child in children:
        child.start()
    try:
        reports = dict(queue.get(timeout=CHILD_BOUND_S) for _ in children)
    finally:
        for child in children:
            child.join(timeout=5)
            if child.is_alive():
                child.kill()
    assert reports == {seed: "" for seed in range(1, 5)}
    assert all(child.exitcode == 0 for child in children)
    assert _check_calls(kernel, 9) == ""  # the parent still works


def test_kernel_from_parent_runs_in_fork_started_pool(served):
    global _inherited_kernel
    _inherited_kernel = served.kernel("gemm_bias_relu")
    assert _check_calls(_inherited_kernel, 0, calls=runtime.INLINE_PROBES + 2) == ""
    with FORK.Pool(4) as pool:
        reports = pool.map_async(_pool_task, range(1, 9)).get(timeout=CHILD_BOUND_S)
    assert reports == [""] * 8


@pytest.mark.parametrize("name", ["mlp", "gemm_bias_relu"])
def test_concurrent_calls_from_threads_match_numpy(served, name):
    """Calls overlap on the task executor and inline on the callers' threads; each must be right."""
    kernel = served.kernel(name)
    reports: list[str] = []
    threads = [threading.Thread(target=lambda seed=seed: reports.append(_check_calls(kernel, seed, calls=6))) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=CHILD_BOUND_S)
    assert reports == [""] * 8




OPENCL_FORK = """
import os, sys, numpy as np, portkern
loaded = portkern.load(sys.argv[1])
kernel = loaded.kernel("vadd", device="opencl")
x = np.arange(1000, dtype=np.float32)
assert np.array_equal(kernel(x, x), 2 * x)
pid = os.fork()
if pid == 0:
    for attempt in (lambda: kernel(x, x), lambda: loaded.kernel("softmax_rows", device="opencl")):
        try:
            attempt()
        except portkern.ForkError as exc:
            print("child:", type(exc).__name__, "spawn" in str(exc))
    sys.exit(0)  # a normal exit: atexit handlers run in the child
os.waitpid(pid, 0)
print("scratch kept:", os.path.isdir(os.environ["POCL_CACHE_DIR"]))
after = loaded.kernel("matmul_tiled", device="opencl")  # one nobody has built yet
print("parent:", after.origin)
"""


def test_opencl_after_fork_raises_fork_error_and_parent_keeps_working(opencl_examples_bundle, tmp_path):
    """OpenCL drivers do not survive fork: the child gets a typed error, not a hang, and its
    exit leaves the parent's PoCL scratch directory alone (the parent's next build needs it)."""
    if opencl_device_missing():
        pytest.skip(opencl_device_missing())
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("POCL_")}
    env["PORTKERN_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OPENCL_FORK), str(opencl_examples_bundle)],
        env=env, capture_output=True, text=True, timeout=CHILD_BOUND_S * 2,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["child: ForkError True", "child: ForkError True", "scratch kept: True", "parent: finalized"]


def _probed_gemm_drivers(kernel, monkeypatch, executor_ms: float) -> list[str]:
    """`kernel` past its probes, which found 1 ms inline and `executor_ms` on the task
    executor, with nothing overlapping lately; the list the driver of each later call goes to."""
    executable = kernel.executable
    monkeypatch.setattr(executable, "_inline_probes", runtime.INLINE_PROBES)
    monkeypatch.setattr(executable, "_inline_s", 1e-3)
    monkeypatch.setattr(executable, "_executor_probes", runtime.EXECUTOR_PROBES)
    monkeypatch.setattr(executable, "_executor_s", executor_ms * 1e-3)
    monkeypatch.setattr(runtime, "OVERLAP_WINDOW_S", 0.0)
    used: list[str] = []
    host_call = executable._host_call
    monkeypatch.setattr(executable, "_host_call", lambda driver, *args: used.append(driver) or host_call(driver, *args))
    return used


@pytest.mark.parametrize(("executor_ms", "on_executor"), [(0.9, False), (0.5, True)])
def test_lone_calls_use_the_task_executor_only_when_it_is_clearly_faster(served, monkeypatch, executor_ms, on_executor):
    """After the probes, a lone call goes to the task executor only when its probes ran
    `EXECUTOR_GAIN` times faster than inline (here inline took 1 ms)."""
    kernel = served.kernel("gemm_bias_relu")
    used = _probed_gemm_drivers(kernel, monkeypatch, executor_ms)
    assert _check_calls(kernel, 3, calls=2) == ""
    assert used == (["local-task"] * 2 if on_executor else ["local-sync"] * 2)


def _drivers_child(kernel, used: list, queue) -> None:
    used.clear()
    report = _check_calls(kernel, 4, calls=2)
    queue.put((report, list(used)))


def test_a_forked_child_runs_lone_calls_on_the_calling_thread(served, monkeypatch):
    """A pre-fork server's workers share the cores: in a forked child a lone call stays on the
    calling thread even where the parent found the task executor clearly faster (each child
    spreading its calls over every core made two children worth 1.1 times one)."""
    kernel = served.kernel("gemm_bias_relu")
    used = _probed_gemm_drivers(kernel, monkeypatch, 0.5)
    assert _check_calls(kernel, 3, calls=1) == "" and used == ["local-task"]
    queue = FORK.Queue()
    child = FORK.Process(target=_drivers_child, args=(kernel, used, queue))
    child.start()
    try:
        assert queue.get(timeout=CHILD_BOUND_S) == ("", ["local-sync"] * 2)
    finally:
        child.join(timeout=5)
        if child.is_alive():
            child.kill()


def _calls_from_threads(kernel, threads: int = 4, calls: int = 4) -> list[str]:
    reports: list[str] = []
    workers = [threading.Thread(target=lambda seed=seed: reports.append(_check_calls(kernel, seed, calls))) for seed in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=CHILD_BOUND_S)
    return reports




def test_fork_while_a_thread_is_inside_the_gate(served):
    """A child forked while another thread of the parent is inside the gate gets a gate of its
    own (the parent's would never open there)."""
    kernel = served.kernel("mlp")
    assert _check_calls(kernel, 0, calls=runtime.INLINE_PROBES) == ""
    gate = runtime._process.gate
    gate.enter(1e-4)
    try:
        queue = FORK.Queue()
        child = FORK.Process(target=_child, args=(kernel, 5, queue))
        child.start()
        try:
            assert queue.get(timeout=CHILD_BOUND_S) == (5, "")
        finally:
            child.join(timeout=5)
            if child.is_alive():
                child.kill()
    finally:
        gate.leave()
    assert _check_calls(kernel, 6) == ""


def test_the_serving_bench_deployer_models_match_numpy(tmp_path):
    """The MNIST MLP and CNN the serving bench times compute what their NumPy references say."""
    pytest.importorskip("onnx", reason="the deployer's models are ONNX graphs (portkern[onnx])")
    from portkern.examples import serving_models
    from portkern.portable.builder import build_file

    build_file(serving_models.manifest(tmp_path / "models"), tmp_path / "deployer.pkb")
    loaded = portkern.load(tmp_path / "deployer.pkb", store=Store(CacheConfig(tmp_path / "cache", 1 << 30, False)))
    for model in (serving_models.mnist_mlp(), serving_models.mnist_cnn()):
        kernel = loaded.kernel(model.name)
        for seed in range(2):
            inputs = model.inputs(np.random.default_rng(seed))
            assert_matches(kernel(*inputs), model.reference(*inputs), model.rtol, model.atol)
