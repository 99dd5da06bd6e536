#!/usr/bin/env python3
"""A model of how long causal attention's blocks take to run in a given launch order.

The GPU starts blocks in launch order on free block slots (SMs x blocks per SM). A
query tile's causal work is proportional to its key tiles (its index + 1, times the query
rows over the key-tile width), plus a fixed cost per block. This prints, for some shapes,
the list-scheduling makespan over the ideal (total work / slots) in two orders:
  tiles innermost  (the grid of x = tile, y = head, z = batch row; each head's light
                    tiles first);
  longest first    (cuda/routed_attention.cu's block_tile: the tile outermost, counting
                    down, the heads and batch rows innermost).

--documents instead models the routed dK/dV kernel on the benchmark's packed documents
(bench/bench_routed_attention_cuda.cpp: its selection, splitmix64 of seed + b T + t against
density 2^24, and documents of equal runs): a block of 64 compacted keys visits the query
tiles of 64 rows from its first key's to the end of its last key's document, and costs
fixed + a tile per tile visited (the medians of the H200's block timelines,
docs/gpu_runs/2026-11-29/routed_timeline.txt, or their least-squares fit). The grid has a
block for every 64 keys of T, so the blocks past a row's keys, launched last in either
order, cost `--empty` each: about the fit's intercept of 0.8 us, since three in four of
the blocks it was fitted over are empty. It prints the makespan in rank order
(block_tile: key tile outermost, heads innermost) and heaviest first
(set_attention_backward_key_order), and the tiles visited, to hold against the timelines.

It is a model, not a timing: blocks of equal work are taken to take equal time.

Usage: scripts/attention_block_order.py [--slots 264] [--overhead 0.5]
       scripts/attention_block_order.py --documents [--slots 264] [--fixed 15.2] [--tile 2.5]
                                        [--empty 0.8]
"""
import argparse
import heapq

MASK = (1 << 64) - 1
BENCH_MASK_SEED = 12345  # kMaskSeed of bench/bench_routed_attention_cuda.cpp


def makespan(works, slots):
    finish = [0.0] * slots
    for work in works:
        heapq.heappush(finish, heapq.heappop(finish) + work)
    return max(finish)


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def key_block_tiles(seq_len, batch, density, docs, key_rows=64, query_rows=64):
    """Per rank of key tile, the query tiles each batch row's block of that rank visits."""
    by_rank = {}
    threshold = density * (1 << 24)
    for b in range(batch):
        doc = [t * docs // seq_len for t in range(seq_len)]
        doc_end = {d: t + 1 for t, d in enumerate(doc)}
        keys = [t for t in range(seq_len) if density >= 1
                or (splitmix64(BENCH_MASK_SEED + b * seq_len + t) >> 40) < threshold]
        for rank in range(0, len(keys), key_rows):
            tile = keys[rank:rank + key_rows]
            last_row = doc_end[doc[tile[-1]]] - 1
            by_rank.setdefault(rank // key_rows, []).append(
                last_row // query_rows - tile[0] // query_rows + 1)
    return by_rank


def documents(args):
    print("case                        blocks  tiles  rank order  heaviest first  work/slots (us)")
    for seq_len, batch, density, docs in [(16384, 1, 0.25, 20), (16384, 1, 0.5, 20),
                                          (4096, 4, 0.25, 20), (4096, 4, 0.5, 20),
                                          (4096, 4, 0.25, 1), (16384, 1, 1.0, 20)]:
        by_rank = key_block_tiles(seq_len, batch, density, docs)
        heads = 16
        rank_order = [args.fixed + args.tile * tiles
                      for rank in sorted(by_rank) for tiles in by_rank[rank] for _ in range(heads)]
        heaviest_first = sorted(rank_order, reverse=True)
        empty = [args.empty] * (seq_len // 64 * batch * heads - len(rank_order))
        rank_order += empty
        heaviest_first += empty
        visited = sum(tiles for rank in by_rank.values() for tiles in rank) * heads
        name = f"B{batch} T{seq_len} rho {density} docs {docs}"
        print(f"{name:<27} {len(rank_order) - len(empty):6} {visited:6}  "
              f"{makespan(rank_order, args.slots):10.1f}  "
              f"{makespan(heaviest_first, args.slots):14.1f}  "
              f"{sum(rank_order) / args.slots:5.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=132 * 2, help="SMs x blocks per SM")
    parser.add_argument("--overhead", type=float, default=0.5,
                        help="fixed cost of a block, in key tiles")
    parser.add_argument("--documents", action="store_true",
                        help="the routed dK/dV kernel on the benchmark's packed documents")
    parser.add_argument("--fixed", type=float, default=15.2,
                        help="--documents: a block's fixed cost, us (prologue + epilogue)")
    parser.add_argument("--tile", type=float, default=2.5,
                        help="--documents: a visited query tile's cost, us")
    parser.add_argument("--empty", type=float, default=0.8,
                        help="--documents: the cost of a block past its row's keys, us")
    args = parser.parse_args()
    if args.documents:
        documents(args)
        return
    print("T      rows heads batch  tiles-innermost  longest-first  (makespan / ideal)")
    for seq_len, rows, heads, batch in [(16384, 128, 16, 1), (16384, 64, 16, 1),
                                        (4096, 128, 16, 4), (8192, 128, 16, 2),
                                        (16384, 128, 5, 1), (4096, 128, 5, 4)]:
        work = [(i + 1) * rows / 64 + args.overhead for i in range(seq_len // rows)]
        lanes = heads * batch
        tiles_innermost = [w for _ in range(lanes) for w in work]
        longest_first = [w for w in reversed(work) for _ in range(lanes)]
        ideal = sum(work) * lanes / args.slots
        print(f"{seq_len:<6} {rows:4} {heads:5} {batch:5}  "
              f"{makespan(tiles_innermost, args.slots) / ideal:15.3f}  "
              f"{makespan(longest_first, args.slots) / ideal:13.3f}")


if __name__ == "__main__":
    main()
