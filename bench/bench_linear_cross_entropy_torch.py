#!/usr/bin/env python3
"""PyTorch's LM head + cross-entropy on the shapes bench_linear_cross_entropy_cuda measured.

Usage: python3 bench/bench_linear_cross_entropy_torch.py lce_ham.csv [--out ratios.csv]
                                                         [--reps N]

Reads the CSV written by `bench_linear_cross_entropy_cuda --csv`, and for each case's
dtype and shape (hidden [N, D], weight [V, D], targets [N] int64, none ignored) times with
CUDA events (2 warm-ups, then each call alone; min / median / max ms over --reps, the
ham CSV's reps by default):

  torch_fb      F.cross_entropy(h @ W.T, t) forward, then torch.autograd.grad of h and W:
                the unfused LM head (the whole [N, V] logits and their gradient exist)
  torch_fwd     the same loss under torch.no_grad()
  torch_ce_fb   F.cross_entropy(logits, t) forward and backward on precomputed logits
                (made outside the timed region): the cross-entropy alone, no GEMM

"tf32" rows set torch.backends.cuda.matmul.allow_tf32 = True, "f32" rows False. "peak MiB"
is torch.cuda.max_memory_allocated during one step minus what was allocated before it,
as ham's program measures it. Prints per case ham's and torch's min / median / max, the
ratios torch / ham of the mins, medians and maxes (above 1: ham is faster), and at the
end, over all cases, the min / median / max of the median ratios. The same dtype and
shape is timed once however many chunk sizes ham ran on it.
"""
import argparse
import csv
import statistics
import sys

import torch
import torch.nn.functional as F


def event_times_ms(reps, step, warmup=2):
    for _ in range(warmup):
        step()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        step()
        stops[i].record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in zip(starts, stops))


def time_step(reps, step):
    ms = event_times_ms(reps, step)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak_mib = (torch.cuda.max_memory_allocated() - before) / 2**20
    return {"min": ms[0], "median": statistics.median(ms), "max": ms[-1], "peak_mib": peak_mib}


def time_shape(dtype_name, rows, dim, vocab, reps):
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
    gen = torch.Generator(device="cuda").manual_seed(1234)
    h = (torch.rand(rows, dim, device="cuda", generator=gen) * 2 - 1).to(dtype)
    w = ((torch.rand(vocab, dim, device="cuda", generator=gen) * 2 - 1) / dim**0.5).to(dtype)
    t = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
    h.requires_grad_(True)
    w.requires_grad_(True)
    results = {}

    def fused_fb():
        loss = F.cross_entropy(h @ w.T, t)
        torch.autograd.grad(loss, (h, w))

    results["torch_fb"] = time_step(reps, fused_fb)

    def fwd():
        with torch.no_grad():
            F.cross_entropy(h @ w.T, t)

    results["torch_fwd"] = time_step(reps, fwd)
    with torch.no_grad():
        logits = (h @ w.T).detach()
    logits.requires_grad_(True)

    def ce_fb():
        loss = F.cross_entropy(logits, t)
        torch.autograd.grad(loss, (logits,))

    results["torch_ce_fb"] = time_step(reps, ce_fb)
    with torch.no_grad():
        results["loss"] = F.cross_entropy(h @ w.T, t).item()
    del logits, h, w, t
    torch.cuda.empty_cache()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ham_csv")
    parser.add_argument("--out", help="write the comparison as CSV here")
    parser.add_argument("--reps", type=int, default=0, help="default: the ham CSV's reps")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_linear_cross_entropy_torch: torch sees no GPU", file=sys.stderr)
        return 1
    with open(args.ham_csv) as f:
        rows = list(csv.DictReader(f))
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'case':<34} {'dtype':<5} {'ham fused fwd+bwd ms':>26} {'torch fwd+bwd ms':>26} "
          f"{'torch/ham min/med/max':>22} {'ham fwd':>8} {'torch fwd':>9} {'fwd t/h':>7} "
          f"{'torch CE-only fb':>16} {'MiB ham/torch':>15}")
    cache = {}
    out_rows = []
    for row in rows:
        key = (row["dtype"], int(row["rows"]), int(row["dim"]), int(row["vocab"]))
        if key not in cache:
            cache[key] = time_shape(*key, args.reps or int(row["reps"]))
        torch_r = cache[key]
        ham_fb = {k: float(row[f"fused_fb_{k}_ms"]) for k in ("min", "median", "max")}
        ham_fwd = float(row["fused_fwd_median_ms"])
        tfb = torch_r["torch_fb"]
        ratios = tuple(tfb[k] / ham_fb[k] for k in ("min", "median", "max"))
        fwd_ratio = torch_r["torch_fwd"]["median"] / ham_fwd
        print(f"{row['name']:<34} {row['dtype']:<5} "
              f"{ham_fb['min']:8.2f} {ham_fb['median']:8.2f} {ham_fb['max']:8.2f}  "
              f"{tfb['min']:8.2f} {tfb['median']:8.2f} {tfb['max']:8.2f}  "
              f"{ratios[0]:6.2f} {ratios[1]:6.2f} {ratios[2]:6.2f}  "
              f"{ham_fwd:8.2f} {torch_r['torch_fwd']['median']:9.2f} {fwd_ratio:7.2f} "
              f"{torch_r['torch_ce_fb']['median']:16.2f} "
              f"{float(row['fused_fb_peak_mib']):7.0f}/{tfb['peak_mib']:.0f}", flush=True)
        if abs(torch_r["loss"] - float(row["fused_loss"])) > 1e-2 * max(1.0, abs(torch_r["loss"])):
            print(f"  note: losses differ: ham {float(row['fused_loss']):.5f}, torch "
                  f"{torch_r['loss']:.5f} (different random inputs; both should be near log V)")
        out_rows.append({
            "name": row["name"], "dtype": row["dtype"], "chunk_rows": row["chunk_rows"],
            "ham_fused_fb_median_ms": ham_fb["median"],
            "torch_fb_min_ms": tfb["min"], "torch_fb_median_ms": tfb["median"],
            "torch_fb_max_ms": tfb["max"],
            "ratio_min": ratios[0], "ratio_median": ratios[1], "ratio_max": ratios[2],
            "ham_fused_fwd_median_ms": ham_fwd,
            "torch_fwd_median_ms": torch_r["torch_fwd"]["median"], "fwd_ratio_median": fwd_ratio,
            "torch_ce_only_fb_median_ms": torch_r["torch_ce_fb"]["median"],
            "ham_unfused_fb_median_ms": float(row["unfused_fb_median_ms"]),
            "ham_fused_fb_peak_mib": float(row["fused_fb_peak_mib"]),
            "ham_unfused_fb_peak_mib": float(row["unfused_fb_peak_mib"]),
            "torch_fb_peak_mib": tfb["peak_mib"],
        })
    medians = [r["ratio_median"] for r in out_rows]
    if medians:
        print(f"torch/ham fwd+bwd median ratio over {len(medians)} cases: min {min(medians):.2f}, "
              f"median {statistics.median(medians):.2f}, max {max(medians):.2f}")
    if args.out and out_rows:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(out_rows[0].keys()))
            writer.writeheader()
            writer.writerows(out_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
