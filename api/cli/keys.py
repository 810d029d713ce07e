"""`portkern keys new PREFIX`: a key pair for signing bundles, exports and remote entries."""

from __future__ import annotations

import argparse
from pathlib import Path

from portkern.cli.common import Report, add_json


def register(sub) -> None:
    keys = sub.add_parser("keys", help="make signing keys (OpenSSF Model Signing, EC P-256)")
    actions = keys.add_subparsers(dest="action", metavar="ACTION", required=True)
    new = actions.add_parser("new", help="write PREFIX.key (private, mode 0600) and PREFIX.pub (public)")
    new.add_argument("prefix", type=Path, help="path prefix of the two key files")
    add_json(new)
    new.set_defaults(handler=run_new)


def run_new(args: argparse.Namespace) -> Report:
    from portkern.base.signing import new_key_pair, read_trusted_keys

    private, public = new_key_pair(args.prefix)
    key = read_trusted_keys(public)[0]
    data = {"private_key": str(private), "public_key": str(public), "fingerprint": key.short}

    def render(out):
        out.print(f"wrote {private} (private, keep it secret) and {public} (public, {key.short})")
        out.print(f"sign with `portkern build --sign {private}`; trust with PORTKERN_TRUSTED_KEYS={public}")

    return Report(data, render)
