// cuBLASLt for the SIMT emulator: descriptors as plain structs and cublasLtMatmul as a
// reference GEMM on the host. It computes what cuBLASLt defines, in column-major terms:
//   D = epilogue(alpha op(A) op(B) + beta C [+ bias]),  op(X) = X or X^T,
//   X(i, j) at X[i + j ld] (+ batch * stride),  bias one value per row of D,
// each element's sum taken in f64 and rounded once (at least as accurate as cuBLASLt's f32
// accumulation; TF32 first rounds A and B to 10 mantissa bits, as the tensor cores read
// them). Inconsistent shapes, a type cuBLASLt would not take, and operands less aligned than
// the preferences the algorithm was chosen under are errors, as on the GPU.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/emulator/eight_doubles.h"
#include "cuda/emulator/racecheck.h"

struct cublasLtContext {
  int device;
};

struct cublasLtMatmulDescOpaque {
  cublasComputeType_t compute;
  cudaDataType_t scale_type;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
};

struct cublasLtMatrixLayoutOpaque {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch = 1;
  int64_t stride = 0;
};

struct cublasLtMatmulPreferenceOpaque {
  uint64_t max_workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};

namespace {

using ham::cuda::emulator::EightDoubles;

// What the emulated "algorithm" asks of its operands; kept in cublasLtMatmulAlgo_t::data.
struct AlgoRecord {
  uint32_t align[4];
  uint64_t workspace;
};
static_assert(sizeof(AlgoRecord) <= sizeof(cublasLtMatmulAlgo_t));

constexpr uint64_t kWorkspaceWanted = 4u << 20;

size_t element_size(cudaDataType_t type) {
  switch (type) {
    case CUDA_R_32F: return 4;
    case CUDA_R_64F: return 8;
    case CUDA_R_16BF: return 2;
    default: return 0;
  }
}

double load(const void* base, cudaDataType_t type, int64_t index) {
  switch (type) {
    case CUDA_R_32F: return static_cast<const float*>(base)[index];
    case CUDA_R_64F: return static_cast<const double*>(base)[index];
    case CUDA_R_16BF: return float(static_cast<const __nv_bfloat16*>(base)[index]);
    default: return NAN;
  }
}

void store(void* base, cudaDataType_t type, int64_t index, double value) {
  switch (type) {
    case CUDA_R_32F: static_cast<float*>(base)[index] = float(value); break;
    case CUDA_R_64F: static_cast<double*>(base)[index] = value; break;
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(base)[index] = __nv_bfloat16(float(value)); break;
    default: break;
  }
}

// f32 -> TF32: 10 mantissa bits, rounded to nearest (ties away), as the tensor cores read it.
float to_tf32(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}

bool aligned(const void* p, uint32_t bytes) {
  return bytes == 0 || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <class C>
C epilogue_value(C x, cublasLtEpilogue_t epilogue) {
  if (epilogue == CUBLASLT_EPILOGUE_RELU || epilogue == CUBLASLT_EPILOGUE_RELU_BIAS) {
    return x > C(0) ? x : C(0);
  }
  if (epilogue == CUBLASLT_EPILOGUE_GELU || epilogue == CUBLASLT_EPILOGUE_GELU_BIAS) {
    const C k = C(0.7978845608028654);  // sqrt(2 / pi)
    return C(0.5) * x * (C(1) + std::tanh(k * (x + C(0.044715) * x * x * x)));
  }
  return x;
}

// The bytes of every column of every batch of the matrix at `x` (the racecheck's view).
void add_matrix_accesses(std::vector<ham::cuda::emulator::WorkAccess>& accesses, const void* x,
                         const cublasLtMatrixLayoutOpaque& l, int32_t batch,
                         ham::cuda::emulator::MemoryAccess kind) {
  const size_t bytes = element_size(l.type);
  for (int32_t i = 0; i < (l.stride == 0 ? 1 : batch); ++i) {
    for (uint64_t j = 0; j < l.cols; ++j) {
      const int64_t first = int64_t(i) * l.stride + int64_t(j) * l.ld;
      accesses.push_back({static_cast<const char*>(x) + first * int64_t(bytes),
                          l.rows * bytes, kind});
    }
  }
}

bool has_bias(cublasLtEpilogue_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_RELU_BIAS ||
         epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
}

// One product of the batch; C is the compute type (float or double).
template <class C>
void gemm_one(const cublasLtMatmulDescOpaque& desc, C alpha, C beta, const void* a,
              const cublasLtMatrixLayoutOpaque& la, const void* b,
              const cublasLtMatrixLayoutOpaque& lb, const void* c,
              const cublasLtMatrixLayoutOpaque& lc, void* d, const cublasLtMatrixLayoutOpaque& ld,
              int64_t m, int64_t n, int64_t k, int64_t batch) {
  const bool tf32 = desc.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  auto operand = [&](const void* base, const cublasLtMatrixLayoutOpaque& l, bool transposed,
                     int64_t rows, int64_t cols) {
    // op(X) as a row-major [rows, cols] buffer in the compute type.
    std::vector<C> out(size_t(rows * cols));
    const int64_t offset = batch * l.stride;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t index = transposed ? j + i * l.ld : i + j * l.ld;
        C v = C(load(base, l.type, offset + index));
        if constexpr (std::is_same_v<C, float>) {
          if (tf32) v = to_tf32(v);
        }
        out[size_t(i * cols + j)] = v;
      }
    }
    return out;
  };
  const std::vector<C> op_a = operand(a, la, desc.trans_a == CUBLAS_OP_T, m, k);   // [m, k]
  const std::vector<C> op_bt = operand(b, lb, desc.trans_b == CUBLAS_OP_N, n, k);  // op(B)^T [n, k]
  auto finish = [&](int64_t i, int64_t j, double sum) {
    C value = alpha * C(sum);
    if (beta != C(0)) value += beta * C(load(c, lc.type, batch * lc.stride + i + j * lc.ld));
    if (has_bias(desc.epilogue)) value += C(load(desc.bias, ld.type, i));
    store(d, ld.type, batch * ld.stride + i + j * ld.ld,
          double(epilogue_value(value, desc.epilogue)));
  };
  if constexpr (std::is_same_v<C, float>) {
    // Eight rows of op(A) at a time, their sums one vector: the products of two floats are
    // exact in double, so each element's sum (from 0, in the order l = 0, 1, ..) is the
    // scalar loop's bit for bit, fused or not. Block r holds rows 8 r .. 8 r + 7 of each
    // column l at [r k + l], rows past m 0.
    const int64_t blocks = (m + 7) / 8;
    std::vector<EightDoubles> a_blocks(size_t(blocks * k));  // value-initialized: zeros
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t l = 0; l < k; ++l) {
        a_blocks[size_t(i / 8 * k + l)].set(int(i % 8), op_a[size_t(i * k + l)]);
      }
    }
    for (int64_t r = 0; r < blocks; ++r) {
      const EightDoubles* x = &a_blocks[size_t(r * k)];
      for (int64_t j = 0; j < n; ++j) {
        const C* y = &op_bt[size_t(j * k)];
        EightDoubles sums{};
        for (int64_t l = 0; l < k; ++l) sums += x[l] * double(y[l]);
        for (int64_t i = 8 * r; i < std::min(m, 8 * r + 8); ++i) finish(i, j, sums[i % 8]);
      }
    }
  } else {  // f64: the products are not exact, so the sums stay as they were written
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        double sum = 0;
        const C* x = &op_a[size_t(i * k)];
        const C* y = &op_bt[size_t(j * k)];
        for (int64_t l = 0; l < k; ++l) sum += double(x[l]) * double(y[l]);
        finish(i, j, sum);
      }
    }
  }
}

}  // namespace

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) { return cublasGetStatusName(status); }

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  int device = 0;
  cudaGetDevice(&device);
  *handle = new cublasLtContext{device};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
  const bool f64 = compute == CUBLAS_COMPUTE_64F && scale_type == CUDA_R_64F;
  const bool f32 = (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_FAST_TF32) &&
                   scale_type == CUDA_R_32F;
  if (!f64 && !f32) return CUBLAS_STATUS_NOT_SUPPORTED;
  *desc = new cublasLtMatmulDescOpaque{compute, scale_type};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attribute,
                                              const void* value, size_t size) {
  if (!desc || !value) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attribute) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
      if (size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
      cublasOperation_t op;
      std::memcpy(&op, value, size);
      if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return CUBLAS_STATUS_NOT_SUPPORTED;
      (attribute == CUBLASLT_MATMUL_DESC_TRANSA ? desc->trans_a : desc->trans_b) = op;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      if (size != sizeof(cublasLtEpilogue_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&desc->epilogue, value, size);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      if (size != sizeof(void*)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&desc->bias, value, size);
      return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (!layout || element_size(type) == 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (rows > 0 && ld < int64_t(rows)) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new cublasLtMatrixLayoutOpaque{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attribute,
                                                const void* value, size_t size) {
  if (!layout || !value) return CUBLAS_STATUS_INVALID_VALUE;
  if (attribute == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT && size == sizeof(int32_t)) {
    std::memcpy(&layout->batch, value, size);
    return layout->batch >= 1 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
  }
  if (attribute == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET && size == sizeof(int64_t)) {
    std::memcpy(&layout->stride, value, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  if (!preference) return CUBLAS_STATUS_INVALID_VALUE;
  *preference = new cublasLtMatmulPreferenceOpaque{};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  delete preference;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute,
                                                    const void* value, size_t size) {
  if (!preference || !value) return CUBLAS_STATUS_INVALID_VALUE;
  if (attribute == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && size == sizeof(uint64_t)) {
    std::memcpy(&preference->max_workspace, value, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attribute >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
      attribute <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES && size == sizeof(uint32_t)) {
    std::memcpy(&preference->align[attribute - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], value,
                size);
    return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t preference, int requested, cublasLtMatmulHeuristicResult_t* results,
    int* returned) {
  if (!handle || !desc || !a || !b || !c || !d || !preference || requested < 1 || !results ||
      !returned) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *returned = 0;
  // Like the tensor-core kernels: operands need at least their element's alignment.
  const size_t sizes[4] = {element_size(a->type), element_size(b->type), element_size(c->type),
                           element_size(d->type)};
  for (int i = 0; i < 4; ++i) {
    if (preference->align[i] < sizes[i]) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  AlgoRecord record{};
  std::memcpy(record.align, preference->align, sizeof record.align);
  record.workspace = std::min<uint64_t>(preference->max_workspace, kWorkspaceWanted);
  results[0] = cublasLtMatmulHeuristicResult_t{};
  std::memcpy(results[0].algo.data, &record, sizeof record);
  results[0].workspaceSize = record.workspace;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void* alpha, const void* a, cublasLtMatrixLayout_t a_layout,
                              const void* b, cublasLtMatrixLayout_t b_layout, const void* beta,
                              const void* c, cublasLtMatrixLayout_t c_layout, void* d,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (!handle || !desc || !alpha || !beta || !a || !b || !c || !d || !a_layout || !b_layout ||
      !c_layout || !d_layout || !algo) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  AlgoRecord record;
  std::memcpy(&record, algo->data, sizeof record);
  if (workspace_bytes < record.workspace || (record.workspace > 0 && !workspace)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const cublasLtMatrixLayoutOpaque &la = *a_layout, &lb = *b_layout, &lc = *c_layout,
                                   &ld = *d_layout;
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  const int64_t m = int64_t(ta ? la.cols : la.rows), k = int64_t(ta ? la.rows : la.cols);
  const int64_t kb = int64_t(tb ? lb.cols : lb.rows), n = int64_t(tb ? lb.rows : lb.cols);
  if (k != kb || int64_t(ld.rows) != m || int64_t(ld.cols) != n || lc.rows != ld.rows ||
      lc.cols != ld.cols || lc.ld != ld.ld || lc.type != ld.type) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const int32_t batch = ld.batch;
  if (la.batch != batch || lb.batch != batch || lc.batch != batch) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (la.type != lb.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool f64 = desc->compute == CUBLAS_COMPUTE_64F;
  if (f64 != (la.type == CUDA_R_64F) || (f64 && ld.type != CUDA_R_64F) ||
      (la.type == CUDA_R_32F && ld.type != CUDA_R_32F) ||
      (la.type == CUDA_R_16BF && ld.type != CUDA_R_16BF && ld.type != CUDA_R_32F)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (has_bias(desc->epilogue) && !desc->bias) return CUBLAS_STATUS_INVALID_VALUE;
  // The chosen algorithm assumed these alignments of every batch's start.
  const void* pointers[4] = {a, b, c, d};
  const int64_t strides[4] = {la.stride, lb.stride, lc.stride, ld.stride};
  const size_t sizes[4] = {element_size(la.type), element_size(lb.type), element_size(lc.type),
                           element_size(ld.type)};
  for (int i = 0; i < 4; ++i) {
    if (!aligned(pointers[i], record.align[i])) return CUBLAS_STATUS_INVALID_VALUE;
    if (batch > 1 && record.align[i] > 0 &&
        (uint64_t(strides[i]) * sizes[i]) % record.align[i] != 0) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  // Runs on `stream` (later, in the emulator's held stream orders): the descriptors and the
  // host scalars are copied now, as the library reads them at the call.
  auto scalar = [f64](const void* p) {
    return f64 ? *static_cast<const double*>(p) : double(*static_cast<const float*>(p));
  };
  const double alpha_value = scalar(alpha), beta_value = scalar(beta);
  const cublasLtMatmulDescOpaque op = *desc;
  const cudaError_t issued = ham::cuda::emulator::issue(stream, [=] {
    if (ham::cuda::emulator::racecheck_on()) {
      using ham::cuda::emulator::MemoryAccess;
      std::vector<ham::cuda::emulator::WorkAccess> accesses;
      add_matrix_accesses(accesses, a, la, batch, MemoryAccess::Read);
      add_matrix_accesses(accesses, b, lb, batch, MemoryAccess::Read);
      if (beta_value != 0) add_matrix_accesses(accesses, c, lc, batch, MemoryAccess::Read);
      if (has_bias(op.epilogue)) {
        accesses.push_back({op.bias, ld.rows * element_size(ld.type), MemoryAccess::Read});
      }
      if (workspace) accesses.push_back({workspace, workspace_bytes, MemoryAccess::Write});
      add_matrix_accesses(accesses, d, ld, batch, MemoryAccess::Write);
      ham::cuda::emulator::racecheck_work_accesses("cublasLtMatmul", accesses);
    }
    if (workspace) std::memset(workspace, 0xff, workspace_bytes);  // scratch, as a GPU leaves it
    for (int64_t i = 0; i < batch; ++i) {
      if (f64) {
        gemm_one<double>(op, alpha_value, beta_value, a, la, b, lb, c, lc, d, ld, m, n, k, i);
      } else {
        gemm_one<float>(op, float(alpha_value), float(beta_value), a, la, b, lb, c, lc, d, ld, m,
                        n, k, i);
      }
    }
  });
  return issued == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
