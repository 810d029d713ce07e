"""The Redis remote tier with a real `redis-server`: hosts share native code and tuning results,
compile a cold kernel once fleet-wide, refuse tampered, unsigned or untrusted entries (whenever
trusted keys are configured), publish nothing from a reader, bound the wait for a planted or dead
lock, say in `finalize --json` what was published, and run on when Redis is down, slow or full."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket

import pytest
import redis_server

pytestmark = pytest.mark.skipif(bool(redis_server.missing()), reason=redis_server.missing() or "redis-server is here")
pytest.importorskip("model_signing", reason="signatures need the 'fleet' extra (model-signing)")

from helpers import RUN_EXAMPLES, assert_example, cli_json, last_json, logged, spawn  # noqa: E402

import portkern  # noqa: E402
from portkern.base import framing, signing  # noqa: E402
from portkern.cache import remote  # noqa: E402
from portkern.cache.config import CacheConfig  # noqa: E402
from portkern.cache.keys import tuning_key  # noqa: E402
from portkern.cache.remote import FORMAT, RemoteCache  # noqa: E402
from portkern.cache.store import Store  # noqa: E402
from portkern.jit import devices  # noqa: E402
from portkern.jit.native import compiler_id, selection_problem  # noqa: E402
from portkern.jit.workers import Pool  # noqa: E402
from portkern.tuner import perfconfig  # noqa: E402
from portkern.tuner.cpu_config import CpuConfig  # noqa: E402

#: A CPU config of gemm_bias_relu's GEMM that compiles and computes correctly.
TUNED = "0=" + perfconfig.to_string(CpuConfig((128, 128, 0), (8, 32, 0), (0, 0, 4)))


@pytest.fixture(scope="module")
def examples_bundle(examples_bundle, keys, tmp_path_factory):
    """The example bundle signed by the fleet's trusted key (a fleet that requires signatures
    loads no unsigned bundle)."""
    signed = tmp_path_factory.mktemp("signed-examples") / "examples.pkb"
    shutil.copy(examples_bundle, signed)
    signing.sign_file(signed, keys / "trusted.key")
    return signed


@pytest.fixture
def fleet(server, keys, monkeypatch):
    """The environment of a fleet that signs its entries and requires signatures."""
    monkeypatch.setenv("PORTKERN_REMOTE_CACHE", server.url)
    monkeypatch.setenv("PORTKERN_SIGNING_KEY", str(keys / "trusted.key"))
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted.pub"))
    monkeypatch.setenv("PORTKERN_REQUIRE_SIGNATURE", "1")
    return server


def host(tmp_path, name: str) -> Store:
    """One machine's local cache, with the remote tier the environment names."""
    return Store(CacheConfig(tmp_path / name / "v1", 1 << 30, False), RemoteCache(remote.config_from_env()))


def no_compiling(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("compiled although the remote tier had the code")

    monkeypatch.setattr(Pool, "run", refuse)  # every compile is a job for the worker pool


def native_values(server) -> list[bytes]:
    return sorted(server.client().keys(f"{remote.NAMESPACE}:{remote.NATIVE}:*"))


def test_a_second_host_gets_native_code_and_tuning_without_compiling(fleet, examples_bundle, tmp_path, rng, capsys, monkeypatch):
    first = host(tmp_path, "a")
    bundle = portkern.load(examples_bundle, store=first)
    record, target = bundle.record("gemm_bias_relu"), devices.resolve("cpu", first)
    problem = selection_problem(record, target)
    first.put_tuning(problem, target.fingerprint, compiler_id(record), {"kind": "kernel", "config": TUNED, "strategy": "quick"})
    built = bundle.kernel("gemm_bias_relu")
    assert (built.origin, built.config) == ("finalized", TUNED)
    assert len(native_values(fleet)) == 1

    no_compiling(monkeypatch)
    second = host(tmp_path, "b")
    served = portkern.load(examples_bundle, store=second).kernel("gemm_bias_relu")
    assert (served.origin, served.config) == ("remote", TUNED)
    assert_example(served, rng)
    assert second.get_record("t", tuning_key(problem, target.fingerprint, compiler_id(record)))["config"] == TUNED
    again = portkern.load(examples_bundle, store=second).kernel("gemm_bias_relu")
    assert again.origin == "cache"

    status, stats = cli_json(capsys, "cache", "stats", "--cache-dir", tmp_path / "b")
    assert status == 0
    assert (stats["remote_hits"], stats["remote_misses"]) == (1, 0)


def test_eight_processes_on_two_hosts_compile_a_cold_kernel_once(fleet, examples_bundle, tmp_path):
    procs = [spawn(RUN_EXAMPLES, examples_bundle, "gemm_glu", cache_dir=tmp_path / f"host{i % 2}") for i in range(8)]
    results = [last_json(p) for p in procs]
    origins = sorted(r["origins"]["gemm_glu"] for r in results)
    assert all(r["ok"] for r in results)
    assert origins.count("finalized") == 1, origins
    assert set(origins) <= {"finalized", "remote", "cache"} and "remote" in origins


def test_a_dead_holders_lock_expires_and_the_waiter_builds(fleet, examples_bundle, tmp_path, monkeypatch):
    store = host(tmp_path, "a")
    bundle = portkern.load(examples_bundle, store=store)
    key = bundle.key(bundle.record("gemm_rowsum"), devices.resolve("cpu", store)).hex
    fleet.client().set(remote.RemoteCache.name("lock", key), b"a host that died", px=1500)
    kernel = bundle.kernel("gemm_rowsum")
    assert kernel.origin == "finalized"
    assert fleet.client().get(remote.RemoteCache.name("lock", key)) is None


def _rewrite(server, change) -> None:
    """Change the one native-code value in Redis (as an attacker with write access could)."""
    (name,) = native_values(server)
    _, _, document = framing.unpack(FORMAT, server.client().get(name))
    change(document)
    server.client().set(name, framing.pack(FORMAT, document))


def _tamper(document) -> None:
    data = bytearray(document["blobs"]["data"])
    data[len(data) // 2] ^= 0xFF
    document["blobs"]["data"] = bytes(data)
    document["meta"]["sha256"] = hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("attack, reason", [
    (_tamper, "does not verify"),
    (lambda document: document["blobs"].pop("signature"), "not signed"),
    (None, "untrusted key"),
    ("garbage", "not a portkern remote cache value"),
])
def test_tampered_untrusted_unsigned_or_garbage_entries_are_refused_and_rebuilt(
    fleet, examples_bundle, keys, tmp_path, rng, caplog, monkeypatch, attack, reason
):
    if attack is None:  # published by a host signing with a key the fleet does not trust
        monkeypatch.setenv("PORTKERN_SIGNING_KEY", str(keys / "stranger.key"))
    portkern.load(examples_bundle, store=host(tmp_path, "a")).kernel("gemm_transpose_add")
    monkeypatch.setenv("PORTKERN_SIGNING_KEY", str(keys / "trusted.key"))
    if attack == "garbage":
        (name,) = native_values(fleet)
        fleet.client().set(name, b"\x00 not a value")
    elif attack is not None:
        _rewrite(fleet, attack)

    caplog.clear()
    rebuilt = portkern.load(examples_bundle, store=host(tmp_path, "b")).kernel("gemm_transpose_add")
    assert logged(caplog, reason)
    assert rebuilt.origin == "finalized"
    assert_example(rebuilt, rng)
    # the bad value was replaced by the good one built here: a third host is served it
    caplog.clear()
    third = portkern.load(examples_bundle, store=host(tmp_path, "c")).kernel("gemm_transpose_add")
    assert not logged(caplog, "remote cache")
    assert third.origin == "remote"
    assert_example(third, rng)


def test_redis_killed_mid_run_leaves_kernels_running(fleet, examples_bundle, tmp_path, rng, caplog):
    store = host(tmp_path, "a")
    bundle = portkern.load(examples_bundle, store=store)
    assert bundle.kernel("gemm_glu").origin == "finalized"
    fleet.stop()
    caplog.clear()
    first = bundle.kernel("gemm_rowsum")
    second = bundle.kernel("gemm_transpose_add")
    assert len(logged(caplog, "remote cache .* not usable")) == 1
    assert (first.origin, second.origin) == ("finalized", "finalized")
    assert_example(first, rng)
    assert_example(second, rng)
    assert bundle.kernel("gemm_glu").origin == "cache"


def test_a_full_redis_is_one_warning(examples_bundle, tmp_path, rng, caplog, monkeypatch):
    full = redis_server.RedisServer(tmp_path, "--maxmemory", "1", "--maxmemory-policy", "noeviction")
    try:
        monkeypatch.setenv("PORTKERN_REMOTE_CACHE", full.url)
        kernel = portkern.load(examples_bundle, store=host(tmp_path, "a")).kernel("gemm_rowsum")
        assert len(logged(caplog, "not usable .*OutOfMemoryError")) == 1
        assert kernel.origin == "finalized"
        assert_example(kernel, rng)
    finally:
        full.stop()


def test_a_redis_that_does_not_answer_is_one_warning(examples_bundle, tmp_path, rng, caplog, monkeypatch):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setenv("PORTKERN_REMOTE_CACHE", f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
        monkeypatch.setenv("PORTKERN_REMOTE_TIMEOUT", "0.3")
        kernel = portkern.load(examples_bundle, store=host(tmp_path, "a")).kernel("gemm_rowsum")
        assert len(logged(caplog, "not usable .*Timeout")) == 1
    assert kernel.origin == "finalized"
    assert_example(kernel, rng)


def test_values_over_the_size_limit_are_neither_written_nor_read(fleet, examples_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("PORTKERN_REMOTE_MAX_VALUE", "1KB")
    portkern.load(examples_bundle, store=host(tmp_path, "a")).kernel("gemm_rowsum")
    assert native_values(fleet) == []


def _forge(server, victim: str, source: str, signer=None) -> None:
    """Store the native code of kernel key `source` under kernel key `victim`, unsigned or signed
    by `signer` (a well-formed value whose only fault is its signature)."""
    client = server.client()
    _, _, document = framing.unpack(FORMAT, client.get(RemoteCache.name(remote.NATIVE, source)))
    document["meta"]["key"] = victim
    document["blobs"].pop("signature")
    if signer is not None:
        document["blobs"]["signature"] = signing.sign_value(f"{remote.NATIVE}-{victim}", document["blobs"]["data"], signer)
    client.set(RemoteCache.name(remote.NATIVE, victim), framing.pack(FORMAT, document))


@pytest.mark.parametrize("signer, reason", [(None, "not signed"), ("stranger.key", "untrusted key")])
def test_with_trusted_keys_other_code_unsigned_or_untrusted_is_dropped_even_when_not_required(
    fleet, examples_bundle, keys, tmp_path, rng, caplog, monkeypatch, signer, reason
):
    monkeypatch.delenv("PORTKERN_REQUIRE_SIGNATURE")
    farm = host(tmp_path, "farm")
    bundle = portkern.load(examples_bundle, store=farm)
    target = devices.resolve("cpu", farm)
    victim, source = (bundle.key(bundle.record(name), target).hex for name in ("gemm_transpose_add", "gemm_rowsum"))
    assert bundle.kernel("gemm_rowsum").origin == "finalized"
    _forge(fleet, victim, source, keys / signer if signer else None)

    monkeypatch.delenv("PORTKERN_SIGNING_KEY")  # a reader: it drops the value and builds, but replaces nothing
    caplog.clear()
    rebuilt = portkern.load(examples_bundle, store=host(tmp_path, "reader")).kernel("gemm_transpose_add")
    assert logged(caplog, f"dropped .*{reason}")
    assert rebuilt.origin == "finalized"
    assert_example(rebuilt, rng)

    monkeypatch.setenv("PORTKERN_SIGNING_KEY", str(keys / "trusted.key"))  # a publisher replaces it
    caplog.clear()
    assert portkern.load(examples_bundle, store=host(tmp_path, "publisher")).kernel("gemm_transpose_add").origin == "finalized"
    assert logged(caplog, f"dropped .*{reason}")
    monkeypatch.delenv("PORTKERN_SIGNING_KEY")
    caplog.clear()
    served = portkern.load(examples_bundle, store=host(tmp_path, "third")).kernel("gemm_transpose_add")
    assert not logged(caplog, "remote cache")
    assert served.origin == "remote"
    assert_example(served, rng)


@pytest.mark.parametrize("key_file", [False, True])
def test_a_reader_publishes_nothing(server, examples_bundle, keys, tmp_path, rng, monkeypatch, key_file):
    monkeypatch.setenv("PORTKERN_REMOTE_CACHE", server.url)
    monkeypatch.setenv("PORTKERN_TRUSTED_KEYS", str(keys / "trusted.pub"))
    if key_file:  # a key file present does not make a reader publish
        monkeypatch.setenv("PORTKERN_SIGNING_KEY", str(keys / "trusted.key"))
        monkeypatch.setenv("PORTKERN_ROLE", "reader")
    store = host(tmp_path, "device")
    bundle = portkern.load(examples_bundle, store=store)
    record, target = bundle.record("gemm_rowsum"), devices.resolve("cpu", store)
    store.put_tuning(selection_problem(record, target), target.fingerprint, compiler_id(record), {"kind": "kernel", "config": TUNED})
    kernel = bundle.kernel("gemm_rowsum")
    assert kernel.origin == "finalized"
    assert_example(kernel, rng)
    assert server.client().keys("*") == []


def test_a_planted_lock_costs_a_bounded_wait_and_a_warning(fleet, examples_bundle, tmp_path, rng, caplog, monkeypatch):
    monkeypatch.setenv("PORTKERN_REMOTE_LOCK_S", "1")
    store = host(tmp_path, "a")
    bundle = portkern.load(examples_bundle, store=store)
    key = bundle.key(bundle.record("gemm_rowsum"), devices.resolve("cpu", store)).hex
    fleet.client().set(remote.RemoteCache.name("lock", key), b"x", ex=3600)
    kernel = bundle.kernel("gemm_rowsum")
    assert logged(caplog, "lock of gemm_rowsum .* held by 'x' .*building it here")
    assert kernel.origin == "finalized"
    assert_example(kernel, rng)


def test_finalize_json_says_what_was_published(fleet, examples_bundle, keys, tmp_path, rng, capsys, monkeypatch):
    argv = ["finalize", examples_bundle, "--target", "cpu", "--kernel", "gemm_rowsum"]
    status, report = cli_json(capsys, *argv, "--cache-dir", tmp_path / "farm", "--publish")
    assert status == 0 and report["published"] and report["remote"]["missing"] == 0
    assert report["entries"][0]["remote"] in ("published", "present")
    served = portkern.load(examples_bundle, store=host(tmp_path, "device")).kernel("gemm_rowsum")
    assert served.origin == "remote"
    assert_example(served, rng)

    monkeypatch.delenv("PORTKERN_SIGNING_KEY")  # a reader publishes nothing, and says so
    status, report = cli_json(capsys, *argv, "--cache-dir", tmp_path / "reader", "--publish")
    assert status == 1 and not report["published"] and "reader" in report["remote"]["reason"]

    monkeypatch.setenv("PORTKERN_SIGNING_KEY", str(keys / "trusted.key"))
    fleet.stop()
    status, report = cli_json(capsys, *argv, "--cache-dir", tmp_path / "farm")
    assert status == 0 and report["entries"][0]["ok"]  # the remote tier was not required
    assert not report["published"] and "not usable" in report["remote"]["reason"]
    status, report = cli_json(capsys, *argv, "--cache-dir", tmp_path / "farm", "--publish")
    assert status == 1 and not report["published"] and report["remote"]["missing"] == 1
    assert "not usable" in report["remote"]["reason"]


def test_a_build_lock_names_its_holder_and_lives_a_short_lease(fleet, tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("PORTKERN_REMOTE_LOCK_S", "0.5")
    key = hashlib.sha256(b"a kernel").hexdigest()
    holder, waiter = RemoteCache(remote.config_from_env()), RemoteCache(remote.config_from_env())
    with holder.lock(key, "k") as held:
        assert held
        name = remote.RemoteCache.name("lock", key)
        assert f"pid {os.getpid()}".encode() in fleet.client().get(name)
        assert 0 < fleet.client().pttl(name) <= remote.LEASE_S * 1000
        with waiter.lock(key, "k") as waited:
            assert not waited
        assert logged(caplog, f"lock of k .* held by '.*pid {os.getpid()} .*building it here")
    assert fleet.client().get(name) is None
