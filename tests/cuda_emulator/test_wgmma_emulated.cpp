// tests/cuda/test_wgmma.cu compiled as C++ for the SIMT emulator.
#include "tests/cuda/test_wgmma.cu"
