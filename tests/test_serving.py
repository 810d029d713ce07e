"""Serving: kernels made in a parent work in forked children and from many threads at once, and
where a CPU call runs (the calling thread or IREE's task executor) follows a rule of its
arguments' size and a setting."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest
from helpers import assert_matches, opencl_device_missing

import portkern
from portkern.base import settings
from portkern.base.settings import SettingWarning
from portkern.cache.config import CacheConfig
from portkern.cache.store import Store
from portkern.examples.reference import EXAMPLES

#: Seconds a forked child may take for its calls before the test fails (it used to hang).
CHILD_BOUND_S = 120
FORK = multiprocessing.get_context("fork")
#: The example kernels served here: a small one (mostly Python work per call) and a large one.
SMALL, LARGE = "mlp", "gemm_bias_relu"

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


def _calls_from_threads(kernel, threads: int = 8, calls: int = 6) -> list[str]:
    """Each thread's report (see `_check_calls`) of `calls` calls, all threads started together."""
    reports: list[str] = []
    start = threading.Barrier(threads)

    def work(seed: int) -> None:
        start.wait()
        reports.append(_check_calls(kernel, seed, calls))

    workers = [threading.Thread(target=work, args=(seed,)) for seed in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=CHILD_BOUND_S)
    assert not any(worker.is_alive() for worker in workers), "a calling thread never returned"
    return reports


def _pool_task(seed: int) -> str:
    return _check_calls(_inherited_kernel, seed)


def _child(kernel, seed: int, queue) -> None:
    queue.put((seed, _check_calls(kernel, seed)))


def _driver_child(kernel, queue) -> None:
    inputs = EXAMPLES[kernel.name].inputs(np.random.default_rng(0))
    queue.put((kernel.executable.driver_for(inputs), _check_calls(kernel, 4)))


def _in_child(target, *args):
    """What `target(*args, queue)` put on the queue in a forked child, which must exit with 0."""
    queue = FORK.Queue()
    child = FORK.Process(target=target, args=(*args, queue))
    child.start()
    try:
        return queue.get(timeout=CHILD_BOUND_S)
    finally:
        child.join(timeout=CHILD_BOUND_S)
        if child.is_alive():
            child.kill()
        assert child.exitcode == 0


@pytest.fixture(scope="module")
def served_cache(tmp_path_factory):
    """The cache directory this module's kernels are finalised into (each kernel once)."""
    return tmp_path_factory.mktemp("serving-cache")


@pytest.fixture(scope="module")
def served(examples_bundle, served_cache):
    """The example bundle on the module's cache."""
    return portkern.load(examples_bundle, store=Store(CacheConfig(served_cache, 1 << 30, False)))


def _kernel_with(examples_bundle, served_cache, monkeypatch, name: str, executor_min_bytes: str | None):
    """An example kernel of the bundle loaded again (so its code is loaded afresh) under a
    `PORTKERN_EXECUTOR_MIN_BYTES` value (None: unset), running its final code."""
    if executor_min_bytes is None:
        monkeypatch.delenv(settings.EXECUTOR_MIN_BYTES, raising=False)
    else:
        monkeypatch.setenv(settings.EXECUTOR_MIN_BYTES, executor_min_bytes)
    kernel = portkern.load(examples_bundle, store=Store(CacheConfig(served_cache, 1 << 30, False))).kernel(name)
    assert kernel.wait(CHILD_BOUND_S)
    return kernel


@pytest.mark.parametrize(("name", "called_in_parent"), [(SMALL, False), (LARGE, True)])
def test_kernel_from_parent_runs_in_forked_children(served, name, called_in_parent):
    kernel = served.kernel(name)
    if called_in_parent:
        assert _check_calls(kernel, 0, calls=5) == ""
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
    _inherited_kernel = served.kernel(LARGE)
    assert _check_calls(_inherited_kernel, 0, calls=5) == ""
    with FORK.Pool(4) as pool:
        reports = pool.map_async(_pool_task, range(1, 9)).get(timeout=CHILD_BOUND_S)
    assert reports == [""] * 8


@pytest.mark.parametrize("executor_min_bytes", ["4MiB", "0"], ids=["default-rule", "all-on-executor"])
@pytest.mark.parametrize("name", [SMALL, LARGE])
def test_calls_from_eight_threads_at_once_match_numpy(examples_bundle, served_cache, monkeypatch, name, executor_min_bytes):
    """Eight threads call one kernel object at once, on the calling threads (the default rule
    for these kernels) and on IREE's task executor (every call, `PORTKERN_EXECUTOR_MIN_BYTES=0`);
    every result is right."""
    kernel = _kernel_with(examples_bundle, served_cache, monkeypatch, name, executor_min_bytes)
    assert _calls_from_threads(kernel) == [""] * 8


def test_eight_threads_calling_two_kernels_at_once_match_numpy(served):
    """Threads calling a small and a large kernel side by side, each result checked."""
    small, large = served.kernel(SMALL), served.kernel(LARGE)
    reports: list[str] = []
    start = threading.Barrier(8)

    def work(seed: int) -> None:
        start.wait()
        reports.append(_check_calls(small if seed % 2 else large, seed, calls=6))

    workers = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=CHILD_BOUND_S)
    assert reports == [""] * 8


PRE_FORK_SERVER = """
import os, sys, threading, numpy as np, portkern
from portkern.examples.reference import EXAMPLES

names = sys.argv[2].split(",")
loaded = portkern.load(sys.argv[1])
for name in names:  # the parent asks for each kernel once (a pre-fork server warms its cache)
    loaded.kernel(name).wait()

def serve(worker):
    reports = []
    def calls(name, seed):
        kernel = loaded.kernel(name)
        example = EXAMPLES[name]
        rng = np.random.default_rng(seed)
        for _ in range(4):
            inputs = example.inputs(rng)
            got = kernel(*inputs)
            got = got if isinstance(got, tuple) else (got,)
            for have, want in zip(got, example.reference(*inputs)):
                np.testing.assert_allclose(have, want, rtol=example.rtol, atol=example.atol)
        reports.append(name)
    threads = [threading.Thread(target=calls, args=(name, i)) for i, name in enumerate(names * 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sys.stdout.flush()  # one write() per line: forked workers share the pipe, and a print may take two
    os.write(1, f"worker {worker}: {len(reports)} checked\\n".encode())

pids = []
for worker in range(3):
    pid = os.fork()
    if pid == 0:
        serve(worker)
        sys.exit(0)  # a normal exit: exit handlers run in the child
    pids.append(pid)
statuses = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
print("workers exited:", statuses)
serve("parent")
"""


def test_pre_fork_workers_load_and_call_kernels(examples_bundle, served_cache):
    """A pre-fork server: the parent loads the bundle and forks; each worker asks for its
    kernels and calls them from two threads each, every result checked against NumPy, then
    exits normally with status 0; the parent still serves afterwards."""
    env = {**os.environ, settings.CACHE_DIR: str(served_cache)}
    env.pop(settings.EXECUTOR_MIN_BYTES, None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PRE_FORK_SERVER), str(examples_bundle), f"{SMALL},{LARGE}"],
        env=env, capture_output=True, text=True, timeout=CHILD_BOUND_S * 3,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sorted(lines[:3]) == [f"worker {w}: 4 checked" for w in range(3)]
    assert lines[3:] == ["workers exited: [0, 0, 0]", "worker parent: 4 checked"]


def test_fork_while_another_thread_is_calling(served):
    """A child forked while another thread of the parent keeps calling the kernel gets a
    runtime of its own: its calls are right and it exits, and the parent's thread goes on."""
    kernel = served.kernel(SMALL)
    called, stop = threading.Event(), threading.Event()
    reports: list[str] = []

    def keep_calling() -> None:
        seed = 100
        while not stop.is_set() and not any(reports):
            reports.append(_check_calls(kernel, seed, calls=1))
            called.set()
            seed += 1

    caller = threading.Thread(target=keep_calling)
    caller.start()
    try:
        assert called.wait(CHILD_BOUND_S)
        assert _in_child(_child, kernel, 5) == (5, "")
    finally:
        stop.set()
        caller.join(timeout=CHILD_BOUND_S)
    assert reports and not any(reports)
    assert _check_calls(kernel, 6) == ""


@pytest.mark.parametrize(
    ("executor_min_bytes", "small", "large"),
    [
        (None, "local-sync", "local-sync"),  # the default (4 MiB): both example kernels' arguments are smaller
        ("1MiB", "local-sync", "local-task"),  # gemm_bias_relu's arguments are 1.25 MiB, mlp's 8 KiB
        ("0", "local-task", "local-task"),
        ("inf", "local-sync", "local-sync"),
    ],
)
def test_where_a_call_runs_follows_its_arguments_size_and_the_setting(examples_bundle, served_cache, monkeypatch, executor_min_bytes, small, large):
    """A CPU call runs on the calling thread (`local-sync`) unless its arguments total
    `PORTKERN_EXECUTOR_MIN_BYTES` or more (then on IREE's task executor, `local-task`); the
    same arguments always go the same way, and the results are right either way."""
    for name, driver in ((SMALL, small), (LARGE, large)):
        kernel = _kernel_with(examples_bundle, served_cache, monkeypatch, name, executor_min_bytes)
        inputs = EXAMPLES[name].inputs(np.random.default_rng(0))
        assert kernel.target.driver == "local-task"
        assert [kernel.executable.driver_for(inputs) for _ in range(3)] == [driver] * 3
        assert _check_calls(kernel, 1) == ""


@pytest.mark.parametrize(("executor_min_bytes", "driver"), [(None, "local-task"), ("inf", "local-sync"), ("4MiB", "local-sync")])
def test_a_kernel_tuned_faster_on_the_executor_runs_its_calls_there_unless_the_setting_is_given(
    examples_bundle, tmp_path, monkeypatch, executor_min_bytes, driver,
):
    """A kernel whose stored selection says its calls ran faster on the task executor runs every
    call there, small ones included, in any later process; where `PORTKERN_EXECUTOR_MIN_BYTES` is
    given, the setting decides as for any kernel. The results are right either way."""
    from portkern.cache.tuning import TuningDB
    from portkern.jit import devices
    from portkern.jit.native import compiler_id, selection_problem

    store = Store(CacheConfig(tmp_path, 1 << 30, False))
    loaded = portkern.load(examples_bundle, store=store)
    record, target = loaded.record(SMALL), devices.resolve("cpu", store)
    fields = {"config": "default", "strategy": "quick", "complete": True, "executor": True}
    assert TuningDB(store, compiler_id(record)).put_selection(selection_problem(record, target), target.fingerprint, target.label, "examples", fields)
    kernel = _kernel_with(examples_bundle, tmp_path, monkeypatch, SMALL, executor_min_bytes)
    inputs = EXAMPLES[SMALL].inputs(np.random.default_rng(0))
    assert [kernel.executable.driver_for(inputs) for _ in range(3)] == [driver] * 3
    assert _check_calls(kernel, 2) == ""


def test_a_forked_child_runs_every_call_on_the_calling_thread(examples_bundle, served_cache, monkeypatch):
    """A pre-fork server's workers share the cores: in a forked child even calls the parent
    runs on the task executor (`PORTKERN_EXECUTOR_MIN_BYTES=0`) run on the calling thread."""
    kernel = _kernel_with(examples_bundle, served_cache, monkeypatch, LARGE, "0")
    inputs = EXAMPLES[LARGE].inputs(np.random.default_rng(0))
    assert kernel.executable.driver_for(inputs) == "local-task" and _check_calls(kernel, 3) == ""
    assert _in_child(_driver_child, kernel) == ("local-sync", "")


@pytest.mark.parametrize(("value", "expected"), [("2MiB", 2 << 20), ("1000", 1000), ("0", 0), ("inf", settings.LARGEST_SIZE)])
def test_the_executor_setting_is_a_size(monkeypatch, value, expected):
    """`PORTKERN_EXECUTOR_MIN_BYTES` takes any size, `inf` (no call on the executor) included, without a warning."""
    monkeypatch.setenv(settings.EXECUTOR_MIN_BYTES, value)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SettingWarning)
        assert settings.executor_min_bytes() == expected


def test_an_unreadable_executor_setting_is_one_warning_and_the_default(monkeypatch):
    monkeypatch.setenv(settings.EXECUTOR_MIN_BYTES, "lots-of-bytes")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert settings.executor_min_bytes() == settings.DEFAULT_EXECUTOR_MIN_BYTES
    assert [str(w.message) for w in caught if issubclass(w.category, SettingWarning)] == [
        f"{settings.EXECUTOR_MIN_BYTES}='lots-of-bytes' is not a size (examples: 2GB, 512MiB, 1000000); "
        f"using the default {settings.DEFAULT_EXECUTOR_MIN_BYTES} bytes"
    ]


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
    env = {k: v for k, v in os.environ.items() if not k.startswith("POCL_")}
    env["PORTKERN_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OPENCL_FORK), str(opencl_examples_bundle)],
        env=env, capture_output=True, text=True, timeout=CHILD_BOUND_S * 2,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["child: ForkError True", "child: ForkError True", "scratch kept: True", "parent: finalized"]


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
