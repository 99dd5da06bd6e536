#!/usr/bin/env python3
"""`ham train-tokenizer` against Hugging Face's tokenizers BpeTrainer on the same documents.

Both learn a byte-level BPE with the GPT-2 pre-tokenizer, <|endoftext|> as the special token
and the 256 byte characters as the initial alphabet. The script checks that both learn the
same merges (as piece pairs; the two number bytes differently), and that Hugging Face's
tokenizer, loading ham's tokenizer.json, encodes the documents to the ids `ham tokenize` writes
with it, then times each trainer, alternating,
and prints the time ratio ham / Hugging Face with its min, median and max.

  python3 bench/bench_bpe_training_hf.py build/ham VOCAB_SIZE REPEATS FILE...

Needs `pip install tokenizers`; the reference only, never part of the build or the tests.
ham's time is the one it prints (reading, counting and merging, not the process start or the
write); Hugging Face's is train_from_iterator over the documents already in memory. Both use
all the cores unless RAYON_NUM_THREADS / --threads say otherwise (HAM_THREADS here).
"""
import array
import glob
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time

from tokenizers import Tokenizer, models, pre_tokenizers, trainers


def documents_of(path):
    """Documents as ham reads them: split at lines holding only <|endoftext|>."""
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", errors="surrogateescape")
    docs, current = [], []
    for line in text.splitlines(keepends=True):
        if line.rstrip("\r\n") == "<|endoftext|>":
            if current:
                docs.append("".join(current))
            current = []
        else:
            current.append(line)
    if current:
        docs.append("".join(current))
    return docs


def hf_train(documents, vocab_size):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    start = time.perf_counter()
    tokenizer.train_from_iterator(documents, trainer=trainer, length=len(documents))
    return time.perf_counter() - start, tokenizer


def merges_of(tokenizer_json):
    merges = tokenizer_json["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]


def ham_train(ham, files, vocab_size, out):
    cmd = [ham, "train-tokenizer", "--in", *files, "--out", out, "--vocab-size", str(vocab_size)]
    if os.environ.get("HAM_THREADS"):
        cmd += ["--threads", os.environ["HAM_THREADS"]]
    log = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    counted = float(re.search(r"counted in ([0-9.]+) s", log).group(1))
    merged = float(re.search(r"merges: \d+ in ([0-9.]+) s", log).group(1))
    return counted + merged, log


def shard_ids(paths):
    """The tokens of llm.c shards, in order (uint16 for version 1, uint32 for version 7)."""
    ids = []
    for path in paths:
        with open(path, "rb") as f:
            magic, version, count = struct.unpack("<3i", f.read(12))
            f.seek(1024)
            tokens = array.array("H" if version == 1 else "I")
            tokens.frombytes(f.read())
        assert len(tokens) == count, f"{path}: {len(tokens)} tokens, the header says {count}"
        ids.extend(tokens)
    return ids


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    ham, vocab_size, repeats, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    documents = [d for f in files for d in documents_of(f)]
    print(f"{len(documents)} documents, {sum(len(d.encode('utf-8', 'surrogateescape')) for d in documents)} bytes, "
          f"vocabulary {vocab_size}")
    with tempfile.TemporaryDirectory() as tmp:
        ham_out = os.path.join(tmp, "ham.json")
        ham_seconds, ham_log = ham_train(ham, files, vocab_size, ham_out)
        print(ham_log, end="")
        hf_seconds, hf = hf_train(documents, vocab_size)
        hf_merges = merges_of(json.loads(hf.to_str()))
        with open(ham_out, encoding="utf-8") as f:
            ham_merges = merges_of(json.load(f))
        same = next((i for i, (a, b) in enumerate(zip(ham_merges, hf_merges)) if a != b),
                    min(len(ham_merges), len(hf_merges)))
        print(f"merges: ham {len(ham_merges)}, Hugging Face {len(hf_merges)}; the first {same} are the same")
        if same < max(len(ham_merges), len(hf_merges)):
            print(f"  first difference at {same}: ham {ham_merges[same:same + 1]}, "
                  f"Hugging Face {hf_merges[same:same + 1]}")
        ham_tokens = int(re.search(r"encode to (\d+) tokens", ham_log).group(1))
        hf_tokens = sum(len(e.ids) for e in hf.encode_batch(documents))
        print(f"the documents encode to {ham_tokens} tokens with ham's merges, {hf_tokens} with Hugging Face's")
        subprocess.run([ham, "tokenize", "--tokenizer", ham_out, "--in", *files, "--out",
                        os.path.join(tmp, "shard")], check=True, capture_output=True)
        ham_ids = shard_ids(sorted(glob.glob(os.path.join(tmp, "shard_train_*.bin"))))
        ham_tokenizer = Tokenizer.from_file(ham_out)
        hf_ids = []
        for encoding in ham_tokenizer.encode_batch(documents):
            hf_ids += [256] + encoding.ids  # ham tokenize opens each document with <|endoftext|>
        same_ids = ham_ids == hf_ids
        print(f"ham tokenize and Hugging Face's encoder with ham's tokenizer.json: {len(ham_ids)} and "
              f"{len(hf_ids)} ids, {'identical' if same_ids else 'DIFFERENT'}")
        ratios = []
        for _ in range(repeats):
            h, _ = ham_train(ham, files, vocab_size, ham_out)
            r, _ = hf_train(documents, vocab_size)
            ratios.append(h / r)
            print(f"  ham {h:.3f} s, Hugging Face {r:.3f} s, ratio {h / r:.3f}")
        print(f"time ratio ham / Hugging Face: min {min(ratios):.3f}, median {statistics.median(ratios):.3f}, "
              f"max {max(ratios):.3f} ({repeats} repetitions, alternating)")
        agree = same == len(ham_merges) == len(hf_merges) and ham_tokens == hf_tokens and same_ids
        sys.exit(0 if agree else 1)


if __name__ == "__main__":
    main()
