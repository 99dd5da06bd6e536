#!/usr/bin/env python3
"""torch.matmul on the shapes bench_matmul_cuda measured, and ham / torch ratios.

Usage: python3 bench/bench_matmul_torch.py matmul_ham.csv [--out ratios.csv]

Reads the CSV written by `bench_matmul_cuda --csv`, times torch.matmul on the same shapes,
dtypes and transposes the same way (5 warm-ups, then each product timed alone with CUDA
events; four input sets rotated when one is under 256 MiB), and prints per case the
min / median / max TFLOP/s of both and the ratio ham / torch of the medians (and of the
mins and maxes). "tf32" rows set torch.backends.cuda.matmul.allow_tf32 = True; "f32"
rows set it False. Transposed operands are transposed views (torch passes the transpose
flag to cuBLAS, as ham does), not copies.
"""
import argparse
import csv
import statistics
import sys

import torch


def time_case(row):
    dtype_name = row["dtype"]
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
    batch, m, n, k = (int(row[key]) for key in ("batch", "m", "n", "k"))
    trans_a, trans_b = row["trans_a"] == "1", row["trans_b"] == "1"
    reps = int(row["reps"])
    lead = (batch,) if batch > 1 else ()
    a_shape = lead + ((k, m) if trans_a else (m, k))
    b_shape = lead + ((n, k) if trans_b else (k, n))
    elem = 2 if dtype == torch.bfloat16 else 4
    set_bytes = elem * (batch * (m * k + k * n + m * n))
    sets = 4 if set_bytes < (256 << 20) else 1
    gen = torch.Generator(device="cuda").manual_seed(1234)
    inputs = []
    for _ in range(sets):
        a = torch.randn(a_shape, device="cuda", dtype=dtype, generator=gen)
        b = torch.randn(b_shape, device="cuda", dtype=dtype, generator=gen)
        a = a.transpose(-1, -2) if trans_a else a
        b = b.transpose(-1, -2) if trans_b else b
        out = torch.empty(lead + (m, n), device="cuda", dtype=dtype)
        inputs.append((a, b, out))
    for i in range(5):
        a, b, out = inputs[i % sets]
        torch.matmul(a, b, out=out)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        a, b, out = inputs[i % sets]
        starts[i].record()
        torch.matmul(a, b, out=out)
        stops[i].record()
    torch.cuda.synchronize()
    flops = 2.0 * batch * m * n * k
    tflops = sorted(flops / (s.elapsed_time(e) * 1e-3) / 1e12 for s, e in zip(starts, stops))
    return tflops[0], statistics.median(tflops), tflops[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ham_csv")
    parser.add_argument("--out", help="write the comparison as CSV here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_matmul_torch: torch sees no GPU", file=sys.stderr)
        return 1
    with open(args.ham_csv) as f:
        rows = list(csv.DictReader(f))
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    header = (f"{'case':<14} {'dtype':<5} {'ham min/med/max TFLOP/s':>24} "
              f"{'torch min/med/max TFLOP/s':>26} {'ham/torch min/med/max':>22}")
    print(header)
    results = []
    for row in rows:
        t_min, t_med, t_max = time_case(row)
        h_min, h_med, h_max = (float(row[key]) for key in ("tflops_min", "tflops_median", "tflops_max"))
        ratios = (h_min / t_min, h_med / t_med, h_max / t_max)
        print(f"{row['name']:<14} {row['dtype']:<5} {h_min:7.1f} {h_med:7.1f} {h_max:7.1f}   "
              f"{t_min:7.1f} {t_med:7.1f} {t_max:7.1f}    "
              f"{ratios[0]:5.2f} {ratios[1]:5.2f} {ratios[2]:5.2f}", flush=True)
        results.append((row, (t_min, t_med, t_max), ratios))
    medians = [r[2][1] for r in results]
    if medians:
        print(f"ham/torch median ratio over {len(medians)} cases: min {min(medians):.2f}, "
              f"median {statistics.median(medians):.2f}, max {max(medians):.2f}")
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["name", "dtype", "batch", "m", "n", "k", "trans_a", "trans_b",
                             "ham_median", "torch_min", "torch_median", "torch_max",
                             "ratio_min", "ratio_median", "ratio_max"])
            for row, torch_t, ratios in results:
                writer.writerow([row[k] for k in ("name", "dtype", "batch", "m", "n", "k",
                                                  "trans_a", "trans_b", "tflops_median")]
                                + [f"{x:.3f}" for x in torch_t] + [f"{x:.3f}" for x in ratios])
    return 0


if __name__ == "__main__":
    sys.exit(main())
