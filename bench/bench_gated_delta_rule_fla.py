#!/usr/bin/env python3
"""Times flash-linear-attention's chunk_gated_delta_rule on the shapes of ham's CUDA
benchmark (bench/bench_gated_delta_rule_cuda --csv FILE) and prints the ratios.

Usage: python3 bench/bench_gated_delta_rule_fla.py gdr_ham.csv [--out ratio.csv] [--reps 5]
FLA autotunes every Triton kernel on its first call for each shape: on an H200 (2026-11-25)
that took over 8 minutes for the 4 bf16 cases, forward and backward, so give this script a
device call of its own (scripts/gpu_check.sh leaves it out unless HAM_GPU_BENCH names fla).

Same conventions as the ham program: inputs [B, T, H, D]; q, k L2-normalised (q scaled by
K^-1/2 beforehand, FLA's scale = 1 so neither side scales inside); g = -softplus(normal);
beta = sigmoid(normal); "docs" rows become FLA's varlen form (B = 1, cu_seqlens of equal
documents). "fwd" is the forward with the final state; "bwd" is torch.autograd.grad of
(o, h_final) with grad_o normal and grad_h_final zero, timed alone (the forward's graph is
built outside the timed region). Every call is timed with CUDA events after one warm-up;
the min, median and max in ms are reported, and ham/FLA at each. ham's fit error is extra
work FLA does not do; a table puts ham's forward without it ("fwd_no_fit", a GDN
layer's forward: the outputs FLA computes) against FLA's forward. The "tuned" tables are
ham with kernel.autotune on (its bit-equal variants timed at each shape first, as FLA's
Triton kernels autotune theirs). The last table gives forward + backward, a training step's
pass (#7 asks for both the forward and that), for each of ham's pairs against FLA's.
With --kernels, each case's FLA forward and backward are then run under torch.profiler,
and each FLA kernel's time a pass is printed (the counterpart of ham's per-kernel times:
bench_gated_delta_rule_cuda --timeline, or gpu_check.sh's ncu profile), to say which of
ham's passes is behind FLA's.
Exit status 2 when torch with CUDA or fla is missing (nothing to compare against).
"""
import argparse
import csv
import inspect
import sys


CHUNK = 64


def forward_flops(tokens, heads, key_dim, value_dim):
    """The chunked forward's FLOPs (docs/gpu_results.md, first session), per token and head:
    6CK (K K^T, W, the intra-chunk scores) + 4CV (U, P v_new) + 6KV (W S, the state update,
    Q S) + (2/3)C^2 (the triangular inverse), C = 64. The backward counts as twice this."""
    C, K, V = CHUNK, key_dim, value_dim
    return tokens * heads * (6 * C * K + 4 * C * V + 6 * K * V + 2 * C * C / 3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ham_csv")
    parser.add_argument("--dtype", default=None, help="only the rows of this dtype (bf16, f32)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--kernels", action="store_true",
                        help="also print each FLA kernel's time a pass (torch.profiler)")
    args = parser.parse_args()

    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"bench_gated_delta_rule_fla: no torch ({e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_gated_delta_rule_fla: torch sees no CUDA device", file=sys.stderr)
        return 2
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as e:
        print(f"bench_gated_delta_rule_fla: flash-linear-attention is not installed ({e})",
              file=sys.stderr)
        return 2
    params = set(inspect.signature(chunk_gated_delta_rule).parameters)
    # FLA 0.6.0 refuses its gated backward on Hopper under Triton 3.4.0 .. 3.7.0, which it
    # says miscompiles one kernel there (chunk_bwd_dqkwg, FLA issue #640). The machine's
    # Triton is such a version and nothing newer can be installed there, so for timing only
    # the guard is lifted: the same kernels run, and their gradients are not used.
    import fla.ops.common.chunk_o as fla_chunk_o
    if getattr(fla_chunk_o, "IS_NVIDIA_HOPPER", False) and \
            getattr(fla_chunk_o, "TRITON_ABOVE_3_4_0", False) and \
            not getattr(fla_chunk_o, "TRITON_ABOVE_3_7_1", True):
        fla_chunk_o.TRITON_ABOVE_3_7_1 = True
        print("bench_gated_delta_rule_fla: FLA's Triton-version guard on its Hopper backward "
              "lifted for timing (FLA #640: its dq/dk may be wrong on this Triton; unused here)")

    def timed(fn, reps):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        times.sort()
        return times[0], times[len(times) // 2], times[-1]

    def kernel_times(fn, reps):
        """Each CUDA kernel's summed time (us) and launches in `reps` calls of fn, under
        torch.profiler, as (name, us a call, launches a call), longest first."""
        from torch.profiler import ProfilerActivity, profile
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        totals, launches = {}, {}
        for event in prof.events():
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            totals[event.name] = totals.get(event.name, 0.0) + event.time_range.elapsed_us()
            launches[event.name] = launches.get(event.name, 0) + 1
        return sorted(((name, us / reps, launches[name] / reps) for name, us in totals.items()),
                      key=lambda item: -item[1])

    def print_kernel_times(title, times):
        total = sum(us for _, us, _ in times)
        print(f"  FLA {title}: {total:.1f} us of kernels a pass")
        for name, us, calls in times:
            print(f"    {us:9.1f} us {100 * us / total:5.1f}% {calls:4g}x  {name[:90]}")

    rows = [row for row in csv.DictReader(open(args.ham_csv))
            if args.dtype is None or row["dtype"] == args.dtype]
    results = []
    print(f"{'case':22s} {'dtype':5s} {'ham fwd':>9s} {'fla fwd':>9s} {'ham/fla min/med/max':>17s} "
          f"{'ham bwd':>9s} {'fla bwd':>9s} {'ham/fla min/med/max':>17s}   (ms, medians)")
    # bf16: ham's other pairs (bench_gated_delta_rule_cuda.cpp), each against FLA's pair:
    # keeping nothing (the backward recomputing every chunk term) and every chunk state.
    pairs = {("fwd_bare", "bwd_recompute"): [], ("fwd_keep", "bwd_kept"): [],
             ("fwd_tuned", "bwd_tuned"): [], ("fwd_no_fit_tuned", "bwd_tuned"): []}
    no_fit_lines = []
    # forward + backward, #7's second measure: ham's pairs (forward key, backward key)
    step_pairs = (("fwd", "bwd"), ("fwd_no_fit", "bwd"), ("fwd_tuned", "bwd_tuned"),
                  ("fwd_no_fit_tuned", "bwd_tuned"))
    step_lines = []
    kernel_failures = 0
    for row in rows:
        dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[row["dtype"]]
        B, T, H = int(row["batch"]), int(row["seq_len"]), int(row["heads"])
        K, V, docs = int(row["key_dim"]), int(row["value_dim"]), int(row["docs"])
        gen = torch.Generator(device="cuda").manual_seed(1234)

        def normal(*shape):
            return torch.randn(*shape, device="cuda", generator=gen, dtype=torch.float32)

        cu_seqlens = None
        if docs > 0:
            # B rows of `docs` equal documents -> one varlen row of B * docs sequences.
            bounds = [b * T + (d * T + docs - 1) // docs for b in range(B) for d in range(docs)]
            cu_seqlens = torch.tensor(bounds + [B * T], device="cuda", dtype=torch.long)
            B, T = 1, B * T
        q = (F.normalize(normal(B, T, H, K), dim=-1) * K ** -0.5).to(dtype).requires_grad_()
        k = F.normalize(normal(B, T, H, K), dim=-1).to(dtype).requires_grad_()
        v = normal(B, T, H, V).to(dtype).requires_grad_()
        g = (-F.softplus(normal(B, T, H))).to(dtype).requires_grad_()
        beta = torch.sigmoid(normal(B, T, H)).to(dtype).requires_grad_()
        kwargs = dict(q=q, k=k, v=v, g=g, beta=beta, scale=1.0, output_final_state=True)
        if cu_seqlens is not None:
            kwargs["cu_seqlens"] = cu_seqlens
        if "head_first" in params:
            kwargs["head_first"] = False
        kwargs = {key: val for key, val in kwargs.items() if key in params}

        def forward():
            with torch.no_grad():
                return chunk_gated_delta_rule(**kwargs)

        grad_o = normal(B, T, H, V).to(dtype)

        def backward():
            o, h_final = chunk_gated_delta_rule(**kwargs)
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            torch.autograd.grad((o, h_final), (q, k, v, g, beta),
                                (grad_o, torch.zeros_like(h_final)))
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop)

        fla_fwd = timed(forward, args.reps)
        backward()
        bwd_times = sorted(backward() for _ in range(args.reps))
        fla_bwd = (bwd_times[0], bwd_times[len(bwd_times) // 2], bwd_times[-1])
        kernel_lines = []
        if args.kernels:
            # A profiler failure is reported and fails the run at the end, after the other
            # cases' timings (FLA's autotuning made them costly to repeat).
            try:
                o, h_final = chunk_gated_delta_rule(**kwargs)

                def gradients():  # the backward alone: the forward's graph is kept
                    torch.autograd.grad((o, h_final), (q, k, v, g, beta),
                                        (grad_o, torch.zeros_like(h_final)), retain_graph=True)

                kernel_lines = [("forward", kernel_times(forward, args.reps)),
                                ("backward", kernel_times(gradients, args.reps))]
                del o, h_final
            except Exception as e:  # noqa: BLE001 (reported, and the exit status says so)
                print(f"bench_gated_delta_rule_fla: --kernels failed on {row['name']}: {e}",
                      file=sys.stderr)
                kernel_failures += 1

        # ham / FLA at like quantiles of the two runs: min/min, median/median, max/max.
        ham_fwd = [float(row[f"fwd_ms_{q}"]) for q in ("min", "median", "max")]
        ham_bwd = [float(row[f"bwd_ms_{q}"]) for q in ("min", "median", "max")]
        fwd_ratio = [h / f for h, f in zip(ham_fwd, fla_fwd)]
        bwd_ratio = [h / f for h, f in zip(ham_bwd, fla_bwd)]
        print(f"{row['name']:22s} {row['dtype']:5s} {ham_fwd[1]:9.3f} {fla_fwd[1]:9.3f} "
              f"{fwd_ratio[0]:5.2f} {fwd_ratio[1]:5.2f} {fwd_ratio[2]:5.2f} "
              f"{ham_bwd[1]:9.3f} {fla_bwd[1]:9.3f} "
              f"{bwd_ratio[0]:5.2f} {bwd_ratio[1]:5.2f} {bwd_ratio[2]:5.2f}", flush=True)
        for title, times in kernel_lines:
            print_kernel_times(title, times)
        flops = forward_flops(B * T, H, K, V)
        tflops = [flops * scale / (ms * 1e-3) / 1e12
                  for scale, ms in ((1, ham_fwd[1]), (1, fla_fwd[1]), (2, ham_bwd[1]),
                                    (2, fla_bwd[1]))]
        print(f"{'':22s} TFLOP/s at the medians: ham fwd {tflops[0]:.1f}, FLA fwd {tflops[1]:.1f}, "
              f"ham bwd {tflops[2]:.1f}, FLA bwd {tflops[3]:.1f} (forward {flops / 1e9:.1f} GFLOP)",
              flush=True)
        if row.get("fwd_no_fit_ms_median"):
            no_fit = [float(row[f"fwd_no_fit_ms_{q}"]) for q in ("min", "median", "max")]
            no_fit_lines.append(
                f"{row['name']:22s} {row['dtype']:5s} {no_fit[1]:10.3f} {fla_fwd[1]:9.3f} "
                + " ".join(f"{h / f:5.2f}" for h, f in zip(no_fit, fla_fwd))
                + f"   {flops / (no_fit[1] * 1e-3) / 1e12:.1f} TFLOP/s")
        fla_step = [f + b for f, b in zip(fla_fwd, fla_bwd)]
        for fwd_key, bwd_key in step_pairs:
            if not row.get(f"{fwd_key}_ms_median") or not row.get(f"{bwd_key}_ms_median"):
                continue
            step = [float(row[f"{fwd_key}_ms_{q}"]) + float(row[f"{bwd_key}_ms_{q}"])
                    for q in ("min", "median", "max")]
            step_lines.append(
                f"{row['name']:22s} {row['dtype']:5s} {fwd_key + ' + ' + bwd_key:28s} "
                f"{step[1]:9.3f} {fla_step[1]:9.3f} "
                + " ".join(f"{h / f:5.2f}" for h, f in zip(step, fla_step)))
        for (fwd_key, bwd_key), lines in pairs.items():
            if not row.get(f"{bwd_key}_ms_median"):
                continue
            pair_fwd = [float(row[f"{fwd_key}_ms_{q}"]) for q in ("min", "median", "max")]
            pair_bwd = [float(row[f"{bwd_key}_ms_{q}"]) for q in ("min", "median", "max")]
            lines.append(
                f"{row['name']:22s} {row['dtype']:5s} {pair_fwd[1]:9.3f} "
                + " ".join(f"{h / f:5.2f}" for h, f in zip(pair_fwd, fla_fwd))
                + f" {pair_bwd[1]:9.3f} "
                + " ".join(f"{h / f:5.2f}" for h, f in zip(pair_bwd, fla_bwd)))
        results.append(dict(row, fla_fwd_ms_min=fla_fwd[0], fla_fwd_ms_median=fla_fwd[1],
                            fla_fwd_ms_max=fla_fwd[2], fla_bwd_ms_min=fla_bwd[0],
                            fla_bwd_ms_median=fla_bwd[1], fla_bwd_ms_max=fla_bwd[2],
                            fwd_ratio_min=fwd_ratio[0], fwd_ratio_median=fwd_ratio[1],
                            fwd_ratio_max=fwd_ratio[2], bwd_ratio_min=bwd_ratio[0],
                            bwd_ratio_median=bwd_ratio[1], bwd_ratio_max=bwd_ratio[2]))
        del q, k, v, g, beta, grad_o, kwargs
        torch.cuda.empty_cache()

    titles = {"fwd_bare": "ham keeping nothing for the backward (less memory than FLA, which"
                          " keeps A; the backward recomputes A too)",
              "fwd_keep": "ham keeping every chunk state for the backward (more memory, no"
                          " recompute)",
              "fwd_tuned": "ham with kernel.autotune on (cuda/autotune.h: each pass's bit-equal"
                           " variants timed at the shape first, the fastest kept)",
              "fwd_no_fit_tuned": "ham with kernel.autotune on, its forward without the fit"
                                  " error (a GDN layer's; the outputs FLA's forward computes)"}
    for (fwd_key, bwd_key), lines in pairs.items():
        if not lines:
            continue
        print(f"\n{titles[fwd_key]}\nagainst FLA's pair above (ms, medians; ham/fla at"
              " min/med/max)")
        print(f"{'case':22s} {'dtype':5s} {fwd_key:>9s} {'ham/fla':>17s} {bwd_key:>9s} "
              f"{'ham/fla':>17s}")
        for line in lines:
            print(line)

    if no_fit_lines:
        print("\nham's forward without the fit error (a GDN layer's forward; the outputs FLA's"
              " forward computes)\nagainst FLA's forward (ms, medians; ham/fla at min/med/max)")
        print(f"{'case':22s} {'dtype':5s} {'fwd_no_fit':>10s} {'fla fwd':>9s} {'ham/fla':>17s}")
        for line in no_fit_lines:
            print(line)

    if step_lines:
        print("\nforward + backward, a training step's pass (ham's pair against FLA's forward +"
              " backward; ms, sums at the medians; ham/fla of the sums at min/med/max)")
        print(f"{'case':22s} {'dtype':5s} {'ham pair':28s} {'ham':>9s} {'fla':>9s} "
              f"{'ham/fla':>17s}")
        for line in step_lines:
            print(line)

    if args.out and results:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(results[0].keys()))
            writer.writeheader()
            writer.writerows(results)
    return 1 if kernel_failures else 0


if __name__ == "__main__":
    sys.exit(main())
