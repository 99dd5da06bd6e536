#!/usr/bin/env python3
"""PyTorch SDPA (flash) and FlexAttention on the cases bench_routed_attention_cuda measured.

Usage: python3 bench/bench_routed_attention_torch.py routed_ham.csv [--out ratios.csv]
                                                     [--reps N] [--no-flex] [--also CSV]

Reads the CSV written by `bench_routed_attention_cuda --csv`, rebuilds each case's masks
bit for bit (the same splitmix64 selection and equal-run documents), and times in bf16:

  sdpa_flash  F.scaled_dot_product_attention(is_causal=True) under the flash backend:
              dense causal attention over all T keys, one document. It ignores the
              selection and the documents: the dense cost routed attention is measured
              against (for density 1 with one document the two compute the same thing).
              Only where q, k and v share one head dim: the flash backend takes no other.
  flex        FlexAttention (torch.compile'd) with a block mask built from
              mask_mod = kv <= q  &  select[b, kv]  &  doc[b, q] == doc[b, kv]
              (the same S(b, t) as ham): blocks holding no selected key are skipped,
              the rest are computed densely and masked per element. Compiled afresh for
              each case; where its default backward tiles do not fit the GPU's shared
              memory (q/k 128 beside v 192 on the H200), again with smaller ones
              (FLEX_SMALL_BACKWARD), and the log says so.

Both get v already multiplied by value_scale (outside the timed region); ham applies it
inside its kernels. Forward and backward are timed separately with CUDA events (3 warm-ups,
median of --reps, with the min and max in a second table and the CSV; ratios at each pair
min/min, median/median, max/max); the backward of each rep runs on a fresh forward graph,
timed alone.
Prints ms per step and the ratios torch / ham (above 1: ham is faster). Where the CSV has
ham's forward and backward with kernel.autotune on ("forward_tuned_ms", "backward_tuned_ms":
their bit-equal variants timed at the case's shape first, cuda/autotune.h; empty under
--set), the ratios against those too. --also names a second
CSV of the same program, run under other kernel settings (its --set, the CSV's "settings"
field): its forward and backward against the same reference times, for the cases both
CSVs have, so that two variants of ham meet one reference timed once. A reference that
fails on a case (an unsupported head dim, memory) is reported and gets nan in that row.
"""
import argparse
import csv
import statistics
import sys

import numpy as np
import torch
import torch.nn.functional as F


def splitmix64(x):
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def case_masks(row):
    batch, seq_len = int(row["batch"]), int(row["seq_len"])
    density, docs, seed = float(row["density"]), int(row["docs"]), int(row["mask_seed"])
    n = np.arange(batch * seq_len, dtype=np.uint64)
    if density >= 1.0:
        select = np.ones(batch * seq_len, dtype=bool)
    else:
        threshold = np.uint64(int(density * float(1 << 24)))
        select = (splitmix64(np.uint64(seed) + n) >> np.uint64(40)) < threshold
    t = np.arange(seq_len, dtype=np.int64)
    doc = np.tile(t * docs // seq_len, (batch, 1))
    return (torch.from_numpy(select.reshape(batch, seq_len)).cuda(),
            torch.from_numpy(doc).cuda())


def spread_ms(reps, step, before=None):
    """(min, median, max) ms of step() timed alone; before() (untimed) runs ahead of each."""
    for _ in range(3):
        if before:
            before()
        step()
    times = []
    for _ in range(reps):
        if before:
            before()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return (min(times), statistics.median(times), max(times))


def time_attention(attend, q, k, v, dout, reps):
    """(forward, backward) spreads in ms of out = attend(q, k, v) and its gradient."""
    with torch.no_grad():
        fwd = spread_ms(reps, lambda: attend(q, k, v))
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    state = {}

    def forward_graph():
        state["out"] = attend(q, k, v)

    def backward():
        torch.autograd.grad(state["out"], (q, k, v), dout)

    bwd = spread_ms(reps, backward, before=forward_graph)
    return fwd, bwd


def run_case(row, reps, use_flex):
    batch, seq_len = int(row["batch"]), int(row["seq_len"])
    q_heads, kv_heads = int(row["q_heads"]), int(row["kv_heads"])
    key_dim, value_dim = int(row["key_dim"]), int(row["value_dim"])
    gen = torch.Generator(device="cuda").manual_seed(1234)
    dtype = torch.bfloat16

    def rand(*shape):
        return torch.rand(shape, device="cuda", dtype=torch.float32, generator=gen) * 2 - 1

    # [B, H, T, D], the layout both torch paths take.
    q = rand(batch, q_heads, seq_len, key_dim).to(dtype)
    k = rand(batch, kv_heads, seq_len, key_dim).to(dtype)
    v = rand(batch, kv_heads, seq_len, value_dim)
    p = torch.rand(batch, 1, seq_len, 1, device="cuda", generator=gen) * 1.3 + 0.2
    v = (v * p).to(dtype)
    dout = rand(batch, q_heads, seq_len, value_dim).to(dtype)
    results = {}

    # SDPA flash: dense causal; grouped-query heads expanded beforehand (untimed).
    group = q_heads // kv_heads
    k_full = k.repeat_interleave(group, dim=1) if group > 1 else k
    v_full = v.repeat_interleave(group, dim=1) if group > 1 else v
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(q_, k_, v_):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)

    def timed(label, attend, *inputs):
        # A reference that refuses a case (a head dim, a GPU) costs that case's column only.
        try:
            results[label] = time_attention(attend, *inputs, dout, reps)
        except Exception as error:  # noqa: BLE001 - reported, and the row gets nan
            first_line = (str(error).splitlines() or [type(error).__name__])[0]
            print(f"{row['name']}: {label} failed: {first_line}", flush=True)

    if key_dim == value_dim:  # SDPA's flash backend needs one head dim for q, k and v
        timed("sdpa_flash", sdpa, q, k_full, v_full)

    if use_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        select, doc = case_masks(row)

        def routed_mask(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & select[b, kv_idx] & (doc[b, q_idx] == doc[b, kv_idx])

        block_mask = create_block_mask(routed_mask, batch, None, seq_len, seq_len, device="cuda")
        # A fresh compile per case (compiled_flex): past dynamo's recompile limit (8 per
        # function, reached by the 19th case on 2026-11-27) flex_attention runs unfused,
        # scores materialised, and recompiled kernels ran slower than fresh ones.
        def compiled_flex(kernel_options):
            torch._dynamo.reset()
            flex = torch.compile(flex_attention)

            def attend(q_, k_, v_):
                return flex(q_, k_, v_, block_mask=block_mask, enable_gqa=group > 1,
                            kernel_options=kernel_options)
            return attend

        timed("flex", compiled_flex(None), q, k, v)
        if "flex" not in results:
            # Inductor's default backward tiles can ask for more shared memory than the GPU
            # has (q/k 128 beside v 192: 248,320 bytes on the H200, which has 232,448).
            # Smaller ones fit; they are not autotuned, so flex may be slower than its best.
            print(f"{row['name']}: flex again with backward tiles {FLEX_SMALL_BACKWARD}",
                  flush=True)
            timed("flex", compiled_flex(FLEX_SMALL_BACKWARD), q, k, v)
    return results


# Backward tiles for FlexAttention where its defaults do not fit (N1 a multiple of M1, M2
# of N2, all dividing the block mask's 128).
FLEX_SMALL_BACKWARD = {"bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64,
                       "bwd_BLOCK_N2": 32, "bwd_num_stages": 2}


def spread(ratios):
    return "/".join(f"{r:.2f}" for r in ratios)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ham_csv")
    parser.add_argument("--out", help="write the comparison as CSV here")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--no-flex", action="store_true", help="time SDPA flash only")
    parser.add_argument("--also", help="ham's CSV of the same cases under other kernel settings")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_routed_attention_torch: torch sees no GPU", file=sys.stderr)
        return 1
    with open(args.ham_csv) as f:
        rows = list(csv.DictReader(f))
    also = {}
    if args.also:
        with open(args.also) as f:
            also = {r["name"]: r for r in csv.DictReader(f)}
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"ham's kernel settings: {rows[0].get('settings', 'defaults') if rows else '-'}")
    if args.also:
        settings = next(iter(also.values()), {}).get("settings", "?")
        print(f"and, from {args.also}: {settings} ({sum(r['name'] in also for r in rows)} "
              f"of {len(rows)} cases)")
    print(f"{'case':<40} {'ham fwd/bwd ms':>18} {'flash fwd/bwd ms':>18} {'flex fwd/bwd ms':>18} "
          f"{'flash/ham':>11} {'flex/ham':>11}")
    out_rows = []
    nan = (float("nan"),) * 3
    for row in rows:
        # ham's min and max where the CSV has them (older CSVs: the median alone).
        def ham_spread(step, of=row):
            median = float(of[f"{step}_ms"])
            return (float(of.get(f"{step}_ms_min") or median), median,
                    float(of.get(f"{step}_ms_max") or median))

        ham = (ham_spread("forward"), ham_spread("backward"))
        torch_times = run_case(row, args.reps, not args.no_flex)
        flash = torch_times.get("sdpa_flash", (nan, nan))
        flex = torch_times.get("flex", (nan, nan))

        # reference / ham at min, median and max, forward and backward (above 1: ham faster)
        def ratio(other):
            return tuple(tuple(o / h for o, h in zip(other[i], ham[i])) for i in range(2))

        r_flash, r_flex = ratio(flash), ratio(flex)
        print(f"{row['name']:<40} {ham[0][1]:8.3f} {ham[1][1]:8.3f}  {flash[0][1]:8.3f} "
              f"{flash[1][1]:8.3f}  {flex[0][1]:8.3f} {flex[1][1]:8.3f}  {r_flash[0][1]:5.2f} "
              f"{r_flash[1][1]:5.2f} {r_flex[0][1]:5.2f} {r_flex[1][1]:5.2f}", flush=True)
        # the spread at once too, so that a run cut short keeps it for the cases it finished
        print(f"{'':<40} min/median/max: flash/ham fwd {spread(r_flash[0])} bwd "
              f"{spread(r_flash[1])}, flex/ham fwd {spread(r_flex[0])} bwd {spread(r_flex[1])}",
              flush=True)
        out = {"name": row["name"]}
        for label, times in (("ham", ham), ("flash", flash), ("flex", flex)):
            for i, step in enumerate(("forward", "backward")):
                out[f"{label}_{step}_ms"] = times[i][1]
                out[f"{label}_{step}_ms_min"] = times[i][0]
                out[f"{label}_{step}_ms_max"] = times[i][2]
        for label, r in (("flash", r_flash), ("flex", r_flex)):
            for i, step in enumerate(("forward", "backward")):
                for j, at in enumerate(("min", "median", "max")):
                    out[f"{label}_over_ham_{step}_{at}"] = r[i][j]
        for i, step in enumerate(("forward", "backward")):
            # ham with kernel.autotune on (cuda/autotune.h); empty where it was not timed
            if not row.get(f"{step}_tuned_ms"):
                continue
            tuned = ham_spread(f"{step}_tuned")
            for label, other in (("flash", flash), ("flex", flex)):
                for j, at in enumerate(("min", "median", "max")):
                    out[f"{label}_over_ham_tuned_{step}_{at}"] = other[i][j] / tuned[j]
            short = {"forward": "fwd", "backward": "bwd"}[step]
            print(f"{'':<40} ham tuned {short} {tuned[1]:.3f} ms: flash/ham "
                  f"{spread([flash[i][j] / tuned[j] for j in range(3)])}, flex/ham "
                  f"{spread([flex[i][j] / tuned[j] for j in range(3)])}", flush=True)
        if row["name"] in also:  # the same case under --also's kernel settings
            other = also[row["name"]]
            times = (ham_spread("forward", other), ham_spread("backward", other))
            for i, step in enumerate(("forward", "backward")):
                out[f"ham_also_{step}_ms"] = times[i][1]
            for label, reference in (("flash", flash), ("flex", flex)):
                for i, step in enumerate(("forward", "backward")):
                    for j, at in enumerate(("min", "median", "max")):
                        out[f"{label}_over_ham_also_{step}_{at}"] = reference[i][j] / times[i][j]
            print(f"{'':<40} ham also fwd/bwd {times[0][1]:.3f} {times[1][1]:.3f} ms: "
                  f"flash/ham fwd {spread([flash[0][j] / times[0][j] for j in range(3)])} bwd "
                  f"{spread([flash[1][j] / times[1][j] for j in range(3)])}, flex/ham fwd "
                  f"{spread([flex[0][j] / times[0][j] for j in range(3)])} bwd "
                  f"{spread([flex[1][j] / times[1][j] for j in range(3)])}", flush=True)
        out_rows.append(out)
    spreads = [(r["name"], label, step) for r in out_rows for label in ("flash", "flex")
               for step in ("forward", "backward", "tuned_forward", "tuned_backward",
                            "also_forward", "also_backward")
               if f"{label}_over_ham_{step}_median" in r]
    print(f"\n{'case':<40} {'ratio':<26} {'min':>6} {'median':>6} {'max':>6}")
    for name, label, step in spreads:
        row = next(r for r in out_rows if r["name"] == name)
        values = [row[f"{label}_over_ham_{step}_{at}"] for at in ("min", "median", "max")]
        print(f"{name:<40} {label + '/ham ' + step:<26} " +
              " ".join(f"{v:6.2f}" for v in values))
    if args.out:
        with open(args.out, "w", newline="") as f:
            fields = list(dict.fromkeys(k for r in out_rows for k in r)) or ["name"]
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(out_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
