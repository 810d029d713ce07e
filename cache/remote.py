"""The remote tier: native code and tuning results shared by a fleet through Redis.

`PORTKERN_REMOTE_CACHE=redis://[:password@]host:port/db` (or `rediss://` for TLS, as
redis-py reads URLs) turns it on. Each value is one framed document (`portkern.base.framing`,
magic `\\x89PKR\\r\\n\\x1a\\n`): `{"meta": {kind, key, sha256, signature?...}, "blobs":
{"data": ...}}` under `portkern:v1:<kind>:<key>`. Values are written once (`SET NX`);
eviction is left to Redis (`maxmemory-policy`). Only publishers write (`PORTKERN_ROLE`,
`portkern.base.signing`): they sign each value with `PORTKERN_SIGNING_KEY` (over the bytes as a
file named after the key); readers write nothing. With trusted keys configured
(`PORTKERN_TRUSTED_KEYS`), any value no trusted key signed is dropped, whether or not
`PORTKERN_REQUIRE_SIGNATURE` is set.

A value is untrusted until checked: its size is bounded before it is read, its
framing, key and sha256 are checked, and a bad one is dropped and logged (and
replaced by the next good write, never a good value by a bad one). Redis down,
slow, full or refusing: one logged warning, then local behaviour; it is tried again after
`RETRY_AFTER_S`. Nothing here ever makes a kernel fail.

Other settings: `PORTKERN_REMOTE_MAX_VALUE` (largest value written or read, default
64MiB), `PORTKERN_REMOTE_TIMEOUT` (seconds per Redis operation, default 2),
`PORTKERN_REMOTE_LOCK_S` (the longest a host waits for another host's build lock before it
logs a warning and builds itself, default 30; the holder keeps a `LEASE_S` lease renewed while it builds,
so a dead holder's lock lapses within that).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
import warnings
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

from portkern import schemas
from portkern.base import framing, settings, signing
from portkern.base.errors import CacheError, PortkernError
from portkern.base.records import frozen_record
from portkern.cache.config import CacheWarning

if TYPE_CHECKING:
    import redis
    from redis.lock import Lock

REMOTE_ENV = settings.REMOTE_CACHE
MAX_VALUE_ENV = settings.REMOTE_MAX_VALUE
TIMEOUT_ENV = settings.REMOTE_TIMEOUT
LOCK_ENV = settings.REMOTE_LOCK_S
MAGIC = b"\x89PKR\r\n\x1a\n"
FORMAT = framing.Format.with_error("remote cache value", MAGIC, 1, 0, CacheError)
NAMESPACE = "portkern:v1"
DEFAULT_MAX_VALUE = settings.DEFAULT_REMOTE_MAX_VALUE
#: After Redis fails, local behaviour for this long before it is tried again.
RETRY_AFTER_S = 30.0
#: Value kinds: native code ("a", as in the store) and tuning results ("t").
NATIVE, TUNING = "a", "t"
#: How long a build lock lives unless its holder renews it (every third of this while it builds).
LEASE_S = 10.0
DEFAULT_LOCK_S = settings.DEFAULT_REMOTE_LOCK_S
#: What became of a value offered to the remote tier (`RemoteCache.offer`), besides a reason it was not.
PUBLISHED, PRESENT = "published", "present"
#: What a lookup found (`Lookup.outcome`): a value that passed the checks, no value (or one dropped
#: earlier), a value refused now (it failed a check), or no answer from Redis (down, slow, backing off).
HIT, MISS, REFUSED, UNREACHED = "hit", "miss", "refused", "unreached"


log = logging.getLogger(__name__)

_T = TypeVar("_T")
_D = TypeVar("_D")


class RemoteCacheWarning(CacheWarning):
    """This host cannot sign what it would publish (its signing key); kernels still run. The remote
    tier's operational events (Redis not usable, a value dropped, a build lock not let go) are
    logged on `portkern.cache.remote`."""


@frozen_record
class RemoteConfig:
    """Where the remote tier is and its limits."""

    url: str
    max_value: int = DEFAULT_MAX_VALUE
    timeout_s: float = settings.DEFAULT_REMOTE_TIMEOUT_S
    #: The longest a host waits for another host's build lock.
    lock_s: float = DEFAULT_LOCK_S


@frozen_record
class Fetched:
    """A remote value that passed every check."""

    data: bytes
    meta: dict[str, Any]
    #: The trusted key that signed it (None when signatures are not required and it had none).
    signer: signing.TrustedKey | None


@frozen_record
class Lookup:
    """What one lookup in the remote tier found: `outcome` (`HIT`, `MISS`, `REFUSED`, `UNREACHED`)
    and, on a hit, the value."""

    outcome: str
    fetched: Fetched | None = None


def config_from_env() -> RemoteConfig | None:
    """The remote tier the settings (`portkern.base.settings`) name, or None. Never raises: an
    unusable limit is one warning and its default."""
    url = settings.remote_url()
    if not url:
        return None
    return RemoteConfig(url, settings.remote_max_value(), settings.remote_timeout_s(), settings.remote_lock_s())


class RemoteCache:
    """One Redis server shared by many hosts. Methods never raise for Redis failures."""

    def __init__(self, config: RemoteConfig, policy: signing.Policy | None = None) -> None:
        self.config = config
        self.policy = policy if policy is not None else signing.from_env()
        self._client: redis.Redis | None = None
        self._down_until = 0.0
        #: sha256 of values dropped as bad, by Redis key: skipped when read, and only these are overwritten.
        self._bad: dict[str, str] = {}
        #: sha256 of the value last served, by Redis key (so a caller can reject it later).
        self._served: dict[str, str] = {}
        #: Why Redis was last not usable ("" if it has been).
        self.last_error = ""

    @property
    def url(self) -> str:
        """The Redis URL without its password."""
        return _safe(self.config.url)

    # --- plumbing ------------------------------------------------------------

    def _redis(self) -> redis.Redis | None:
        if time.monotonic() < self._down_until:
            return None
        if self._client is None:
            try:
                import redis

                self._client = redis.Redis.from_url(
                    self.config.url, socket_timeout=self.config.timeout_s, socket_connect_timeout=self.config.timeout_s
                )
            except Exception as exc:  # noqa: BLE001 - a bad URL or a missing package degrades to local
                self._fail(exc)
        return self._client

    def _fail(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self._down_until <= time.monotonic():
            log.warning(
                "remote cache %s is not usable (%s: %s); running on the local cache (trying again in %.0f s)",
                _safe(self.config.url), type(exc).__name__, exc, RETRY_AFTER_S,
            )
        self._down_until = time.monotonic() + RETRY_AFTER_S
        self._client = None

    def _call(self, what: Callable[[redis.Redis], _T], default: _D) -> _T | _D:
        client = self._redis()
        if client is None:
            return default
        try:
            return what(client)
        except Exception as exc:  # noqa: BLE001 - down, slow, full: local behaviour
            self._fail(exc)
            return default

    @staticmethod
    def name(kind: str, key: str) -> str:
        return f"{NAMESPACE}:{kind}:{key}"

    # --- values ----------------------------------------------------------------

    def get_native(self, key: str) -> Fetched | None:
        """Native code stored under a cache key, checked; None on a miss or a bad value."""
        return self._get(NATIVE, key)

    def lookup_native(self, key: str) -> Lookup:
        """`get_native`, saying what the lookup found (a miss apart from a refused value or no answer)."""
        return self._lookup(NATIVE, key)

    def put_native(self, key: str, data: bytes, meta: dict[str, Any]) -> bool:
        """Publish native code (signed when this host has a signing key); False if not written
        (always on a reader)."""
        return self._put(NATIVE, key, data, meta)

    def offer(self, kind: str, key: str, data: bytes, meta: dict[str, Any]) -> str:
        """Make sure the fleet has this value: `PUBLISHED` (written now), `PRESENT` (a value that
        passes this host's checks is stored under the key), else why it is not there. A value
        stored there that fails the checks is replaced."""
        outcome = self._publish(kind, key, data, meta)
        if outcome != PRESENT:
            return outcome
        name = self.name(kind, key)
        raw = self._call(lambda client: _bytes(client.get(name)), None)
        if raw is None:
            return self._why_not_written()
        try:
            self._check(kind, key, raw)
            return PRESENT
        except PortkernError as exc:
            self._drop(kind, key, raw, str(exc))
        return self._publish(kind, key, data, meta)

    def get_tuning(self, key: str) -> dict[str, Any] | None:
        """A tuning record stored under a tuning key, checked; None on a miss or a bad value."""
        fetched = self._get(TUNING, key)
        if fetched is None:
            return None
        try:
            record = json.loads(fetched.data)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            self._drop(TUNING, key, None, "tuning record is not a JSON object")
            return None
        return record

    def put_tuning(self, key: str, record: dict[str, Any]) -> bool:
        return self._put(TUNING, key, json.dumps(record, sort_keys=True).encode(), {})

    def _get(self, kind: str, key: str) -> Fetched | None:
        return self._lookup(kind, key).fetched

    def _lookup(self, kind: str, key: str) -> Lookup:
        name = self.name(kind, key)

        def read(client: redis.Redis) -> bytes | None:
            size = client.strlen(name)
            if not size:
                return None
            if size > self.config.max_value + (1 << 16):
                return b""  # refused unread
            return _bytes(client.get(name))

        failed = object()
        raw = self._call(read, failed)
        if raw is failed:
            return Lookup(UNREACHED)
        if not isinstance(raw, bytes) or self._bad.get(name) == hashlib.sha256(raw).hexdigest():
            return Lookup(MISS)
        try:
            fetched = self._check(kind, key, raw)
        except PortkernError as exc:
            self._drop(kind, key, raw, str(exc))
            return Lookup(REFUSED)
        self._served[name] = hashlib.sha256(raw).hexdigest()
        return Lookup(HIT, fetched)

    def reject_native(self, key: str, reason: str) -> None:
        """Drop the native code last served for `key` (it passed the checks here but does not
        work): it is not served again, and the next build here replaces it."""
        name = self.name(NATIVE, key)
        if name in self._served:
            self._bad[name] = self._served.pop(name)
        log.warning("remote cache value %s:%s dropped (%s); building it here", NATIVE, key[:16], reason)

    def _check(self, kind: str, key: str, raw: bytes) -> Fetched:
        if not raw:
            raise CacheError(f"larger than the {self.config.max_value}-byte value limit")
        _, _, document = framing.unpack(FORMAT, raw)
        meta, blobs = framing.meta_and_blobs(document, "remote-entry", CacheError, validate=False)
        schemas.check("remote-entry", meta, CacheError)
        if "data" not in blobs or not set(blobs) <= {"data", "signature"}:
            raise CacheError("value must hold a 'data' blob and at most a 'signature' blob")
        data = blobs["data"]
        if meta["kind"] != kind or meta["key"] != key:
            raise CacheError(f"value names {meta['kind']}:{meta['key'][:16]}, not the key it is stored under")
        if len(data) > self.config.max_value or hashlib.sha256(data).hexdigest() != meta["sha256"]:
            raise CacheError("content does not match its sha256")
        signer = self.policy.check_value(f"{kind}-{key}", data, blobs.get("signature"), "remote value")
        return Fetched(data, meta, signer)

    def _drop(self, kind: str, key: str, raw: bytes | None, reason: str) -> None:
        name = self.name(kind, key)
        if raw is not None:
            self._bad[name] = hashlib.sha256(raw).hexdigest()
        log.warning("remote cache value %s:%s dropped (%s); building it here", kind, key[:16], reason)

    def _put(self, kind: str, key: str, data: bytes, meta: dict[str, Any]) -> bool:
        return self._publish(kind, key, data, meta) == PUBLISHED

    def _publish(self, kind: str, key: str, data: bytes, meta: dict[str, Any]) -> str:
        if not self.policy.publishes:
            return f"this host is a {self.policy.role} (only a publisher, with {signing.SIGNING_KEY_ENV}, publishes)"
        if len(data) > self.config.max_value:
            return f"larger than the {self.config.max_value}-byte value limit ({MAX_VALUE_ENV})"
        blobs = {"data": bytes(data)}
        if self.policy.signing_key is not None:
            try:
                blobs["signature"] = signing.sign_value(f"{kind}-{key}", data, self.policy.signing_key)
            except PortkernError as exc:
                warnings.warn(f"cannot sign remote cache values ({exc}); not publishing", RemoteCacheWarning, stacklevel=4)
                return f"cannot sign it ({exc})"
        document = {"meta": {**meta, "kind": kind, "key": key, "sha256": hashlib.sha256(data).hexdigest()}, "blobs": blobs}
        value = framing.pack(FORMAT, document)
        name = self.name(kind, key)
        bad = self._bad.get(name)
        failed = object()
        if bad is None:
            written = self._call(lambda client: client.set(name, value, nx=True), failed)
        else:
            written = self._call(lambda client: _replace_if(client, name, bad, value), failed)
        if written is failed:
            return self._why_not_written()
        return PUBLISHED if written else PRESENT

    def _why_not_written(self) -> str:
        return f"remote cache {_safe(self.config.url)} is not usable ({self.last_error or 'no answer'})"

    # --- single flight -------------------------------------------------------------

    @contextmanager
    def lock(self, key: str, what: str = "") -> Iterator[bool]:
        """Hold the fleet-wide build lock of a key (of kernel `what`) while building it; yields
        whether it is held.

        The lock names its holder (host and process) and lives `LEASE_S` unless renewed, which
        the holder does while it builds. A waiter waits up to `lock_s` for the lock; a lock that
        is not let go by then (a planted lock, a holder that died or is slow) costs a logged warning
        naming the kernel and the holder, and the waiter builds itself. Without Redis, yields
        False at once (build locally).
        """
        client = self._redis()
        name = self.name("lock", key)
        lock, renewer = None, None
        if client is not None:
            token = f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"
            try:
                lock = client.lock(name, timeout=LEASE_S, sleep=0.1, blocking_timeout=self.config.lock_s, thread_local=False)
                if not lock.acquire(token=token):
                    lock = None
                    holder = self._call(lambda c: _bytes(c.get(name)), None)
                    log.warning(
                        "the fleet build lock of %s (%s) is held by %s and was not let go within %g s (%s): a planted "
                        "lock or a holder that died or is slow; building it here",
                        what or "kernel", key[:16], _holder(holder), self.config.lock_s, LOCK_ENV,
                    )
            except Exception as exc:  # noqa: BLE001 - Redis down, slow or refusing: build locally, never fail
                self._fail(exc)
                lock = None
        if lock is not None:
            renewer = _Renewer(lock)
        try:
            yield lock is not None
        finally:
            if renewer is not None:
                renewer.stop()
            if lock is not None:
                try:
                    lock.release()
                except Exception:  # noqa: BLE001 - lapsed (renewal failed) or Redis went away: nothing to undo
                    pass


class _Renewer:
    """Renews a held build lock's lease every third of `LEASE_S` until stopped (or the lock is lost)."""

    def __init__(self, lock: Lock) -> None:
        self._lock = lock
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="portkern-remote-lock", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(LEASE_S / 3):
            try:
                self._lock.reacquire()
            except Exception:  # noqa: BLE001 - lost or Redis gone: waiters build after the lease lapses
                return

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(LEASE_S)


def _holder(value: bytes | None) -> str:
    """Who a lock's value says holds it, as untrusted text."""
    if value is None:
        return "a holder that let go just now"
    return repr(value[:80].decode("utf-8", "replace"))


def _replace_if(client: redis.Redis, name: str, expected: str, value: bytes) -> bool:
    """Set `name` to `value` only if it is missing or still holds the value with sha256 `expected`
    (one dropped as bad), never over a value written since."""
    import redis

    with client.pipeline() as pipe:
        try:
            pipe.watch(name)  # type: ignore[no-untyped-call]  # redis-py leaves Pipeline.watch unannotated
            current = _bytes(pipe.get(name))
            if current is not None and hashlib.sha256(current).hexdigest() != expected:
                return False
            pipe.multi()
            pipe.set(name, value)
            pipe.execute()
            return True
        except redis.WatchError:
            return False


def _bytes(value: bytes | str | None) -> bytes | None:
    """A value as Redis answers it: bytes, None when absent; CacheError for text (a client that
    decodes responses, as `decode_responses` in the URL asks)."""
    if isinstance(value, str):
        raise CacheError("the Redis client decodes values to text (decode_responses in the URL); values are bytes")
    return value


def _safe(url: str) -> str:
    """A Redis URL without its password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


_remotes: dict[tuple[RemoteConfig, signing.Policy], RemoteCache] = {}


def from_env() -> RemoteCache | None:
    """The process's remote tier as the environment configures it (Redis and trust policy), or None."""
    config = config_from_env()
    if config is None:
        return None
    policy = signing.from_env()
    if (config, policy) not in _remotes:
        _remotes[config, policy] = RemoteCache(config, policy)
    return _remotes[config, policy]
