"""`portkern devices`: what this machine offers, with fingerprints, and why not when absent."""

from __future__ import annotations

import argparse

from portkern.cli.common import Report, add_cache_dir, add_json, store_from, table


def register(sub) -> None:
    devices = sub.add_parser("devices", help="list the devices found on this machine")
    add_cache_dir(devices)
    add_json(devices)
    devices.set_defaults(handler=run_devices)


def run_devices(args: argparse.Namespace) -> Report:
    from portkern.jit.devices import probe_all

    probes = probe_all(store_from(args))
    data = [
        {
            "kind": p.kind,
            "found": bool(p.devices),
            "reason": p.reason,
            "devices": [
                {**d.to_dict(), "label": d.label, "fingerprint": d.digest(), "details": dict(info)}
                for d, info in zip(p.devices, p.details or ({},) * len(p.devices))
            ],
        }
        for p in probes
    ]

    def render(out):
        rows = []
        for p in probes:
            if not p.devices:
                rows.append([p.kind, "-", "not found: " + (p.reason or "no device"), "-"])
            for d, info in zip(p.devices, p.details or ({},) * len(p.devices)):
                props = ", ".join(f"{k}={v}" for k, v in (*d.properties, *info.items()))
                feats = d.features.split(",")
                shown = f"{len(feats)} features" if len(d.features) > 60 else d.features
                rows.append([p.kind, d.label, "; ".join(x for x in (shown, props) if x), d.digest()[:16]])
        out.print(table("devices", ["kind", "device", "details", "fingerprint"], rows))

    return Report(data, render)
