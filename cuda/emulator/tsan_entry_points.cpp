// The calls GCC's -fsanitize=thread instrumentation makes, taken by the SIMT emulator's
// racecheck (racecheck.h) instead of ThreadSanitizer's runtime, which is not linked: each
// load and store goes to instrumented_access, which looks only at shared memory inside a
// kernel; the atomics are done here (the instrumentation turns them into calls), seq_cst.
// This file itself must not be instrumented (CMakeLists.txt), and no build that links
// ThreadSanitizer may link it.
#include <cstddef>
#include <cstdint>

#include "cuda/emulator/racecheck.h"
#include "cuda/emulator/simt.h"

#if defined(__SANITIZE_THREAD__)
#error "tsan_entry_points.cpp is the instrumentation's runtime; it must not be instrumented"
#endif

namespace {
using ham::cuda::emulator::instrumented_access;
}

#define HAM_TSAN_ACCESS(bytes)                                                       \
  extern "C" void __tsan_read##bytes(void* address) {                                \
    instrumented_access(address, bytes, false, __builtin_return_address(0));         \
  }                                                                                  \
  extern "C" void __tsan_write##bytes(void* address) {                               \
    instrumented_access(address, bytes, true, __builtin_return_address(0));          \
  }                                                                                  \
  extern "C" void __tsan_unaligned_read##bytes(void* address) {                      \
    instrumented_access(address, bytes, false, __builtin_return_address(0));         \
  }                                                                                  \
  extern "C" void __tsan_unaligned_write##bytes(void* address) {                     \
    instrumented_access(address, bytes, true, __builtin_return_address(0));          \
  }
HAM_TSAN_ACCESS(1)
HAM_TSAN_ACCESS(2)
HAM_TSAN_ACCESS(4)
HAM_TSAN_ACCESS(8)
HAM_TSAN_ACCESS(16)
#undef HAM_TSAN_ACCESS

extern "C" void __tsan_read_range(void* address, size_t bytes) {
  instrumented_access(address, bytes, false, __builtin_return_address(0));
}
extern "C" void __tsan_write_range(void* address, size_t bytes) {
  instrumented_access(address, bytes, true, __builtin_return_address(0));
}
extern "C" void __tsan_vptr_update(void** vptr, void*) {
  instrumented_access(vptr, sizeof *vptr, true, __builtin_return_address(0));
}
extern "C" void __tsan_vptr_read(void** vptr) {
  instrumented_access(vptr, sizeof *vptr, false, __builtin_return_address(0));
}
// Each instrumented object's constructor calls this: the racecheck has something to check.
extern "C" void __tsan_init() { ham::cuda::emulator::turn_racecheck_on(); }
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}

// The atomics, by size: what the instrumented code asked for, done in full order.
#define HAM_TSAN_FETCH(bits, type, op)                                                   \
  extern "C" type __tsan_atomic##bits##_fetch_##op(volatile type* a, type v, int) {      \
    return __atomic_fetch_##op(a, v, __ATOMIC_SEQ_CST);                                  \
  }
#define HAM_TSAN_COMPARE_EXCHANGE(bits, type, kind, weak)                                \
  extern "C" int __tsan_atomic##bits##_compare_exchange_##kind(                          \
      volatile type* a, type* expected, type v, int, int) {                              \
    return __atomic_compare_exchange_n(a, expected, v, weak, __ATOMIC_SEQ_CST,           \
                                       __ATOMIC_SEQ_CST);                                \
  }
#define HAM_TSAN_ATOMIC(bits, type)                                                      \
  extern "C" type __tsan_atomic##bits##_load(const volatile type* a, int) {              \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                         \
  }                                                                                      \
  extern "C" void __tsan_atomic##bits##_store(volatile type* a, type v, int) {           \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                            \
  }                                                                                      \
  extern "C" type __tsan_atomic##bits##_exchange(volatile type* a, type v, int) {        \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                  \
  }                                                                                      \
  HAM_TSAN_FETCH(bits, type, add)                                                        \
  HAM_TSAN_FETCH(bits, type, sub)                                                        \
  HAM_TSAN_FETCH(bits, type, and)                                                        \
  HAM_TSAN_FETCH(bits, type, or)                                                         \
  HAM_TSAN_FETCH(bits, type, xor)                                                        \
  HAM_TSAN_FETCH(bits, type, nand)                                                       \
  HAM_TSAN_COMPARE_EXCHANGE(bits, type, strong, false)                                   \
  HAM_TSAN_COMPARE_EXCHANGE(bits, type, weak, true)                                      \
  extern "C" type __tsan_atomic##bits##_compare_exchange_val(volatile type* a,           \
                                                             type expected, type v, int, \
                                                             int) {                      \
    __atomic_compare_exchange_n(a, &expected, v, false, __ATOMIC_SEQ_CST,                \
                                __ATOMIC_SEQ_CST);                                       \
    return expected;                                                                     \
  }
HAM_TSAN_ATOMIC(8, int8_t)
HAM_TSAN_ATOMIC(16, int16_t)
HAM_TSAN_ATOMIC(32, int32_t)
HAM_TSAN_ATOMIC(64, int64_t)
#undef HAM_TSAN_ATOMIC
#undef HAM_TSAN_COMPARE_EXCHANGE
#undef HAM_TSAN_FETCH

extern "C" void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
extern "C" void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
