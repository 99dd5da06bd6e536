// matmul's CUDA kernel: cuBLASLt, registered with gemm_kernels() at load time.
//
// Layout. ham's operands are row-major; cuBLASLt's are column-major. A row-major [r, c]
// matrix is the column-major [c, r] matrix X^T, so C = op(A) op(B) is computed as
//   C^T = op(B)^T op(A)^T
// with cuBLASLt's first operand taken from B and its second from A, each with its own
// transpose flag unchanged, and C read as a column-major [N, M] matrix (ld = N).
//
// Precision. f32: fp32 compute (TF32 tensor cores only when allowed, cuda/cublas.h);
// f64: fp64; bf16: bf16 operands and output, fp32 accumulation and alpha/beta.
//
// Batches. A Linear weight (2-D B) shared by a batch of untransposed A is one GEMM with
// M' = batch * M (the rows of all A's are contiguous); other batches are strided batched
// GEMMs, stride 0 for an operand the batch shares.
//
// Epilogues. gemm_epilogue (cuda/cublas.h) fuses + bias [N] and ReLU or GELU into the
// product (CUBLASLT_EPILOGUE_*_BIAS): in the C^T view the bias is one value per row.
//
// Plans. The descriptors and the heuristic's algorithm are cached per (device, dtype,
// TF32, shape, flags, strides, pointer alignment); the workspace (32 MiB) comes from the
// caching allocator, one per device and stream.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "core/ops/matmul.h"
#include "cuda/caching_allocator.h"
#include "cuda/check.h"
#include "cuda/cublas.h"
#include "cuda/launch.h"
#include "cuda/stream.h"

namespace ham::cuda {

namespace {

bool tf32_from_environment() {
  const char* value = std::getenv("HAM_ALLOW_TF32");
  return value && std::string(value) == "1";
}

std::mutex& gemm_mutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}

bool& allow_tf32_flag() {
  static bool flag = tf32_from_environment();
  return flag;
}

// The largest power of two (<= 256 bytes, cuBLASLt's largest requirement) dividing every
// address the operand's batches start at.
uint32_t alignment_bytes(const void* ptr, int64_t batch_stride_elems, size_t elem_size) {
  uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(ptr)) | 256u;
  if (batch_stride_elems != 0) bits |= uint64_t(batch_stride_elems) * elem_size;
  return uint32_t(bits & (~bits + 1));  // lowest set bit
}

struct PlanKey {
  GemmEpilogue epilogue;
  int device;
  DType dtype;    // of A and B
  DType c_dtype;  // of C and D: dtype, or f32 for bf16 operands
  bool tf32;
  bool trans_a, trans_b;
  int64_t batch, m, n, k, a_stride, b_stride;
  uint32_t align_a, align_b, align_c;
  auto tie() const {
    return std::tie(epilogue, device, dtype, c_dtype, tf32, trans_a, trans_b, batch, m, n, k,
                    a_stride, b_stride, align_a, align_b, align_c);
  }
  bool operator<(const PlanKey& other) const { return tie() < other.tie(); }
};

// Owns the cuBLASLt descriptors of one GEMM shape and its chosen algorithm.
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_first = nullptr;   // from B
  cublasLtMatrixLayout_t layout_second = nullptr;  // from A
  cublasLtMatrixLayout_t layout_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;
  ~GemmPlan() {
    if (layout_c) cublasLtMatrixLayoutDestroy(layout_c);
    if (layout_second) cublasLtMatrixLayoutDestroy(layout_second);
    if (layout_first) cublasLtMatrixLayoutDestroy(layout_first);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

std::map<PlanKey, std::unique_ptr<GemmPlan>>& plan_cache() {
  static auto* cache = new std::map<PlanKey, std::unique_ptr<GemmPlan>>;
  return *cache;
}

std::string describe(const PlanKey& key) {
  return detail::concat(key.epilogue == GemmEpilogue::kNone ? "matmul" : "matmul+epilogue",
                        " on cuda:", key.device, ": ", dtype_name(key.dtype),
                        key.c_dtype != key.dtype ? " into " : "",
                        key.c_dtype != key.dtype ? dtype_name(key.c_dtype) : "", " batch ",
                        key.batch, " M=", key.m, " N=", key.n, " K=", key.k, " trans_a=",
                        key.trans_a, " trans_b=", key.trans_b, key.tf32 ? " (tf32)" : "");
}

cudaDataType_t cuda_data_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return CUDA_R_32F;
    case DType::F64: return CUDA_R_64F;
    case DType::BF16: return CUDA_R_16BF;
    default: HAM_FAIL("matmul: CUDA GEMM takes f32, f64 or bf16, got ", dtype_name(dtype));
  }
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                                   int64_t batch, int64_t stride, const std::string& what) {
  cublasLtMatrixLayout_t layout = nullptr;
  HAM_CUBLAS_CHECK_CTX(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld),
                       what);
  if (batch > 1) {
    int32_t count = int32_t(batch);
    HAM_CUBLAS_CHECK_CTX(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                          &count, sizeof count),
                         what);
    HAM_CUBLAS_CHECK_CTX(cublasLtMatrixLayoutSetAttribute(
                             layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
                         what);
  }
  return layout;
}

std::unique_ptr<GemmPlan> make_plan(const PlanKey& key) {
  const std::string what = describe(key);
  auto plan = std::make_unique<GemmPlan>();
  cudaDataType_t type = cuda_data_type(key.dtype);
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale_type = CUDA_R_32F;
  if (key.dtype == DType::F64) {
    compute = CUBLAS_COMPUTE_64F;
    scale_type = CUDA_R_64F;
  } else if (key.dtype == DType::F32 && key.tf32) {
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  HAM_CUBLAS_CHECK_CTX(cublasLtMatmulDescCreate(&plan->desc, compute, scale_type), what);
  // First operand from B (row-major [K, N], or [N, K] when transposed), second from A.
  cublasOperation_t op_first = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_second = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  HAM_CUBLAS_CHECK_CTX(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                      &op_first, sizeof op_first),
                       what);
  HAM_CUBLAS_CHECK_CTX(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                      &op_second, sizeof op_second),
                       what);
  if (key.epilogue != GemmEpilogue::kNone) {
    cublasLtEpilogue_t epilogue = key.epilogue == GemmEpilogue::kBias       ? CUBLASLT_EPILOGUE_BIAS
                                  : key.epilogue == GemmEpilogue::kReluBias ? CUBLASLT_EPILOGUE_RELU_BIAS
                                                                            : CUBLASLT_EPILOGUE_GELU_BIAS;
    HAM_CUBLAS_CHECK_CTX(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                        &epilogue, sizeof epilogue),
                         what);
  }
  int64_t first_rows = key.trans_b ? key.k : key.n, first_cols = key.trans_b ? key.n : key.k;
  int64_t second_rows = key.trans_a ? key.m : key.k, second_cols = key.trans_a ? key.k : key.m;
  plan->layout_first = make_layout(type, first_rows, first_cols, first_rows, key.batch,
                                   key.b_stride, what);
  plan->layout_second = make_layout(type, second_rows, second_cols, second_rows, key.batch,
                                    key.a_stride, what);
  plan->layout_c = make_layout(cuda_data_type(key.c_dtype), key.n, key.m, key.n, key.batch,
                               key.m * key.n, what);

  cublasLtMatmulPreference_t preference = nullptr;
  HAM_CUBLAS_CHECK_CTX(cublasLtMatmulPreferenceCreate(&preference), what);
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                  cublasStatus_t (*)(cublasLtMatmulPreference_t)>
      preference_owner(preference, &cublasLtMatmulPreferenceDestroy);
  uint64_t workspace = kGemmWorkspaceBytes;
  HAM_CUBLAS_CHECK_CTX(cublasLtMatmulPreferenceSetAttribute(
                           preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                           sizeof workspace),
                       what);
  // cuBLASLt assumes 256-byte aligned operands unless told otherwise; views are not.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
  for (const auto& [attribute, bytes] : alignments) {
    HAM_CUBLAS_CHECK_CTX(
        cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof bytes), what);
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  HAM_CUBLAS_CHECK_CTX(cublasLtMatmulAlgoGetHeuristic(
                           cublaslt_handle(key.device), plan->desc, plan->layout_first,
                           plan->layout_second, plan->layout_c, plan->layout_c, preference, 1,
                           &result, &found),
                       what);
  HAM_CHECK(found > 0, what, ": cuBLASLt has no algorithm for this GEMM (alignments A ",
            key.align_a, ", B ", key.align_b, ", C ", key.align_c, " bytes)");
  plan->algo = result.algo;
  plan->workspace_bytes = result.workspaceSize;
  return plan;
}

// The per-(device, stream) workspace; blocks of the caching allocator kept for good.
void* gemm_workspace(int device, cudaStream_t stream) {
  static auto* workspaces = new std::map<std::pair<int, StreamKey>, void*>;
  auto key = std::make_pair(device, stream_key(stream));
  auto it = workspaces->find(key);
  if (it != workspaces->end()) return it->second;
  void* ptr = device_allocator(device).allocate(kGemmWorkspaceBytes, stream_key(stream));
  workspaces->emplace(key, ptr);
  return ptr;
}

template <class T>
__global__ void scale_in_place(T* data, int64_t n, float factor) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) data[i] = T(float(data[i]) * factor);
}
__global__ void scale_in_place_f64(double* data, int64_t n, double factor) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) data[i] *= factor;
}

// K = 0: the product is empty, so C = beta * C.
void scale_output(Tensor& c, double beta, cudaStream_t stream, const std::string& what) {
  int64_t n = c.numel();
  if (n == 0 || beta == 1.0) return;
  if (beta == 0.0) {
    HAM_CUDA_CHECK_CTX(cudaMemsetAsync(c.raw_data(), 0, c.nbytes(), stream), what);
    return;
  }
  int threads = 256;
  unsigned blocks = unsigned((n + threads - 1) / threads);
  switch (c.dtype()) {
    case DType::F32:
      HAM_LAUNCH(blocks, threads, 0, stream, scale_in_place)(c.data<float>(), n, float(beta));
      break;
    case DType::BF16:
      HAM_LAUNCH(blocks, threads, 0, stream, scale_in_place)(
          static_cast<__nv_bfloat16*>(c.raw_data()), n, float(beta));
      break;
    case DType::F64:
      HAM_LAUNCH(blocks, threads, 0, stream, scale_in_place_f64)(c.data<double>(), n, beta);
      break;
    default: HAM_FAIL(what, ": unsupported dtype");
  }
  HAM_CUDA_CHECK_CTX(cudaGetLastError(), what, " (scaling C by beta)");
}

void run_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmShape& shape,
              GemmEpilogue epilogue, const Tensor* bias) {
  int device = a.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = current_stream(device);
  GemmShape s = shape;
  // A Linear weight shared by a batch of untransposed A: one tall GEMM.
  if (s.batch > 1 && s.b_batch_stride == 0 && !s.trans_a) {
    s.m *= s.batch;
    s.batch = 1;
  }
  size_t elem = dtype_size(a.dtype());
  PlanKey key{epilogue,
              device,
              a.dtype(),
              c.dtype(),
              a.dtype() == DType::F32 && matmul_allows_tf32(),
              s.trans_a,
              s.trans_b,
              s.batch,
              s.m,
              s.n,
              s.k,
              s.batch > 1 ? s.a_batch_stride : 0,
              s.batch > 1 ? s.b_batch_stride : 0,
              alignment_bytes(a.raw_data(), s.batch > 1 ? s.a_batch_stride : 0, elem),
              alignment_bytes(b.raw_data(), s.batch > 1 ? s.b_batch_stride : 0, elem),
              alignment_bytes(c.raw_data(), s.batch > 1 ? s.m * s.n : 0, dtype_size(c.dtype()))};
  if (s.batch == 0 || s.m == 0 || s.n == 0) return;
  if (s.k == 0) {
    scale_output(c, s.beta, stream, describe(key));
    return;
  }
  const int64_t int_max = 2147483647;
  HAM_CHECK(s.m <= int_max && s.n <= int_max && s.k <= int_max && s.batch <= int_max,
            describe(key), ": a dimension exceeds cuBLASLt's int32 range");

  std::lock_guard<std::mutex> lock(gemm_mutex());
  std::unique_ptr<GemmPlan>& plan = plan_cache()[key];
  if (!plan) plan = make_plan(key);
  if (bias) {
    // The bias is the row vector of ham's C, i.e. one value per row of cuBLASLt's C^T.
    const void* bias_ptr = bias->raw_data();
    HAM_CUBLAS_CHECK_CTX(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                        &bias_ptr, sizeof bias_ptr),
                         describe(key));
  }
  void* workspace = plan->workspace_bytes ? gemm_workspace(device, stream) : nullptr;
  float alpha32 = float(s.alpha), beta32 = float(s.beta);
  const void* alpha = &alpha32;
  const void* beta = &beta32;
  if (a.dtype() == DType::F64) {
    alpha = &s.alpha;
    beta = &s.beta;
  }
  HAM_CUBLAS_CHECK_CTX(cublasLtMatmul(cublaslt_handle(device), plan->desc, alpha, b.raw_data(),
                                      plan->layout_first, a.raw_data(), plan->layout_second, beta,
                                      c.raw_data(), plan->layout_c, c.raw_data(), plan->layout_c,
                                      &plan->algo, workspace, plan->workspace_bytes, stream),
                       describe(key));
}

void gemm_cuda(const Tensor& a, const Tensor& b, Tensor& c, const GemmShape& shape) {
  run_gemm(a, b, c, shape, GemmEpilogue::kNone, nullptr);
}

}  // namespace

void gemm_epilogue(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& c, bool trans_a,
                   bool trans_b, GemmEpilogue epilogue) {
  GemmShape s = ops::gemm_shape(a, b, trans_a, trans_b);
  auto fail = [&](const char* why) {
    HAM_FAIL("matmul+epilogue: ", why, ": A", shape_str(a.shape()), trans_a ? "^T" : "", " @ B",
             shape_str(b.shape()), trans_b ? "^T" : "", " + bias",
             bias.defined() ? shape_str(bias.shape()) : std::string("(none)"), " into C",
             shape_str(c.shape()));
  };
  if (!a.device().is_cuda()) fail("operands must be CUDA tensors");
  if (c.numel() != s.batch * s.m * s.n || c.dim() < 2 || c.size(-2) != s.m || c.size(-1) != s.n)
    fail("output shape does not match");
  if (c.dtype() != a.dtype() || c.device() != a.device()) fail("output dtype or device differs");
  if (epilogue == GemmEpilogue::kNone) {
    if (bias.defined()) fail("a bias needs a bias epilogue");
  } else {
    if (!bias.defined() || bias.dim() != 1 || bias.size(0) != s.n) fail("bias must be [N]");
    if (bias.dtype() != c.dtype() || bias.device() != c.device()) fail("bias dtype or device differs");
    if (a.dtype() == DType::F64) fail("epilogues take f32 or bf16");
    if (s.k == 0) fail("K = 0 leaves nothing for cuBLASLt to fuse");
  }
  run_gemm(a, b, c, s, epilogue, epilogue == GemmEpilogue::kNone ? nullptr : &bias);
}

bool matmul_allows_tf32() {
  std::lock_guard<std::mutex> lock(gemm_mutex());
  return allow_tf32_flag();
}

void set_matmul_allow_tf32(bool allow) {
  std::lock_guard<std::mutex> lock(gemm_mutex());
  allow_tf32_flag() = allow;
}

cublasLtHandle_t cublaslt_handle(int device) {
  static auto* handles = new std::map<int, cublasLtHandle_t>;
  static auto* mutex = new std::mutex;
  std::lock_guard<std::mutex> lock(*mutex);
  auto it = handles->find(device);
  if (it != handles->end()) return it->second;
  DeviceGuard guard(device);
  cublasLtHandle_t handle = nullptr;
  HAM_CUBLAS_CHECK_CTX(cublasLtCreate(&handle), "creating the cuBLASLt handle of cuda:", device);
  handles->emplace(device, handle);
  return handle;
}

size_t gemm_plan_cache_size() {
  std::lock_guard<std::mutex> lock(gemm_mutex());
  return plan_cache().size();
}

namespace {
const bool registered = [] {
  gemm_kernels().register_kernel(DeviceKind::CUDA, &gemm_cuda);
  return true;
}();
}  // namespace

}  // namespace ham::cuda
