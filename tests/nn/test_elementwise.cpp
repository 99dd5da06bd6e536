#include "nn/elementwise.h"

#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/ops/elementwise.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::randn64;
using testing::uniform64;

struct BroadcastCase {
  Shape a, b;
};

void PrintTo(const BroadcastCase& c, std::ostream* os) { *os << shape_str(c.a) << "_" << shape_str(c.b); }


class BinaryGradcheck : public ::testing::TestWithParam<BroadcastCase> {};

TEST_P(BinaryGradcheck, AddSubMulDiv) {
  const auto& c = GetParam();
  Tensor a = randn64(c.a, 1);
  Tensor b = uniform64(c.b, 2, 0.5, 2.0);  // away from 0 for div
  expect_gradcheck([](const std::vector<Tensor>& x) { return std::vector{add(x[0], x[1])}; }, {a, b});
  expect_gradcheck([](const std::vector<Tensor>& x) { return std::vector{sub(x[0], x[1])}; }, {a, b});
  expect_gradcheck([](const std::vector<Tensor>& x) { return std::vector{mul(x[0], x[1])}; }, {a, b});
  expect_gradcheck([](const std::vector<Tensor>& x) { return std::vector{div(x[0], x[1])}; }, {a, b});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BinaryGradcheck,
    ::testing::Values(BroadcastCase{{3, 4}, {3, 4}},        // same shape
                      BroadcastCase{{2, 3, 4}, {4}},        // bias over the last dim
                      BroadcastCase{{2, 3, 4}, {3, 1}},     // middle stretch
                      BroadcastCase{{1, 4}, {3, 1}},        // both stretch
                      BroadcastCase{{2, 1, 4}, {1, 3, 1}},  // 3-D both ways
                      BroadcastCase{{}, {2, 3}},            // 0-d scalar
                      BroadcastCase{{1}, {1}}));            // size-1

TEST(Elementwise, ScaleAndAddScalarGradcheck) {
  Tensor x = randn64({2, 5}, 3);
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{scale(v[0], -2.5)}; }, {x});
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{add_scalar(v[0], 4.0)}; }, {x});
}

TEST(Elementwise, ForwardValuesBroadcast) {
  Tensor a = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<double>({10, 20}, {2, 1});
  auto y = (a * b).to_vector<double>();
  EXPECT_EQ(y, (std::vector<double>{10, 20, 30, 80, 100, 120}));
}

TEST(Elementwise, ShapeMismatchNamesOpAndShapes) {
  Tensor a = Tensor::zeros({2, 3});
  Tensor b = Tensor::zeros({4});
  try {
    add(a, b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("add"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
  }
}

// Every operand shape that broadcasts to `out`: each dim kept or stretched to 1, and the
// leading dims dropped where they are 1.
std::vector<Shape> shapes_broadcasting_to(const Shape& out) {
  std::vector<Shape> shapes;
  for (uint32_t mask = 0; mask < (1u << out.size()); ++mask) {
    Shape s = out;
    for (size_t d = 0; d < out.size(); ++d) {
      if (mask & (1u << d)) s[d] = 1;
    }
    shapes.push_back(s);
    size_t leading = 0;
    while (leading < s.size() && s[leading] == 1) ++leading;
    if (leading > 0) shapes.push_back(Shape(s.begin() + int64_t(leading), s.end()));
  }
  return shapes;
}

// Offset into a tensor of shape `s` of flat index `flat` of `out` (right-aligned broadcast).
int64_t naive_offset(const Shape& s, const Shape& out, int64_t flat) {
  int64_t offset = 0, stride = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    size_t o = out.size() - 1 - i;
    int64_t index = flat % out[o];
    flat /= out[o];
    if (i < s.size()) {
      int64_t size = s[s.size() - 1 - i];
      if (size != 1) offset += index * stride;
      stride *= size;
    }
  }
  return offset;
}

// Output shapes for the CPU kernels' tests: small ones, one big enough to go parallel, and
// rows longer than a binary op's piece (4096).
const Shape kOutShapes[] = {{2, 3, 4, 5}, {7, 1, 9}, {64, 3, 200}, {2, 9000}, {5}, {}};

// Each binary op of every broadcast pattern against a loop that maps each output element to
// its operands: the same arithmetic, so the same bits.
TEST(Elementwise, CpuBinaryMatchesANaiveLoopOverEveryBroadcastPattern) {
  uint64_t seed = 40;
  for (const Shape& out : kOutShapes) {
    for (const Shape& sa : shapes_broadcasting_to(out)) {
      for (const Shape& sb : shapes_broadcasting_to(out)) {
        if (ops::broadcast_shapes("test", sa, sb) != out) continue;
        Tensor a = randn64(sa, ++seed), b = uniform64(sb, ++seed, 0.5, 2.0);
        const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
        for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div}) {
          auto got = ops::binary(op, a, b).to_vector<double>();
          ASSERT_EQ(int64_t(got.size()), shape_numel(out));
          for (int64_t i = 0; i < int64_t(got.size()); ++i) {
            double x = va[size_t(naive_offset(sa, out, i))];
            double y = vb[size_t(naive_offset(sb, out, i))];
            double want = op == BinaryOp::Add   ? x + y
                          : op == BinaryOp::Sub ? x - y
                          : op == BinaryOp::Mul ? x * y
                                                : x / y;
            ASSERT_EQ(got[size_t(i)], want) << binary_op_name(op) << " " << shape_str(sa)
                                            << " " << shape_str(sb) << " at " << i;
          }
        }
      }
    }
  }
}

// sum_to to every shape the input broadcasts from, against a long-double sum; and the same
// bits on one thread as on all of them.
TEST(Elementwise, CpuSumToMatchesANaiveSumOverEveryPatternOnAnyThreadCount) {
  uint64_t seed = 70;
  for (const Shape& in_shape : kOutShapes) {
    for (DType dtype : {DType::F64, DType::F32}) {
      Tensor x = randn64(in_shape, ++seed).to(dtype);
      const auto vx = x.to_vector<double>();
      for (const Shape& target : shapes_broadcasting_to(in_shape)) {
        SCOPED_TRACE(shape_str(in_shape) + " to " + shape_str(target) + " " + dtype_name(dtype));
        Tensor sum = ops::sum_to(x, target);
        std::vector<long double> want(size_t(shape_numel(target)), 0.0L);
        for (int64_t i = 0; i < int64_t(vx.size()); ++i) {
          want[size_t(naive_offset(target, in_shape, i))] += vx[size_t(i)];
        }
        const auto got = sum.to_vector<double>();
        const double tolerance = dtype == DType::F64 ? 1e-12 : 1e-5;
        for (size_t j = 0; j < got.size(); ++j) {
          ASSERT_NEAR(got[j], double(want[j]), tolerance * (1 + std::abs(double(want[j]))))
              << "element " << j;
        }
        const int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        const auto serial = ops::sum_to(x, target).to_vector<double>();
        omp_set_num_threads(threads);
        EXPECT_EQ(serial, got);
      }
    }
  }
}

// The CUDA kernels against the CPU reference: fresh random inputs, NaN-poisoned outputs,
// f32, bf16 and f64 (relative RMS error <= 1e-5 / 1e-2 / 1e-12). Skips without a GPU.
TEST(Elementwise, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{4, 33, 20}, {4, 33, 20}},  // same shape
      {{4, 33, 20}, {20}},         // a bias
      {{4, 1, 20}, {33, 1}},       // both stretched
      {{3}, {2, 5, 3}}};
  for (DType dtype : testing::kGpuDtypesAndF64) {
    uint64_t seed = 1;
    for (const auto& [sa, sb] : cases) {
      for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div}) {
        Tensor a = testing::random_tensor(sa, dtype, gpu, seed++);
        Tensor b = op == BinaryOp::Div ? testing::random_tensor(sb, dtype, gpu, seed++, 0.4, 2.0)
                                       : testing::random_tensor(sb, dtype, gpu, seed++);
        Tensor want = ops::binary(op, testing::cpu_reference(a), testing::cpu_reference(b));
        Tensor out = testing::poisoned(want.shape(), dtype, gpu);
        binary_kernels()(gpu, op, a, b, out);
        testing::expect_matches_reference(
            out, want, dtype, std::string(binary_op_name(op)) + shape_str(sa) + shape_str(sb));
      }
    }
    // Same shapes in 16-byte vectors, then in views off a 16-byte boundary (element by
    // element): binary ops, axpy_ and scale_.
    for (bool offset_views : {false, true}) {
      auto place = [&](const Tensor& t) { return offset_views ? testing::one_element_in(t) : t; };
      const std::string where = offset_views ? " (offset views)" : "";
      for (BinaryOp op : {BinaryOp::Add, BinaryOp::Mul}) {
        Tensor a = place(testing::random_tensor({3, 1001}, dtype, gpu, seed++));
        Tensor b = place(testing::random_tensor({3, 1001}, dtype, gpu, seed++));
        Tensor want = ops::binary(op, testing::cpu_reference(a), testing::cpu_reference(b));
        Tensor out = place(testing::poisoned(want.shape(), dtype, gpu));
        binary_kernels()(gpu, op, a, b, out);
        testing::expect_matches_reference(out, want, dtype, binary_op_name(op) + where);
      }
      Tensor src = place(testing::random_tensor({5000}, dtype, gpu, seed++));
      Tensor dst = place(testing::random_tensor({5000}, dtype, gpu, seed++));
      Tensor want = testing::cpu_reference(dst).clone();
      ops::axpy_(0.75, testing::cpu_reference(src), want);
      ops::axpy_(0.75, src, dst);
      testing::expect_matches_reference(dst, want, dtype, "axpy_" + where);
      ops::scale_(want, -1.5);
      ops::scale_(dst, -1.5);
      testing::expect_matches_reference(dst, want, dtype, "scale_" + where);
    }

    Tensor x = testing::random_tensor({4, 333, 20}, dtype, gpu, seed++, 1.0, 0.5);
    for (const Shape& target : std::vector<Shape>{{20}, {4, 1, 20}, {333, 1}, {4, 333, 1}, {1}, {}}) {
      Tensor want_sum = ops::sum_to(testing::cpu_reference(x), target);
      Tensor out = testing::poisoned(target, dtype, gpu);
      sum_to_kernels()(gpu, x, out);
      testing::expect_matches_reference(out, want_sum, dtype, "sum_to " + shape_str(target));
    }
    // Runs of reduced dims apart (each its own pass, innermost first, through the compute
    // type): an inner run that is not the last dim, rows past a warp's reach, and runs
    // apart only by a dim of size 1 (the outer run's rows then have inner 1 too).
    for (const auto& [shape, target] : std::vector<std::pair<Shape, Shape>>{
             {{3, 4, 5, 6}, {4, 1, 6}}, {{2, 3, 1500}, {3, 1}}, {{4, 1, 1500}, {1}},
             {{1500, 1, 4}, {1}}}) {
      Tensor y = testing::random_tensor(shape, dtype, gpu, seed++, 1.0, 0.5);
      Tensor want_sum = ops::sum_to(testing::cpu_reference(y), target);
      Tensor out = testing::poisoned(target, dtype, gpu);
      sum_to_kernels()(gpu, y, out);
      testing::expect_matches_reference(out, want_sum, dtype,
                                        "sum_to " + shape_str(shape) + " -> " + shape_str(target));
    }
  }
}

}  // namespace
}  // namespace ham
