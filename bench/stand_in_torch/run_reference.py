#!/usr/bin/env python3
"""Runs one of bench/'s reference scripts (bench_routed_attention_torch.py,
bench_gated_delta_rule_fla.py, bench_decoding_torch.py) on a CSV of the C++ benchmark with
this directory's stand-in torch and flash-linear-attention, then checks what the script
wrote.

The stand-ins compute nothing and time every region as torch.EVENT_MS, so this checks the
plumbing a GPU session would otherwise try first, in its few minutes: the CSV fields the
script reads, the cases it takes or leaves, its arithmetic on ham's times, its fallbacks
(FlexAttention's smaller backward tiles, SDPA only where the head dims agree), its output
CSV and its exit status. The tests run it on the emulated benchmarks' --smoke CSVs.

Usage: run_reference.py SCRIPT HAM_CSV OUT_CSV [SCRIPT ARGUMENTS]
"""
import contextlib
import csv
import io
import math
import os
import runpy
import sys
import traceback

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402 (the stand-in, from the line above)

STAND_IN = torch.EVENT_MS


class Failure(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise Failure(message)


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def check_routed(ham_rows, out_rows, printed, arguments):
    expect(len(out_rows) == len(ham_rows),
           f"{len(out_rows)} output rows for {len(ham_rows)} cases")
    # the fields the script reads ham's tuned passes from (read with .get: a renamed field
    # would drop the comparison without a word)
    for step in ("forward", "backward"):
        expect(f"{step}_tuned_ms" in ham_rows[0], f"no {step}_tuned_ms in the CSV")
    for ham, out in zip(ham_rows, out_rows):
        name = ham["name"]
        expect(out["name"] == name, f"row {out['name']} where {name} was expected")
        one_head_dim = ham["key_dim"] == ham["value_dim"]
        for step in ("forward", "backward"):
            ham_ms = float(ham[f"{step}_ms"])
            expect(close(float(out[f"ham_{step}_ms"]), ham_ms), f"{name}: ham_{step}_ms")
            flex = float(out[f"flex_over_ham_{step}_median"])
            expect(close(flex, STAND_IN / ham_ms), f"{name}: flex/ham {step} {flex}")
            flash = float(out[f"flash_over_ham_{step}_median"])
            # SDPA flash only where q, k and v share a head dim; nan elsewhere
            expect(close(flash, STAND_IN / ham_ms) if one_head_dim else math.isnan(flash),
                   f"{name}: flash/ham {step} {flash}")
        for step in ("forward", "backward"):
            if ham[f"{step}_tuned_ms"]:
                tuned = float(out[f"flex_over_ham_tuned_{step}_median"])
                expect(close(tuned, STAND_IN / float(ham[f"{step}_tuned_ms"])),
                       f"{name}: flex/ham against the tuned {step} {tuned}")
            else:
                expect(f"flex_over_ham_tuned_{step}_median" not in out,
                       f"{name}: a tuned {step} ratio without its time")
        retried = f"{name}: flex again with backward tiles" in printed
        expect(retried == (not one_head_dim),
               f"{name}: FlexAttention's smaller tiles {'not ' if not retried else ''}tried")
    # --also: a second CSV of the same cases under other kernel settings, against the same
    # reference times
    if "--also" in arguments:
        with open(arguments[arguments.index("--also") + 1]) as f:
            also = {row["name"]: row for row in csv.DictReader(f)}
        settings = next(iter(also.values()))["settings"]
        expect(settings != "defaults", f"--also's CSV under the defaults ({settings})")
        expect(f"from {arguments[arguments.index('--also') + 1]}: {settings}" in printed,
               "--also's settings not printed")
        common = [out for out in out_rows if out["name"] in also]
        expect(len(common) == len(also),
               f"{len(also) - len(common)} of --also's cases not among the first CSV's")
        for out in common:
            for step in ("forward", "backward"):
                # under --set the program times no tuned pass (autotune refuses settings set
                # by hand)
                expect(not also[out["name"]][f"{step}_tuned_ms"],
                       f"{out['name']}: a tuned {step} time under --set")
                ms = float(also[out["name"]][f"{step}_ms"])
                expect(close(float(out[f"ham_also_{step}_ms"]), ms), f"{out['name']}: also {step}")
                flex = float(out[f"flex_over_ham_also_{step}_median"])
                expect(close(flex, STAND_IN / ms), f"{out['name']}: flex/ham also {step} {flex}")
        expect(printed.count("ham also fwd/bwd") == len(common),
               f"{printed.count('ham also fwd/bwd')} 'ham also' lines for {len(common)} cases")


def check_fla(ham_rows, out_rows, printed, arguments):
    dtype = arguments[arguments.index("--dtype") + 1] if "--dtype" in arguments else None
    wanted = [row for row in ham_rows if dtype is None or row["dtype"] == dtype]
    expect(wanted, f"no {dtype} rows in the CSV")
    expect([row["name"] for row in out_rows] == [row["name"] for row in wanted],
           f"output rows {[row['name'] for row in out_rows]}, expected those of {dtype}")
    for ham, out in zip(wanted, out_rows):
        for step in ("fwd", "bwd"):
            ratio = float(out[f"{step}_ratio_median"])
            expected = float(ham[f"{step}_ms_median"]) / STAND_IN
            expect(close(ratio, expected), f"{ham['name']}: ham/fla {step} {ratio}, not {expected}")
    # ham's other pairs, each a table the script prints only where it finds their fields
    # (read with .get), and the forward + backward table's four pairs a case
    for title in ("ham keeping nothing for the backward", "ham keeping every chunk state",
                  "ham with kernel.autotune on (", "ham with kernel.autotune on, its forward",
                  "ham's forward without the fit error", "forward + backward, a training step"):
        expect(title in printed, f"no table '{title}...'")
    steps = sum(printed.count(f" {pair} ") for pair in (
        "fwd + bwd", "fwd_no_fit + bwd", "fwd_tuned + bwd_tuned", "fwd_no_fit_tuned + bwd_tuned"))
    expect(steps == 4 * len(wanted), f"{steps} forward + backward rows for {len(wanted)} cases")
    if "--kernels" in arguments:
        tables = printed.count("FLA forward:") + printed.count("FLA backward:")
        expect(tables == 2 * len(wanted), f"{tables} kernel tables for {len(wanted)} cases")
        expect("aten::stand_in_op" not in printed, "a CPU event in the kernel tables")


def check_decoding(ham_rows, out_rows):
    expect([row["name"] for row in out_rows] == [row["name"] for row in ham_rows],
           f"output rows {[row['name'] for row in out_rows]} for {len(ham_rows)} cases")
    calls = 20  # bench_decoding_torch.py's CALLS_PER_REP, as the C++ program's kCallsPerRep
    references = {"gdr": "fla fused_recurrent_gated_delta_rule", "attn": "torch sdpa"}
    for ham, out in zip(ham_rows, out_rows):
        expect(out["reference"] == references[ham["op"]],
               f"{ham['name']}: reference {out['reference']}")
        ratio = float(out["ref_over_ham_median"])
        expected = STAND_IN / calls / float(ham["ms_median"])
        expect(close(ratio, expected), f"{ham['name']}: ref/ham {ratio}, not {expected}")


def main():
    if len(sys.argv) < 4:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    script, ham_csv, out_csv, arguments = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    with open(ham_csv) as f:
        ham_rows = list(csv.DictReader(f))
    if os.path.exists(out_csv):
        os.remove(out_csv)
    sys.argv = [script, ham_csv, "--out", out_csv, *arguments]
    captured = io.StringIO()
    status = 0
    with contextlib.redirect_stdout(captured):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exit_:
            status = exit_.code or 0
        except Exception as error:  # noqa: BLE001 (a failure of the script, reported below)
            traceback.print_exc()
            status = f"{type(error).__name__}: {error}"
    printed = captured.getvalue()
    sys.stdout.write(printed)
    name = os.path.basename(script)
    try:
        expect(status == 0, f"exit status {status}" if isinstance(status, int) else status)
        expect(os.path.exists(out_csv), f"no output CSV at {out_csv}")
        with open(out_csv) as f:
            out_rows = list(csv.DictReader(f))
        if name == "bench_routed_attention_torch.py":
            check_routed(ham_rows, out_rows, printed, arguments)
        elif name == "bench_gated_delta_rule_fla.py":
            check_fla(ham_rows, out_rows, printed, arguments)
        elif name == "bench_decoding_torch.py":
            check_decoding(ham_rows, out_rows)
        else:
            raise Failure("no checks for this script")
    except Failure as failure:
        print(f"run_reference: {name} on {ham_csv}: {failure}", file=sys.stderr)
        return 1
    print(f"run_reference: {name} on {ham_csv}: {len(out_rows)} rows as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
