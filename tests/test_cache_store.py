"""The per-device store: hits, misses on every key part, corruption, budgets, degraded modes."""

from __future__ import annotations

import os
import sqlite3
import warnings

import pytest
from helpers import assert_matches, logged

import portkern
from portkern.base.errors import SettingError
from portkern.base.settings import format_size, parse_size
from portkern.base.settings import parse_duration as parse_age
from portkern.cache.config import CacheConfig, from_env
from portkern.cache.device import DeviceFingerprint
from portkern.cache.keys import artifact_key, kernel_digest
from portkern.cache.store import CacheWarning, Entry, Store
from portkern.examples.reference import EXAMPLES
from portkern.jit.toolchain import IreeToolchain


def flip_byte(store: Store, key: str, offset: int = 100) -> None:
    """Corrupt a stored artifact in place, in the database file."""
    db = sqlite3.connect(store.directory / "cache.db")
    (value,) = db.execute("SELECT value FROM portkern_records WHERE name = ?", (f"a/{key}",)).fetchone()
    data = bytearray(value)
    data[offset] ^= 0x01
    db.execute("UPDATE portkern_records SET value = ? WHERE name = ?", (bytes(data), f"a/{key}"))
    db.commit()
    db.close()


def entry(key: str, size: int = 0, **kw) -> Entry:
    fields = dict(key=key, kernel="k", bundle="b", bundle_digest="", device={"kind": "cpu", "arch": "x"},
                  device_label="cpu:x", config="default", format="vmfb", size=size, sha256="", compiler="c")
    return Entry(**{**fields, **kw})


def test_warm_hit_after_cold_miss(examples_bundle, store, rng):
    bundle = portkern.load(examples_bundle, store=store)
    cold = bundle.kernel("gemm_glu")
    warm = portkern.load(examples_bundle, store=store).kernel("gemm_glu")
    assert (cold.origin, warm.origin) == ("finalized", "cache")
    assert cold.native.data == warm.native.data
    example = EXAMPLES["gemm_glu"]
    inputs = example.inputs(rng)
    assert_matches(warm(*inputs), example.reference(*inputs), example.rtol, example.atol)
    (cached,) = store.entries()
    assert (cached.kernel, cached.bundle, cached.hits, cached.config) == ("gemm_glu", "examples", 1, "default")
    assert cached.finalize_s > 0 and cached.bundle_digest == bundle.digest
    assert store.counters() == {"hits": 1, "misses": 1, "remote_hits": 0, "remote_misses": 0, "remote_errors": 0}


def test_every_key_part_changes_the_key():
    device = DeviceFingerprint("cpu", "znver5", "+avx2", (("triple", "x86_64"),))
    base = dict(kernel="k" * 64, device=device, compiler="iree 3.13", config="default", flags=("--a",))
    variants = [
        dict(kernel="j" * 64),
        dict(device=DeviceFingerprint("cpu", "znver4", "+avx2", (("triple", "x86_64"),))),
        dict(device=DeviceFingerprint("cpu", "znver5", "+avx2,+avx512f", (("triple", "x86_64"),))),
        dict(device=DeviceFingerprint("cpu", "znver5", "+avx2", (("triple", "aarch64"),))),
        dict(compiler="iree 3.14"),
        dict(config="v1:cpu:64,64,0:8,32,0:0,0,8"),
        dict(flags=("--b",)),
    ]
    keys = {artifact_key(**base).hex} | {artifact_key(**{**base, **v}).hex for v in variants}
    assert len(keys) == 1 + len(variants)
    assert kernel_digest("mlir", "f", "a" * 64) != kernel_digest("mlir", "g", "a" * 64)


def test_changed_compiler_or_device_misses_end_to_end(examples_bundle, store, monkeypatch):
    portkern.load(examples_bundle, store=store).kernel("gemm_rowsum")
    assert portkern.load(examples_bundle, store=store).kernel("gemm_rowsum").origin == "cache"
    assert portkern.load(examples_bundle, store=store).kernel("gemm_rowsum", device="cpu:haswell").origin == "finalized"
    monkeypatch.setattr(IreeToolchain, "compiler_id", lambda self: "iree 99.0 upgraded")
    assert portkern.load(examples_bundle, store=store).kernel("gemm_rowsum").origin == "finalized"
    assert len(store.entries()) == 3


def test_other_bundle_with_same_kernel_shares_the_entry(examples_bundle, store, tmp_path):
    from portkern.examples import MANIFEST
    from portkern.portable.builder import build_file

    text = MANIFEST.read_text().replace("bundle: examples", "bundle: renamed")
    (tmp_path / "m.yaml").write_text(text.replace("source: ", f"source: {MANIFEST.parent}/"))
    build_file(tmp_path / "m.yaml", tmp_path / "renamed.pkb")
    portkern.load(examples_bundle, store=store).kernel("gemm_bias_relu")
    assert portkern.load(tmp_path / "renamed.pkb", store=store).kernel("gemm_bias_relu").origin == "cache"


def test_flipped_byte_is_found_by_verify(examples_bundle, store):
    kernel = portkern.load(examples_bundle, store=store).kernel("mlp")
    flip_byte(store, kernel.native.key)
    bad = store.verify()
    assert [(f.entry.kernel, f.problem) for f in bad] == [("mlp", "artifact does not match its sha256")]
    assert store.entries() == []


def test_flipped_byte_is_found_by_the_loader_and_rebuilt(examples_bundle, store, rng, caplog):
    kernel = portkern.load(examples_bundle, store=store).kernel("gemm_transpose_add")
    flip_byte(store, kernel.native.key, offset=kernel.native.data.find(b"\x7fELF") + 64)
    again = portkern.load(examples_bundle, store=store).kernel("gemm_transpose_add")
    assert logged(caplog, "is corrupt; evicted, it will be rebuilt")
    assert again.origin == "finalized" and again.native.data == kernel.native.data
    example = EXAMPLES["gemm_transpose_add"]
    inputs = example.inputs(rng)
    assert_matches(again(*inputs), example.reference(*inputs), example.rtol, example.atol)
    assert store.verify() == []


def test_size_budget_evicts_least_recently_used(tmp_path):
    store = Store(CacheConfig(tmp_path / "c", 250_000, False))
    for i in range(3):
        assert store.put(f"{i:064x}", bytes([i]) * 100_000, entry(f"{i:064x}"))
        store.get(f"{0:064x}")  # keep entry 0 the most recently used
    kept = {e.key[-1] for e in store.entries()}
    assert kept == {"0", "2"}
    assert sum(e.size for e in store.entries()) <= 250_000


def test_prune_by_age_and_size(tmp_path, monkeypatch):
    store = Store(CacheConfig(tmp_path / "c", 1 << 30, False))
    import portkern.cache.store as store_module

    clock = [1_000_000.0]
    monkeypatch.setattr(store_module.time, "time", lambda: clock[0])
    for i in range(4):
        store.put(f"{i:064x}", bytes(1000), entry(f"{i:064x}"))
        clock[0] += 86400
    assert {e.key[-1] for e in store.prune(older_than=parse_age("2d") + 1)} == {"0", "1"}
    assert {e.key[-1] for e in store.prune(max_size=1500)} == {"2"}
    assert [e.key[-1] for e in store.entries()] == ["3"]


def test_sizes_and_ages_parse():
    assert parse_size("2GB") == 2 * 10**9 and parse_size("512MiB") == 512 << 20 and parse_size("1000") == 1000
    assert parse_age("30d") == 30 * 86400 and parse_age("90m") == 5400
    with pytest.raises(SettingError, match="cannot read size"):
        parse_size("lots")


def test_sizes_print_as_people_read_them():
    assert [format_size(n) for n in (0, 512, 1536, 260 << 20, 3 << 30, 5 << 40)] == [
        "0 B", "512 B", "1.5 KiB", "260.0 MiB", "3.0 GiB", "5120.0 GiB"]
    assert parse_size(format_size(260 << 20)) == 260 << 20


def test_disabled_cache_still_runs(examples_bundle, monkeypatch, rng):
    monkeypatch.setenv("PORTKERN_CACHE_DISABLE", "1")
    kernel = portkern.load(examples_bundle).kernel("gemm_bias_relu")
    assert kernel.origin == "finalized"
    assert portkern.load(examples_bundle).kernel("gemm_bias_relu").origin == "finalized"
    example = EXAMPLES["gemm_bias_relu"]
    inputs = example.inputs(rng)
    assert_matches(kernel(*inputs), example.reference(*inputs), example.rtol, example.atol)


def test_cache_dir_that_cannot_be_created_warns_once_and_runs(examples_bundle, tmp_path, rng):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = Store(CacheConfig(blocker / "cache", 1 << 30, False))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bundle = portkern.load(examples_bundle, store=store)
        kernels = [bundle.kernel(name) for name in ("gemm_glu", "gemm_rowsum")]
    assert len([w for w in caught if issubclass(w.category, CacheWarning)]) == 1
    assert "not usable" in str(caught[0].message)
    example = EXAMPLES["gemm_glu"]
    inputs = example.inputs(rng)
    assert_matches(kernels[0](*inputs), example.reference(*inputs), example.rtol, example.atol)


def test_full_disk_while_writing_warns_and_runs(examples_bundle, store, monkeypatch, rng):
    from portkern.cache.database import Database

    def full(self, *args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(Database, "set", full)
    with pytest.warns(CacheWarning, match="disk is full"):
        kernel = portkern.load(examples_bundle, store=store).kernel("gemm_bias_relu")
    example = EXAMPLES["gemm_bias_relu"]
    inputs = example.inputs(rng)
    assert_matches(kernel(*inputs), example.reference(*inputs), example.rtol, example.atol)


def test_clear_one_device_keeps_the_others(examples_bundle, store):
    bundle = portkern.load(examples_bundle, store=store)
    bundle.kernel("gemm_glu")
    bundle.kernel("gemm_glu", device="cpu:haswell")
    host = bundle.kernel("gemm_glu").device
    assert store.clear("cpu:haswell") == 1
    assert [e.device_label for e in store.entries()] == [host]
    assert store.clear() == 1 and store.entries() == []


def test_stats_per_device(examples_bundle, store):
    bundle = portkern.load(examples_bundle, store=store)
    bundle.kernel("mlp")
    bundle.kernel("mlp")
    stats = store.stats()
    assert stats["entries"] == 1 and stats["hits"] == 1 and stats["misses"] == 1
    (device,) = stats["devices"].values()
    assert device["entries"] == 1 and device["hits"] == 1 and device["bytes"] == stats["bytes"] > 0


def test_cache_dir_may_list_several_directories(monkeypatch, tmp_path):
    monkeypatch.setenv("PORTKERN_CACHE_DIR", f"{tmp_path / 'image'}{os.pathsep}{tmp_path / 'local'}{os.pathsep}")
    config = from_env()
    assert config.directories == (tmp_path / "image" / "v1", tmp_path / "local" / "v1")
    assert from_env(str(tmp_path / "one")).directories == (tmp_path / "one" / "v1",)


def test_several_directories_are_looked_up_in_order_and_written_to_the_first_writable(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    Store(CacheConfig(second, 1 << 30, False)).put("k2", b"two", entry("k2", kernel="second"))
    Store(CacheConfig(second, 1 << 30, False)).put_record("t", "r", {"from": "second"})
    both = Store(CacheConfig(first, 1 << 30, False, (second,)))
    assert both.get("k2")[0] == b"two"
    assert both.get_record("t", "r") == {"from": "second"}
    assert both.put("k1", b"one", entry("k1", kernel="first"))
    assert Store(CacheConfig(first, 1 << 30, False)).get("k1")[0] == b"one"
    assert Store(CacheConfig(second, 1 << 30, False)).get("k1") is None
    assert {e.kernel for e in both.entries()} == {"first", "second"}
    assert (both.directory_of("k1"), both.directory_of("k2")) == (first, second)
    assert [p["state"] for p in both.places()] == ["writable", "writable"]
    assert both.stats()["entries"] == 2
