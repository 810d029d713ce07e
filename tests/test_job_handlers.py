"""Work of packages above `jit` in the worker processes: handlers registered by name, and
resolved in a worker only from the fixed list of modules `jit.handlers.MODULES`; `tune=` of a
bundle the loader opened without a tuner."""

from __future__ import annotations

import pytest

from portkern.base.errors import FinalizeError, TuningError
from portkern.jit import devices, handlers
from portkern.jit.loader import load
from portkern.jit.workers import Job, Pool, Source

OUTSIDE = ("os:system", "builtins:eval", "portkern.tuner.analysis:stamp", "portkern.tuner.jobs", "portkern.tuner.jobs:_private",
           "portkern.tuner.jobs:not a name", "portkern.tuner.jobs:stamp:x", "", 3, None)


def test_handlers_resolve_only_from_the_listed_modules():
    assert handlers.resolve("portkern.tuner.jobs:stamp").__name__ == "stamp"
    assert handlers.resolve("portkern.tuner.jobs:dispatches").__name__ == "dispatches"
    for name in OUTSIDE:
        with pytest.raises(FinalizeError, match="not one the workers run"):
            handlers.resolve(name)
    with pytest.raises(FinalizeError, match="is not a function"):
        handlers.resolve("portkern.tuner.jobs:missing")


def test_only_handlers_from_the_listed_modules_can_be_registered():
    for name in OUTSIDE:
        with pytest.raises(FinalizeError, match="not one the workers run"):
            handlers.register(handlers.STAMP, name)


def test_a_worker_refuses_a_handler_outside_the_list_that_a_job_names(store):
    target = devices.resolve("cpu", store)
    source = Source("k", b"not parsed", "input")
    jobs = [
        Job(0, "compile", "k", target, {"source": source.message(), "config": "0=cpu:v1:8x8x0,0x0x0,0x0x0", "handler": "os:system"}),
        Job(1, "analyse", "k", target, {"source": source.message(), "handler": "builtins:eval"}),
        Job(2, "analyse", "k", target, {"source": source.message()}),
    ]
    with Pool(workers=1) as pool:
        results = pool.run(jobs, workers=1)
    assert len(results) == 3
    for result in results.values():
        assert not result.ok and result.error_type == "FinalizeError" and "not one the workers run" in result.error


def test_a_bundle_opened_without_a_tuner_refuses_a_searching_tune(examples_bundle, store):
    bundle = load(examples_bundle, store=store)
    with pytest.raises(TuningError, match="opened without a tuner"):
        bundle.kernel("gemm_bias_relu", tune="quick")
