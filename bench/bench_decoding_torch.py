#!/usr/bin/env python3
"""Times the reference decoding kernels on the cases bench_decoding_cuda measured.

Usage: python3 bench/bench_decoding_torch.py decoding_ham.csv [--out ratio.csv] [--reps 20]

Reads the CSV written by `bench_decoding_cuda --csv` and times, in bf16 on the same shapes:
  gdr rows   flash-linear-attention's fused_recurrent_gated_delta_rule: one token
             [B, 1, H, K], an f32 initial state [B, H, K, V], the final state returned
             (scale 1: q is L2-normalised and scaled beforehand, as in ham's benchmark).
  attn rows  F.scaled_dot_product_attention of one query [B, H, 1, K] over the cache
             [B, Hkv, L, K] / [B, Hkv, L, V] (enable_gqa for grouped heads), PyTorch
             choosing its backend (flash where the head dims allow).
Like ham's program, each rep times 20 calls issued back to back between two CUDA events
and reports the time per call, so the host's launch cost counts on both sides (Python's
included here). Prints the medians and reference / ham at min, median and max (above 1:
ham is faster). Rows whose reference is missing (no fla) are skipped, saying so.
Exit status 2 when torch with CUDA is missing (nothing to compare against).
"""
import argparse
import csv
import inspect
import sys

CALLS_PER_REP = 20


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ham_csv")
    parser.add_argument("--out", default=None)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()

    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"bench_decoding_torch: no torch ({e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_decoding_torch: torch sees no CUDA device", file=sys.stderr)
        return 2
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        fla_params = set(inspect.signature(fused_recurrent_gated_delta_rule).parameters)
    except ImportError as e:
        fused_recurrent_gated_delta_rule = None
        print(f"bench_decoding_torch: no flash-linear-attention ({e}): gdr rows skipped",
              file=sys.stderr)

    def per_call_ms(fn, reps):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(CALLS_PER_REP):
                fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / CALLS_PER_REP)
        times.sort()
        return times[0], times[len(times) // 2], times[-1]

    results = []
    print(f"{'case':34s} {'ham us':>9s} {'ref us':>9s} {'ref/ham min/med/max':>19s}  reference")
    for row in csv.DictReader(open(args.ham_csv)):
        B, H, Hkv = int(row["batch"]), int(row["heads"]), int(row["kv_heads"])
        K, V, L = int(row["key_dim"]), int(row["value_dim"]), int(row["context"])
        gen = torch.Generator(device="cuda").manual_seed(4321)

        def normal(*shape):
            return torch.randn(*shape, device="cuda", generator=gen, dtype=torch.float32)

        with torch.no_grad():
            if row["op"] == "gdr":
                if fused_recurrent_gated_delta_rule is None:
                    continue
                q = (F.normalize(normal(B, 1, H, K), dim=-1) * K ** -0.5).bfloat16()
                k = F.normalize(normal(B, 1, H, K), dim=-1).bfloat16()
                v = normal(B, 1, H, V).bfloat16()
                g = (-F.softplus(normal(B, 1, H))).bfloat16()
                beta = torch.sigmoid(normal(B, 1, H)).bfloat16()
                state = normal(B, H, K, V) * 0.1
                kwargs = dict(q=q, k=k, v=v, g=g, beta=beta, scale=1.0, initial_state=state,
                              output_final_state=True)
                kwargs = {key: val for key, val in kwargs.items() if key in fla_params}
                name = "fla fused_recurrent_gated_delta_rule"

                def call():
                    return fused_recurrent_gated_delta_rule(**kwargs)
            else:
                q = (torch.rand(B, H, 1, K, device="cuda", generator=gen) * 2 - 1).bfloat16()
                k = (torch.rand(B, Hkv, L, K, device="cuda", generator=gen) * 2 - 1).bfloat16()
                v = (torch.rand(B, Hkv, L, V, device="cuda", generator=gen) * 2 - 1).bfloat16()
                extra = {"enable_gqa": True} if Hkv != H else {}
                name = "torch sdpa"

                def call():
                    return F.scaled_dot_product_attention(q, k, v, **extra)

            ref = per_call_ms(call, args.reps)
        ham = [float(row[f"ms_{q}"]) for q in ("min", "median", "max")]
        speedup = [r / h for r, h in zip(ref, ham)]
        print(f"{row['name']:34s} {ham[1] * 1e3:9.2f} {ref[1] * 1e3:9.2f} "
              f"{speedup[0]:5.2f} {speedup[1]:5.2f} {speedup[2]:5.2f}    {name}", flush=True)
        results.append(dict(row, reference=name, ref_ms_min=ref[0], ref_ms_median=ref[1],
                            ref_ms_max=ref[2], ref_over_ham_min=speedup[0],
                            ref_over_ham_median=speedup[1], ref_over_ham_max=speedup[2]))
        torch.cuda.empty_cache()

    if args.out and results:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(results[0].keys()))
            writer.writeheader()
            writer.writerows(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
