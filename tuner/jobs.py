"""The tuner's part of the worker processes' jobs (`portkern.jit.handlers`): reading the
dispatches of a configured module, and writing a kernel config on one.

`register()` tells the worker pool to use these; the workers import this module
(and the compiler-facing modules it calls) only when a job names it.
"""

from __future__ import annotations

from portkern.jit import handlers


def dispatches(module) -> list[dict]:
    """The dispatches of a module at `executable-configurations`, as plain data (`Dispatch.to_dict`)."""
    from portkern.tuner import analysis

    return [d.to_dict() for d in analysis.dispatches(module)]


def stamp(module, config: str, context):
    """A clone of a module at `executable-configurations` with the kernel config `config` written on it."""
    from portkern.tuner import analysis, kernel_config

    return analysis.stamp(module, kernel_config.parse(config), context)


def profile_dispatches(module) -> list[dict]:
    """The dispatches of a module at `executable-configurations` with their places and benchmark
    functions (`tuner.profile`; an "analyse" job naming this handler)."""
    from portkern.tuner.profile import benchmarked_dispatches

    return benchmarked_dispatches(module)


def dispatch_benchmark(module, config: str, context):
    """IREE's benchmark module of one dispatch, `config` being "<index>;<kernel config>"
    (`tuner.profile`; a "compile" job naming this handler compiles it)."""
    from portkern.tuner.profile import benchmark_module

    return benchmark_module(module, config, context)


def register() -> None:
    """Have the workers read dispatches and stamp kernel configs with this module's handlers."""
    handlers.register(handlers.ANALYSE, f"{__name__}:dispatches")
    handlers.register(handlers.STAMP, f"{__name__}:stamp")
