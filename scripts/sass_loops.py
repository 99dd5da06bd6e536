#!/usr/bin/env python3
"""Static instruction counts of CUDA kernels' loops, from their SASS (no GPU needed).

Prints, for each kernel whose mangled name contains KERNEL: its instruction count, spill
instructions (STL/LDL) inside and outside its largest loop, and every loop (a backward
branch) of at least --min instructions with its opcode mix. A fully unrolled loop body's
static count is what one of its iterations executes, so the count of a kernel's tile loop
before and after a change says how many instructions a tile costs; with branches inside,
it bounds the cost from above. ncu's per-instruction counts (gpu_check's diagnose stage)
are the measured version.

With --lines, it also says which source lines the instructions come from: for each
kernel (within --range FIRST-LAST, addresses as printed for the loops), the instruction
count and opcode mix of each line of the kernel's own body (a line that calls an inlined
function counts everything inlined there), or with --depth N the innermost N lines of
the inlining chain (so `issue_tile`'s own lines, each with the kernel line it was called
from). That needs line information, so OBJECT must then be a .cu source: the script
compiles it to a cubin with -lineinfo by its line in BUILD/compile_commands.json (--build,
default build-sm90), and reads it with nvdisasm. A .cubin compiled so (the script keeps
its own under /tmp/sass_loops_*) is read as it is, for a second look without the compile.

With --against EARLIER (an object or SASS text of the same source before a change), it
prints only the kernels whose counts (instructions, loops of at least --min, spill
instructions) differ, and the totals of the kernels both hold: the static before and after
of a change to a kernel's source (compile the earlier source with the build's nvcc line).

Usage:
  scripts/sass_loops.py OBJECT KERNEL [KERNEL ...] [--min N] [--against EARLIER]
  scripts/sass_loops.py cuda/SOURCE.cu KERNEL [--lines] [--range 0x680-0xeca0] [--depth N]
OBJECT is an object file or cubin built for the GPU (e.g.
build-sm90/CMakeFiles/ham_cuda.dir/cuda/routed_attention.cu.o), a text file that
`cuobjdump -sass` wrote, or a .cu source (compiled as above). cuobjdump and nvdisasm come
with the CUDA toolkit on the GPU machine; where the toolkit lacks them, the PyPI wheels
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm carry them (set CUOBJDUMP and NVDISASM to
their paths).
"""
import argparse
import collections
import os
import re
import shutil
import json
import shlex
import subprocess
import sys
import tempfile


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


def tool(variable, name):
    path = os.environ.get(variable) or shutil.which(name)
    if not path:
        sys.exit(f"sass_loops: no {name} on PATH; set {variable} (see --help)")
    return path


def compile_with_lines(source, build):
    """A cubin of `source` with line information, compiled as BUILD's compile line does."""
    commands = json.load(open(os.path.join(build, "compile_commands.json")))
    wanted = os.path.abspath(source)
    entry = next((c for c in commands if os.path.abspath(c["file"]) == wanted), None)
    if entry is None:
        sys.exit(f"sass_loops: {source} is not in {build}/compile_commands.json")
    words = shlex.split(entry["command"])
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word == "-o":
            skip = True
        elif word == "-c" or word.startswith(("--generate-code", "-gencode", "-Xcompiler")):
            pass
        else:
            kept.append(word)
    cubin = os.path.join(tempfile.mkdtemp(prefix="sass_loops_"), "lines.cubin")
    # the newest of the build's architectures (90a where it has it: the wgmma kernels)
    archs = re.findall(r"sm_(\d+a?)", entry["command"])
    arch = max(archs, key=lambda a: int(a.rstrip("a")), default="90")
    kept += ["-cubin", "-lineinfo", f"-arch=sm_{arch}", "-o", cubin]
    subprocess.run(kept, check=True, cwd=entry["directory"], stderr=subprocess.DEVNULL)
    return cubin


def line_counts(cubin, names, first, last, depth):
    """{key: Counter of opcodes} for the instructions of the kernels `names` in [first,
    last]: key is the kernel body's line (depth 0) or the innermost `depth` lines of the
    inlining chain."""
    text = subprocess.run([tool("NVDISASM", "nvdisasm"), "-gi", "-c", cubin], check=True,
                          capture_output=True, text=True).stdout
    counts = collections.defaultdict(collections.Counter)
    inside, chain, after_location = False, [], False
    for line in text.split("\n"):
        # (not "\t.sectioninfo", which follows a section's start)
        if line.startswith("//----") or line.startswith("\t.section\t"):
            inside = ".text." in line and any(n in line for n in names)
            continue
        if not inside:
            continue
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)(.*)', line)
        if m:
            if not after_location:
                chain = []
            after_location = True
            chain.append((os.path.basename(m.group(1)), int(m.group(2))))
            chain += [(os.path.basename(f), int(n))
                      for f, n in re.findall(r'inlined at "([^"]+)", line (\d+)', m.group(3))]
            continue
        after_location = False
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if not m or not first <= int(m.group(1), 16) <= last:
            continue
        if not chain:
            key = "?"
        elif depth == 0:
            key = f"{chain[-1][0]}:{chain[-1][1]}"
        else:
            key = " <- ".join(f"{f}:{n}" for f, n in chain[:depth])
        counts[key][m.group(2).split(".")[0]] += 1
    return counts


def source_text(key, root):
    file, line = key.split(" <- ")[0].rsplit(":", 1)
    for folder in ("cuda", "core", "."):
        path = os.path.join(root, folder, file)
        if os.path.exists(path):
            lines = open(path).read().split("\n")
            return lines[int(line) - 1].strip()[:60] if int(line) <= len(lines) else ""
    return ""


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


def summary(body, smallest):
    """(instructions, sizes of the loops of at least `smallest`, in address order, and the
    spill instructions in the largest loop and outside it) of a kernel's body."""
    ops = [op for _, op in body]
    spans = loops(body)
    spills = (0, 0)
    if spans:
        first, last = spans[0]
        inside = sum(1 for op in ops[first:last + 1] if op.startswith(("STL", "LDL")))
        spills = (inside, sum(1 for op in ops if op.startswith(("STL", "LDL"))) - inside)
    sizes = [last - first + 1 for first, last in sorted(spans) if last - first + 1 >= smallest]
    return len(body), sizes, spills


def compare(before, after, patterns, smallest):
    """Prints each kernel matching `patterns` whose counts differ between two objects
    (kernels matched by name, the anonymous namespace's hash aside), then the totals."""
    def table(path):  # {name without the hash: (name, summary)}
        return {re.sub(r"_GLOBAL__N__[0-9a-f]+_", "", name): (name, summary(body, smallest))
                for name, body in kernels(sass_text(path))
                if any(k in name for k in patterns)}
    old, new = table(before), table(after)
    for key in sorted(old.keys() | new.keys()):
        if key not in old or key not in new:
            name, path = (new[key][0], after) if key in new else (old[key][0], before)
            print(f"{name}\n  only in {path}")
        elif old[key][1] != new[key][1]:
            (n0, l0, s0), (n1, l1, s1) = old[key][1], new[key][1]
            print(f"{new[key][0]}\n  {n0} -> {n1} instructions, loops {l0} -> {l1}, spill "
                  f"instructions (largest loop, outside) {s0} -> {s1}")
    common = old.keys() & new.keys()
    print(f"{len(common)} kernels in both: {sum(old[k][1][0] for k in common)} -> "
          f"{sum(new[k][1][0] for k in common)} instructions")


def mix(ops, top=12):
    counts = collections.Counter(op.split()[0].split(".")[0] for op in ops)
    return ", ".join(f"{k} {v}" for k, v in counts.most_common(top))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("object")
    parser.add_argument("kernel", nargs="+")
    parser.add_argument("--min", type=int, default=100, help="smallest loop shown")
    parser.add_argument("--lines", action="store_true", help="instructions per source line")
    parser.add_argument("--range", default=None, help="FIRST-LAST addresses for --lines")
    parser.add_argument("--depth", type=int, default=0, help="inlining depth for --lines")
    parser.add_argument("--top", type=int, default=40, help="lines shown with --lines")
    parser.add_argument("--build", default="build-sm90", help="build folder of a .cu OBJECT")
    parser.add_argument("--against", default=None,
                        help="an earlier OBJECT: print only the kernels whose counts differ")
    args = parser.parse_args()
    if args.against:
        compare(args.against, args.object, args.kernel, args.min)
        return
    if args.object.endswith(".cu"):
        args.object = compile_with_lines(args.object, args.build)
    elif args.lines and not args.object.endswith(".cubin"):
        sys.exit("sass_loops: --lines needs a .cu source, or a .cubin built with -lineinfo")
    shown = 0
    for name, body in kernels(sass_text(args.object)):
        if not any(k in name for k in args.kernel):
            continue
        shown += 1
        ops = [op for _, op in body]
        spans = loops(body)
        print(f"{name}\n  {len(body)} instructions: {mix(ops)}")
        if spans:
            inside, outside = summary(body, args.min)[2]
            print(f"  spill instructions: {inside} in the largest loop, {outside} outside it")
        for first, last in sorted(spans):
            if last - first + 1 < args.min:
                continue
            print(f"  loop {body[first][0]:#x}-{body[last][0]:#x}: {last - first + 1} "
                  f"instructions: {mix(ops[first:last + 1])}")
        if args.lines:
            first, last = 0, 1 << 62
            if args.range:
                first, last = (int(x, 16) for x in args.range.split("-"))
            counts = line_counts(args.object, [name], first, last, args.depth)
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            print(f"  by source line ({sum(sum(c.values()) for c in counts.values())} "
                  "instructions):")
            ranked = sorted(counts.items(), key=lambda kv: -sum(kv[1].values()))
            for key, ops_at in ranked[:args.top]:
                top = ", ".join(f"{k} {v}" for k, v in ops_at.most_common(4))
                print(f"  {sum(ops_at.values()):6d}  {key}  {source_text(key, root)}  [{top}]")
    if not shown:
        sys.exit(f"sass_loops: no kernel matches {args.kernel}")


if __name__ == "__main__":
    main()
