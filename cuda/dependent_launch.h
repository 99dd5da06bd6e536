#pragma once
// Programmatic dependent launch (sm_90): a kernel launched with HAM_LAUNCH_DEPENDENT may
// start while the kernel ahead of it on its stream still runs, so that its blocks are
// already placed on the SMs, their launch done, when that kernel ends. Between two kernels
// of one stream the H200 left the SMs idle about 4 us (routed attention's block timelines,
// docs/gpu_runs/2026-11-29/routed_timeline.txt): 17.6 us of the backward's 354 at B4 T4096,
// 20 packed documents, rho 0.25, five kernels in a row.
//
// The contract, which the emulator checks (docs/cuda_emulator.md):
// - every thread of a dependent launch calls wait_for_earlier_kernels() before it reads or
//   writes anything the kernels ahead of it may touch, and before it exits (griddepcontrol
//   .wait: returns once the grids it depends on have ended and their writes are visible);
// - a thread calls let_later_kernels_launch() (griddepcontrol.launch_dependents: the next
//   dependent launch may start once every block of this one has called it or exited) only
//   after its wait, so that when a dependent launch starts, the kernel ahead of the one it
//   depends on has ended.
// Most of the project's kernels call both first thing (begin_dependent_kernel), so that
// nothing they read or write comes before the wait: what the launch gains is its own
// latency and the placing of its blocks. Two do work early: routed attention's wgmma dQ and
// dK/dV kernels run their block prologues (dependent loads and the first tiles' copies,
// reading only what kernels two or more launches back wrote) before their wait, under the
// tail of the kernel ahead (cuda/routed_attention.cu). Nothing is written before a wait
// but a block's own timeline stamps, whose buffer no other launch touches.
//
// Where set_dependent_launches(true) and the kernel's code on the device is sm_90 or newer
// (compute capability 9.0); elsewhere the same kernels go out as plain launches, in which
// the wait returns at once.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cuda/check.h"

#ifdef HAM_CUDA_EMULATOR
#include "cuda/emulator/simt.h"
#endif

namespace ham::cuda {

// Waits for the kernels this launch depends on (griddepcontrol.wait). A no-op in a plain
// launch, and below sm_90.
__device__ __forceinline__ void wait_for_earlier_kernels() {
#ifdef HAM_CUDA_EMULATOR
  emulator::grid_dependency_wait();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next dependent launch on this stream start (griddepcontrol.launch_dependents).
__device__ __forceinline__ void let_later_kernels_launch() {
#ifdef HAM_CUDA_EMULATOR
  emulator::grid_dependents_may_launch();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// The first statement of a kernel launched with HAM_LAUNCH_DEPENDENT that does nothing
// before its wait.
__device__ __forceinline__ void begin_dependent_kernel() {
  wait_for_earlier_kernels();
  let_later_kernels_launch();
}

// Whether HAM_LAUNCH_DEPENDENT launches may start before the kernel ahead of them ends.
// Off by default until the H200 has timed it; off, they are plain launches. Returns the
// previous setting.
bool set_dependent_launches(bool on);
// How many launches of this process went out as dependent ones.
int64_t dependent_launch_count();
// Whether the current device runs dependent launches (compute capability 9.0 or newer; the
// emulator: always).
bool dependent_launches_supported();
// Whether the launch of `kernel` on the current device goes out as a dependent one, counted
// if so: the setting, and the kernel's code there built for sm_90 or newer (the emulator:
// the setting alone).
#ifdef HAM_CUDA_EMULATOR
bool take_dependent_launch();
#else
bool take_dependent_launch(const void* kernel);
#endif

#ifndef HAM_CUDA_EMULATOR
// HAM_LAUNCH_DEPENDENT's launch on a GPU: cudaLaunchKernelEx, with the programmatic stream
// serialization attribute where take_dependent_launch().
template <class... Params>
struct DependentLaunch {
  void (*kernel)(Params...);
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;

  template <class... Args>
  void operator()(Args&&... args) const {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = take_dependent_launch(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
    HAM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  }
};
template <class... Params>
DependentLaunch<Params...> dependent_launch(dim3 grid, dim3 block, size_t shared_bytes,
                                            cudaStream_t stream, void (*kernel)(Params...)) {
  return {kernel, grid, block, shared_bytes, stream};
}
#endif

}  // namespace ham::cuda

// HAM_LAUNCH_DEPENDENT(grid, block, shared_bytes, stream, kernel)(args...): HAM_LAUNCH as a
// dependent launch. `kernel` names one function (its template arguments all given) whose
// first statement is begin_dependent_kernel(), or which keeps the contract above itself.
#ifdef HAM_CUDA_EMULATOR
#define HAM_LAUNCH_DEPENDENT(grid, block, shared_bytes, stream, ...)                          \
  HAM_EMULATED_LAUNCH((::ham::cuda::emulator::LaunchSite{#__VA_ARGS__, __FILE__, __LINE__,    \
                                                         nullptr, 0,                          \
                                                         ::ham::cuda::take_dependent_launch()}), \
                      grid, block, shared_bytes, stream, __VA_ARGS__)
#else
#define HAM_LAUNCH_DEPENDENT(grid, block, shared_bytes, stream, ...) \
  ::ham::cuda::dependent_launch(grid, block, shared_bytes, stream, __VA_ARGS__)
#endif
