"""Perf-config spaces, search strategies and the benchmark harness that picks a winner per device.

- `perfconfig`, `cpu_config`, `gpu_config` (`amdgpu_config`, `cuda_config`), `kernel_config`: configs
  as data and strings;
- `family`, `cpu_family`, `gpu_family` (`amdgpu_family`, `cuda_family`), `registry`: one module per
  target family (config class, roots, followers, space) and the registry every family lookup goes through;
- `dispatch`: one dispatch as plain data; `analysis`: reading dispatches from a configured module,
  and stamping configs on a clone;
- `space`, `cpu_space`, `gpu_space` (`gpu_target`: an arch's limits): the candidates of a dispatch
  and the rules that prune them;
- `compile_only`: spaces compiled and checked for a device that is not here (nothing stored);
- `measure`, `evaluate`: timing, the output check, duplicates;
- `search`, `strategies`: budgets and the strategies that drive a search;
- `results`, `session`: reports, and `tune_kernel` (results are stored in the tuning DB,
  `portkern.cache.tuning`);
- `jobs`: the tuner's work in the worker processes (handlers it registers with `portkern.jit.handlers`);
- `profile`: each dispatch of a kernel timed alone (`portkern profile`); `report`: a tuning run as
  one HTML page (`portkern tune --report`).

Compiling runs in the worker pool of `portkern.jit.workers`, shared with finalisation.

docs/tuning.md describes the whole.
"""
