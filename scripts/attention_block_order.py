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
It is a model, not a timing: blocks of equal work are taken to take equal time.

Usage: scripts/attention_block_order.py [--slots 264] [--overhead 0.5]
"""
import argparse
import heapq


def makespan(works, slots):
    finish = [0.0] * slots
    for work in works:
        heapq.heappush(finish, heapq.heappop(finish) + work)
    return max(finish)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=132 * 2, help="SMs x blocks per SM")
    parser.add_argument("--overhead", type=float, default=0.5,
                        help="fixed cost of a block, in key tiles")
    args = parser.parse_args()
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
