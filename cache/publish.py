"""Making sure the remote tier has native code of the local cache: each entry offered to Redis
(`RemoteCache.offer`), and what became of it (`portkern finalize`, `portkern cache publish`)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from portkern.base.records import record
from portkern.cache.remote import NATIVE, PRESENT, PUBLISHED, RemoteCache
from portkern.cache.store import Store

#: Why an entry offered by key was not: it is not in the local cache (any more).
NOT_CACHED = "no longer in the local cache"


@record
class Publication:
    """What became of native code offered to the remote tier: by cache key, `PUBLISHED` (written
    now), `PRESENT` (the fleet had it) or why it is not there."""

    url: str
    role: str
    outcomes: dict[str, str] = field(default_factory=dict)

    def count(self, outcome: str) -> int:
        return sum(1 for found in self.outcomes.values() if found == outcome)

    @property
    def missing(self) -> int:
        """Entries not in the remote tier."""
        return sum(1 for found in self.outcomes.values() if found not in (PUBLISHED, PRESENT))

    @property
    def complete(self) -> bool:
        """Whether every entry offered (at least one) is in the remote tier."""
        return bool(self.outcomes) and not self.missing

    def summary(self) -> dict[str, Any]:
        """`url`, `role`, counts `published`/`present`/`missing`, and the `reason` for what is missing."""
        reasons = list(dict.fromkeys(found for found in self.outcomes.values() if found not in (PUBLISHED, PRESENT)))
        return {"url": self.url, "role": self.role, "published": self.count(PUBLISHED), "present": self.count(PRESENT),
                "missing": self.missing, "reason": "; ".join(reasons) or None}


def publish(store: Store, remote: RemoteCache, keys: list[str], built: set[str] | frozenset[str] = frozenset()) -> Publication:
    """Offer the local cache's native code under each key to the remote tier. `built`: keys this
    process compiled just now, under the fleet-wide build lock, so written through as they were
    built: found there, they count as `PUBLISHED`."""
    publication = Publication(remote.url, remote.policy.role)
    for key in dict.fromkeys(keys):
        hit = store.get(key, count=False)
        if hit is None:
            publication.outcomes[key] = NOT_CACHED
            continue
        data, entry = hit
        meta = {"config": entry.config, "format": entry.format, "finalize_s": entry.finalize_s}
        outcome = remote.offer(NATIVE, key, data, meta)
        publication.outcomes[key] = PUBLISHED if outcome == PRESENT and key in built else outcome
    return publication
