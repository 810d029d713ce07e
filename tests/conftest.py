"""Shared fixtures: an example bundle built once, and caches that never touch the user's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from portkern.cache.config import CacheConfig
from portkern.cache.store import Store


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Point the default cache at a session directory for every test."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PORTKERN_CACHE_DIR", str(tmp_path_factory.mktemp("session-cache")))
    mp.delenv("PORTKERN_CACHE_DISABLE", raising=False)
    mp.delenv("PORTKERN_CACHE_MAXSIZE", raising=False)
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


@pytest.fixture
def store(tmp_path) -> Store:
    """An empty cache of its own."""
    return Store(CacheConfig(tmp_path / "cache", 1 << 30, False))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)

