#include "nn/matmul.h"


#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/cpu/fma_peak.h"
#include "core/cpu/matmul.h"
#include "core/ops/matmul.h"
#include "tests/error_testing.h"

#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::randn64;
using cpu::ProductOnThisThread;
using cpu::StridedMatrix;

struct MatmulCase {
  Shape a, b;
  bool ta, tb;
};

void PrintTo(const MatmulCase& c, std::ostream* os) { *os << shape_str(c.a) << (c.ta ? "T" : "") << "_" << shape_str(c.b) << (c.tb ? "T" : ""); }


class MatmulGradcheck : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulGradcheck, AllTransposeFlags) {
  const auto& c = GetParam();
  Tensor a = randn64(c.a, 11), b = randn64(c.b, 12);
  bool ta = c.ta, tb = c.tb;
  expect_gradcheck(
      [ta, tb](const std::vector<Tensor>& x) { return std::vector{matmul(x[0], x[1], ta, tb)}; },
      {a, b});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatmulGradcheck,
    ::testing::Values(MatmulCase{{3, 4}, {4, 5}, false, false},
                      MatmulCase{{4, 3}, {4, 5}, true, false},
                      MatmulCase{{3, 4}, {5, 4}, false, true},
                      MatmulCase{{4, 3}, {5, 4}, true, true},
                      MatmulCase{{2, 3, 4}, {2, 4, 5}, false, false},  // batched
                      MatmulCase{{2, 3, 4}, {2, 5, 4}, false, true},
                      MatmulCase{{2, 4, 3}, {2, 4, 5}, true, false},
                      MatmulCase{{2, 3, 4}, {4, 5}, false, false},     // shared B
                      MatmulCase{{2, 3, 4}, {5, 4}, false, true},
                      MatmulCase{{1, 1}, {1, 1}, false, false}));      // size-1

TEST(Linear, GradcheckWithBiasAnd3dInput) {
  Tensor x = randn64({2, 3, 4}, 1), w = randn64({5, 4}, 2), b = randn64({5}, 3);
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{linear(v[0], v[1], v[2])}; },
                   {x, w, b});
}

TEST(Linear, GradcheckSingleToken) {
  Tensor x = randn64({1, 1, 4}, 4), w = randn64({3, 4}, 5);
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{linear(v[0], v[1])}; },
                   {x, w});
}

TEST(Matmul, ForwardMatchesHandComputed) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<float>({7, 8, 9, 10, 11, 12}, {3, 2});
  EXPECT_EQ(matmul(a, b).to_vector<float>(), (std::vector<float>{58, 64, 139, 154}));
}

TEST(Matmul, MismatchNamesBothShapes) {
  try {
    matmul(Tensor::zeros({2, 3}), Tensor::zeros({4, 5}));
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("matmul"), std::string::npos);
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos);
    EXPECT_NE(msg.find("[4, 5]"), std::string::npos);
  }
}

// ---- The CPU kernel (core/cpu/matmul.cpp) against a plain f64 triple loop: every
// transpose, shapes on both sides of each tile and block edge, alpha and beta, batches,
// and bits that do not depend on the thread count.

template <class T>
Tensor random_matrix(const Shape& shape, uint64_t seed) {
  return randn64(shape, seed, 1.0, false).to(dtype_of<T>());
}

struct Product {
  int64_t batch, m, k, n;
  bool trans_a, trans_b;
  bool shared_b = false;  // one 2-D B for the whole batch (a Linear weight)
};

std::string describe(const Product& p, double alpha, double beta) {
  return "batch " + std::to_string(p.batch) + " m " + std::to_string(p.m) + " k " +
         std::to_string(p.k) + " n " + std::to_string(p.n) + (p.trans_a ? " A^T" : "") +
         (p.trans_b ? " B^T" : "") + (p.shared_b ? " shared B" : "") + " alpha " +
         std::to_string(alpha) + " beta " + std::to_string(beta);
}

// How far a T element of alpha * (a k-term dot product) + beta * old may be from its f64
// value: 2 (k + 2) eps times the terms' magnitudes (the standard bound for a dot product).
template <class T>
double gemm_error_bound(int64_t k, double alpha, double magnitude, double beta, double old) {
  const double eps = std::numeric_limits<T>::epsilon();
  return 2 * double(k + 2) * eps * (std::abs(alpha) * magnitude + std::abs(beta * old));
}

// Checks C = alpha op(A) op(B) + beta C0 element by element against f64 sums, within
// gemm_error_bound.
template <class T>
void expect_gemm_matches_reference(const Product& p, double alpha, double beta, uint64_t seed) {
  SCOPED_TRACE(describe(p, alpha, beta));
  Shape a_shape = p.trans_a ? Shape{p.batch, p.k, p.m} : Shape{p.batch, p.m, p.k};
  Shape b_shape = p.trans_b ? Shape{p.n, p.k} : Shape{p.k, p.n};
  if (!p.shared_b) b_shape.insert(b_shape.begin(), p.batch);
  Tensor a = random_matrix<T>(a_shape, seed), b = random_matrix<T>(b_shape, seed + 1);
  Tensor c = random_matrix<T>({p.batch, p.m, p.n}, seed + 2);
  if (beta == 0.0) c = Tensor::full({p.batch, p.m, p.n}, std::nan(""), dtype_of<T>());
  const std::vector<T> c0 = c.to_vector<T>();
  ops::gemm(a, b, c, p.trans_a, p.trans_b, alpha, beta);

  const std::vector<T> va = a.to_vector<T>(), vb = b.to_vector<T>(), vc = c.to_vector<T>();
  int64_t bad = 0;
  for (int64_t l = 0; l < p.batch; ++l) {
    const T* pa = va.data() + l * p.m * p.k;
    const T* pb = vb.data() + (p.shared_b ? 0 : l * p.k * p.n);
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.n; ++j) {
        double sum = 0, magnitude = 0;
        for (int64_t q = 0; q < p.k; ++q) {
          const double x = p.trans_a ? pa[q * p.m + i] : pa[i * p.k + q];
          const double y = p.trans_b ? pb[j * p.k + q] : pb[q * p.n + j];
          sum += x * y;
          magnitude += std::abs(x * y);
        }
        const size_t at = size_t((l * p.m + i) * p.n + j);
        const double old = beta == 0.0 ? 0.0 : double(c0[at]);
        const double want = alpha * sum + beta * old;
        const double bound = gemm_error_bound<T>(p.k, alpha, magnitude, beta, old);
        if (!(std::abs(double(vc[at]) - want) <= bound) && bad++ < 3) {
          ADD_FAILURE() << "C[" << l << ", " << i << ", " << j << "] = " << vc[at] << ", want "
                        << want << " within " << bound;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

// Shapes around the tile edges of both register files (MR 6 or 8, NR 16, 24 or 48 and
// their neighbours), more than one K slice (256), more than one row block, and a panel
// wider than one NC (2016 f32 columns under AVX-512, 1008 f64 ones).
const Product kProducts[] = {
    {1, 1, 1, 1, false, false},       {1, 7, 3, 5, false, false},
    {1, 8, 16, 48, false, false},     {1, 9, 17, 49, false, false},
    {1, 6, 40, 24, false, false},     {1, 13, 257, 47, false, false},
    {1, 130, 300, 100, false, false}, {1, 3, 5, 2100, false, false},
    {2, 33, 64, 70, false, false},    {3, 20, 31, 25, false, false, true},
};

template <class T>
void check_all_transposes(uint64_t seed) {
  for (Product p : kProducts) {
    for (int flags = 0; flags < 4; ++flags) {
      p.trans_a = flags & 1;
      p.trans_b = flags & 2;
      expect_gemm_matches_reference<T>(p, 1.0, 0.0, seed++);
    }
  }
}

TEST(MatmulCpuKernel, F32MatchesF64ReferenceForEveryTranspose) {
  check_all_transposes<float>(100);
}
TEST(MatmulCpuKernel, F64MatchesReferenceForEveryTranspose) {
  check_all_transposes<double>(200);
}

TEST(MatmulCpuKernel, AlphaAndBetaScaleAndAccumulate) {
  const Product p{2, 19, 270, 53, true, false};
  for (double beta : {0.0, 1.0, -0.75}) {
    expect_gemm_matches_reference<float>(p, 0.5, beta, 300);
    expect_gemm_matches_reference<double>(p, -1.5, beta, 301);
  }
}

TEST(MatmulCpuKernel, EmptyInnerDimensionOnlyScalesC) {
  Tensor a = Tensor::empty({3, 0}), b = Tensor::empty({0, 4});
  Tensor c = Tensor::full({3, 4}, std::nan(""));
  ops::gemm(a, b, c, false, false, 1.0, 0.0);
  for (float v : c.to_vector<float>()) EXPECT_EQ(v, 0.0f);
  c = Tensor::full({3, 4}, 1.5);
  ops::gemm(a, b, c, false, false, 1.0, 2.0);
  for (float v : c.to_vector<float>()) EXPECT_EQ(v, 3.0f);
}

// Each element of C gets the same FMAs however the threads split C (and a batch), so the
// bits are the same on 1, 2 and 3 threads.
TEST(MatmulCpuKernel, BitsDoNotDependOnTheThreadCount) {
  struct Case {
    Shape a, b;
    bool trans_a, trans_b;
  };
  const Case cases[] = {{{300, 200}, {200, 170}, false, false},
                        {{1000, 90}, {257, 90}, false, true},
                        {{500, 70}, {500, 140}, true, false},
                        {{5, 40, 60}, {5, 60, 50}, false, false}};
  for (const Case& c : cases) {
    Tensor a = random_matrix<float>(c.a, 7), b = random_matrix<float>(c.b, 8);
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2, 3}) {
      testing::ScopedThreadCount scope(threads);
      // A NaN-filled C, so a block no thread wrote cannot pass as an earlier result.
      Tensor product = ops::matmul(a, b, c.trans_a, c.trans_b);
      product.copy_(Tensor::full(product.shape(), std::nan("")));
      ops::gemm(a, b, product, c.trans_a, c.trans_b);
      results.push_back(product.to_vector<float>());
    }
    EXPECT_EQ(results[0], results[1]) << shape_str(c.a) << " @ " << shape_str(c.b);
    EXPECT_EQ(results[0], results[2]) << shape_str(c.a) << " @ " << shape_str(c.b);
  }
}

// ProductOnThisThread on blocks of larger row-major buffers: A read along rows or (as a
// transposed block) along columns, B through both kinds of transposed view, C a block
// whose neighbours must stay untouched. Against f64 sums, within gemm_error_bound.
template <class T>
void expect_strided_products_match_reference(uint64_t seed) {
  struct Case {
    int64_t m, k, n;
    bool trans_a, trans_b;
    double alpha, beta;
  };
  const Case cases[] = {
      {64, 64, 96, false, true, 1.0, 0.0},   {64, 128, 64, true, false, 1.0, 1.0},
      {9, 257, 49, false, false, -0.5, 1.0}, {17, 5, 130, true, true, 2.0, 0.0},
      {1, 3, 1, false, false, 1.0, 1.0},     {130, 70, 7, true, false, 0.25, 0.0}};
  ProductOnThisThread<T> product;  // one object throughout: its buffer grows and is reused
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.m) + " x " + std::to_string(c.k) + " x " +
                 std::to_string(c.n) + (c.trans_a ? " A^T" : "") + (c.trans_b ? " B^T" : ""));
    // Each operand sits at row 2, column 3 of a buffer 5 columns wider than the block.
    auto buffer = [&](int64_t rows, int64_t cols, uint64_t s) {
      return randn64({rows + 4, cols + 5}, s, 1.0, false).to_vector<double>();
    };
    const int64_t a_rows = c.trans_a ? c.k : c.m, a_cols = c.trans_a ? c.m : c.k;
    const int64_t b_rows = c.trans_b ? c.n : c.k, b_cols = c.trans_b ? c.k : c.n;
    const std::vector<double> a64 = buffer(a_rows, a_cols, seed++);
    const std::vector<double> b64 = buffer(b_rows, b_cols, seed++);
    const std::vector<double> c64 = buffer(c.m, c.n, seed++);
    const std::vector<T> a(a64.begin(), a64.end()), b(b64.begin(), b64.end());
    std::vector<T> out(c64.begin(), c64.end());
    const int64_t lda = a_cols + 5, ldb = b_cols + 5, ldc = c.n + 5;
    const int64_t corner_a = 2 * lda + 3, corner_b = 2 * ldb + 3, corner_c = 2 * ldc + 3;
    // op(X)[i, j] of a block at the corner, row stride ld.
    auto view = [](const T* corner, int64_t rows, int64_t cols, int64_t ld, bool transposed) {
      return transposed ? StridedMatrix<const T>{corner, rows, cols, 1, ld}
                        : StridedMatrix<const T>{corner, rows, cols, ld, 1};
    };
    product(StridedMatrix<T>{out.data() + corner_c, c.m, c.n, ldc, 1},
            view(a.data() + corner_a, c.m, c.k, lda, c.trans_a),
            view(b.data() + corner_b, c.k, c.n, ldb, c.trans_b), T(c.alpha), T(c.beta));

    int64_t bad = 0;
    for (int64_t i = 0; i < c.m + 4; ++i) {
      for (int64_t j = 0; j < c.n + 5; ++j) {
        const size_t at = size_t(i * ldc + j);
        const bool inside = i >= 2 && i < c.m + 2 && j >= 3 && j < c.n + 3;
        if (!inside) {
          if (out[at] != T(c64[at]) && bad++ < 3) ADD_FAILURE() << "wrote outside at " << i;
          continue;
        }
        double sum = 0, magnitude = 0;
        for (int64_t q = 0; q < c.k; ++q) {
          const int64_t r = i - 2, col = j - 3;
          const double x = c.trans_a ? a[size_t(corner_a + q * lda + r)]
                                     : a[size_t(corner_a + r * lda + q)];
          const double y = c.trans_b ? b[size_t(corner_b + col * ldb + q)]
                                     : b[size_t(corner_b + q * ldb + col)];
          sum += x * y;
          magnitude += std::abs(x * y);
        }
        const double old = double(T(c64[at]));
        const double want = c.alpha * sum + c.beta * old;
        const double bound = gemm_error_bound<T>(c.k, c.alpha, magnitude, c.beta, old);
        if (!(std::abs(double(out[at]) - want) <= bound) && bad++ < 3) {
          ADD_FAILURE() << "C[" << i - 2 << ", " << j - 3 << "] = " << out[at] << ", want "
                        << want << " within " << bound;
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(MatmulCpuKernel, ProductOnThisThreadMatchesF64SumsOnStridedBlocks) {
  expect_strided_products_match_reference<float>(400);
  expect_strided_products_match_reference<double>(500);
}

TEST(MatmulCpuKernel, ProductOnThisThreadRejectsMismatchedOrUnreadableOperands) {
  std::vector<float> x(64, 1.0f);
  ProductOnThisThread<float> product;
  const StridedMatrix<const float> a{x.data(), 2, 3, 3, 1}, b{x.data(), 3, 4, 4, 1};
  testing::expect_error(
      [&] { product(StridedMatrix<float>{x.data(), 2, 5, 5, 1}, a, b, 1.0f, 0.0f); },
      {"cpu product", "[2, 5] = [2, 3] x [3, 4]"});
  testing::expect_error(
      [&] { product(StridedMatrix<float>{x.data(), 2, 4, 1, 2}, a, b, 1.0f, 0.0f); },
      {"cpu product", "column stride is 2"});
  testing::expect_error(
      [&] {
        product(StridedMatrix<float>{x.data(), 2, 4, 4, 1},
                StridedMatrix<const float>{x.data(), 2, 3, 6, 2}, b, 1.0f, 0.0f);
      },
      {"cpu product", "strides 6 and 2"});
}

// ops::measure_matmul_peak_flops on the CPU: between a tenth of the FMA peak on the same
// threads (other tests may share the cores) and 1.3 times it, which a flop count twice
// too high would pass (ham's GEMM reaches 0.8-0.9 of it on one thread).
TEST(MatmulPeak, MeasuredOnTheCpuIsWithinTheFmaPeak) {
  const int threads = omp_get_max_threads();
  const double gemm_peak = ops::measure_matmul_peak_flops(Device::cpu(), DType::F32, 3);
  const double fma_peak = cpu::measure_fma_peak_flops(threads, 5);
  EXPECT_GT(gemm_peak, 0.1 * fma_peak) << "GEMM " << gemm_peak << ", FMA " << fma_peak;
  EXPECT_LT(gemm_peak, 1.3 * fma_peak) << "GEMM " << gemm_peak << ", FMA " << fma_peak;
  testing::expect_error([] { ops::measure_matmul_peak_flops(Device::cpu(), DType::F32, 0); },
                        {"measure_matmul_peak_flops", "trials must be at least 1", "0"});
}

}  // namespace
}  // namespace ham
