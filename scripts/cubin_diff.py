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


def kernels(path):
    data = open(path, "rb").read()
    return {without_anonymous_tags(name): data[offset:offset + size]
            for name, offset, size in text_sections(data)}


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    old, new = kernels(sys.argv[1]), kernels(sys.argv[2])
    differ = sorted(name for name in old.keys() & new.keys() if old[name] != new[name])
    only_old = sorted(old.keys() - new.keys())
    only_new = sorted(new.keys() - old.keys())
    same = len(old.keys() & new.keys()) - len(differ)
    print(f"{same} kernels identical, {len(differ)} differ, {len(only_old)} only in "
          f"{sys.argv[1]}, {len(only_new)} only in {sys.argv[2]}")
    for label, names in (("differs", differ), ("only old", only_old), ("only new", only_new)):
        for name in names:
            print(f"  {label}: {name}")
    sys.exit(1 if differ or only_old or only_new else 0)


if __name__ == "__main__":
    main()
