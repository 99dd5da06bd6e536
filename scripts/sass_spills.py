#!/usr/bin/env python3
"""Where a kernel's register spills fall against its warpgroup products, read from a cubin
with no disassembler: this machine's toolkit has nvcc but neither cuobjdump nor nvdisasm.
(The PyPI wheels nvidia-cuda-nvdisasm and nvidia-cuda-cuobjdump carry both, unpacked with
`python3 -m zipfile -e`; with them scripts/sass_loops.py says more: the spills in each loop.)

Prints, for each kernel whose symbol matches PATTERN, the instruction indices of its local
loads (LDL) and stores (STL) and of its wgmma products (HGMMA), so that one can see whether
the spills ptxas reports (-Xptxas -v) sit between the products, where every query tile
pays them, or in the prologue and epilogue.

The opcodes are the low 12 bits of each 16-byte sm_90 instruction. Their meaning here is
inferred, not documented: 0x983 and 0x387 occur in exactly the instances that ptxas says
spill, as many times as its spill bytes over 4; 0x9f0 (both operands in shared memory) and
0xdf0 (A from registers) occur 12, 18 and 24 times in forward_wgmma_persistent<128, 128>,
backward_dq_wgmma_persistent<128, 128> and backward_dkdv_wgmma<128, 128, 1>: the wgmma
count of one tile of each (nvcc 13.0). nvdisasm 13.5 agrees on backward_dkdv_wgmma_persistent
<128, 128>: its 78 STL, 85 LDL and 24 HGMMA are where this script puts them.

Usage: scripts/sass_spills.py CUBIN PATTERN
  e.g. nvcc ... -arch=sm_90a -cubin -o ra.cubin cuda/routed_attention.cu
       scripts/sass_spills.py ra.cubin 'dkdv_wgmma_persistentILi128ELi128'
"""
import re
import struct
import sys

OPCODES = {0x983: "LDL", 0x387: "STL", 0x9F0: "HGMMA", 0xDF0: "HGMMA"}


def text_sections(data):
    """(name, offset, size) of each .text section of an ELF64 file."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise SystemExit("sass_spills: not an ELF64 file (a cubin from nvcc -cubin)")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * entsize) for i in range(count)]
    names_offset = headers[names_index][4]
    for name, _, _, _, offset, size in headers:
        label = data[names_offset + name:data.index(b"\0", names_offset + name)].decode()
        if label.startswith(".text."):
            yield label[len(".text."):], offset, size


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    data = open(sys.argv[1], "rb").read()
    pattern = re.compile(sys.argv[2])
    found = 0
    for name, offset, size in text_sections(data):
        if not pattern.search(name):
            continue
        found += 1
        at = {"LDL": [], "STL": [], "HGMMA": []}
        for index in range(size // 16):
            opcode = struct.unpack_from("<Q", data, offset + 16 * index)[0] & 0xFFF
            if opcode in OPCODES:
                at[OPCODES[opcode]].append(index)
        products = at["HGMMA"]
        print(f"{name}: {size // 16} instructions")
        for kind, indices in at.items():
            print(f"  {kind} ({len(indices)}): {' '.join(map(str, indices))}")
        if products:
            first, last = products[0], products[-1]
            between = [i for i in at["LDL"] + at["STL"] if first < i < last]
            print(f"  spills between the first and the last HGMMA ({first}..{last}): "
                  f"{len(between)}")
            for side, keep in (("before the first", lambda i: i < first),
                               ("after the last", lambda i: i > last)):
                stores = sum(map(keep, at["STL"]))
                loads = sum(map(keep, at["LDL"]))
                print(f"  {side} HGMMA: {stores} STL, {loads} LDL")
    if found == 0:
        raise SystemExit(f"sass_spills: no kernel in {sys.argv[1]} matches '{sys.argv[2]}'")


if __name__ == "__main__":
    main()
