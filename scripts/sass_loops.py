#!/usr/bin/env python3
"""Static instruction counts of CUDA kernels' loops, from their SASS (no GPU needed).

Prints, for each kernel whose mangled name contains KERNEL: its instruction count, spill
instructions (STL/LDL) inside and outside its largest loop, and every loop (a backward
branch) of at least --min instructions with its opcode mix. A fully unrolled loop body's
static count is what one of its iterations executes, so the count of a kernel's tile loop
before and after a change says how many instructions a tile costs; with branches inside,
it bounds the cost from above. ncu's per-instruction counts (gpu_check's diagnose stage)
are the measured version.

Usage:
  scripts/sass_loops.py OBJECT KERNEL [KERNEL ...] [--min N]
OBJECT is an object file or cubin built for the GPU (e.g.
build-sm90/CMakeFiles/ham_cuda.dir/cuda/routed_attention.cu.o) or a text file that
`cuobjdump -sass` wrote. cuobjdump comes with the CUDA toolkit on the GPU machine; where
the toolkit lacks it, the PyPI wheel nvidia-cuda-cuobjdump carries one (set CUOBJDUMP to
its path).
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys


def sass_text(path):
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        with open(path) as f:
            return f.read()
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        sys.exit("sass_loops: no cuobjdump on PATH; set CUOBJDUMP (see --help)")
    return subprocess.run([tool, "-sass", path], check=True, capture_output=True,
                          text=True).stdout


def kernels(text):
    """(mangled name, [(address, instruction without predicate)]) per function."""
    for part in re.split(r"\n\s*Function : ", text)[1:]:
        name = part.split("\n", 1)[0].strip()
        body = []
        for line in part.split("\n"):
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
            if m:
                body.append((int(m.group(1), 16), re.sub(r"^@!?U?P\w+\s+", "", m.group(2))))
        yield name, body


def loops(body):
    """(first, last) indices of each backward branch's range, outermost first."""
    at = {address: i for i, (address, _) in enumerate(body)}
    found = set()
    for i, (address, op) in enumerate(body):
        m = re.match(r"BRA\S*\s.*?0x([0-9a-f]+)", op)
        if m and int(m.group(1), 16) <= address and int(m.group(1), 16) in at:
            found.add((at[int(m.group(1), 16)], i))
    return sorted(found, key=lambda r: (r[0] - r[1], r[0]))


def mix(ops, top=12):
    counts = collections.Counter(op.split()[0].split(".")[0] for op in ops)
    return ", ".join(f"{k} {v}" for k, v in counts.most_common(top))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("object")
    parser.add_argument("kernel", nargs="+")
    parser.add_argument("--min", type=int, default=100, help="smallest loop shown")
    args = parser.parse_args()
    shown = 0
    for name, body in kernels(sass_text(args.object)):
        if not any(k in name for k in args.kernel):
            continue
        shown += 1
        ops = [op for _, op in body]
        spans = loops(body)
        print(f"{name}\n  {len(body)} instructions: {mix(ops)}")
        if spans:
            first, last = spans[0]
            inside = sum(1 for op in ops[first:last + 1] if op.startswith(("STL", "LDL")))
            outside = sum(1 for op in ops if op.startswith(("STL", "LDL"))) - inside
            print(f"  spill instructions: {inside} in the largest loop, {outside} outside it")
        for first, last in sorted(spans):
            if last - first + 1 < args.min:
                continue
            print(f"  loop {body[first][0]:#x}-{body[last][0]:#x}: {last - first + 1} "
                  f"instructions: {mix(ops[first:last + 1])}")
    if not shown:
        sys.exit(f"sass_loops: no kernel matches {args.kernel}")


if __name__ == "__main__":
    main()
