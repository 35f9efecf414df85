#!/usr/bin/env python3
"""Summarizes scripts/device/ncu_sass.sh's CSV: stall reasons, opcodes by
executions and samples, and (with --listing) every instruction with its
executions, samples and two main stall reasons, for reading a hot loop.

Usage: scripts/sass_profile.py sass.csv [--listing] [--min-exec N]"""
import argparse
import collections
import csv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--listing", action="store_true")
    ap.add_argument("--min-exec", type=int, default=0, help="listing: only instructions executed this often")
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    header, data = rows[1], rows[2:]
    col = {h: i for i, h in enumerate(header)}
    samples_col, exec_col = col["Warp Stall Sampling (All Samples)"], col["Instructions Executed"]
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def num(r, c):
        return int(r[c] or 0)

    total = sum(num(r, samples_col) for r in data) or 1
    print(f"{total} samples, {sum(num(r, exec_col) for r in data) / 1e6:.1f} M warp instructions")
    by_reason = {s: sum(num(r, col[s]) for r in data) for s in stalls}
    for s, v in sorted(by_reason.items(), key=lambda x: -x[1])[:10]:
        print(f"  {s[6:]:20s} {100 * v / total:5.1f}%")
    ops, op_samples = collections.Counter(), collections.Counter()
    for r in data:
        words = r[col["Source"]].split()
        if not words:
            continue
        op = (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]
        ops[op] += num(r, exec_col)
        op_samples[op] += num(r, samples_col)
    print("opcode        M executed  % samples")
    for op, v in ops.most_common(25):
        print(f"  {op:12s} {v / 1e6:9.2f}  {100 * op_samples[op] / total:6.1f}")
    if a.listing:
        for n, r in enumerate(data):
            e = num(r, exec_col)
            if e < a.min_exec:
                continue
            top = sorted(((num(r, col[h]), h[6:]) for h in stalls), reverse=True)[:2]
            why = " ".join(f"{h}:{v}" for v, h in top if v > 0)
            print(f"{n:5d} {e:10d} {num(r, samples_col):6d} {r[col['Source']].strip()[:80]:80s} {why}")


if __name__ == "__main__":
    main()
