#pragma once
// HAM_ADDRESS_SANITIZER is 1 where this code is compiled with AddressSanitizer
// (-DHAM_SANITIZE=address: scripts/sanitize.sh), which then includes its interface for the
// places that tell it what it cannot see for itself: the SIMT emulator's fiber stacks
// (cuda/emulator/simt.cpp), the caching allocator's unowned bytes on the emulator's device
// (cuda/caching_allocator.cpp) and the CPU pool's cached blocks (core/cpu_memory_pool.cpp).
#if defined(__SANITIZE_ADDRESS__)
#define HAM_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAM_ADDRESS_SANITIZER 1
#endif
#endif
#ifndef HAM_ADDRESS_SANITIZER
#define HAM_ADDRESS_SANITIZER 0
#endif

#if HAM_ADDRESS_SANITIZER
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
