#!/usr/bin/env python3
"""Sums Nsight Compute kernel durations (a --csv run with gpu__time_duration.sum)
by kernel name, over the forwards that start with a marker kernel.

Usage: ncu_kernel_times.py NCU_CSV --marker REGEX [--first N] [--count M]
Forward i starts at the i-th launch whose name matches the marker (e.g. the
embedding); forwards first .. first + count - 1 are summed and averaged.
Prints a markdown table: kernel, launches a forward, us a forward, share.
"""
import argparse
import csv
import re
import sys
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--marker", required=True)
    ap.add_argument("--first", type=int, default=1)
    ap.add_argument("--count", type=int, default=1)
    a = ap.parse_args()
    launches = []  # (id, name, ns)
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "ns")
        v = float(row["Metric Value"].replace(",", ""))
        ns = v * {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1)
        launches.append((int(row["ID"]), row["Kernel Name"], ns))
    launches.sort()
    marker = re.compile(a.marker)
    starts = [i for i, (_, name, _) in enumerate(launches) if marker.search(name)]
    if len(starts) < a.first + a.count:
        sys.exit(f"only {len(starts)} forwards marked by {a.marker!r}")
    begin = starts[a.first]
    end = starts[a.first + a.count] if a.first + a.count < len(starts) else len(launches)
    total = defaultdict(float)
    calls = defaultdict(int)
    for _, name, ns in launches[begin:end]:
        short = re.sub(r"\(.*", "", name)[:90]
        total[short] += ns
        calls[short] += 1
    all_ns = sum(total.values())
    print(f"| kernel | launches a forward | us a forward | share |\n|---|---|---|---|")
    for name, ns in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"| `{name}` | {calls[name] / a.count:g} | {ns / a.count / 1e3:.1f} | {100 * ns / all_ns:.1f}% |")
    print(f"| all | {sum(calls.values()) / a.count:g} | {all_ns / a.count / 1e3:.1f} | |")


if __name__ == "__main__":
    main()
