"""What cache operations cost at 10, 1,000, 10,000 and 100,000 entries, in one run.

    python bench/cache_scale.py [--sizes 10,1000,10000,100000] [--repeat 5] [--json]

For each size a fresh cache is filled with synthetic entries (valid keys for a
made-up CPU, distinct perf configs, 256-byte blobs), then, at that size:
    put        one entry per transaction (as a finalisation stores it), mean of 200;
    lookup     warm `Store.get` of a random entry in a fresh Python process
               (opening the database included, imports not), median of --repeat;
    get        warm `Store.get` in this process, mean of 2,000;
    import     `portkern cache import` of an export of 1,000 new entries, seconds per 1,000;
    ls, stats  the `portkern cache ls` (default: 50 most recent) and `stats` commands in-process;
    evict      `prune --max-size` to 90 % of the bytes (10 % of the entries), per evicted entry;
    verify     `portkern cache verify` (reads and re-hashes everything, by design);
    disk       bytes on disk per entry.
The last lines print each column's ratio between the largest and the smallest size
(the goal: within 1.5x for all but verify).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from children import python_report

from portkern.cache.config import CacheConfig
from portkern.cache.device import DeviceFingerprint
from portkern.cache.keys import artifact_key, kernel_digest
from portkern.cache.store import Entry, Store
from portkern.cache.transfer import export
from portkern.cli.main import main as cli

DEVICE = DeviceFingerprint("cpu", "benchcpu", "+avx2,+fma", (("triple", "x86_64-unknown-linux-gnu"),))
KERNEL = kernel_digest("mlir", "main", "0" * 64)
BLOB = 256

# One warm lookup in a fresh process; prints the seconds from opening the store to the hit.
CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from portkern.cache.config import CacheConfig
    from portkern.cache.store import Store
    start = time.perf_counter()
    store = Store(CacheConfig(Path(sys.argv[1]), 1 << 40, False))
    hit = store.get(sys.argv[2])
    elapsed = time.perf_counter() - start
    assert hit is not None
    print(json.dumps({"lookup_s": elapsed}))
    """
)


def entry(i: int) -> tuple[str, bytes, Entry]:
    """Synthetic entry number `i`: a valid key (its own perf config) and distinct bytes."""
    config = f"bench:{i}"
    key = artifact_key(KERNEL, DEVICE, "iree bench", config).hex
    data = (key.encode() * (BLOB // 64 + 1))[:BLOB]
    return key, data, Entry(key=key, kernel=f"k{i % 7}", bundle="bench", bundle_digest="", device=DEVICE.to_dict(),
                            device_label=DEVICE.label, config=config, format="vmfb", size=0, sha256="",
                            compiler="iree bench", kernel_digest=KERNEL)


def quiet(*argv: str) -> float:
    """Seconds one `portkern` command takes in this process (its output discarded)."""
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        cli(list(argv))
    return time.perf_counter() - start


def median_of(repeat: int, *argv: str) -> float:
    return statistics.median(quiet(*argv) for _ in range(repeat))


def disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def measure(size: int, repeat: int, tmp: Path) -> dict:
    base = tmp / f"n{size}"
    directory = base / "v1"
    store = Store(CacheConfig(directory, 1 << 40, False))
    start = time.perf_counter()
    store.put_many(entry(i) for i in range(size))
    fill = time.perf_counter() - start
    row: dict = {"entries": size, "fill_s": fill}

    extra = [entry(size + i) for i in range(200)]
    start = time.perf_counter()
    for item in extra:
        store.put(*item)
    row["put_ms"] = (time.perf_counter() - start) / len(extra) * 1e3
    for key, _, _ in extra:
        store.delete(key)

    rng = random.Random(size)
    keys = [entry(rng.randrange(size))[0] for _ in range(2000)]
    store.close()
    lookups = []
    for key in keys[:repeat]:
        lookups.append(python_report(CHILD, str(directory), key)["lookup_s"])
    row["fresh_lookup_ms"] = statistics.median(lookups) * 1e3
    store = Store(CacheConfig(directory, 1 << 40, False))
    start = time.perf_counter()
    assert all(store.get(key) is not None for key in keys)
    row["get_us"] = (time.perf_counter() - start) / len(keys) * 1e6
    store.flush()

    source = Store(CacheConfig(base / "export-source", 1 << 40, False))
    source.put_many(entry(10_000_000 + i) for i in range(1000))
    export(source, base / "new.pkcx")
    row["import_s_per_1000"] = quiet("cache", "import", str(base / "new.pkcx"), "--cache-dir", str(base), "--json")

    row["ls_ms"] = median_of(repeat, "cache", "ls", "--cache-dir", str(base), "--json") * 1e3
    row["stats_ms"] = median_of(repeat, "cache", "stats", "--cache-dir", str(base), "--json") * 1e3

    before = store.stats()
    start = time.perf_counter()
    evicted = store.prune(max_size=int(before["bytes"] * 0.9))
    elapsed = time.perf_counter() - start
    row["evict_us_per_entry"] = elapsed / max(1, len(evicted)) * 1e6
    row["evicted"] = len(evicted)

    row["verify_s"] = quiet("cache", "verify", "--cache-dir", str(base), "--json")
    store.close()
    row["disk_bytes_per_entry"] = disk_bytes(directory) / max(1, store.count())
    return row


COLUMNS = [
    ("put_ms", "put", "{:.2f} ms"),
    ("fresh_lookup_ms", "lookup (fresh process)", "{:.2f} ms"),
    ("get_us", "get (in process)", "{:.0f} us"),
    ("import_s_per_1000", "import /1000", "{:.2f} s"),
    ("ls_ms", "ls", "{:.1f} ms"),
    ("stats_ms", "stats", "{:.1f} ms"),
    ("evict_us_per_entry", "evict /entry", "{:.0f} us"),
    ("verify_s", "verify", "{:.2f} s"),
    ("disk_bytes_per_entry", "disk /entry", "{:.0f} B"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,1000,10000,100000", help="comma-separated entry counts")
    parser.add_argument("--repeat", type=int, default=5, help="fresh-process lookups per size")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory() as tmp:
        quiet("cache", "stats", "--cache-dir", str(Path(tmp) / "warm-up"))  # imports the commands once
        rows = [measure(size, args.repeat, Path(tmp)) for size in sizes]
    ratios = {name: rows[-1][name] / rows[0][name] for name, _, _ in COLUMNS if rows[0][name]}
    if args.json:
        json.dump({"sizes": sizes, "rows": rows, "ratio_largest_to_smallest": ratios}, sys.stdout, indent=2)
        print()
        return 0
    width = max(len(title) for _, title, _ in COLUMNS)
    print(f"cache operations by cache size ({BLOB}-byte synthetic entries); fill = put_many, not a column")
    print(f"{'':<{width}} " + " ".join(f"{size:>12,}" for size in sizes) + f" {'ratio':>8}")
    for name, title, fmt in COLUMNS:
        cells = " ".join(f"{fmt.format(row[name]):>12}" for row in rows)
        print(f"{title:<{width}} {cells} {ratios.get(name, 0):>7.2f}x")
    print(f"{'fill (put_many)':<{width}} " + " ".join(f"{row['fill_s']:>10.2f} s" for row in rows))
    print(f"ratio = value at {sizes[-1]:,} entries / value at {sizes[0]:,} (verify reads everything by design)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
