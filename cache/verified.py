"""Signatures this device verified, remembered in its local store (records `s/<key>`).

`portkern.base.signing` asks a `Verified` record here before it imports model-signing, and
writes one only after model-signing's verifier passed that check. The records live in the
local store only: nothing read from the remote tier or a cache import becomes one.
"""

from __future__ import annotations

import dataclasses

from portkern.base.signing import Verified
from portkern.cache.keys import signature_key
from portkern.cache.store import Store

#: The store's record kind of a remembered check.
RECORD_KIND = "s"


class VerifiedSignatures:
    """The `signing.Memo` of a store: the signature checks that passed on this device."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def verified(self, check: Verified) -> bool:
        """Whether exactly this check passed here before."""
        record = self.store.get_record(RECORD_KIND, signature_key(check))
        return record == dataclasses.asdict(check)

    def remember(self, check: Verified) -> None:
        """Remember a check model-signing's verifier passed."""
        self.store.put_record(RECORD_KIND, signature_key(check), dataclasses.asdict(check), memo=True)
