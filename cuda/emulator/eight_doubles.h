#pragma once
// Eight doubles that GCC and Clang add and multiply as one vector (a scalar operand is
// broadcast): the emulator's products (mma.cpp) and its cuBLASLt GEMM (cublaslt.cpp) form
// their sums eight at a time in these, each element's in the order a loop of scalars would.
namespace ham::cuda::emulator {
typedef double EightDoubles __attribute__((vector_size(64)));
}  // namespace ham::cuda::emulator
