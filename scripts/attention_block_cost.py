#!/usr/bin/env python3
"""Splits routed attention's forward time into key tiles and a fixed cost per block.

For each benchmark case at head dims of 128 x 128 (bench_routed_attention_cuda's CSV, or
the fifteenth session's medians when none is given), it recomputes the forward's work
from the case's mask, as the benchmark draws it: the blocks of 128 query rows and, for
each, the 64-key tiles its rows' visible ranges span (cuda/routed_attention.cu,
forward_mma). Then it fits, by least squares on relative errors,

    forward ms = tile_ms * tiles + block_ms * blocks

and prints both per block slot (SMs x 2 blocks per SM), and per case the measured and the
modelled time and the share of the fixed cost. A fit is a model, not a timing; every case
here has 2048 blocks, so only the ncu kernel times (gpu_check's profile stage) tell a
cost per block from one per call.

Usage: scripts/attention_block_cost.py [routed_ham.csv] [--slots 264]
"""
import argparse
import csv

MASK = (1 << 64) - 1

# Fifteenth session (docs/gpu_results.md), H200, forward ms (median), 16 heads of 128:
# (batch, seq_len, density, docs, ms).
FIFTEENTH_SESSION = [
    (1, 16384, 1.0, 1, 3.452), (1, 16384, 0.5, 1, 1.839), (1, 16384, 0.25, 1, 0.989),
    (4, 4096, 1.0, 1, 0.981), (4, 4096, 0.5, 1, 0.579), (4, 4096, 0.25, 1, 0.368),
    (1, 16384, 0.5, 20, 0.232), (1, 16384, 0.25, 20, 0.177),
    (4, 4096, 0.5, 20, 0.179), (4, 4096, 0.25, 20, 0.150),
]


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def forward_work(batch, seq_len, density, docs, seed=12345, rows=128, keys=64):
    """(key tiles, blocks) of one query head, as bench_routed_attention_cuda masks it."""
    threshold = int(density * (1 << 24))
    tiles = blocks = 0
    for b in range(batch):
        begin, end = [0] * seq_len, [0] * seq_len
        count = first = 0
        previous_doc = None
        for t in range(seq_len):
            doc = t * docs // seq_len
            if doc != previous_doc:
                first, previous_doc = count, doc
            selected = density >= 1.0 or (splitmix64(seed + b * seq_len + t) >> 40) < threshold
            count += int(selected)
            begin[t], end[t] = first, count  # row t sees compacted keys [begin, end)
        for q0 in range(0, seq_len, rows):
            blocks += 1
            seen = [(begin[t], end[t]) for t in range(q0, min(seq_len, q0 + rows))
                    if end[t] > begin[t]]
            if seen:
                lo, hi = min(s[0] for s in seen), max(s[1] for s in seen)
                tiles += -(-(hi - lo) // keys)
    return tiles, blocks


def cases_from_csv(path):
    out = []
    with open(path) as f:
        for row in csv.DictReader(f):
            if (row["key_dim"], row["value_dim"]) != ("128", "128"):
                continue
            if row["q_heads"] != row["kv_heads"]:
                continue
            out.append((int(row["batch"]), int(row["seq_len"]), float(row["density"]),
                        int(row["docs"]), float(row["forward_ms"]), int(row["q_heads"]),
                        int(row["mask_seed"])))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="?", help="bench_routed_attention_cuda --csv output")
    parser.add_argument("--slots", type=int, default=132 * 2, help="SMs x blocks per SM")
    args = parser.parse_args()
    if args.csv:
        cases = cases_from_csv(args.csv)
    else:
        cases = [(b, t, d, n, ms, 16, 12345) for b, t, d, n, ms in FIFTEENTH_SESSION]
    if len(cases) < 2:
        raise SystemExit("attention_block_cost: need two or more 128 x 128 cases")
    rows = []
    for batch, seq_len, density, docs, ms, heads, seed in cases:
        tiles, blocks = forward_work(batch, seq_len, density, docs, seed)
        documents = f"{docs} document" + ("s" if docs > 1 else "")
        rows.append((f"T{seq_len} B{batch} rho {density:g}, {documents}", tiles * heads,
                     blocks * heads, ms))
    # Normal equations of min sum ((tile_ms x + block_ms y - ms) / ms)^2.
    a = [[0.0, 0.0], [0.0, 0.0]]
    v = [0.0, 0.0]
    for _, tiles, blocks, ms in rows:
        x, w = (tiles, blocks), 1.0 / ms**2
        for i in range(2):
            v[i] += w * x[i] * ms
            for j in range(2):
                a[i][j] += w * x[i] * x[j]
    det = a[0][0] * a[1][1] - a[0][1] * a[1][0]
    tile_ms = (v[0] * a[1][1] - v[1] * a[0][1]) / det
    block_ms = (a[0][0] * v[1] - a[1][0] * v[0]) / det
    print(f"per block slot ({args.slots}): {tile_ms * args.slots * 1e3:.2f} us a 128 x 64 key "
          f"tile, {block_ms * args.slots * 1e3:.2f} us a block "
          f"({block_ms / tile_ms:.1f} tiles)")
    print(f"{'case':36s} {'tiles':>8s} {'/block':>7s} {'ms':>7s} {'model':>7s} {'fixed':>6s}")
    for name, tiles, blocks, ms in rows:
        model = tile_ms * tiles + block_ms * blocks
        print(f"{name:36s} {tiles:8d} {tiles / blocks:7.1f} {ms:7.3f} {model:7.3f} "
              f"{block_ms * blocks / model:6.0%}")


if __name__ == "__main__":
    main()
