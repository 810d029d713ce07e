"""Shared fixtures: an example bundle built once, and caches that never touch the user's.
Under CI (`CI=true`), a skip whose reason is not marked expected (`helpers.expected_skip`) fails the run."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import numpy as np
import pytest
import redis_server
from helpers import EXPECTED_SKIPS

from portkern.cache.config import CacheConfig
from portkern.cache.store import Store

# --- under CI, an unexpected skip fails the run ------------------------------------------

#: (test or module id, reason) of every skip in this session.
_skips: list[tuple[str, str]] = []
_unexpected: list[tuple[str, str]] = []


def under_ci() -> bool:
    """Whether this is a CI run: `CI` set to true (as CI services and `.ci/run` set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_runtest_logreport(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):  # an xfail is declared where it is written
        _skips.append((report.nodeid, _reason(report)))


def pytest_collectreport(report) -> None:
    if report.skipped:  # a module skipped as a whole (a module-level importorskip)
        _skips.append((report.nodeid, _reason(report)))


def unexpected_skips(skips: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The skips whose reason is not marked as one of `EXPECTED_SKIPS`; a torch skip counts as
    unexpected where torch is installed (CI's torch step runs those tests)."""
    expected = set(EXPECTED_SKIPS)
    if importlib.util.find_spec("torch") is not None:
        expected.discard("torch")
    return [(where, why) for where, why in skips if not ((m := re.match(r"\[(\w+)\] ", why)) and m.group(1) in expected)]


def pytest_sessionfinish(session, exitstatus) -> None:
    if not under_ci():
        return
    _unexpected[:] = unexpected_skips(_skips)
    if _unexpected and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:
    if _unexpected:
        terminalreporter.section("unexpected skips (CI fails on a skip not marked expected in tests/helpers.py)", red=True)
        for where, why in _unexpected:
            terminalreporter.line(f"{where}: {why}")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Point the default cache at a session directory for every test."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PORTKERN_CACHE_DIR", str(tmp_path_factory.mktemp("session-cache")))
    mp.delenv("PORTKERN_CACHE_DISABLE", raising=False)
    mp.delenv("PORTKERN_CACHE_MAXSIZE", raising=False)
    for name in ("PORTKERN_REMOTE_CACHE", "PORTKERN_TRUSTED_KEYS", "PORTKERN_REQUIRE_SIGNATURE", "PORTKERN_SIGNING_KEY",
                 "PORTKERN_ROLE", "PORTKERN_REMOTE_LOCK_S", "PORTKERN_COMPILE"):
        mp.delenv(name, raising=False)  # a fleet set up on this machine must not reach the tests
    mp.setenv("PORTKERN_CONFIG", "")  # nor a config file in the user's config dir
    yield
    mp.undo()


@pytest.fixture(scope="session")
def examples_bundle(tmp_path_factory) -> Path:
    """The shipped example manifest, built once per test session."""
    from portkern.examples import MANIFEST
    from portkern.portable.builder import build_file

    path = tmp_path_factory.mktemp("bundles") / "examples.pkb"
    build_file(MANIFEST, path)
    return path


@pytest.fixture(scope="session")
def opencl_examples_bundle(tmp_path_factory) -> Path:
    """The OpenCL C example manifest, built once per test session (skips without clang/llvm-spirv)."""
    from helpers import opencl_toolchain_missing

    from portkern.examples import OPENCL_MANIFEST
    from portkern.portable.builder import build_file

    if opencl_toolchain_missing():
        pytest.skip(opencl_toolchain_missing())
    path = tmp_path_factory.mktemp("bundles") / "opencl-examples.pkb"
    build_file(OPENCL_MANIFEST, path)
    return path


@pytest.fixture(scope="session")
def keys(tmp_path_factory) -> Path:
    """Signing key pairs (EC P-256) in one directory: `trusted` and `other`, both in
    `trusted-keys.pem` (named "build farm" and "colleague"), and `stranger`, trusted by no one."""
    pytest.importorskip("model_signing", reason="signatures need the 'fleet' extra (model-signing)")
    from portkern.base import signing

    where = tmp_path_factory.mktemp("keys")
    for name in ("trusted", "other", "stranger"):
        signing.new_key_pair(where / name)
    (where / "trusted-keys.pem").write_text(
        "# colleague\n" + (where / "other.pub").read_text() + "# build farm\n" + (where / "trusted.pub").read_text()
    )
    return where


@pytest.fixture
def store(tmp_path) -> Store:
    """An empty cache of its own."""
    return Store(CacheConfig(tmp_path / "cache", 1 << 30, False))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)



GPU_MANIFEST = """bundle: gpu
targets: [cpu, amdgpu, cuda]
kernels:
  - name: gemm_bias_relu
    source: {source}
"""


@pytest.fixture(scope="session")
def gpu_bundle(tmp_path_factory) -> Path:
    """One example kernel built with AMD and NVIDIA placeholder stages, once per session."""
    from portkern.examples import MANIFEST
    from portkern.portable.builder import build_file

    where = tmp_path_factory.mktemp("gpu-bundle")
    (where / "manifest.yaml").write_text(GPU_MANIFEST.format(source=MANIFEST.parent / "gemm_bias_relu.mlir"))
    build_file(where / "manifest.yaml", where / "gpu.pkb")
    return where / "gpu.pkb"


@pytest.fixture(scope="session")
def gpu_native(gpu_bundle):
    """`gpu_native(spec)`: the GPU bundle's kernel finalised for a device spec (memoised per session)."""
    from portkern.jit.devices import resolve
    from portkern.jit.finalize import finalize
    from portkern.portable.bundle import read_bundle

    bundle = read_bundle(gpu_bundle)
    done: dict[str, bytes] = {}

    def native(spec: str) -> bytes:
        if spec not in done:
            done[spec] = finalize(bundle, bundle.kernel("gemm_bias_relu"), resolve(spec))
        return done[spec]

    return native


@pytest.fixture
def server(tmp_path):
    """A real redis-server on a free loopback port, stopped after the test."""
    running = redis_server.RedisServer(tmp_path)
    yield running
    running.stop()
