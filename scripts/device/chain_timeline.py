#!/usr/bin/env python3
"""Summarizes the decode chain kernel's phase stamps (bench_model_cuda
--chain-timeline FILE, from a build with -DMLASERVE_CHAIN_TIMELINE=ON).

The file holds u64 nanoseconds {launch % 512, event, block} in the order of
ChainEvent (src/kernels/cuda/mla_decode_chain.h), 0 where a block passed no
such point. For every MoE-layer launch (one that routed) whose successor
started within 200 us, times are taken from the launch's first block entry;
the table gives the median over launches of the first and the last block to
pass each point, then when the next launch's blocks enter and return from
their wait, the spans of a few phases within a block, and the phase-1 path
of the blocks by entry order.

Usage: chain_timeline.py FILE[.gz]
"""
import array
import gzip
import statistics
import sys

EVENTS = ['blocks enter', 'PDL wait returns', 'phase 1: h normed, weights in', 'phase 1 (qkv rows) done',
          'phase 2: first q rows in', 'phase 2 (W_UK) done', 'attention: q_cat in', 'attention: first tile in',
          'attention: first scores', 'attention: first P·V', 'attention splits done', 'grid barrier',
          'phase 4: first head merged', 'phase 4 (merge, W_UV) done', 'phase 5: attn in', 'phase 5: weights in',
          'phase 5 (o_proj) done', 'tail: sums and logit written', 'exit']
LAUNCHES, BLOCKS = 512, 256
ENTER, WAIT, PHASE1, TAIL = 0, 1, 3, 17
# Spans within one block (from event, to event): the blocks' median for each launch, then over launches.
BLOCK_SPANS = [(WAIT, 2), (2, PHASE1), (4, 5), (11, 12), (14, 15), (15, 16)]


def main(path):
    opener = gzip.open if path.endswith('.gz') else open
    stamps = array.array('Q')
    with opener(path, 'rb') as f:
        stamps.frombytes(f.read())
    if len(stamps) != LAUNCHES * len(EVENTS) * BLOCKS:
        sys.exit(f'{path}: {len(stamps)} stamps, want {LAUNCHES * len(EVENTS) * BLOCKS}')

    def row(launch, event):
        i = (launch * len(EVENTS) + event) * BLOCKS
        return stamps[i:i + BLOCKS]

    launches = []
    for launch in range(LAUNCHES):
        enter = row(launch, ENTER)
        grid = sum(1 for t in enter if t)
        if grid:
            launches.append((min(t for t in enter if t), launch, grid))
    launches.sort()
    spans = {e: [] for e in range(len(EVENTS))}
    after = {'next launch: first block enters': [], 'next launch: last block enters': [],
             'next launch: first wait returns': []}
    by_entry = {}
    block_spans = {s: [] for s in BLOCK_SPANS}
    for (t0, launch, grid), (t1, nxt, _) in zip(launches, launches[1:]):
        if not any(row(launch, TAIL)) or t1 - t0 > 200_000:
            continue  # a dense layer, or the last launch of a run
        for e in range(len(EVENTS)):
            passed = [t for t in row(launch, e)[:grid] if t >= t0]
            if passed:
                spans[e].append(((min(passed) - t0) / 1e3, (max(passed) - t0) / 1e3))
        nxt_enter = [t for t in row(nxt, ENTER) if t]
        after['next launch: first block enters'].append((t1 - t0) / 1e3)
        after['next launch: last block enters'].append((max(nxt_enter) - t0) / 1e3)
        after['next launch: first wait returns'].append((min(t for t in row(nxt, WAIT) if t) - t0) / 1e3)
        for a, b in BLOCK_SPANS:
            start, end = row(launch, a)[:grid], row(launch, b)[:grid]
            within = [(y - x) / 1e3 for x, y in zip(start, end) if x >= t0 and y >= x]
            if within:
                block_spans[(a, b)].append(statistics.median(within))
        enter, wait, phase1 = row(launch, ENTER), row(launch, WAIT), row(launch, PHASE1)
        order = sorted(range(grid), key=lambda b: enter[b])
        for k in sorted({0, grid // 4, grid // 2, 3 * grid // 4, grid - 12, grid - 4, grid - 1}):
            if k >= 0:
                b = order[k]
                by_entry.setdefault(k, []).append(
                    ((enter[b] - t0) / 1e3, (wait[b] - t0) / 1e3, (phase1[b] - t0) / 1e3))
    med = statistics.median
    print(f'{len(spans[ENTER])} MoE-layer launches; us after the first block entered (median over launches)\n')
    print('| event | first block | last block |\n|---|---|---|')
    for e, name in enumerate(EVENTS):
        if spans[e]:
            print(f'| {name} | {med(s[0] for s in spans[e]):.1f} | {med(s[1] for s in spans[e]):.1f} |')
    for name, values in after.items():
        if values:
            print(f'| {name} | {med(values):.1f} | |')
    print('\n| within a block, from | to | us |\n|---|---|---|')
    for (a, b), values in block_spans.items():
        if values:
            print(f'| {EVENTS[a]} | {EVENTS[b]} | {med(values):.2f} |')
    print('\n| k-th block to enter | enters | wait returns | phase 1 done |\n|---|---|---|---|')
    for k, values in sorted(by_entry.items()):
        print(f'| {k} | ' + ' | '.join(f'{med(v[i] for v in values):.1f}' for i in range(3)) + ' |')


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
