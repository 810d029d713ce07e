"""Perf-config spaces, search strategies and the benchmark harness that picks a winner per device."""
