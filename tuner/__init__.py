"""Perf-config spaces, search strategies and the benchmark harness that picks a winner per device.

- `perfconfig`, `cpu_config`, `amdgpu_config`, `kernel_config`: configs as data and strings;
- `family`, `cpu_family`, `amdgpu_family`, `registry`: one module per target family (config class,
  roots, followers, space) and the registry every family lookup goes through;
- `dispatch`: one dispatch as plain data; `analysis`: reading dispatches from a configured module,
  and stamping configs on a clone;
- `space`, `cpu_space`: the candidates of a dispatch and the rules that prune them;
- `pool`, `worker`: crash- and hang-isolated parallel compilation;
- `measure`, `evaluate`: timing, the output check, duplicates;
- `search`, `strategies`: budgets and the strategies that drive a search;
- `db`, `results`, `session`: stored results, reports, and `tune_kernel` / `compile_config`.

docs/tuning.md describes the whole.
"""
