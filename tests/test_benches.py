"""The start-up benches in their short (CI) mode: whole fresh processes whose results match NumPy
(checked by the processes themselves against float64 NumPy at 1e-4), served as the bench says
(baseline code on a fresh device, cached code when warm). Times are printed, not judged."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import expected_skip

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run_bench(script: str) -> dict:
    done = subprocess.run([sys.executable, str(BENCH / script), "--short", "--json"], capture_output=True, text=True, timeout=1500, cwd=BENCH)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout[done.stdout.index("{"):])


def test_warm_start_bench_short(tmp_path):
    report = run_bench("warm_start.py")
    assert report["ok"] is True
    rows = report["rows"]
    assert rows["portkern, warm"]["origins"] == ["cache"] and rows["portkern, warm"]["ok"] is True
    assert rows["IREE from source"]["origins"] == ["source"] and rows["IREE from source"]["ok"] is True
    assert rows["portkern, warm"]["processes"] == rows["IREE from source"]["processes"] == 3
    assert rows["portkern, warm"]["further_s"] is not None  # the further kernels were asked for
    for row in rows.values():  # every part is a measured, non-negative time inside the whole
        assert all(row[f"{part}_s"] >= 0 for part in ("python", "numpy", "import", "load", "kernel", "call", "exit"))
        assert row["whole_s"] >= row["kernel_s"] + row["call_s"]
    assert set(report["figures"]) == {"first_kernel_ms", "further_kernel_ms", "whole_over_source", "cpu_over_source"}


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason=expected_skip("cpu", "x86-64 ISA levels"))
def test_cold_start_bench_short(tmp_path):
    report = run_bench("cold_start.py")
    whole = report["whole_processes"]
    assert whole["ok"] is True
    fresh, source = whole["rows"]["portkern, fresh device"], whole["rows"]["IREE from source"]
    assert fresh["origins"] == ["baseline"] and fresh["ok"] is True
    assert source["origins"] == ["source"] and source["ok"] is True
    assert fresh["processes"] == source["processes"] == 3
    assert report["kernels"] == [] and report["prebuild"] == []  # short: whole processes only
    assert set(whole["figures"]) == {"portkern_part_ms", "whole_over_source", "cpu_over_source"}
