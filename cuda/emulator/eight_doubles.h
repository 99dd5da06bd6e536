#pragma once
// Eight doubles that GCC and Clang add and multiply as vectors (a scalar operand is
// broadcast): the emulator's products (mma.cpp) and its cuBLASLt GEMM (cublaslt.cpp) form
// their sums eight at a time in these, each element's in the order a loop of scalars would.
// Two 4-wide halves rather than one 8-wide vector: without AVX-512, GCC kept an 8-wide sum
// in memory and moved it through the stack at every step of the loop that accumulates it.
namespace ham::cuda::emulator {

typedef double FourDoubles __attribute__((vector_size(32)));

struct EightDoubles {
  FourDoubles low{}, high{};  // elements 0-3 and 4-7

  double operator[](int i) const { return i < 4 ? low[i] : high[i - 4]; }
  void set(int i, double value) {
    if (i < 4) low[i] = value;
    else high[i - 4] = value;
  }
  EightDoubles& operator+=(const EightDoubles& other) {
    low += other.low;
    high += other.high;
    return *this;
  }
};

inline EightDoubles operator*(double scalar, const EightDoubles& v) {
  return {scalar * v.low, scalar * v.high};
}
inline EightDoubles operator*(const EightDoubles& v, double scalar) { return scalar * v; }

}  // namespace ham::cuda::emulator
