"""The benches' measured child processes: the environment each runs in, and the report it prints
as its last line of standard output, in JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: Variables a measured process runs without: OpenBLAS's core-type and L2-size overrides (NumPy's
#: speed as users get it; docs/benchmarks.md), and the switch that stops Python writing `.pyc`
#: files (users' processes read and write them).
UNSET = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "PYTHONDONTWRITEBYTECODE")


def environment(cache: str | Path | None = None, unset: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment for a measured child, without `UNSET` and `unset`, with
    `PORTKERN_CACHE_DIR` set to `cache` when given."""
    env = {k: v for k, v in os.environ.items() if k not in UNSET and k not in unset}
    if cache is not None:
        env["PORTKERN_CACHE_DIR"] = str(cache)
    return env


def last_json(stdout: str, what: str = "a measured process") -> dict:
    """The report a child printed: its last line of standard output, a JSON object."""
    lines = stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        report = None
    if not isinstance(report, dict):
        raise SystemExit(f"{what} printed no report; its output ends: {stdout.strip()[-500:]!r}")
    return report


def report(argv: list[str], env: dict[str, str] | None = None, timeout: float = 1800, what: str = "a measured process") -> dict:
    """Run `argv` to its end; its report (`last_json`). SystemExit, with the end of its standard
    error, when it exits non-zero."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return last_json(done.stdout, what)


def python_report(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 1800, what: str = "a measured process") -> dict:
    """`report` of a fresh Python process that runs `code` with `args`."""
    return report([sys.executable, "-c", code, *args], env=env, timeout=timeout, what=what)
