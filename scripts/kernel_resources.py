#!/usr/bin/env python3
"""Each CUDA kernel's resources, held against its largest emulated launch and the H200's limits.

The SIMT emulator runs the kernels as C++, so it cannot know what nvcc gives each one:
registers, spills, the static shared memory of every variable, and the threads its
__launch_bounds__ allow. nvcc says (ptxas -v, and .maxntid in the PTX), and the emulator
knows every launch the tests make (HAM_EMULATOR_LAUNCH_LOG). Together they find launches a
GPU would refuse, before a GPU runs them:
  - more threads a block than __launch_bounds__ allows (.maxntid), or other than .reqntid;
  - more registers than a block may hold: its warps times each warp's registers (threads'
    registers times 32, rounded up to 256) past 64K;
  - static shared memory past 48 KiB, or static and the largest dynamic past the 227 KiB a
    block may opt into (nvcc counts every static variable, aligned; the emulator counts
    only those its blocks reached);
A kernel's "largest launch" is the most threads a block and the most dynamic shared bytes
any of its launches asked for, taken together: a bound on each launch, which may be
stricter than any one of them. It prints, per kernel, the blocks an SM can hold (the
occupancy calculator's rule) and what limits it, spills and stack. Exit status 1 when a
launch would be refused, a launched kernel of cuda/ has no nvcc entry, or a log's kernel
cannot be found in its binary (rebuilt since the log was written, say).

Usage: scripts/kernel_resources.py BUILD LAUNCH_LOG [LAUNCH_LOG ...] [--all]
BUILD was built with scripts/nvcc_with_resource_report.sh as its CUDA compiler launcher
(scripts/kernel_resources.sh makes one and a launch log, then runs this). --all also lists
the kernels nvcc compiled that no launch in the logs reached.
"""
import argparse
import collections
import glob
import math
import os
import re
import subprocess
import sys

# Hopper (sm_90) limits, as the H200 reports them.
REGISTERS_PER_SM = 65536
REGISTERS_PER_BLOCK = 65536
REGISTER_UNIT_PER_WARP = 256
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32
SHARED_PER_SM = 228 * 1024
SHARED_RESERVED_PER_BLOCK = 1024
SHARED_PER_BLOCK = 48 * 1024
SHARED_PER_BLOCK_OPT_IN = 227 * 1024

# Launch sites in the CUDA backend, whose kernels nvcc's reports must hold (the emulator's
# and the tests' own kernels are not in them).
BACKEND = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cuda", "")
EMULATOR = os.path.join(BACKEND, "emulator", "")

Kernel = collections.namedtuple(
    "Kernel", "registers static_shared stack spill_stores spill_loads max_threads req_threads")


def parse_ptxas(path, found):
    """Adds each entry function of ptxas's report in `path` to found[mangled name]."""
    entry = None
    properties = {}  # name -> (stack, spill stores, spill loads)
    used = {}  # entry -> (registers, static shared bytes)
    pending_properties = None
    with open(path, errors="replace") as report:
        for line in report:
            match = re.search(r"Compiling entry function '([^']+)'", line)
            if match:
                entry = match.group(1)
                continue
            match = re.search(r"Function properties for (\S+)", line)
            if match:
                pending_properties = match.group(1)
                continue
            match = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                              r"(\d+) bytes spill loads", line)
            if match and pending_properties:
                properties[pending_properties] = tuple(int(g) for g in match.groups())
                pending_properties = None
                continue
            match = re.search(r"Used (\d+) registers", line)
            if match and entry:
                shared = re.search(r"(\d+) bytes smem", line)
                used[entry] = (int(match.group(1)), int(shared.group(1)) if shared else 0)
                entry = None
    for name, (registers, shared) in used.items():
        stack, stores, loads = properties.get(name, (0, 0, 0))
        found[name] = Kernel(registers, shared, stack, stores, loads, None, None)


def parse_ptx(path):
    """{mangled entry name: (maxntid threads or None, reqntid threads or None)} of a PTX file."""
    bounds = {}
    entry = None
    with open(path, errors="replace") as ptx:
        for line in ptx:
            match = re.search(r"\.entry (\S+?)\(", line)
            if match:
                entry = match.group(1)
                bounds[entry] = [None, None]
                continue
            if entry is None:
                continue
            if line.strip() == "{":
                entry = None
                continue
            for index, directive in enumerate((".maxntid", ".reqntid")):
                if line.strip().startswith(directive):
                    dims = re.findall(r"\d+", line.strip()[len(directive):])
                    bounds[entry][index] = math.prod(int(d) for d in dims)
    return bounds


def compiled_kernels(build):
    found = {}
    reports = glob.glob(os.path.join(build, "**", "*.o.ptxas"), recursive=True)
    if not reports:
        sys.exit(f"kernel_resources: {build}: no *.o.ptxas reports; build it with "
                 "scripts/nvcc_with_resource_report.sh as CMAKE_CUDA_COMPILER_LAUNCHER")
    for report in reports:
        parse_ptxas(report, found)
    for ptx in glob.glob(os.path.join(build, "**", "*.o.keep", "*.ptx"), recursive=True):
        for name, (max_threads, req_threads) in parse_ptx(ptx).items():
            if name in found:
                found[name] = found[name]._replace(max_threads=max_threads,
                                                   req_threads=req_threads)
    return found


def demangle(names):
    names = list(names)
    if not names:
        return {}
    result = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                            text=True, check=True)
    return dict(zip(names, result.stdout.splitlines()))


def symbols(binary):
    """{address: mangled name} of `binary`'s functions, and whether it is position-independent."""
    with open(binary, "rb") as elf:
        header = elf.read(18)
    if header[:4] != b"\x7fELF":
        sys.exit(f"kernel_resources: {binary}: not an ELF file")
    position_independent = int.from_bytes(header[16:18], "little") == 3  # ET_DYN
    listing = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True,
                             check=True).stdout
    table = {}
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tTwW":
            table[int(parts[0], 16)] = parts[2]
    return table, position_independent


Launch = collections.namedtuple("Launch", "threads dynamic_shared reached_static site")


def launch_log_fields(log, tool):
    """Each line of the launch log `log` as its 10 fields; `tool` names the caller in an
    error."""
    with open(log) as lines:
        for number, line in enumerate(lines, 1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 10:
                sys.exit(f"{tool}: {log}:{number}: expected 10 tab-separated fields, "
                         f"found {len(fields)}")
            yield fields


def launched_kernels(logs):
    """{mangled name: Launch, the largest over all logs}, and why entries could not be named."""
    tables = {}
    launches = {}
    unnamed = []
    for log in logs:
        for fields in launch_log_fields(log, "kernel_resources"):
            binary, modified, offset, address, threads, dynamic, reached, kernel, site = \
                fields[:9]
            where = f"{kernel} launched at {site}"
            if not os.path.isfile(binary):
                unnamed.append(f"{where}: its binary {binary} is not there")
                continue
            if os.stat(binary).st_mtime_ns != int(modified):
                unnamed.append(f"{where}: {binary} was rebuilt after {log} was written")
                continue
            if binary not in tables:
                tables[binary] = symbols(binary)
            table, position_independent = tables[binary]
            name = table.get(int(offset if position_independent else address, 16))
            if name is None:
                unnamed.append(f"{where}: no symbol at {offset} in {binary}")
                continue
            launch = Launch(int(threads), int(dynamic), int(reached), site)
            if name in launches:
                old = launches[name]
                launch = Launch(max(old.threads, launch.threads),
                                max(old.dynamic_shared, launch.dynamic_shared),
                                max(old.reached_static, launch.reached_static), old.site)
            launches[name] = launch
    return launches, unnamed


def worst(kernels):
    """One Kernel holding the largest needs and the tightest bounds of `kernels`."""
    def tightest(values):
        values = [v for v in values if v is not None]
        return min(values) if values else None
    return Kernel(*(max(getattr(k, field) for k in kernels)
                    for field in Kernel._fields[:5]),
                  tightest(k.max_threads for k in kernels),
                  tightest(k.req_threads for k in kernels))


def rounded_up(value, unit):
    return -(-value // unit) * unit


def occupancy(kernel, threads, dynamic_shared):
    """(blocks an SM holds, what limits it) by the CUDA occupancy calculator's rule."""
    warps = -(-threads // 32)
    per_warp = rounded_up(max(kernel.registers, 1) * 32, REGISTER_UNIT_PER_WARP)
    limits = {
        "blocks": BLOCKS_PER_SM,
        "threads": THREADS_PER_SM // (warps * 32),
        "registers": (REGISTERS_PER_SM // per_warp) // warps,
        "shared": SHARED_PER_SM // (kernel.static_shared + dynamic_shared +
                                    SHARED_RESERVED_PER_BLOCK),
    }
    limiter = min(limits, key=lambda k: limits[k])
    return limits[limiter], limiter


def refusals(kernel, launch):
    """Why a GPU would refuse the kernel's largest launch, as a list of sentences."""
    why = []
    if kernel.max_threads is not None and launch.threads > kernel.max_threads:
        why.append(f"{launch.threads} threads a block, past its __launch_bounds__ "
                   f"(.maxntid {kernel.max_threads})")
    if kernel.req_threads is not None and launch.threads != kernel.req_threads:
        why.append(f"{launch.threads} threads a block, not its .reqntid {kernel.req_threads}")
    warps = -(-launch.threads // 32)
    block_registers = warps * rounded_up(kernel.registers * 32, REGISTER_UNIT_PER_WARP)
    if block_registers > REGISTERS_PER_BLOCK:
        why.append(f"{warps} warps of {kernel.registers} registers a thread need "
                   f"{block_registers} registers, past the {REGISTERS_PER_BLOCK} of a block")
    if kernel.static_shared > SHARED_PER_BLOCK:
        why.append(f"{kernel.static_shared} bytes of static shared memory, past "
                   f"{SHARED_PER_BLOCK}")
    if kernel.static_shared + launch.dynamic_shared > SHARED_PER_BLOCK_OPT_IN:
        why.append(f"{kernel.static_shared} static and {launch.dynamic_shared} dynamic bytes "
                   f"of shared memory, past the {SHARED_PER_BLOCK_OPT_IN} a block may opt into")
    return why


def short(demangled):
    """The kernel's name and template arguments, without namespaces or parameters."""
    text = re.sub(r"^void ", "", demangled).replace("ham::cuda::", "")
    text = text.replace("(anonymous namespace)::", "")
    depth = 0
    for index, char in enumerate(text):
        depth += char == "<"
        depth -= char == ">"
        if char == "(" and depth == 0:
            return text[:index]
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build")
    parser.add_argument("logs", nargs="+")
    parser.add_argument("--all", action="store_true")
    arguments = parser.parse_args()

    compiled = compiled_kernels(arguments.build)
    launches, unnamed = launched_kernels(arguments.logs)
    compiled_names = demangle(compiled)
    launched_names = demangle(launches)
    # Kernels match by demangled name (c++filt spells nvcc's anonymous namespaces, which
    # carry a per-file hash, as the host compiler's). A template in an anonymous namespace
    # of a header is one kernel a translation unit, all of one name; the worst counts.
    by_name = collections.defaultdict(list)
    for name in compiled:
        by_name[compiled_names[name]].append(name)

    failures = []
    rows = []
    reached = set()
    for host_name, launch in sorted(launches.items(), key=lambda item: launched_names[item[0]]):
        demangled = launched_names[host_name]
        device_names = by_name.get(demangled)
        if not device_names:
            if launch.site.startswith(BACKEND) and not launch.site.startswith(EMULATOR):
                failures.append(f"{short(demangled)} (launched at {launch.site}): "
                                "no kernel of that name in nvcc's reports")
            continue
        reached.update(device_names)
        kernel = worst([compiled[name] for name in device_names])
        blocks, limiter = occupancy(kernel, launch.threads, launch.dynamic_shared)
        for why in refusals(kernel, launch):
            failures.append(f"{short(demangled)} (launched at {launch.site}): {why}")
        rows.append((short(demangled), kernel, launch, blocks, limiter))

    width = min(max((len(row[0]) for row in rows), default=10), 70)
    print(f"{'kernel':<{width}} {'regs':>4} {'spill st/ld':>11} {'stack':>5} "
          f"{'static':>6} {'reached':>7} {'dynamic':>7} {'threads':>7} {'bound':>5} "
          f"{'blocks/SM':>9}  limit")
    for name, kernel, launch, blocks, limiter in rows:
        bound = kernel.max_threads or kernel.req_threads or "-"
        print(f"{name[:width]:<{width}} {kernel.registers:>4} "
              f"{f'{kernel.spill_stores}/{kernel.spill_loads}':>11} {kernel.stack:>5} "
              f"{kernel.static_shared:>6} {launch.reached_static:>7} "
              f"{launch.dynamic_shared:>7} {launch.threads:>7} {bound:>5} {blocks:>9}  "
              f"{limiter}")
    never = sorted(short(compiled_names[name]) for name in compiled if name not in reached)
    print(f"\n{len(rows)} kernels launched and found in nvcc's reports; {len(never)} of the "
          f"{len(compiled)} nvcc compiled never launched in these logs"
          + (":" if arguments.all else " (--all lists them)"))
    if arguments.all:
        for name in never:
            print(f"  {name}")
    failures += sorted(set(unnamed))
    for failure in failures:
        print(f"kernel_resources: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
