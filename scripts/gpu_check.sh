#!/usr/bin/env bash
# Builds ham with the CUDA backend on a bare GPU machine (nvcc, CMake and PyTorch present;
# no Debian packages, no network) and runs the GPU tests and the GEMM benchmark against
# torch.matmul, in one go. Dependencies come from .gpu-deps/, made beforehand on a machine
# with the packages by scripts/gpu_bundle_deps.sh and carried along with the tree.
#
# Usage (from anywhere): scripts/gpu_check.sh [OUTDIR]
#   OUTDIR (default build-gpu/gpu_check) receives test.log, bench_matmul_ham.csv,
#   bench_matmul_ratio.csv and bench.log.
# Environment:
#   HAM_GPU_ARCH     CUDA architecture (default 90a, the H100/H200 with wgmma)
#   HAM_GPU_TARGETS  what to build (default: test_core test_nn test_cuda bench_matmul_cuda
#                    bench_routed_attention_cuda bench_gated_delta_rule_cuda
#                    bench_linear_cross_entropy_cuda bench_memory_bound_cuda
#                    bench_decoding_cuda test_train test_distributed)
#   HAM_GPU_TESTS    ctest -R regex of the tests to run (default: [Cc]uda|Gpu|GPU)
#   HAM_GPU_TEST_RUNS  runs of each selected test, stopping at a failure (default 2)
#   HAM_GPU_SKIP_BENCH=1  tests only
#   HAM_GPU_BUILD    build directory (default build-gpu)
#   HAM_GPU_PREBUILT=1  use HAM_GPU_BUILD as it is, built elsewhere for sm_$HAM_GPU_ARCH
#                    (no configure or build here: device time goes to tests and benchmarks).
#                    Made on a machine with nvcc by scripts/gpu_prebuild.sh, whose packed
#                    slim copy (.gpu-prebuilt/BUILD.tar.xz, carried) is unpacked here when
#                    BUILD is missing or of other sources: it must be built from this
#                    tree's (its ham_source_stamp, scripts/source_stamp.sh's here), else
#                    the script fails. Its CTest files name the source
#                    tree and build directory it was made in; the script links those paths
#                    here when they are free.
#   HAM_GPU_BENCH    which benchmarks, of: gemm memory lce decode gdr fla routed timeline
#                    profile sanitize diagnose cli goals
#                    (default: all but fla, sanitize, diagnose, cli and goals; goals = #8's
#                    open goals, routed attention's first table at B4 T4096 under the
#                    defaults and under HAM_GPU_GOALS_SET's kernel settings (goals() below),
#                    against PyTorch's once, then the persistent tables; cli = `ham train`
#                    and `ham compare` on the GPU (the ham target), tiny and paper-sized
#                    models, with their logs and the comparison's report; fla = gdr's bf16 cases with
#                    flash-linear-attention beside it, whose first run autotunes for over
#                    8 minutes: give it a call of its own, e.g. HAM_GPU_BENCH=fla with
#                    HAM_GPU_TESTS=NONE; profile = per-kernel
#                    times of one gated delta rule and one dense attention case under ncu;
#                    sanitize = compute-sanitizer's racecheck, synccheck and memcheck over
#                    small GPU test cases of the hand-written tensor-core kernels, up to
#                    2 to 2.5 minutes a run: e.g. HAM_GPU_BENCH=sanitize HAM_GPU_TESTS=NONE;
#                    diagnose = ncu's speed-of-light, occupancy, warp-stall and source
#                    (the stalls' top SASS lines) sections of one launch of each of the
#                    slowest hand-written kernels, or of those HAM_GPU_DIAGNOSE names
#                    (e.g. "gdr_prepare_mma gdr_state_mma", or KERNEL:FILTER for one
#                    of a kernel's cases); timeline = where the routed
#                    attention kernels' blocks spend their time, from their own clock
#                    stamps (bench_routed_attention_cuda --timeline), into
#                    routed_timeline.txt, and every block's stamps of the B4 T4096
#                    cases into routed_timeline_blocks.csv, then the gated delta rule's
#                    tensor-core passes (bench_gated_delta_rule_cuda --timeline) into
#                    gdr_timeline.txt; lce times bf16 only unless
#                    HAM_GPU_LCE_ALL=1)
# Exit status: 0 when every selected test passed (none skipped: on a GPU machine a skip
# means the GPU was unusable) and the benchmark ran.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
root=$(pwd)
out=${1:-build-gpu/gpu_check}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${HAM_GPU_BUILD:-build-gpu}
arch=${HAM_GPU_ARCH:-90a}
targets=${HAM_GPU_TARGETS:-test_core test_nn test_cuda test_train test_distributed bench_matmul_cuda bench_routed_attention_cuda bench_gated_delta_rule_cuda bench_linear_cross_entropy_cuda bench_memory_bound_cuda bench_decoding_cuda}
tests=${HAM_GPU_TESTS:-[Cc]uda|Gpu|GPU}

fail() { echo "gpu_check: $*" >&2; exit 1; }
[[ -d /usr/local/cuda/bin ]] && export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || fail "nvcc not found (looked on PATH and in /usr/local/cuda/bin)"
command -v cmake >/dev/null || fail "cmake not found"
[[ -f .gpu-deps/include/Eigen/Core ]] ||
  fail "no .gpu-deps/: run scripts/gpu_bundle_deps.sh on a machine with the packages and carry .gpu-deps"
echo "== machine"
nvidia-smi -L 2>&1 || true
nvcc --version | tail -1
cmake --version | head -1
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 || true
# flash-linear-attention from the carried wheels, installed into the build tree (no network).
if compgen -G ".gpu-deps/wheels/*.whl" >/dev/null; then
  python3 -m pip install --quiet --no-deps --no-index --target "$root/build-gpu/pylib" \
    .gpu-deps/wheels/*.whl 2>&1 | tail -2 || true
  export PYTHONPATH="$root/build-gpu/pylib${PYTHONPATH:+:$PYTHONPATH}"
fi

# NCCL: the toolkit's, else the nvidia-nccl wheel that PyTorch installs (its prefix has
# include/nccl.h and lib/libnccl.so.2).
nccl_root=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.dirname(n.__file__) if n.__file__ else list(n.__path__)[0])' 2>/dev/null || true)
echo "nccl: ${nccl_root:-toolkit only}"

if [[ ${HAM_GPU_PREBUILT:-0} == 1 ]]; then
  stamp=$(scripts/source_stamp.sh)
  # An unpacked copy left by an earlier call of other sources gives way to the carried one.
  if [[ -f .gpu-prebuilt/$build.tar.xz ]] &&
     [[ ! -d $build || $(cat "$build/ham_source_stamp" 2>/dev/null) != "$stamp" ]]; then
    rm -rf "$build"
    tar -xJf ".gpu-prebuilt/$build.tar.xz" || fail "cannot unpack .gpu-prebuilt/$build.tar.xz"
  fi
  [[ -f $build/CMakeCache.txt ]] || fail "HAM_GPU_PREBUILT=1 but $build has no CMakeCache.txt"
  [[ $(cat "$build/ham_source_stamp" 2>/dev/null) == "$stamp" ]] ||
    fail "$build was not built from this tree's sources (its ham_source_stamp is not" \
      "scripts/source_stamp.sh's): rerun scripts/gpu_prebuild.sh and carry .gpu-prebuilt"
  built_in=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
  if [[ $built_in != "$root" && ! -e $built_in ]]; then
    mkdir -p "$(dirname "$built_in")" && ln -s "$root" "$built_in" ||
      fail "cannot link $built_in (where $build was configured) to $root"
  fi
  [[ $(cd "$built_in" && pwd -P) == $(pwd -P) ]] ||
    fail "$build was configured in $built_in, which is another tree"
  # A slim copy (gpu_prebuild's BUILD-carry) stands in for the directory it was made from.
  built_at=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "$build/CMakeCache.txt")
  [[ -e $built_at ]] || ln -s "$(cd "$build" && pwd)" "$built_at" ||
    fail "cannot link $built_at (the build's own path) to $build"
  # NCCL at run time: the library the build linked may live elsewhere here.
  [[ -n $nccl_root ]] && export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== prebuilt $build (configured in $built_in)"
else
  generator=(-G Ninja)
  command -v ninja >/dev/null || generator=(-G "Unix Makefiles")

  echo "== configure ($build, sm_$arch)"
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DHAM_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DHAM_DEPS_PREFIX="$root/.gpu-deps" -DHAM_ICU=OFF \
    -DHAM_NCCL_ROOT="$nccl_root" -DHAM_CUDA_EMULATOR=OFF \
    -DHAM_BUILD_TESTS=ON -DHAM_BUILD_BENCH=ON >"$out/configure.log" 2>&1 ||
    { tail -40 "$out/configure.log"; fail "configure failed (log: $out/configure.log)"; }

  echo "== [$(date +%T)] build: $targets"
  # shellcheck disable=SC2086
  # Keep going past a failing file, so that one run shows every compile error.
  keep_going=(-k); [[ ${generator[1]} == Ninja ]] && keep_going=(-k 0)
  cmake --build "$build" -j "$(nproc)" --target $targets -- "${keep_going[@]}" >"$out/build.log" 2>&1 ||
    { grep -E 'error' "$out/build.log" | sort -u | head -80; fail "build failed (log: $out/build.log)"; }
fi

echo "== [$(date +%T)] tests (ctest -R '$tests')"
status=0
# Left out, as they are no GPU tests: CudaRequestWithoutBackend... (skips by design where
# the backend exists), ...UnderAddressSanitizer (skips outside an AddressSanitizer build) and
# build.* (builds this tree's other targets with the host's cmake, which the prebuilt
# build's CTest files name by its path on the machine it was built on).
OMP_NUM_THREADS=4 ctest --test-dir "$build" -R "$tests" \
  -E 'CudaRequestWithoutBackend|UnderAddressSanitizer|^build\.' \
  --repeat "until-fail:${HAM_GPU_TEST_RUNS:-2}" \
  --output-on-failure -j 4 2>&1 | tee "$out/test.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
# A regex matching nothing fails, unless asked for (HAM_GPU_TESTS=NONE: benchmarks only).
if [[ $tests != NONE ]] && grep -q 'No tests were found' "$out/test.log"; then
  echo "gpu_check: no test matches '$tests' in $build" >&2
  status=1
fi
if grep -q -E 'Skipped|\*\*\*Not Run' "$out/test.log"; then
  echo "gpu_check: some GPU tests were skipped: the GPU is not usable from this build" >&2
  grep -E 'Skipped|Not Run' "$out/test.log" | head -20 >&2
  status=1
fi

# bench TITLE NAME [REFERENCE [ARGS...]]: runs build-gpu/bench/NAME (CSV in OUT/NAME.csv), then the
# Python REFERENCE on that CSV, which times PyTorch's or FLA's kernels on the same shapes in
# this session and writes the ratios to OUT/NAME_ratio.csv. A reference that exits 2 has no
# library to compare with here (not a failure: ham's times stand alone).
bench() {
  local title="$1" name="$2" reference="${3:-}" reference_args=("${@:4}")
  echo "== [$(date +%T)] $title"
  # shellcheck disable=SC2086  # HAM_ARGS: extra arguments of the ham benchmark, word-split
  if ! "$build/bench/$name" --csv "$out/$name.csv" ${HAM_ARGS:-} 2>&1 | tee -a "$out/bench.log"; then
    echo "gpu_check: $name failed" >&2
    status=1
    return
  fi
  [[ -n $reference ]] || return
  python3 "$reference" "$out/$name.csv" --out "$out/${name}_ratio.csv" "${reference_args[@]}" 2>&1 |
    tee -a "$out/bench.log"
  local rc=${PIPESTATUS[0]}
  if [[ $rc -eq 2 ]]; then
    echo "gpu_check: $reference has no reference library here: ham's times only" >&2
  elif [[ $rc -ne 0 ]]; then
    echo "gpu_check: $reference failed" >&2
    status=1
  fi
}

# profile NAME ARGS...: each kernel's time in one run of build-gpu/bench/NAME under Nsight
# Compute (clocks left as they are), summed per kernel name into OUT/NAME[_FILTER]_kernels.txt
# (FILTER: the value of a --filter argument, so that two cases of one benchmark keep apart).
profile() {
  local name="$1"; shift
  local stem=$name arg previous=""
  for arg in "$@"; do
    [[ $previous == --filter ]] && stem+="_${arg//[^A-Za-z0-9_]/_}"
    previous=$arg
  done
  echo "== [$(date +%T)] kernel times of $name $* (ncu)"
  if ! command -v ncu >/dev/null; then
    echo "gpu_check: no ncu here: no kernel profile" >&2
    return
  fi
  ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    "$build/bench/$name" "$@" >"$out/${stem}_ncu.csv" 2>"$out/${stem}_ncu.log" ||
    { echo "gpu_check: ncu on $name failed (log: $out/${stem}_ncu.log)" >&2; return; }
  python3 - "$out/${stem}_ncu.csv" <<'PY' | tee "$out/${stem}_kernels.txt"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
name_at, value_at = head.index("Kernel Name"), head.index("Metric Value")
unit_at = head.index("Metric Unit")
total, count = collections.Counter(), collections.Counter()
for r in rows[1:]:
    scale = {"ns": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0,
             "nsecond": 1e-6, "s": 1e3, "second": 1e3}.get(r[unit_at], float("nan"))
    kernel = r[name_at].split("(")[0][:90]
    total[kernel] += float(r[value_at].replace(",", "")) * scale
    count[kernel] += 1
grand = sum(total.values())
print(f"{'ms':>9s} {'share':>6s} {'calls':>5s}  kernel (all calls of the run)")
for kernel, ms in total.most_common():
    print(f"{ms:9.3f} {ms / grand:6.1%} {count[kernel]:5d}  {kernel}")
print(f"{grand:9.3f} total")
PY
}

# diagnose NAME KERNEL_REGEX ARGS...: Nsight Compute's speed-of-light, occupancy, launch,
# warp-stall and source-counter sections for the first launch of the kernels matching
# KERNEL_REGEX in a run of build-gpu/bench/NAME ARGS (clocks left as they are), into
# OUT/diagnose_KERNEL[_FILTER].txt (FILTER as for profile), with the report (.ncu-rep) and
# its SASS with the stall samples of each instruction (_sass.csv), which say which lines of
# a kernel its warps wait on.
diagnose() {
  local name="$1" kernel="$2"; shift 2
  local stem="$out/diagnose_${kernel//[^A-Za-z0-9_]/_}" arg previous="" filter=""
  for arg in "$@"; do
    [[ $previous == --filter ]] && stem+="_${arg//[^A-Za-z0-9_]/_}" && filter=$arg
    previous=$arg
  done
  # HAM_GPU_DIAGNOSE names a kernel (all its cases) or KERNEL:FILTER (that case alone)
  [[ -z ${HAM_GPU_DIAGNOSE:-} || " $HAM_GPU_DIAGNOSE " == *" $kernel "* ||
     " $HAM_GPU_DIAGNOSE " == *" $kernel:$filter "* ]] || return 0
  local file="$stem.txt"
  echo "== [$(date +%T)] ncu sections of $kernel in $name $*"
  if ! command -v ncu >/dev/null; then
    echo "gpu_check: no ncu here: no diagnosis" >&2
    return
  fi
  if ! timeout 150 ncu --clock-control none -k "regex:$kernel" -c 1 --section SpeedOfLight \
    --section LaunchStats --section Occupancy --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SourceCounters -f -o "$stem" \
    "$build/bench/$name" "$@" >"$stem.log" 2>&1; then
    echo "gpu_check: ncu on $kernel failed (log: $stem.log)" >&2
    return
  fi
  ncu -i "$stem.ncu-rep" --page details >"$file" 2>&1
  ncu -i "$stem.ncu-rep" --page source --csv --print-source sass >"${stem}_sass.csv" 2>&1 ||
    echo "gpu_check: no SASS page for $kernel (see ${stem}_sass.csv)" >&2
  grep -E 'SM Frequency|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Registers Per|Shared Memory Config|Dynamic Shared|Block Limit|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Grid Size|Stall|OPT|Waves' "$file" | head -40
}

# sanitize: compute-sanitizer's racecheck, synccheck and memcheck over small GPU test
# cases of the tensor-core kernels and the fused rms_norm backward. The SIMT emulator runs
# their barriers and cp.async as a model; this checks them on the hardware. A runtime that
# refuses the sanitizer (gVisor: "Device not supported") is reported, not failed.
sanitize() {
  # racecheck runs the attention and small cases apart from the gated delta rule's: under it
  # the K = 256 shape alone took 92 s on the H200, and a 120 s limit over all of them once
  # ended before the attention cases ran.
  local attention='RoutedAttentionGpu.Bf16BackwardWithWgmmaMatchesCpu'
  attention+=':Cases/RoutedAttentionGpu.GpuMatchesCpu/B2_T300_H4x2_D64x64_rho25_p_DocRuns_FirstEmpty'
  attention+=':Cases/RoutedAttentionGpu.GpuMatchesCpu/B1_T700_H4x2_D128x192_rho25_p_Packed20_FirstEmpty'
  attention+=':Cases/RoutedAttentionGpu.GpuMatchesCpu/B1_T170_H2x1_D256x192_rho25_p_DocRuns_FirstEmpty'
  attention+=':Norm.GpuBackwardRowGroupsMatchCpu'
  attention+=':Shapes/GatedDeltaRuleDecodeGpu.GpuMatchesCpu/3'
  attention+=':Shapes/RoutedAttentionDecodeCases.GpuMatchesCpu/1'
  local gdr='Shapes/GatedDeltaRuleGpu.GpuMatchesCpuForwardAndBackward/2'
  gdr+=':Shapes/GatedDeltaRuleGpu.GpuMatchesCpuForwardAndBackward/8'
  gdr+=':Shapes/GatedDeltaRuleGpu.GpuMatchesCpuForwardAndBackward/5'
  # The wgmma kernels (the forward; both passes at the paper's 128 x 192 heads and
  # at 256 x 256, in 32-row tiles; the dQ kernel in 32-key tiles), racechecked last: a run cut short by the stage's
  # deadline loses these first.
  local wgmma='RoutedAttentionGpu.Bf16ForwardWithWgmmaMatchesCpu'
  wgmma+=':RoutedAttentionGpu.Bf16BackwardWithWgmmaMatchesCpuAtWideHeads'
  wgmma+=':RoutedAttentionGpu.Bf16ForwardWithWgmmaMatchesCpuAtWideHeads'
  wgmma+=':RoutedAttentionGpu.Bf16BackwardWithWgmmaDqIn32KeyTilesMatchesCpu'
  if ! command -v compute-sanitizer >/dev/null; then
    echo "gpu_check: no compute-sanitizer here: no sanitizer run" >&2
    return
  fi
  local run tool filter name seconds rc log
  for run in "racecheck attention 120" "racecheck gdr 150" "synccheck all 120" \
             "memcheck all 120" "racecheck wgmma 120"; do
    read -r tool name seconds <<<"$run"
    case $name in
      attention) filter=$attention ;;
      gdr) filter=$gdr ;;
      wgmma) filter=$wgmma ;;
      all) filter="$attention:$gdr" ;;
    esac
    log="$out/sanitize_${tool}_$name.log"
    echo "== [$(date +%T)] compute-sanitizer --tool $tool, small GPU test cases ($name)"
    timeout "$seconds" compute-sanitizer --tool "$tool" --error-exitcode 3 \
      "$build/tests/test_nn" --gtest_filter="$filter" >"$log" 2>&1
    rc=$?
    tail -4 "$log"
    if [[ $rc -eq 3 ]]; then
      echo "gpu_check: compute-sanitizer $tool found errors (log: $log)" >&2
      status=1
    elif [[ $rc -ne 0 ]]; then
      echo "gpu_check: compute-sanitizer $tool did not finish (exit $rc; log: $log)" >&2
    fi
  done
}

# cli_logs_have LOG TEXT...: each TEXT is in LOG, else the stage fails naming it.
cli_logs_have() {
  local log=$1 text; shift
  tail -4 "$log"
  for text in "$@"; do
    grep -qF -- "$text" "$log" || { echo "gpu_check: no '$text' in $log" >&2; status=1; }
  done
}

# cli_paper_run FAMILY: `ham train` of configs/paper/FAMILY.json on the GPU, 6 steps of 4096
# tokens, with cli's $ham; steps 2 and 3 profiled (each op's time by CUDA events, a table
# by phase and op in the log), steps 4 to 6 not.
cli_paper_run() {
  local log="$out/cli_train_paper_$1.log"
  echo "== [$(date +%T)] ham train: configs/paper/$1.json, cuda, bf16, B1 T4096, 6 steps"
  timeout 75 "$ham" train --config "configs/paper/$1.json" --device cuda \
    --precision bf16 --steps 6 --batch-size 1 --seq-len 4096 --warmup 1 --log-every 1 \
    --eval-every 1000 --set train.eval_batches=1 --profile 2 >"$log" 2>&1
  cli_logs_have "$log" "GEMM peak" "done: training loss"
}

# cli: the training commands on the GPU as a user runs them, each under its own time limit:
# `ham train` of the tiny HAM in bf16 with the kernels tuned by default; the paper-sized
# HAM (configs/paper, 0.8B parameters) for 6 steps of 4096 tokens, for its tokens/s and
# MFU against the GPU's measured GEMM peak; `ham compare` of the four tiny families with
# "device": "cuda" in two jobs at once (--no-plots: the GPU machine has no gnuplot); then
# the other paper-sized families as the HAM.
cli() {
  local ham="$build/ham" log family
  [[ -x $ham ]] || { echo "gpu_check: no $ham (build the ham target)" >&2; status=1; return; }
  log="$out/cli_train_tiny_ham.log"
  echo "== [$(date +%T)] ham train: tiny HAM, cuda, bf16, kernels tuned by default"
  timeout 60 "$ham" train --config configs/tiny/ham-fixed-tau.json --device cuda \
    --precision bf16 --steps 200 --batch-size 8 --seq-len 256 --log-every 50 \
    --eval-every 100 >"$log" 2>&1
  cli_logs_have "$log" "kernel: autotune off -> on" "GEMM peak" "done: training loss"
  cli_paper_run ham-fixed-tau
  local spec="$out/compare_cuda.json"
  cat >"$spec" <<SPEC
{
  "runs": {"transformer": "$root/configs/tiny/transformer.json",
           "gdn": "$root/configs/tiny/gdn.json",
           "gdn-gsa": "$root/configs/tiny/gdn-gsa.json",
           "ham": "$root/configs/tiny/ham-fixed-tau.json"},
  "train": {"steps": 100, "batch_size": 8, "seq_len": 256, "log_every": 50, "device": "cuda",
            "precision": "bf16", "mix_mqar": 1, "mqar_pairs": 8},
  "eval": {"perplexity": false, "mqar_lengths": [256], "mqar_pairs": 8, "samples": 64,
           "batch_size": 16}
}
SPEC
  # Its checkpoints stay behind (tens of MB: the results must come back in 16 MiB); the
  # report and each run's logs come along.
  local runs
  runs=$(mktemp -d)
  log="$out/cli_compare_cuda.log"
  echo "== [$(date +%T)] ham compare: four tiny families, cuda, bf16, --jobs 2"
  timeout 120 "$ham" compare "$spec" --out "$runs" --jobs 2 --threads 4 --no-plots \
    >"$log" 2>&1
  cli_logs_have "$log" "report:"
  mkdir -p "$out/compare_cuda"
  (cd "$runs" && find . -name '*.md' -o -name '*.json' -o -name '*.log' -o -name '*.jsonl' |
     grep -v '/step-' | tar -cf - -T -) | tar -C "$out/compare_cuda" -xf -
  for family in transformer gdn gdn-gsa; do cli_paper_run "$family"; done
}

# goals: #8's open goals in one go. The first table of bench_routed_attention_cuda, at B4
# T4096 (dense and rho 0.05 to 0.5, one document and 20) and at B1 T16384 with 20
# documents and rho 0.25 (the two cases short against FlexAttention), twice: under the
# defaults, and under the kernel settings of HAM_GPU_GOALS_SET (--set; default: the three
# persistent kernels, forward, dQ and dK/dV, and dependent launches, none of them a default
# until timed). Each run prints time / (rho x dense time) under its own settings; the
# defaults' run also times each case's passes with kernel.autotune on, whose choice lines
# give every combination's time, the persistent forward and dQ kernels among them (each
# checked equal to the defaults' outputs to the bit; the dK/dV one is not among the
# tuner's combinations). Then PyTorch's side once, against both (--also). Into
# goals_defaults.csv, goals_set.csv, goals_ratio.csv, goals.log.
# Last, for whether a persistent kernel can be a default: each against the kernel of a
# block a tile over every case they take (--part persistent, 18 cases each, the dK/dV
# kernel's last; a stage cut at its limit loses only this part).
goals() {
  local program="$build/bench/bench_routed_attention_cuda" setting sets=() rc
  local cases="T4096_B4|T16384_B1_H16x16_D128_rho25_docs20"
  local settings="kernel.attention_forward_persistent=-1 kernel.attention_backward_dq_persistent=-1"
  settings+=" kernel.attention_backward_dkdv_persistent=-1"
  settings=${HAM_GPU_GOALS_SET:-"$settings kernel.dependent_launches=on"}
  for setting in $settings; do sets+=(--set "$setting"); done
  echo "== [$(date +%T)] #8's goals: routed attention's first table at B4 T4096 and more, defaults"
  "$program" --part main --filter "$cases" --csv "$out/goals_defaults.csv" 2>&1 |
    tee -a "$out/goals.log"
  rc=${PIPESTATUS[0]}
  ((rc == 0)) || { echo "gpu_check: goals: the defaults' run failed" >&2; status=1; return; }
  echo "== [$(date +%T)] #8's goals: the same under $settings"
  "$program" --part main --filter "$cases" "${sets[@]}" --csv "$out/goals_set.csv" 2>&1 |
    tee -a "$out/goals.log"
  rc=${PIPESTATUS[0]}
  ((rc == 0)) || { echo "gpu_check: goals: the run under --set failed" >&2; status=1; return; }
  echo "== [$(date +%T)] #8's goals: SDPA flash and FlexAttention against both"
  python3 bench/bench_routed_attention_torch.py "$out/goals_defaults.csv" \
    --also "$out/goals_set.csv" --out "$out/goals_ratio.csv" 2>&1 | tee -a "$out/goals.log"
  rc=${PIPESTATUS[0]}
  ((rc == 0)) || { echo "gpu_check: goals: the reference failed (exit $rc)" >&2; status=1; }
  echo "== [$(date +%T)] #8's goals: the persistent kernels against a block a tile, every case"
  "$program" --part persistent 2>&1 | tee -a "$out/goals.log"
  rc=${PIPESTATUS[0]}
  ((rc == 0)) || { echo "gpu_check: goals: the persistent tables failed" >&2; status=1; }
}

# HAM_GPU_BENCH (see the top): default all but fla, sanitize and diagnose.
benches=" ${HAM_GPU_BENCH:-gemm memory lce decode gdr routed timeline profile} "
if [[ ${HAM_GPU_SKIP_BENCH:-0} != 1 ]]; then
  [[ $benches == *" sanitize "* ]] && sanitize
  if [[ $benches == *" diagnose "* ]]; then
    # The wgmma kernels (the backward's by default, the forward's in the benchmark's last
    # table), then the backward's largest kernels (the ninth session's profile), the decode
    # last.
    diagnose bench_routed_attention_cuda backward_dkdv_wgmma --reps 1 \
      --filter T16384_B1_H16x16_D128_rho100_docs1
    diagnose bench_routed_attention_cuda backward_dq_wgmma --reps 1 \
      --filter T16384_B1_H16x16_D128_rho100_docs1
    diagnose bench_routed_attention_cuda forward_wgmma --reps 1 \
      --filter T16384_B1_H16x16_D128_rho100_docs1
    diagnose bench_gated_delta_rule_cuda gdr_bwd_keys_mma --reps 1 --filter T4096_H16_D128_bf16
    # the state passes where they weigh most: B = 2, T = 16384, 32 columns (#7's unmet case)
    diagnose bench_gated_delta_rule_cuda gdr_bwd_state_mma --reps 1 --filter T16384_H16_D128_bf16
    diagnose bench_gated_delta_rule_cuda gdr_state_mma --reps 1 --filter T16384_H16_D128_bf16
    # the paper's heads at 16384 tokens (1.10x FLA's forward, thirty-sixth session): 60 blocks
    # of 32 columns, one an SM
    diagnose bench_gated_delta_rule_cuda gdr_state_mma --reps 1 --filter T16384_H5_K256_V384_bf16
    diagnose bench_gated_delta_rule_cuda gdr_output_mma --reps 1 --filter T16384_H5_K256_V384_bf16
    diagnose bench_gated_delta_rule_cuda gdr_prepare_mma --reps 1 \
      --filter T16384_H5_K256_V384_bf16
    diagnose bench_gated_delta_rule_cuda gdr_output_mma --reps 1 --filter T4096_H16_D128_bf16
    diagnose bench_gated_delta_rule_cuda gdr_prepare_mma --reps 1 --filter T4096_H16_D128_bf16
    diagnose bench_gated_delta_rule_cuda gdr_bwd_values_mma --reps 1 --filter T4096_H16_D128_bf16
    diagnose bench_gated_delta_rule_cuda gdr_bwd_wy_mma --reps 1 --filter T4096_H16_D128_bf16
    diagnose bench_routed_attention_cuda forward_mma --reps 1 \
      --filter T16384_B1_H16x16_D128_rho100_docs1
    diagnose bench_routed_attention_cuda backward_dkdv_mma --reps 1 \
      --filter T16384_B1_H16x16_D128_rho100_docs1
    diagnose bench_routed_attention_cuda backward_dq_mma --reps 1 \
      --filter T16384_B1_H16x16_D128_rho100_docs1
    diagnose bench_decoding_cuda decode_kernel --reps 1 --filter attn_B1_H16x16_L16384
    # B = 4, T = 4096 with 20 documents at rho 0.5: blocks of one or two key tiles, where a
    # block's fixed cost (about 15 us, docs/gpu_results.md, seventeenth session) dominates;
    # the stall samples say where its blocks wait.
    diagnose bench_routed_attention_cuda forward_mma --reps 1 \
      --filter T4096_B4_H16x16_D128_rho50_docs20
    # 20 documents at rho 0.25, where the dQ kernel's prologue is about 60% of it (block
    # timelines, thirty-sixth session): which of its reads its warps wait on
    diagnose bench_routed_attention_cuda backward_dq_wgmma --reps 1 \
      --filter T16384_B1_H16x16_D128_rho25_docs20
    diagnose bench_routed_attention_cuda backward_dkdv_wgmma --reps 1 \
      --filter T16384_B1_H16x16_D128_rho25_docs20
  fi
  # The hand-written kernels of the two hard ops first, then the rest of the backend.
  if [[ $benches == *" fla "* ]]; then
    # bf16 only: the comparison's dtype (gdr times ham's f32 too); FLA's kernel times a
    # pass beside it, against ham's in the profile and timeline stages
    HAM_ARGS="--filter _bf16 ${HAM_ARGS:-}" \
      bench "gated delta rule: ham vs flash-linear-attention chunk_gated_delta_rule" \
      bench_gated_delta_rule_cuda bench/bench_gated_delta_rule_fla.py --dtype bf16 --kernels
  elif [[ $benches == *" gdr "* ]]; then
    bench "gated delta rule: ham alone (HAM_GPU_BENCH=fla adds FLA)" bench_gated_delta_rule_cuda
  fi
  if [[ $benches == *" profile "* ]]; then
    profile bench_gated_delta_rule_cuda --reps 1 --filter T4096_H16_D128_bf16
    profile bench_gated_delta_rule_cuda --reps 1 --filter T4096_H5_K256_V384_bf16
    # the paper's heads at 16384 tokens: 1.10x FLA's forward, 1.07x its backward (thirty-sixth
    # session), where the state passes have 60 blocks of 32 columns for 132 SMs
    profile bench_gated_delta_rule_cuda --reps 1 --filter T16384_H5_K256_V384_bf16
    # the case furthest from FLA in the ninth session (1.19x forward, 1.55x backward)
    profile bench_gated_delta_rule_cuda --reps 1 --filter T16384_H16_D128_bf16
    # 20 packed documents (1.49x FLA's backward in the ninth session; not profiled since)
    profile bench_gated_delta_rule_cuda --reps 1 --filter T16384_docs20_bf16
    # Routed attention's first table only (--part main): its default kernels, not the
    # variants the later tables time, which made the profile's sums mix both.
    profile bench_routed_attention_cuda --reps 1 --part main \
      --filter T16384_B1_H16x16_D128_rho100_docs1
    # the paper's HAM heads (q/k 128, v 192) at its KV target
    profile bench_routed_attention_cuda --reps 1 --part main \
      --filter T16384_B1_H10x10_D128x192_rho50_docs1
    # B = 4, T = 4096, rho 0.25 and dense: the kernels' own times for the goal time <= 1.2
    # rho dense, not met there (docs/gpu_results.md, seventeenth session)
    profile bench_routed_attention_cuda --reps 1 --part main \
      --filter T4096_B4_H16x16_D128_rho25_docs1
    profile bench_routed_attention_cuda --reps 1 --part main \
      --filter T4096_B4_H16x16_D128_rho100_docs1
    # 20 packed documents at rho 0.25, where the backward falls short of FlexAttention's
    # (flex/ham 2.22 against the goal of 3, twentieth session): which of its kernels weigh
    profile bench_routed_attention_cuda --reps 1 --part main \
      --filter T16384_B1_H16x16_D128_rho25_docs20
  fi
  if [[ $benches == *" timeline "* ]]; then
    echo "== [$(date +%T)] routed attention: block timelines (bench_routed_attention_cuda" \
      "--timeline)"
    "$build/bench/bench_routed_attention_cuda" --timeline 2>&1 | tee "$out/routed_timeline.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] ||
      { echo "gpu_check: bench_routed_attention_cuda --timeline failed" >&2; status=1; }
    echo "== [$(date +%T)] gated delta rule: block timelines (bench_gated_delta_rule_cuda" \
      "--timeline)"
    "$build/bench/bench_gated_delta_rule_cuda" --timeline 2>&1 | tee "$out/gdr_timeline.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] ||
      { echo "gpu_check: bench_gated_delta_rule_cuda --timeline failed" >&2; status=1; }
    # Every block's stamps of the B4 T4096 cases alone (about 12 MB): with all 23 cases the
    # file would take about 40 MB, and the session's results must come back in 16 MiB.
    "$build/bench/bench_routed_attention_cuda" --timeline --reps 1 --filter T4096_B4 \
      --csv "$out/routed_timeline_blocks.csv" > /dev/null ||
      { echo "gpu_check: bench_routed_attention_cuda --timeline --csv failed" >&2; status=1; }
  fi
  if [[ $benches == *" routed "* ]]; then
    # The first table and the reference against it, then ham's variant tables, so that a
    # stage stopped at its deadline has lost variants, not the comparison.
    HAM_ARGS="--part main ${HAM_ARGS:-}" \
      bench "routed attention: ham vs SDPA flash and FlexAttention" bench_routed_attention_cuda \
      bench/bench_routed_attention_torch.py
    # (--part variants writes no CSV: the first table's stays.)
    HAM_ARGS="--part variants ${HAM_ARGS:-}" \
      bench "routed attention: ham's variants against each other" bench_routed_attention_cuda
  fi
  [[ $benches == *" decode "* ]] &&
    bench "decoding: one token, GB/s against the copy; vs FLA fused_recurrent and torch SDPA" \
      bench_decoding_cuda bench/bench_decoding_torch.py
  [[ $benches == *" gemm "* ]] &&
    bench "GEMM: ham (cuBLASLt) vs torch.matmul" bench_matmul_cuda bench/bench_matmul_torch.py
  [[ $benches == *" memory "* ]] &&
    bench "memory-bound kernels: GB/s against the device-to-device copy (target >= 70%)" \
      bench_memory_bound_cuda
  # bf16 only unless HAM_GPU_LCE_ALL=1: the tf32 and f32 rows took over a minute on the H200.
  lce_args="--filter bf16"
  [[ ${HAM_GPU_LCE_ALL:-0} == 1 ]] && lce_args=""
  [[ $benches == *" lce "* ]] &&
    HAM_ARGS=$lce_args bench "linear cross-entropy: ham fused vs F.cross_entropy(h @ W.T, t)" \
      bench_linear_cross_entropy_cuda bench/bench_linear_cross_entropy_torch.py
  [[ $benches == *" cli "* ]] && cli
  [[ $benches == *" goals "* ]] && goals
fi

echo "== gpu_check: $([[ $status -eq 0 ]] && echo PASSED || echo FAILED) (logs in $out)"
exit "$status"
