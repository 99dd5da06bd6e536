#include "nn/reduce.h"

#include <omp.h>

#include <limits>
#include <sstream>
#include <string>

#include "core/ops/reduce.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::max_abs_diff;
using testing::randn64;

constexpr int64_t kAllDims = std::numeric_limits<int64_t>::min();  // reduce every element

struct ReduceCase {
  Shape shape;
  int64_t dim;
  bool keepdim;
};

std::string case_name(const ReduceCase& c) {
  std::ostringstream out;
  if (c.shape.empty()) out << "scalar";
  for (size_t i = 0; i < c.shape.size(); ++i) out << (i ? "x" : "") << c.shape[i];
  if (c.dim == kAllDims) {
    out << "_all";
  } else {
    out << "_dim" << (c.dim < 0 ? "m" : "") << std::abs(c.dim) << (c.keepdim ? "_keep" : "");
  }
  return out.str();
}

void PrintTo(const ReduceCase& c, std::ostream* os) { *os << case_name(c); }

Tensor reduce(bool is_mean, const Tensor& x, const ReduceCase& c) {
  if (c.dim == kAllDims) return is_mean ? mean(x) : sum(x);
  return is_mean ? mean(x, c.dim, c.keepdim) : sum(x, c.dim, c.keepdim);
}

// Plain loops over the multi-index; returns the expected values and shape.
std::pair<std::vector<double>, Shape> naive_reduce(bool is_mean, const Tensor& x,
                                                   const ReduceCase& c) {
  const Shape& s = x.shape();
  std::vector<double> xs = x.to_vector<double>();
  if (c.dim == kAllDims) {
    double total = 0;
    for (double v : xs) total += v;
    return {{is_mean ? total / double(xs.size()) : total}, {}};
  }
  int64_t rank = int64_t(s.size()), d = c.dim < 0 ? c.dim + rank : c.dim;
  Shape out_shape;
  for (int64_t k = 0; k < rank; ++k) {
    if (k != d) out_shape.push_back(s[size_t(k)]);
    else if (c.keepdim) out_shape.push_back(1);
  }
  std::vector<double> out(size_t(shape_numel(out_shape)), 0.0);
  for (size_t flat = 0; flat < xs.size(); ++flat) {
    // coordinates of flat in s, then the output index with coordinate d dropped
    std::vector<int64_t> coord(static_cast<size_t>(rank));
    size_t rest = flat;
    for (int64_t k = rank - 1; k >= 0; --k) {
      coord[size_t(k)] = int64_t(rest % size_t(s[size_t(k)]));
      rest /= size_t(s[size_t(k)]);
    }
    size_t o = 0;
    for (int64_t k = 0; k < rank; ++k) {
      if (k == d) continue;
      o = o * size_t(s[size_t(k)]) + size_t(coord[size_t(k)]);
    }
    out[o] += xs[flat];
  }
  if (is_mean) {
    for (double& v : out) v /= double(s[size_t(d)]);
  }
  return {out, out_shape};
}

class Reduce : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(Reduce, SumAndMeanGradcheck) {
  const ReduceCase c = GetParam();
  Tensor x = randn64(c.shape, 21);
  expect_gradcheck([c](const std::vector<Tensor>& v) { return std::vector{reduce(false, v[0], c)}; },
                   {x});
  expect_gradcheck([c](const std::vector<Tensor>& v) { return std::vector{reduce(true, v[0], c)}; },
                   {x});
}

TEST_P(Reduce, ForwardMatchesNaiveLoops) {
  const ReduceCase c = GetParam();
  Tensor x = randn64(c.shape, 22);
  for (bool is_mean : {false, true}) {
    SCOPED_TRACE(is_mean ? "mean" : "sum");
    auto [expected, expected_shape] = naive_reduce(is_mean, x, c);
    Tensor y = reduce(is_mean, x, c);
    ASSERT_EQ(y.shape(), expected_shape);
    auto got = y.to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-12);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Reduce,
    ::testing::Values(ReduceCase{{3, 4}, 0, false}, ReduceCase{{3, 4}, 1, false},
                      ReduceCase{{3, 4}, -1, true}, ReduceCase{{2, 3, 4}, 1, false},
                      ReduceCase{{2, 3, 4}, 1, true}, ReduceCase{{2, 3, 4}, -3, false},
                      ReduceCase{{2, 1, 3}, 1, false},  // size-1 reduced dim
                      ReduceCase{{1, 1}, 0, true}, ReduceCase{{5}, 0, false},
                      ReduceCase{{1}, -1, false}, ReduceCase{{3, 4}, kAllDims, false},
                      ReduceCase{{2, 1, 3}, kAllDims, false}, ReduceCase{{1}, kAllDims, false},
                      ReduceCase{{}, kAllDims, false}),
    [](const ::testing::TestParamInfo<ReduceCase>& info) { return case_name(info.param); });

// Shapes big enough for the parallel and chunked paths.
const ReduceCase kLargeCases[] = {
    {{300000}, kAllDims, false}, {{3, 70000}, 1, false}, {{70000, 3}, 0, false},
    {{50, 40, 30}, 1, false},    {{40, 1000}, 0, true},  {{1000, 129}, -2, false}};

TEST(Reduce, LargeF32AgreesWithF64) {
  for (const ReduceCase& c : kLargeCases) {
    SCOPED_TRACE(case_name(c));
    Tensor x64 = randn64(c.shape, 23, 1.0, false);
    for (bool is_mean : {false, true}) {
      Tensor y64 = reduce(is_mean, x64, c);
      Tensor y32 = reduce(is_mean, x64.to(DType::F32), c);
      // f32 inputs and output rounding only: accumulation is in f64.
      auto [expected, shape] = naive_reduce(is_mean, x64.to(DType::F32), c);
      (void)shape;
      auto got = y32.to_vector<double>();
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], expected[i], 1e-6 * (1 + std::abs(expected[i])));
      }
      EXPECT_LT(max_abs_diff(y32, y64), 1e-3);
    }
  }
}

TEST(Reduce, ResultDoesNotDependOnThreadCount) {
  int saved = omp_get_max_threads();
  for (const ReduceCase& c : kLargeCases) {
    SCOPED_TRACE(case_name(c));
    Tensor x = randn64(c.shape, 24, 1.0, false).to(DType::F32);
    omp_set_num_threads(1);
    std::vector<float> one = reduce(false, x, c).to_vector<float>();
    for (int threads : {2, 3, 7}) {
      omp_set_num_threads(threads);
      EXPECT_EQ(reduce(false, x, c).to_vector<float>(), one) << threads << " threads";
    }
  }
  omp_set_num_threads(saved);
}

TEST(Reduce, LargeBackwardGradcheckSampled) {
  GradcheckOptions options;
  options.max_elements_per_input = 30;
  Tensor x = randn64({200, 300}, 25);
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{mean(v[0], 0)}; }, {x},
                   options);
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{sum(v[0], -1, true)}; },
                   {x}, options);
}

using testing::expect_error;

TEST(Reduce, DimOutOfRangeNamesOpDimAndShape) {
  Tensor x = Tensor::zeros({2, 3}, DType::F64);
  expect_error([&] { sum(x, 2); }, {"sum", "2", "[2, 3]"});
  expect_error([&] { mean(x, -3, true); }, {"mean", "-3", "[2, 3]"});
  expect_error([&] { sum(Tensor::scalar(1.0), 0); }, {"sum", "0", "[]"});
}

// The CUDA kernels against the CPU reference: fresh random inputs, NaN-poisoned outputs,
// f32, bf16 and f64; row, column and split reductions. Skips without a GPU.
TEST(Reduce, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  for (DType dtype : testing::kGpuDtypesAndF64) {
    uint64_t seed = 20;
    for (const Shape& shape : std::vector<Shape>{{3, 5000, 7}, {200000}, {1, 70000, 3}, {9, 40}}) {
      Tensor x = testing::random_tensor(shape, dtype, gpu, seed++, 1.0, 0.5);
      Tensor x_cpu = testing::cpu_reference(x);
      for (int64_t dim = -1; dim < int64_t(shape.size()); ++dim) {  // -1: every element
        const bool all = dim < 0;
        ReduceDims dims = all ? ReduceDims{1, x.numel(), 1} : ops::reduce_dims(shape, dim);
        Shape out_shape = all ? Shape{} : ops::reduced_shape(shape, dim, false);
        const double scale = 1.0 / double(dims.len);  // a mean
        const std::string what = "mean of " + shape_str(shape) + " over dim " + std::to_string(dim);
        Tensor want = ops::reduce_sum("mean", x_cpu, dims, scale, out_shape);
        Tensor out = testing::poisoned(out_shape, dtype, gpu);
        reduce_sum_kernels()(gpu, x, out, dims, scale);
        testing::expect_matches_reference(out, want, dtype, what);

        Tensor dy = testing::random_tensor(out_shape, dtype, gpu, seed++);
        Tensor want_dx = ops::reduce_sum_backward(testing::cpu_reference(dy), shape, dims, scale);
        Tensor dx = testing::poisoned(shape, dtype, gpu);
        reduce_sum_backward_kernels()(gpu, dy, dx, dims, scale);
        testing::expect_matches_reference(dx, want_dx, dtype, what + " backward");
      }
    }
  }
}

}  // namespace
}  // namespace ham
