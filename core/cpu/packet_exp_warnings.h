#pragma once
// GCC 12 calls the placeholder operands of its own AVX-512 intrinsics (avx512fintrin.h's
// `__Y = __Y`) "used uninitialized" once Eigen's packet exp is inlined: GCC bug 105593,
// fixed in GCC 13. A file that inlines it (core/cpu/packet_math.h's exp) includes this
// first, before any other header, so that the headers' lines come after the pragmas (which
// hold to the end of the file).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
