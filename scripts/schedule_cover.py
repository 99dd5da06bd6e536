#!/usr/bin/env python3
"""Chooses the emulated GPU tests the reverse and shuffled schedules can leave out.

ctest runs every emulated GPU test in the forward schedule, and again in the reverse and
shuffled ones (EmulatedGpu.schedule_reverse, EmulatedGpu.schedule_shuffle), where a race
on shared memory or a missing wait between streams changes a result. A race lives in a
kernel, a missing wait in how kernels are launched, so the schedules need each kernel run
in each way the suite launches it (on the default stream or a created one, plain or as a
dependent launch), not every test that does so. This script runs each test alone with
its own HAM_EMULATOR_LAUNCH_LOG, then picks, greedily by time, tests that together make
every (kernel, launch kind) the whole suite makes; the rest are written to LEAVE_OUT, which
tests/CMakeLists.txt adds to the schedule runs' negative filter. Tests that launch no
kernel at all (cuBLAS's emulated products, stream bookkeeping) are always kept.

Run it after adding or changing GPU tests (about 2 minutes on 2 cores, on the emulator
build of ./scripts/build.sh):
    scripts/schedule_cover.py build/tests/test_emulated_gpu tests/schedule_runs_leave_out.txt
With --check-names it only checks that every name in LEAVE_OUT is still a test of BINARY
(ctest's EmulatedGpu.schedule_leave_out_names_exist), so a renamed test is not silently
dropped from the list's meaning.
"""

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_resources import launch_log_fields  # noqa: E402

# The schedule runs' filter (tests/CMakeLists.txt), before the left-out tests.
SCHEDULE_FILTER = "*Gpu*:*Cuda*:*GPU*:-DeviceTraining.*"


def list_tests(binary, gtest_filter):
    """The full names of the tests `gtest_filter` selects in `binary`, in order."""
    listing = subprocess.run([binary, f"--gtest_filter={gtest_filter}", "--gtest_list_tests"],
                             check=True, capture_output=True, text=True).stdout
    names, suite = [], None
    for line in listing.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.split()[0]
        else:
            names.append(suite + line.split()[0])
    return names


def read_leave_out(path):
    """The test names in `path`: one a line; '#' starts a comment."""
    with open(path) as lines:
        return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def run_alone(binary, test, log_dir, index):
    """Runs `test` in its own process; returns (seconds, its (kernel, kind) set)."""
    log = os.path.join(log_dir, f"{index}.log")
    environment = dict(os.environ, OMP_NUM_THREADS="1", HAM_EMULATOR_LAUNCH_LOG=log)
    environment.pop("HAM_EMULATOR_SCHEDULE", None)
    environment.pop("HAM_EMULATOR_STREAMS", None)
    start = time.monotonic()
    result = subprocess.run([binary, f"--gtest_filter={test}"], env=environment,
                            capture_output=True, text=True)
    seconds = time.monotonic() - start
    if result.returncode != 0:
        sys.exit(f"schedule_cover: {test} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    launches = set()
    if os.path.exists(log):
        for fields in launch_log_fields(log, "schedule_cover"):
            kernel = (fields[2], fields[7])  # offset in the binary, name
            launches.update((kernel, kind) for kind in fields[9].split(","))
    return seconds, launches


def cover(seconds, launches):
    """The tests to keep: every (kernel, kind) made by one, chosen greedily by new launches
    per second, then without any whose launches the others all make."""
    wanted = set().union(*launches.values())
    kept, made = [], set()
    order = {test: i for i, test in enumerate(seconds)}
    while made != wanted:
        # Times to a tenth of a second, ties to the earlier test: a rerun's noise seldom
        # changes the choice.
        best = max((t for t in seconds if t not in kept and launches[t] - made),
                   key=lambda t: (len(launches[t] - made) / max(round(seconds[t], 1), 0.1),
                                  -order[t]))
        kept.append(best)
        made |= launches[best]
    for test in sorted(kept, key=lambda t: -seconds[t]):
        others = set().union(*(launches[t] for t in kept if t != test))
        if launches[test] <= others:
            kept.remove(test)
    return set(kept) | {t for t in seconds if not launches[t]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary", help="build/tests/test_emulated_gpu")
    parser.add_argument("leave_out", help="the list to write (or, with --check-names, read)")
    parser.add_argument("--check-names", action="store_true",
                        help="only check that each listed test exists")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    tests = list_tests(args.binary, SCHEDULE_FILTER)
    if args.check_names:
        missing = [name for name in read_leave_out(args.leave_out) if name not in tests]
        if missing:
            sys.exit(f"schedule_cover: {args.leave_out}: {len(missing)} of its names are no "
                     f"longer tests of {args.binary} (rerun scripts/schedule_cover.py): "
                     f"{', '.join(missing[:5])}")
        print(f"schedule_cover: all {len(read_leave_out(args.leave_out))} names in "
              f"{args.leave_out} are tests")
        return

    seconds, launches = {}, {}
    with tempfile.TemporaryDirectory() as log_dir, \
            concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        runs = {test: pool.submit(run_alone, args.binary, test, log_dir, i)
                for i, test in enumerate(tests)}
        for test, run in runs.items():
            seconds[test], launches[test] = run.result()
    kept = cover(seconds, launches)
    left_out = [t for t in tests if t not in kept]
    total = sum(seconds.values())
    kept_seconds = sum(seconds[t] for t in kept)
    wanted = len(set().union(*launches.values()))
    with open(args.leave_out, "w") as out:
        out.write("# Emulated GPU tests the reverse and shuffled schedules leave out: the tests\n"
                  "# they keep launch every kernel in every way the whole suite does.\n"
                  "# Written by scripts/schedule_cover.py; rerun it after changing GPU tests.\n"
                  f"# Kept {len(kept)} of {len(tests)} tests, {kept_seconds:.0f} of {total:.0f} s "
                  f"alone, making all {wanted} (kernel, launch kind) pairs.\n")
        out.writelines(f"{name}\n" for name in left_out)
    print(f"schedule_cover: kept {len(kept)} of {len(tests)} tests ({kept_seconds:.0f} of "
          f"{total:.0f} s run alone); {len(left_out)} written to {args.leave_out}")


if __name__ == "__main__":
    main()
