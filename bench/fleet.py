"""First-result time from the fleet's remote tier vs a local warm hit vs cold, per example kernel.

    python bench/fleet.py [--repeat 5] [--unsigned] [--kernel NAME ...] [--json]

Starts its own `redis-server` on a free loopback port. Each measurement runs in a
fresh Python process and times portkern.load + bundle.kernel(name) + the first call
(one-time process setup is measured apart, as in bench/warm_start.py):
    cold:   empty local cache, empty Redis: finalises (and publishes);
    new host: another empty local cache, Redis filled by cold: probes the CPU and checks
            the bundle (as any first process on a machine does), then fetches, checks and
            verifies the signed entry and copies it locally;
    remote: a host whose cache has already probed the CPU and checked the bundle (a
            process loaded it before) but lacks this kernel: the remote tier's own cost;
    warm:   the local cache filled by the new host: a local hit.
Entries are signed with a fresh EC P-256 key and signatures are required (as a fleet
would run), unless --unsigned. Figures are medians of --repeat; ratios are against cold.
`verifier` says which of new host, remote and warm imported model-signing (a signature
check this device had not passed before); a warm hit never does, as its bundle's check is
remembered (`portkern.cache.verified`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from children import environment
from warm_start import CHILD

from portkern.base import signing
from portkern.examples import MANIFEST
from portkern.portable.builder import build_file
from portkern.portable.manifest import load_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from redis_server import RedisServer  # noqa: E402

# Loads the bundle and probes the CPU into a cache, running no kernel.
PRIME = "import sys, portkern; from portkern.jit import devices; b = portkern.load(sys.argv[1]); devices.resolve('cpu', b.store)"


# warm_start's timed child, then whether it imported model-signing (after the timing).
FLEET_CHILD = CHILD + "print(json.dumps({'model_signing': 'model_signing' in sys.modules}))\n"


def measure(bundle: Path, name: str, cache_dir: Path) -> dict:
    """warm_start's measurement of one kernel in a fresh process, and `model_signing`: whether
    that process imported model-signing."""
    done = subprocess.run([sys.executable, "-c", FLEET_CHILD, str(bundle), name], env=environment(cache_dir), capture_output=True, text=True, check=True)
    timed, imported = done.stdout.strip().splitlines()[-2:]
    return {**json.loads(timed), **json.loads(imported)}


def prime(bundle: Path, cache_dir: Path) -> None:
    env = {**os.environ, "PORTKERN_CACHE_DIR": str(cache_dir)}
    subprocess.run([sys.executable, "-c", PRIME, str(bundle)], env=env, check=True, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--unsigned", action="store_true", help="no signing key, signatures not required")
    parser.add_argument("--kernel", action="append", help="only this example kernel (repeatable; default: all)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = [k.name for k in load_manifest(MANIFEST).kernels]
    if args.kernel:
        unknown = sorted(set(args.kernel) - set(names))
        if unknown:
            parser.error(f"no example kernel {', '.join(unknown)} (there are {', '.join(names)})")
        names = [n for n in names if n in args.kernel]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bundle = tmp / "examples.pkb"
        build_file(MANIFEST, bundle)
        server = RedisServer(tmp)
        try:
            os.environ["PORTKERN_REMOTE_CACHE"] = server.url
            if not args.unsigned:
                key, public = signing.new_key_pair(tmp / "fleet")
                os.environ.update(PORTKERN_SIGNING_KEY=str(key), PORTKERN_TRUSTED_KEYS=str(public), PORTKERN_REQUIRE_SIGNATURE="1")
                signing.sign_file(bundle, key)  # required signatures cover bundles too
            else:
                os.environ["PORTKERN_ROLE"] = "publisher"  # an unsigned fleet: hosts publish unsigned values
            for name in names:
                cold, new_host, remote, warm = [], [], [], []
                verifier: set[str] = set()
                for i in range(args.repeat):
                    server.client().flushall()
                    primed = tmp / f"host-c-{name}-{i}"
                    prime(bundle, primed)
                    first = measure(bundle, name, tmp / f"host-a-{name}-{i}")
                    second = measure(bundle, name, tmp / f"host-b-{name}-{i}")
                    third = measure(bundle, name, tmp / f"host-b-{name}-{i}")
                    fourth = measure(bundle, name, primed)
                    origins = (first["origin"], second["origin"], third["origin"], fourth["origin"])
                    assert origins == ("finalized", "remote", "cache", "remote"), origins
                    verifier.update(label for label, run in (("new host", second), ("warm", third), ("remote", fourth)) if run["model_signing"])
                    assert not third["model_signing"], "a warm hit imported model-signing: its bundle's signature check was not remembered"
                    cold.append(first["elapsed_s"])
                    new_host.append(second["elapsed_s"])
                    warm.append(third["elapsed_s"])
                    remote.append(fourth["elapsed_s"])
                c, n, r, w = (statistics.median(x) for x in (cold, new_host, remote, warm))
                rows.append({"kernel": name, "cold_s": c, "new_host_s": n, "remote_s": r, "warm_s": w,
                             "remote_ratio": r / c, "warm_ratio": w / c,
                             "verifier": [label for label in ("new host", "remote", "warm") if label in verifier]})
        finally:
            server.stop()
    if args.json:
        json.dump({"repeat": args.repeat, "signed": not args.unsigned, "kernels": rows}, sys.stdout, indent=2)
        print()
        return 0
    print(f"first result (load + kernel() + first call), fresh process each, median of {args.repeat}; "
          f"entries {'unsigned' if args.unsigned else 'signed, signatures required'}")
    print(f"{'kernel':<20} {'cold':>10} {'new host':>10} {'remote':>10} {'warm':>10} {'remote/cold':>12} {'warm/cold':>10}  verifier")
    for r in rows:
        print(f"{r['kernel']:<20} {r['cold_s'] * 1e3:>8.1f}ms {r['new_host_s'] * 1e3:>8.1f}ms {r['remote_s'] * 1e3:>8.2f}ms "
              f"{r['warm_s'] * 1e3:>8.2f}ms {100 * r['remote_ratio']:>11.2f}% {100 * r['warm_ratio']:>9.2f}%  "
              f"{', '.join(r['verifier']) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
