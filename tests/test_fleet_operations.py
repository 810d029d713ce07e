"""Fleet operations: `portkern cache publish` makes sure the remote tier (a real `redis-server`)
has a bundle's native code and says per kernel what became of it; `cache stats` counts a lookup
that never reached Redis apart from a miss; metrics in the Prometheus text format
(`portkern.metrics()`, `cache stats --prometheus`) count what loads did; `portkern tune` under
`PORTKERN_COMPILE=never` is refused before any work."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import redis_server
from helpers import ADD_AND_SCALE, assert_matches, build_mlir, cli_json
from prometheus_client import parser as prometheus_parser

import portkern
from portkern.base import settings
from portkern.cache import remote
from portkern.cache.config import CacheConfig
from portkern.cache.remote import RemoteCache
from portkern.cache.store import Store
from portkern.cli.main import main

needs_redis = pytest.mark.skipif(bool(redis_server.missing()), reason=redis_server.missing() or "redis-server is here")

KERNELS = list(ADD_AND_SCALE)


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory):
    return build_mlir(tmp_path_factory.mktemp("fleet-ops"), "fleetops", **ADD_AND_SCALE)


@pytest.fixture
def publisher(server, monkeypatch):
    """A fleet that does not sign: this host publishes (`PORTKERN_ROLE=publisher`)."""
    monkeypatch.setenv(settings.REMOTE_CACHE, server.url)
    monkeypatch.setenv(settings.ROLE, "publisher")
    return server


def store_at(directory, with_remote: bool = False) -> Store:
    return Store(CacheConfig(directory / "v1", 1 << 30, False), RemoteCache(remote.config_from_env()) if with_remote else None)


def metrics_of(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a Prometheus exposition, by name and labels, parsed with prometheus_client."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in prometheus_parser.text_string_to_metric_families(text) for s in family.samples}


def counter(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def assert_add_runs(kernel, rng) -> None:
    a, b = rng.standard_normal((4, 8), dtype=np.float32), rng.standard_normal((4, 8), dtype=np.float32)
    assert_matches(kernel(a, b), (a + b,), rtol=1e-6, atol=1e-6)


def native_values(server) -> list[bytes]:
    return sorted(server.client().keys(f"{remote.NAMESPACE}:{remote.NATIVE}:*"))


# --- metrics ---------------------------------------------------------------------------------


def test_metrics_count_a_cold_and_a_warm_load(bundle_path, tmp_path, capsys, rng):
    store = store_at(tmp_path / "cache")
    empty = metrics_of(portkern.metrics(store))
    assert counter(empty, "portkern_compiles_total") == 0 and counter(empty, "portkern_cache_hits_total") == 0

    cold = portkern.load(bundle_path, store=store).kernel("add")
    assert cold.origin == "finalized"
    assert_add_runs(cold, rng)
    after_cold = metrics_of(portkern.metrics(store))
    assert counter(after_cold, "portkern_compiles_total") == 1
    assert counter(after_cold, "portkern_compile_seconds_total") > 0
    assert counter(after_cold, "portkern_cache_misses_total") >= 1
    assert counter(after_cold, "portkern_cache_entries") == 1
    assert counter(after_cold, "portkern_remote_misses_total") == counter(after_cold, "portkern_remote_errors_total") == 0

    warm = portkern.load(bundle_path, store=store).kernel("add")
    assert warm.origin == "cache"
    assert_add_runs(warm, rng)
    after_warm = metrics_of(portkern.metrics(store))
    assert counter(after_warm, "portkern_compiles_total") == 1  # nothing compiled again
    assert counter(after_warm, "portkern_compile_seconds_total") == counter(after_cold, "portkern_compile_seconds_total")
    assert counter(after_warm, "portkern_cache_hits_total") == counter(after_cold, "portkern_cache_hits_total") + 1
    assert counter(after_warm, "portkern_cache_misses_total") == counter(after_cold, "portkern_cache_misses_total")

    # the command prints the same exposition, from the cache's database
    assert main(["cache", "stats", "--prometheus", "--cache-dir", str(tmp_path / "cache")]) == 0
    assert metrics_of(capsys.readouterr().out) == after_warm
    assert main(["cache", "stats", "--prometheus", "--json", "--cache-dir", str(tmp_path / "cache")]) == 2


def test_compile_never_counts_refusals_and_tune_is_refused_before_any_work(bundle_path, tmp_path, capsys, monkeypatch):
    from portkern.base.errors import CompileForbiddenError

    cache_dir = tmp_path / "cache"
    monkeypatch.setenv(settings.COMPILE, "never")
    store = store_at(cache_dir)
    with pytest.raises(CompileForbiddenError):
        portkern.load(bundle_path, store=store).kernel("add")

    status, report = cli_json(capsys, "tune", bundle_path, "--kernel", "scale", "--cache-dir", cache_dir)
    assert status == 1 and report["error"] == "CompileForbiddenError"
    assert "'scale'" in report["message"] and "PORTKERN_COMPILE=never" in report["message"]
    assert main(["tune", str(bundle_path), "--cache-dir", str(cache_dir)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'add', 'scale'" in err
    samples = metrics_of(portkern.metrics(store))
    assert counter(samples, "portkern_refusals_total", reason="compile_forbidden") == 3
    assert counter(samples, "portkern_compiles_total") == counter(samples, "portkern_tuning_runs_total") == 0
    assert store.entries() == []


def test_metrics_count_a_refused_bundle_and_a_refused_import(bundle_path, keys, tmp_path, capsys, monkeypatch):
    import shutil

    from portkern.base import signing
    from portkern.base.errors import SignatureError

    untrusted = tmp_path / "untrusted.pkb"
    shutil.copy(bundle_path, untrusted)
    signing.sign_file(untrusted, keys / "stranger.key")
    monkeypatch.setenv(settings.TRUSTED_KEYS, str(keys / "trusted.pub"))
    store = store_at(tmp_path / "cache")
    with pytest.raises(SignatureError):
        portkern.load(untrusted, store=store)

    farm = tmp_path / "farm"
    assert main(["finalize", str(bundle_path), "--target", "cpu", "--cache-dir", str(farm), "--export", str(tmp_path / "x.pkx")]) == 0
    capsys.readouterr()
    status, report = cli_json(capsys, "cache", "import", tmp_path / "x.pkx", "--cache-dir", tmp_path / "cache")
    assert status == 1 and len(report["rejected"]) == 2  # unsigned: native code refused
    samples = metrics_of(portkern.metrics(store))
    assert counter(samples, "portkern_refusals_total", reason="bundle_signature") == 1
    assert counter(samples, "portkern_refusals_total", reason="import_entry") == 2


def test_metrics_count_a_tuning_run_once(examples_bundle, tmp_path, capsys):
    cache_dir = tmp_path / "cache"
    argv = ["tune", examples_bundle, "--kernel", "gemm_rowsum", "--budget", "2", "--cache-dir", cache_dir]
    status, report = cli_json(capsys, *argv)
    assert status == 0 and report["kernels"][0]["source"] == "search"
    status, report = cli_json(capsys, *argv)  # stored: not searched again
    assert status == 0 and report["kernels"][0]["source"] != "search"
    samples = metrics_of(portkern.metrics(store_at(cache_dir)))
    assert counter(samples, "portkern_tuning_runs_total") == 1
    assert counter(samples, "portkern_tuning_seconds_total") > 0


# --- cache stats: remote lookups that never reached Redis -------------------------------------


@needs_redis
def test_a_lookup_redis_does_not_answer_is_not_a_remote_miss(bundle_path, tmp_path, capsys, monkeypatch, server):
    monkeypatch.setenv(settings.REMOTE_CACHE, server.url)  # a reader: reads, writes nothing
    reached = store_at(tmp_path / "reached", with_remote=True)
    portkern.load(bundle_path, store=reached).kernel("add")
    status, stats = cli_json(capsys, "cache", "stats", "--cache-dir", tmp_path / "reached")
    assert status == 0 and (stats["remote_hits"], stats["remote_misses"], stats["remote_errors"]) == (0, 1, 0)

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv(settings.REMOTE_CACHE, f"redis://127.0.0.1:{port}/0")  # nothing listens there
    unreached = store_at(tmp_path / "unreached", with_remote=True)
    bundle = portkern.load(bundle_path, store=unreached)
    assert [bundle.kernel(name).origin for name in KERNELS] == ["finalized", "finalized"]
    status, stats = cli_json(capsys, "cache", "stats", "--cache-dir", tmp_path / "unreached")
    assert (stats["remote_hits"], stats["remote_misses"], stats["remote_errors"]) == (0, 0, 2)
    assert main(["cache", "stats", "--cache-dir", str(tmp_path / "unreached")]) == 0
    assert "0 hits / 0 misses, 2 lookups Redis did not answer" in capsys.readouterr().out
    samples = metrics_of(portkern.metrics(unreached))
    assert counter(samples, "portkern_remote_errors_total") == 2 and counter(samples, "portkern_remote_misses_total") == 0


# --- cache publish ----------------------------------------------------------------------------


@needs_redis
def test_cache_publish_puts_every_kernel_in_the_remote_tier(publisher, bundle_path, tmp_path, capsys, monkeypatch, rng):
    farm = tmp_path / "farm"
    status, report = cli_json(capsys, "cache", "publish", bundle_path, "--cache-dir", farm)
    assert status == 0 and report["ok"] and report["published"] and report["not_published"] == []
    assert [(k["kernel"], k["origin"], k["remote"]) for k in report["kernels"]] == [(n, "finalized", "published") for n in KERNELS]
    assert (report["remote"]["published"], report["remote"]["missing"], report["remote"]["role"]) == (2, 0, "publisher")
    assert len(native_values(publisher)) == 2

    # a second run finds everything here and there; a value gone from Redis is published again
    publisher.client().delete(native_values(publisher)[0])
    status, report = cli_json(capsys, "cache", "publish", bundle_path, "--cache-dir", farm)
    assert status == 0 and [k["origin"] for k in report["kernels"]] == ["cache", "cache"]
    assert sorted(k["remote"] for k in report["kernels"]) == ["present", "published"]
    assert (report["remote"]["published"], report["remote"]["present"]) == (1, 1)
    assert main(["cache", "publish", str(bundle_path), "--cache-dir", str(farm)]) == 0
    assert "0 published, 2 already there" in capsys.readouterr().out

    # a device (a reader) is served both kernels without compiling
    monkeypatch.delenv(settings.ROLE)
    device = store_at(tmp_path / "device", with_remote=True)
    bundle = portkern.load(bundle_path, store=device)
    assert [bundle.kernel(name).origin for name in KERNELS] == ["remote", "remote"]
    assert_add_runs(bundle.kernel("add"), rng)
    samples = metrics_of(portkern.metrics(device))
    assert counter(samples, "portkern_remote_hits_total") == 2 and counter(samples, "portkern_compiles_total") == 0

    # a value that is not a portkern value is refused, counted as a miss and a refusal, and built here
    for name in native_values(publisher):
        publisher.client().set(name, b"\x00 not a value")
    other = store_at(tmp_path / "other-device", with_remote=True)
    assert portkern.load(bundle_path, store=other).kernel("add").origin == "finalized"
    samples = metrics_of(portkern.metrics(other))
    assert counter(samples, "portkern_refusals_total", reason="remote_value") == 1
    assert (counter(samples, "portkern_remote_misses_total"), counter(samples, "portkern_remote_hits_total")) == (1, 0)
    assert counter(samples, "portkern_compiles_total") == 1


@needs_redis
def test_cache_publish_fails_naming_what_is_not_published(publisher, bundle_path, tmp_path, capsys, monkeypatch):
    # a reader publishes nothing, and says why
    monkeypatch.setenv(settings.ROLE, "reader")
    status, report = cli_json(capsys, "cache", "publish", bundle_path, "--cache-dir", tmp_path / "reader")
    assert status == 1 and not report["published"] and report["not_published"] == KERNELS
    assert "reader" in report["remote"]["reason"] and report["remote"]["missing"] == 2
    assert native_values(publisher) == []

    # compiling off and nothing here: each kernel names its error
    monkeypatch.setenv(settings.ROLE, "publisher")
    monkeypatch.setenv(settings.COMPILE, "never")
    status, report = cli_json(capsys, "cache", "publish", bundle_path, "--cache-dir", tmp_path / "never")
    assert status == 1 and report["not_published"] == KERNELS
    assert all(k["error"].startswith("CompileForbiddenError: ") for k in report["kernels"])
    monkeypatch.delenv(settings.COMPILE)

    # Redis down
    publisher.stop()
    status, report = cli_json(capsys, "cache", "publish", bundle_path, "--cache-dir", tmp_path / "farm")
    assert status == 1 and not report["published"] and report["remote"]["missing"] == 2
    assert "not usable" in report["remote"]["reason"]
    assert [k["origin"] for k in report["kernels"]] == ["finalized", "finalized"]  # finalised here all the same

    # no remote tier configured: a usage error, in the JSON envelope
    monkeypatch.delenv(settings.REMOTE_CACHE)
    status, report = cli_json(capsys, "cache", "publish", bundle_path, "--cache-dir", tmp_path / "farm")
    assert status == 2 and report["error"] == "UsageError" and settings.REMOTE_CACHE in report["message"]
