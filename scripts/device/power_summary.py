#!/usr/bin/env python3
"""Summarizes `nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 100`
samples taken while a benchmark repeated: the mean SM clock and board power
over the second half of the busy samples (power above half the run's
highest), so neither the gaps between repetitions (setup, idle) nor the
first seconds, before the clock falls to what the power cap allows, pull
the figures.

Usage: scripts/device/power_summary.py samples.txt"""
import sys


def main():
    samples = []
    for line in open(sys.argv[1]):
        fields = [f.strip() for f in line.split(",")]
        try:
            samples.append((float(fields[0]), float(fields[1])))
        except (ValueError, IndexError):
            continue
    if not samples:
        print("no samples")
        return
    peak = max(p for _, p in samples)
    busy = [(c, p) for c, p in samples if p > peak / 2]
    busy = busy[len(busy) // 2 :]
    clock = sum(c for c, _ in busy) / len(busy)
    power = sum(p for _, p in busy) / len(busy)
    print(f"{len(busy)} steady samples of {len(samples)}: SM clock {clock:.0f} MHz, power {power:.0f} W (max {peak:.0f} W)")


if __name__ == "__main__":
    main()
