#!/usr/bin/env python3
"""Which kernels' machine code differs between two cubins of the same source file, built
before and after a change: a check, on a machine with no GPU, that a change meant for one
kernel leaves the others' code (and so their measured speed) as it was.

Kernels are matched by symbol with the anonymous namespace's per-file tag taken out, so
the two builds may come from files of different names. A kernel's code is its .text
section, compared byte for byte.

Usage: scripts/cubin_diff.py OLD.cubin NEW.cubin
  e.g. git show HEAD~1:cuda/routed_attention.cu > /tmp/old_routed_attention.cu
       nvcc -DHAM_WITH_CUDA=1 -DHAM_CUDA_WGMMA=1 -DFMT_HEADER_ONLY=1 -I. \\
            -isystem .gpu-deps/include -O3 -DNDEBUG -std=c++20 --expt-relaxed-constexpr \\
            -arch=sm_90a -cubin -o old.cubin -x cu /tmp/old_routed_attention.cu
       (the same for cuda/routed_attention.cu into new.cubin)
       scripts/cubin_diff.py old.cubin new.cubin
Exits 1 where a kernel differs or is in one cubin alone.

  --rename REGEX=REPLACEMENT (repeatable) rewrites the new cubin's kernel names (as
  re.sub, after the tag is out) before they are matched: a kernel given one more template
  parameter, defaulted to what it did before, is then compared with its old code, e.g.
    --rename '(gdr_state_mmaI(?:Li-?\d+E){3})Li2E=\1'
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_spills import text_sections  # noqa: E402

# <length>_GLOBAL__N__<hash>_<length>_<file>_cu_<hash>[_<number>]: nvcc's name for a
# file's anonymous namespace, <length> characters long. The number differs between builds
# of a changed file, so the whole name goes, as its length prefix says.
ANONYMOUS = re.compile(r"(\d+)_GLOBAL__N__")


def without_anonymous_tags(name):
    parts, at = [], 0
    for match in ANONYMOUS.finditer(name):
        if match.start() < at:
            continue
        parts.append(name[at:match.start()] + "(anonymous)")
        at = match.start(1) + len(match.group(1)) + int(match.group(1))
    return "".join(parts) + name[at:]


def kernels(path, renames=()):
    data = open(path, "rb").read()
    found = {}
    for name, offset, size in text_sections(data):
        name = without_anonymous_tags(name)
        for pattern, replacement in renames:
            name = pattern.sub(replacement, name)
        if name in found:
            raise SystemExit(f"cubin_diff: two kernels of {path} are named {name}"
                             " once renamed")
        found[name] = data[offset:offset + size]
    return found


def main():
    args, renames = [], []
    argv = sys.argv[1:]
    while argv:
        arg = argv.pop(0)
        if arg == "--rename":
            if not argv or "=" not in argv[0]:
                raise SystemExit("cubin_diff: --rename takes REGEX=REPLACEMENT")
            pattern, replacement = argv.pop(0).split("=", 1)
            renames.append((re.compile(pattern), replacement))
        else:
            args.append(arg)
    if len(args) != 2:
        raise SystemExit(__doc__)
    old, new = kernels(args[0]), kernels(args[1], renames)
    differ = sorted(name for name in old.keys() & new.keys() if old[name] != new[name])
    only_old = sorted(old.keys() - new.keys())
    only_new = sorted(new.keys() - old.keys())
    same = len(old.keys() & new.keys()) - len(differ)
    print(f"{same} kernels identical, {len(differ)} differ, {len(only_old)} only in "
          f"{args[0]}, {len(only_new)} only in {args[1]}")
    for label, names in (("differs", differ), ("only old", only_old), ("only new", only_new)):
        for name in names:
            print(f"  {label}: {name}")
    sys.exit(1 if differ or only_old or only_new else 0)


if __name__ == "__main__":
    main()
