"""The per-device store: native artifacts, tuning results and device probes, on diskcache.

Layout inside one diskcache (only `str` and `bytes` values, so nothing is pickled):

- `a/<key>`: the native artifact's bytes;
- `m/<key>`: its metadata, JSON (an `Entry`), written in the same transaction;
- `t/<key>`: a tuning result, JSON;
- `p/<key>`: a memoised device probe, JSON;
- `s/...`: hit and miss counters.

Every artifact read re-hashes the bytes against the sha256 in its metadata; a
mismatch evicts the entry and reads as a miss. Any failure of the cache itself
(unwritable directory, full disk, broken database) becomes one warning and
the store carries on as if disabled: kernels never fail because of the cache.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator

from portkern.cache.config import CacheConfig, from_env
from portkern.cache.device import DeviceFingerprint
from portkern.cache.keys import tuning_key
from portkern.cache.remote import RemoteCache
from portkern.cache.remote import from_env as remote_from_env


#: Set (to the reason) in a stored tuning result whose config failed to build on its device:
#: the record stays (an import or the remote tier would bring it back) but is not used again.
UNUSABLE = "unusable"


#: Counters `stats()` reports: local hits and misses, and native code found or not in the remote tier.
COUNTERS = ("hits", "misses", "remote_hits", "remote_misses")


class CacheWarning(UserWarning):
    """The cache could not be used; kernels still run without it."""


@dataclass
class Entry:
    """Metadata of one cached native artifact."""

    key: str
    kernel: str
    bundle: str
    bundle_digest: str
    device: dict[str, Any]
    device_label: str
    config: str
    format: str
    size: int
    sha256: str
    compiler: str
    flags: list[str] = field(default_factory=list)
    kernel_digest: str = ""
    created: float = 0.0
    last_used: float = 0.0
    hits: int = 0
    finalize_s: float = 0.0
    kernel_time_s: float | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Entry":
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class Store:
    """A cache directory. Methods never raise for cache failures; they warn once."""

    def __init__(self, config: CacheConfig | None = None, remote: RemoteCache | None = None) -> None:
        self.config = config or from_env()
        #: The fleet's shared tier, if any: tuning results read and write through it here;
        #: native code goes through it in the loader, which alone publishes what it built.
        self.remote = remote
        self._cache = None
        self._broken: str | None = None
        if self.config.disabled:
            self._broken = "disabled by PORTKERN_CACHE_DISABLE"

    @property
    def directory(self) -> Path:
        return self.config.directory

    @property
    def enabled(self) -> bool:
        return self._open() is not None

    # --- plumbing -----------------------------------------------------------

    def _open(self):
        if self._cache is None and self._broken is None:
            try:
                import diskcache

                self.directory.mkdir(parents=True, exist_ok=True)
                self._cache = diskcache.Cache(
                    str(self.directory), eviction_policy="none", size_limit=1 << 62, statistics=0
                )
            except Exception as exc:  # noqa: BLE001 - any cache failure degrades, never fails
                self._fail("open", exc)
        return self._cache

    def _fail(self, what: str, exc: BaseException) -> None:
        if self._broken is None:
            self._broken = f"{what}: {type(exc).__name__}: {exc}"
            warnings.warn(
                f"portkern cache at {self.directory} is not usable ({self._broken}); running without it",
                CacheWarning,
                stacklevel=3,
            )
        self._cache = None

    def _guard(self, what: str, action: Callable[[Any], Any], default: Any = None) -> Any:
        cache = self._open()
        if cache is None:
            return default
        try:
            return action(cache)
        except Exception as exc:  # noqa: BLE001
            self._fail(what, exc)
            return default

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
            self._cache = None

    # --- artifacts ----------------------------------------------------------

    def get(self, key: str, *, count: bool = True) -> tuple[bytes, Entry] | None:
        """The artifact and its metadata, if present and intact (counts a hit or miss)."""

        def read(cache):
            meta = cache.get(f"m/{key}")
            data = cache.get(f"a/{key}") if meta is not None else None
            if meta is None or data is None:
                if count:
                    cache.incr("s/misses", default=0)
                return None
            entry = Entry.from_json(meta)
            if hashlib.sha256(data).hexdigest() != entry.sha256:
                warnings.warn(
                    f"portkern cache entry {key[:16]} ({entry.kernel} on {entry.device_label}) is corrupt; "
                    "evicted, it will be rebuilt",
                    CacheWarning,
                    stacklevel=4,
                )
                self._delete(cache, key)
                if count:
                    cache.incr("s/misses", default=0)
                return None
            if count:
                entry.hits += 1
                entry.last_used = time.time()
                with cache.transact():
                    cache.set(f"m/{key}", entry.to_json())
                    cache.incr("s/hits", default=0)
            return data, entry

        return self._guard("read", read)

    def put(self, key: str, data: bytes, entry: Entry) -> bool:
        """Store an artifact; returns False if the cache could not take it."""
        entry.key = key
        entry.size = len(data)
        entry.sha256 = hashlib.sha256(data).hexdigest()
        entry.created = entry.created or time.time()
        entry.last_used = entry.last_used or entry.created

        def write(cache):
            with cache.transact():
                cache.set(f"a/{key}", bytes(data))
                cache.set(f"m/{key}", entry.to_json())
            return True

        stored = bool(self._guard("write", write, False))
        if stored:
            self.enforce_budget()
        return stored

    def delete(self, key: str) -> bool:
        return bool(self._guard("delete", lambda cache: self._delete(cache, key), False))

    @staticmethod
    def _delete(cache, key: str) -> bool:
        with cache.transact():
            found = cache.delete(f"m/{key}")
            cache.delete(f"a/{key}")
        return bool(found)

    def entries(self) -> list[Entry]:
        """Metadata of every artifact, most recently used first."""

        def scan(cache):
            found = []
            for name in cache.iterkeys():
                if isinstance(name, str) and name.startswith("m/"):
                    text = cache.get(name)
                    if text is not None:
                        found.append(Entry.from_json(text))
            return sorted(found, key=lambda e: e.last_used, reverse=True)

        return self._guard("scan", scan, [])

    def read_raw(self, key: str) -> bytes | None:
        """An artifact's bytes without checking or counting (for verify and export)."""
        return self._guard("read", lambda cache: cache.get(f"a/{key}"))

    def enforce_budget(self, max_size: int | None = None) -> list[Entry]:
        """Evict least-recently-used artifacts until they fit the size budget."""
        budget = self.config.max_size if max_size is None else max_size
        entries = self.entries()
        total = sum(e.size for e in entries)
        evicted = []
        for entry in reversed(entries):  # least recently used first
            if total <= budget:
                break
            if self.delete(entry.key):
                total -= entry.size
                evicted.append(entry)
        return evicted

    def verify(self) -> list[tuple[Entry | None, str, str]]:
        """Re-hash every artifact; evict and return (entry, key, problem) for each bad one."""
        bad: list[tuple[Entry | None, str, str]] = []
        for entry in self.entries():
            data = self.read_raw(entry.key)
            if data is None:
                problem = "artifact missing"
            elif len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
                problem = "artifact does not match its sha256"
            else:
                continue
            self.delete(entry.key)
            bad.append((entry, entry.key, problem))
        for key in self._orphans():
            self._guard("delete", lambda cache, key=key: cache.delete(f"a/{key}"))
            bad.append((None, key, "artifact without metadata"))
        return bad

    def _orphans(self) -> list[str]:
        def scan(cache):
            names = [k for k in cache.iterkeys() if isinstance(k, str)]
            meta = {k[2:] for k in names if k.startswith("m/")}
            return [k[2:] for k in names if k.startswith("a/") and k[2:] not in meta]

        return self._guard("scan", scan, [])

    def prune(self, max_size: int | None = None, older_than: float | None = None) -> list[Entry]:
        """Evict entries unused for `older_than` seconds, then LRU down to `max_size` bytes."""
        evicted = []
        if older_than is not None:
            cutoff = time.time() - older_than
            evicted += [e for e in self.entries() if e.last_used < cutoff and self.delete(e.key)]
        if max_size is not None:
            evicted += self.enforce_budget(max_size)
        return evicted

    def clear(self, device: str | None = None) -> int:
        """Remove everything, or only the artifacts and tuning results of one device.

        `device` is a label ("cpu:znver5") or a prefix of a fingerprint digest.
        """
        if device is None:
            count = len(self.entries())
            self._guard("clear", lambda cache: cache.clear())
            return count
        count = 0
        for entry in self.entries():
            if matches_device(entry.device, device) and self.delete(entry.key):
                count += 1
        for key, record in list(self.records("t")):
            if isinstance(record.get("device"), dict) and matches_device(record["device"], device):
                self.delete_record("t", key)
        return count

    def stats(self) -> dict[str, Any]:
        """Entries, bytes and hits overall and per device, and the hit/miss counters."""
        entries = self.entries()
        per_device: dict[str, dict[str, int]] = {}
        for e in entries:
            d = per_device.setdefault(e.device_label, {"entries": 0, "bytes": 0, "hits": 0})
            d["entries"] += 1
            d["bytes"] += e.size
            d["hits"] += e.hits
        return {
            "directory": str(self.directory),
            "enabled": self.enabled,
            "entries": len(entries),
            "bytes": sum(e.size for e in entries),
            "max_size": self.config.max_size,
            "tuning_results": sum(1 for _ in self.records("t")),
            **self.counters(),
            "devices": per_device,
        }

    # --- small JSON records: tuning results, device probes ------------------

    def get_record(self, kind: str, key: str) -> dict | None:
        text = self._guard("read", lambda cache: cache.get(f"{kind}/{key}"))
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            self._guard("delete", lambda cache: cache.delete(f"{kind}/{key}"))
            return None

    def put_record(self, kind: str, key: str, record: dict) -> bool:
        text = json.dumps(record, sort_keys=True)
        return bool(self._guard("write", lambda cache: cache.set(f"{kind}/{key}", text) or True, False))

    def records(self, kind: str) -> Iterator[tuple[str, dict]]:
        prefix = f"{kind}/"
        keys = self._guard("scan", lambda cache: [k for k in cache.iterkeys() if isinstance(k, str) and k.startswith(prefix)], [])
        for name in keys:
            record = self.get_record(kind, name[len(prefix) :])
            if record is not None:
                yield name[len(prefix) :], record

    def delete_record(self, kind: str, key: str) -> bool:
        return bool(self._guard("delete", lambda cache: cache.delete(f"{kind}/{key}"), False))

    def get_tuning(self, problem: str, device: DeviceFingerprint, compiler: str) -> dict | None:
        """The stored tuning result for a problem on a device, if any (here, else from the remote tier)."""
        key = tuning_key(problem, device, compiler)
        record = self.get_record("t", key)
        if record is None and self.remote is not None:
            shared = self.remote.get_tuning(key)
            if shared is not None and (shared.get("problem"), shared.get("device"), shared.get("compiler")) == (
                problem, device.to_dict(), compiler
            ) and not shared.get(UNUSABLE):
                self.put_record("t", key, shared)
                record = shared
        return record

    def put_tuning(self, problem: str, device: DeviceFingerprint, compiler: str, result: dict) -> bool:
        """Store a tuning result together with the parts of its key (so imports can check it),
        and share it through the remote tier."""
        record = {**result, "problem": problem, "device": device.to_dict(), "compiler": compiler}
        stored = self.put_record("t", tuning_key(problem, device, compiler), record)
        if self.remote is not None and not record.get(UNUSABLE):
            self.remote.put_tuning(tuning_key(problem, device, compiler), record)
        return stored

    # --- counters and locks -------------------------------------------------

    def counters(self) -> dict[str, int]:
        def read(cache):
            return {name: int(cache.get(f"s/{name}", 0) or 0) for name in COUNTERS}

        return self._guard("read", read, dict.fromkeys(COUNTERS, 0))

    def count(self, name: str) -> None:
        """Add one to a counter (`COUNTERS`)."""
        self._guard("write", lambda cache: cache.incr(f"s/{name}", default=0))

    def lock(self, key: str, timeout: float = 900.0):
        """A cross-process lock for building `key`, so concurrent processes build it once."""
        if self._open() is None:
            return nullcontext()
        try:
            from filelock import FileLock

            locks = self.directory / "locks"
            locks.mkdir(exist_ok=True)
            return _tolerant(FileLock(str(locks / f"{key[:32]}.lock"), timeout=timeout))
        except Exception as exc:  # noqa: BLE001
            self._fail("lock", exc)
            return nullcontext()


def matches_device(device: dict[str, Any], wanted: str) -> bool:
    """Whether a fingerprint (as plain data) is the device a user named by label or digest prefix."""
    fingerprint = DeviceFingerprint.from_dict(device)
    return wanted == fingerprint.label or (len(wanted) >= 8 and fingerprint.digest().startswith(wanted))


@contextmanager
def _tolerant(lock):
    """Hold `lock` if it can be taken; run unlocked (duplicate work, never failure) if not."""
    try:
        lock.acquire()
    except Exception:  # noqa: BLE001 - a lock we cannot take only costs duplicate work
        yield
        return
    try:
        yield
    finally:
        lock.release()


_default: Store | None = None


def default_store() -> Store:
    """The process-wide store configured from the environment."""
    global _default
    remote = remote_from_env()
    if _default is None or _default.config != from_env() or _default.remote is not remote:
        _default = Store(remote=remote)
    return _default
