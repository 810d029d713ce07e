"""What portkern did with a cache, as counters, and their Prometheus text exposition.

The counters live in the cache's database (`Store.add_counts`, the table `cache stats` reads),
so they add up over every process that uses the cache and survive restarts (`cache clear`
resets them): local lookups that hit and missed, lookups of native code in the remote tier
(hits, misses, and those that got no answer from Redis), compiles of native code and their
seconds (worker wall time), tuning runs (searches) and their seconds, and refusals by reason.
`prometheus(store)` writes them in the Prometheus text format with `prometheus_client`
(`portkern.metrics()`, `portkern cache stats --prometheus`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from portkern.cache.store import Store

#: Counter names besides the lookups of `cache stats` (`cache.index.COUNTERS`); seconds are
#: counted in microseconds.
COMPILES, COMPILE_FAILURES, COMPILE_US = "compiles", "compile_failures", "compile_us"
TUNING_RUNS, TUNING_US = "tuning_runs", "tuning_us"
#: A refusal is counted under this prefix and its reason.
REFUSED = "refused:"
#: Why something was refused: a compile under `PORTKERN_COMPILE=never`, a remote value that failed
#: a check (signature, framing, not code for the device), a bundle whose signature the trust
#: policy refuses, a native-code entry of an import.
COMPILE_FORBIDDEN, REMOTE_VALUE, BUNDLE_SIGNATURE, IMPORT_ENTRY = "compile_forbidden", "remote_value", "bundle_signature", "import_entry"
REASONS = (COMPILE_FORBIDDEN, REMOTE_VALUE, BUNDLE_SIGNATURE, IMPORT_ENTRY)

#: Prometheus counters: (metric name without `_total`, counter, help, scale).
_COUNTERS = (
    ("portkern_cache_hits", "hits", "Local cache lookups that found native code.", 1),
    ("portkern_cache_misses", "misses", "Local cache lookups that found no native code.", 1),
    ("portkern_remote_hits", "remote_hits", "Remote-tier lookups of native code that served a value.", 1),
    ("portkern_remote_misses", "remote_misses", "Remote-tier lookups of native code that Redis answered without a usable value.", 1),
    ("portkern_remote_errors", "remote_errors", "Remote-tier lookups of native code that got no answer from Redis.", 1),
    ("portkern_compiles", COMPILES, "Kernels compiled to native code here.", 1),
    ("portkern_compile_seconds", COMPILE_US, "Seconds the compiles of native code took (worker wall time).", 1e-6),
    ("portkern_compile_failures", COMPILE_FAILURES, "Compiles of native code that failed.", 1),
    ("portkern_tuning_runs", TUNING_RUNS, "Tuning searches run here.", 1),
    ("portkern_tuning_seconds", TUNING_US, "Seconds the tuning searches took.", 1e-6),
)


def _micro(seconds: float) -> int:
    return max(0, round(seconds * 1e6))


def compiled(store: Store, seconds: float, ok: bool = True) -> None:
    """Count one compile of native code (that took `seconds`), or one that failed."""
    store.add_counts({COMPILES: 1, COMPILE_US: _micro(seconds)} if ok else {COMPILE_FAILURES: 1})


def tuned(store: Store, seconds: float) -> None:
    """Count one tuning search that took `seconds`."""
    store.add_counts({TUNING_RUNS: 1, TUNING_US: _micro(seconds)})


def refused(store: Store, reason: str, count: int = 1) -> None:
    """Count refusals for a reason (`REASONS`)."""
    store.add_counts({REFUSED + reason: count})


def remote_lookup(store: Store, outcome: str, counted: bool = True) -> None:
    """Count a lookup of native code in the remote tier by what it found (`remote.HIT`, ...):
    a lookup Redis did not answer is a `remote_errors`, not a miss; a refused value is a miss and
    a `remote_value` refusal. `counted=False`: only the refusal (a second look for the same code)."""
    from portkern.cache import remote  # only where a remote tier is in use

    deltas = {REFUSED + REMOTE_VALUE: int(outcome == remote.REFUSED)}
    if counted:
        name = {remote.HIT: "remote_hits", remote.UNREACHED: "remote_errors"}.get(outcome, "remote_misses")
        deltas[name] = 1
    store.add_counts(deltas)


def refusals(counters: dict[str, int]) -> dict[str, int]:
    """Refusals by reason from a store's counters (`Store.counters(every=True)`), every known reason included."""
    found = dict.fromkeys(REASONS, 0)
    for name, value in counters.items():
        if name.startswith(REFUSED):
            found[name[len(REFUSED):]] = value
    return found


def prometheus(store: Store) -> str:
    """The store's counters, and its entries and bytes, in the Prometheus text exposition format."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    counters = store.counters(every=True)
    stats = store.stats()

    class Counters(Collector):
        def collect(self) -> Iterator[Metric]:
            for metric, name, text, scale in _COUNTERS:
                value = counters.get(name, 0)
                yield CounterMetricFamily(metric, text, value=value * scale if scale != 1 else value)
            by_reason = CounterMetricFamily("portkern_refusals", "Things refused, by reason.", labels=["reason"])
            for reason, value in sorted(refusals(counters).items()):
                by_reason.add_metric([reason], value)
            yield by_reason
            yield GaugeMetricFamily("portkern_cache_entries", "Native-code entries in the local cache.", value=stats["entries"])
            yield GaugeMetricFamily("portkern_cache_bytes", "Bytes of native code in the local cache.", value=stats["bytes"])

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Counters())
    return generate_latest(registry).decode()
