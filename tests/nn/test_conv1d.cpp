#include "nn/conv1d.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/ops/conv1d.h"
#include "core/ops/unary.h"
#ifdef HAM_WITH_CUDA
#include "cuda/conv1d.h"
#endif
#include "nn/shape.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::randn64;

// y[b, t, c] = bias[c] + sum_j w[c, j] x[b, t - (W-1) + j, c], zero before t = 0 and
// before the start of t's document (found here by walking back while the id is unchanged).
std::vector<double> naive_conv(const Tensor& x, const Tensor& w, const Tensor& bias,
                               const Tensor& doc_ids = Tensor()) {
  int64_t B = x.size(0), T = x.size(1), C = x.size(2), W = w.size(1);
  std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> bv =
      bias.defined() ? bias.to_vector<double>() : std::vector<double>(size_t(C), 0.0);
  std::vector<int64_t> ids = doc_ids.defined() ? doc_ids.to_vector<int64_t>()
                                               : std::vector<int64_t>(size_t(B * T), 0);
  std::vector<double> y(xv.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        int64_t start = t;
        while (start > 0 && ids[size_t(b * T + start - 1)] == ids[size_t(b * T + t)]) --start;
        double acc = bv[size_t(c)];
        for (int64_t j = 0; j < W; ++j) {
          int64_t s = t - (W - 1) + j;
          if (s >= start) acc += wv[size_t(c * W + j)] * xv[size_t((b * T + s) * C + c)];
        }
        y[size_t((b * T + t) * C + c)] = acc;
      }
  return y;
}

struct ConvCase {
  int64_t batch, seq, channels, width;
  bool bias;
};
void PrintTo(const ConvCase& c, std::ostream* os) {
  *os << "B" << c.batch << "_T" << c.seq << "_C" << c.channels << "_W" << c.width
      << (c.bias ? "_bias" : "_nobias");
}

class CausalConv1dTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(CausalConv1dTest, ForwardMatchesNaive) {
  const auto& c = GetParam();
  Tensor x = randn64({c.batch, c.seq, c.channels}, 1, 1.0, false);
  Tensor w = randn64({c.channels, c.width}, 2, 1.0, false);
  Tensor b = c.bias ? randn64({c.channels}, 3, 1.0, false) : Tensor();
  std::vector<double> expected = naive_conv(x, w, b);
  std::vector<double> y = causal_conv1d(x, w, b).to_vector<double>();
  ASSERT_EQ(y.size(), expected.size());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-14);
  std::vector<float> yf =
      causal_conv1d(x.to(DType::F32), w.to(DType::F32), c.bias ? b.to(DType::F32) : Tensor())
          .to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(yf[i], expected[i], 1e-5);
}

TEST_P(CausalConv1dTest, Gradcheck) {
  const auto& c = GetParam();
  Tensor x = randn64({c.batch, c.seq, c.channels}, 4);
  Tensor w = randn64({c.channels, c.width}, 5);
  if (c.bias) {
    Tensor b = randn64({c.channels}, 6);
    expect_gradcheck(
        [](const std::vector<Tensor>& v) { return std::vector{causal_conv1d(v[0], v[1], v[2])}; },
        {x, w, b});
  } else {
    expect_gradcheck(
        [](const std::vector<Tensor>& v) { return std::vector{causal_conv1d(v[0], v[1])}; },
        {x, w});
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CausalConv1dTest,
                         ::testing::Values(ConvCase{2, 5, 3, 3, true},
                                           ConvCase{1, 1, 2, 1, true},   // W = 1, T = 1, B = 1
                                           ConvCase{2, 4, 3, 1, false},  // W = 1
                                           ConvCase{2, 3, 2, 5, true},   // W > T
                                           ConvCase{1, 6, 1, 4, false}));

TEST(CausalConv1d, GradientToWeightOnlyWhenInputIsConstant) {
  Tensor x = randn64({2, 4, 3}, 7, 1.0, false);
  Tensor w = randn64({3, 2}, 8);
  expect_gradcheck(
      [x](const std::vector<Tensor>& v) { return std::vector{causal_conv1d(x, v[0])}; }, {w});
}

TEST(CausalConv1d, F32ChannelBlocksMatchNaive) {
  // More channels than one backward block, so several blocks run.
  Tensor x = randn64({2, 6, 150}, 9, 1.0, false);
  Tensor w = randn64({150, 4}, 10, 1.0, false);
  std::vector<double> expected = naive_conv(x, w, Tensor());
  std::vector<float> y = causal_conv1d(x.to(DType::F32), w.to(DType::F32)).to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-5);
  Tensor xg = randn64({2, 6, 150}, 11), wg = randn64({150, 4}, 12), bg = randn64({150}, 13);
  GradcheckOptions sampled;
  sampled.max_elements_per_input = 60;
  expect_gradcheck(
      [](const std::vector<Tensor>& v) { return std::vector{causal_conv1d(v[0], v[1], v[2])}; },
      {xg, wg, bg}, sampled);
}

// The weight and bias gradients over many rows (row tasks of 64, at most 64 of them, with
// documents) against sums in f64 straight from the definition, and the same bits on 1, 2
// and 3 threads.
TEST(CausalConv1d, F32WeightGradientOverManyRowTasksMatchesF64Sums) {
  const int64_t B = 3, T = 1500, C = 40, W = 4;  // 4500 rows: 64 tasks of 71 rows
  Tensor x = randn64({B, T, C}, 40, 1.0, false), dy = randn64({B, T, C}, 41, 1.0, false);
  Tensor w = randn64({C, W}, 42, 1.0, false);
  std::vector<int64_t> ids(size_t(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i / 97);  // documents of 97 tokens
  Tensor docs = Tensor::from_vector(ids, {B, T});

  std::vector<double> xv = x.to_vector<double>(), gv = dy.to_vector<double>();
  std::vector<double> want_w(size_t(C * W), 0.0), want_b(size_t(C), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const size_t row = size_t(b * T + t);
        const double g = gv[row * size_t(C) + size_t(c)];
        want_b[size_t(c)] += g;
        for (int64_t j = 0; j < W; ++j) {
          const int64_t s = t - (W - 1) + j;
          if (s < 0 || ids[size_t(b * T + s)] != ids[row]) continue;
          want_w[size_t(c * W + j)] += g * xv[size_t((b * T + s) * C + c)];
        }
      }

  Tensor x32 = x.to(DType::F32), dy32 = dy.to(DType::F32), w32 = w.to(DType::F32);
  std::vector<std::vector<float>> dweights, dbiases;
  const int saved_threads = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    auto g = ops::causal_conv1d_backward(dy32, x32, w32, false, true, true, docs);
    dweights.push_back(g.dweight.to_vector<float>());
    dbiases.push_back(g.dbias.to_vector<float>());
  }
  omp_set_num_threads(saved_threads);
  for (size_t i = 0; i < want_w.size(); ++i) {
    EXPECT_NEAR(dweights[0][i], want_w[i], 1e-5 * (1 + std::abs(want_w[i]))) << i;
  }
  for (size_t i = 0; i < want_b.size(); ++i) {
    EXPECT_NEAR(dbiases[0][i], want_b[i], 1e-5 * (1 + std::abs(want_b[i]))) << i;
  }
  EXPECT_EQ(dweights[0], dweights[1]);
  EXPECT_EQ(dweights[0], dweights[2]);
  EXPECT_EQ(dbiases[0], dbiases[1]);
  EXPECT_EQ(dbiases[0], dbiases[2]);
}

// No rows at all (T = 0): the weight and bias gradients are sums of nothing, zeros.
TEST(CausalConv1d, EmptySequenceGivesZeroWeightAndBiasGradients) {
  Tensor x = Tensor::zeros({2, 0, 3}), dy = Tensor::zeros({2, 0, 3});
  Tensor w = randn64({3, 4}, 43, 1.0, false).to(DType::F32);
  auto g = ops::causal_conv1d_backward(dy, x, w, true, true, true);
  EXPECT_EQ(g.dx.shape(), (Shape{2, 0, 3}));
  for (float v : g.dweight.to_vector<float>()) EXPECT_EQ(v, 0.0f);
  for (float v : g.dbias.to_vector<float>()) EXPECT_EQ(v, 0.0f);
}

// Row 0: documents of lengths 2, 1 (a one-token document), 3, and an id that comes back
// (0 after 2 is a new document). Row 1: one document (i32 ids take the same path).
Tensor packed_doc_ids(DType dtype) {
  return Tensor::from_vector(std::vector<int64_t>{0, 0, 1, 2, 2, 2, 0, 0,  //
                                                  5, 5, 5, 5, 5, 5, 5, 5},
                             {2, 8})
      .to(dtype);
}

TEST(CausalConv1dDocuments, ForwardMatchesNaive) {
  for (DType id_dtype : {DType::I64, DType::I32}) {
    Tensor docs = packed_doc_ids(id_dtype);
    Tensor x = randn64({2, 8, 3}, 21, 1.0, false);
    Tensor w = randn64({3, 3}, 22, 1.0, false);
    Tensor b = randn64({3}, 23, 1.0, false);
    std::vector<double> expected = naive_conv(x, w, b, docs);
    std::vector<double> y = causal_conv1d(x, w, b, docs).to_vector<double>();
    ASSERT_EQ(y.size(), expected.size());
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-14) << i;
    // The reset changes something: without doc_ids row 0 differs.
    std::vector<double> unreset = causal_conv1d(x, w, b).to_vector<double>();
    EXPECT_GT(std::abs(unreset[3 * 3] - y[3 * 3]), 1e-6);
  }
}

TEST(CausalConv1dDocuments, Gradcheck) {
  Tensor docs = packed_doc_ids(DType::I64);
  Tensor x = randn64({2, 8, 3}, 24), w = randn64({3, 4}, 25), b = randn64({3}, 26);
  expect_gradcheck(
      [docs](const std::vector<Tensor>& v) {
        return std::vector{causal_conv1d(v[0], v[1], v[2], docs)};
      },
      {x, w, b});
  expect_gradcheck(
      [docs](const std::vector<Tensor>& v) {
        return std::vector{causal_conv1d(v[0], v[1], Tensor(), docs)};
      },
      {x, w});
}

// The SiLU form is the conv then silu: on the CPU the same kernels, so bit for bit in f64
// and f32, forward and every gradient (its backward recomputes y and applies silu's
// backward); and its own f64 gradcheck, with bias and documents.
TEST(CausalConv1dSilu, EqualsSiluOfTheConvAndPassesGradcheck) {
  Tensor docs = packed_doc_ids(DType::I64);
  for (DType dtype : {DType::F64, DType::F32}) {
    Tensor x = randn64({2, 8, 3}, 40, 1.0, false).to(dtype);
    Tensor w = randn64({3, 4}, 41, 1.0, false).to(dtype);
    Tensor b = randn64({3}, 42, 1.0, false).to(dtype);
    Tensor dz = randn64({2, 8, 3}, 43, 1.0, false).to(dtype);
    Tensor y = ops::causal_conv1d(x, w, b, docs);
    EXPECT_EQ(ops::causal_conv1d(x, w, b, docs, Conv1dActivation::SiLU).to_vector<double>(),
              ops::unary(UnaryOp::Silu, y).to_vector<double>())
        << dtype_name(dtype);
    Tensor dy = ops::unary_backward(UnaryOp::Silu, dz, y);
    auto want = ops::causal_conv1d_backward(dy, x, w, true, true, true, docs);
    auto got = ops::causal_conv1d_backward(dz, x, w, true, true, true, docs, b,
                                           Conv1dActivation::SiLU);
    EXPECT_EQ(got.dx.to_vector<double>(), want.dx.to_vector<double>()) << dtype_name(dtype);
    EXPECT_EQ(got.dweight.to_vector<double>(), want.dweight.to_vector<double>());
    EXPECT_EQ(got.dbias.to_vector<double>(), want.dbias.to_vector<double>());
  }
  Tensor x = randn64({2, 8, 3}, 44), w = randn64({3, 4}, 45), b = randn64({3}, 46);
  expect_gradcheck(
      [docs](const std::vector<Tensor>& v) {
        return std::vector{causal_conv1d(v[0], v[1], v[2], docs, Conv1dActivation::SiLU)};
      },
      {x, w, b});
  expect_gradcheck(
      [](const std::vector<Tensor>& v) {
        return std::vector{causal_conv1d(v[0], v[1], Tensor(), Tensor(), Conv1dActivation::SiLU)};
      },
      {x, w});
}

TEST(CausalConv1dDocuments, PackedPairEqualsEachDocumentAlone) {
  // Documents of lengths 3 and 5 packed in one row: outputs, dx and dweight equal those
  // of the two documents run on their own (dweight summed over the two).
  const int64_t C = 4, W = 4;
  Tensor first = randn64({1, 3, C}, 27, 1.0, false), second = randn64({1, 5, C}, 28, 1.0, false);
  Tensor dy_first = randn64({1, 3, C}, 29, 1.0, false);
  Tensor dy_second = randn64({1, 5, C}, 30, 1.0, false);
  Tensor w = randn64({C, W}, 31, 1.0, false);
  Tensor packed = concat({first, second}, 1), dy_packed = concat({dy_first, dy_second}, 1);
  Tensor docs = Tensor::from_vector(std::vector<int64_t>{7, 7, 7, 8, 8, 8, 8, 8}, {1, 8});

  std::vector<double> y = ops::causal_conv1d(packed, w, Tensor(), docs).to_vector<double>();
  std::vector<double> alone = ops::causal_conv1d(first, w).to_vector<double>();
  std::vector<double> second_alone = ops::causal_conv1d(second, w).to_vector<double>();
  alone.insert(alone.end(), second_alone.begin(), second_alone.end());
  ASSERT_EQ(y.size(), alone.size());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], alone[i], 1e-14) << i;

  auto g = ops::causal_conv1d_backward(dy_packed, packed, w, true, true, false, docs);
  auto g1 = ops::causal_conv1d_backward(dy_first, first, w, true, true, false);
  auto g2 = ops::causal_conv1d_backward(dy_second, second, w, true, true, false);
  std::vector<double> dx = g.dx.to_vector<double>(), dx1 = g1.dx.to_vector<double>(),
                      dx2 = g2.dx.to_vector<double>();
  dx1.insert(dx1.end(), dx2.begin(), dx2.end());
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx[i], dx1[i], 1e-13) << i;
  std::vector<double> dw = g.dweight.to_vector<double>(), dw1 = g1.dweight.to_vector<double>(),
                      dw2 = g2.dweight.to_vector<double>();
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw[i], dw1[i] + dw2[i], 1e-13) << i;
}

TEST(CausalConv1d, BadShapesNameOpAndShapes) {
  auto expect_error = [](const std::function<void()>& fn, const std::vector<std::string>& parts) {
    try {
      fn();
      FAIL() << "expected an error";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("causal_conv1d"), std::string::npos) << msg;
      for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
    }
  };
  expect_error([] { causal_conv1d(Tensor::zeros({1, 4, 3}), Tensor::zeros({2, 3})); },
               {"[1, 4, 3]", "[2, 3]"});
  expect_error([] { causal_conv1d(Tensor::zeros({1, 4, 3}), Tensor::zeros({3, 0})); },
               {"[3, 0]"});
  expect_error([] {
    causal_conv1d(Tensor::zeros({1, 4, 3}), Tensor::zeros({3, 2}), Tensor::zeros({2}));
  }, {"[2]", "[1, 4, 3]"});
  expect_error([] {
    causal_conv1d(Tensor::zeros({1, 4, 3}), Tensor::zeros({3, 2}), Tensor(),
                  Tensor::zeros({1, 3}, DType::I64));
  }, {"doc_ids", "[1, 3]", "[1, 4, 3]"});
  expect_error([] {
    causal_conv1d(Tensor::zeros({1, 4, 3}), Tensor::zeros({3, 2}), Tensor(),
                  Tensor::zeros({1, 4}));
  }, {"doc_ids", "i32 or i64"});
}

// The CUDA kernels against the CPU reference: fresh random inputs, packed documents
// (ids that change, including A B A; i64 and i32), with and without bias, NaN-poisoned
// outputs and gradients, f32, bf16 and f64. Skips without a GPU.
TEST(CausalConv1d, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  const int64_t batch = 2, seq = 23, channels = 40, width = 4;
  std::vector<int64_t> ids(size_t(batch * seq));
  for (int64_t t = 0; t < seq; ++t) {
    ids[size_t(t)] = t < 5 ? 7 : t < 6 ? 8 : t < 15 ? 7 : 9;  // A B A C
    ids[size_t(seq + t)] = t / 2;                             // documents of 2 tokens
  }
  for (DType dtype : testing::kGpuDtypesAndF64) {
    uint64_t seed = 80;
    // no documents, then i64 and i32 document ids
    for (int docs = 0; docs < 3; ++docs) {
      const bool with_docs = docs > 0;
      const DType ids_dtype = docs == 1 ? DType::I64 : DType::I32;
      for (bool with_bias : {false, true}) {
        const std::string what =
            std::string("causal_conv1d") +
            (with_docs ? std::string(" ") + dtype_name(ids_dtype) + " docs" : "") +
            (with_bias ? " bias" : "");
        Tensor doc_ids =
            with_docs ? Tensor::from_vector(ids, {batch, seq}).to(ids_dtype).to(gpu) : Tensor();
        Tensor doc_ids_cpu = with_docs ? doc_ids.to(Device::cpu()) : Tensor();
        Tensor x = testing::random_tensor({batch, seq, channels}, dtype, gpu, seed++);
        Tensor weight = testing::random_tensor({channels, width}, dtype, gpu, seed++);
        Tensor bias = with_bias ? testing::random_tensor({channels}, dtype, gpu, seed++) : Tensor();
        Tensor dy = testing::random_tensor({batch, seq, channels}, dtype, gpu, seed++);
        Tensor x_cpu = testing::cpu_reference(x), weight_cpu = testing::cpu_reference(weight);
        Tensor want =
            ops::causal_conv1d(x_cpu, weight_cpu, testing::cpu_reference(bias), doc_ids_cpu);
        auto want_grads = ops::causal_conv1d_backward(testing::cpu_reference(dy), x_cpu, weight_cpu,
                                                      true, true, true, doc_ids_cpu);
        Tensor y = testing::poisoned(x.shape(), dtype, gpu);
        causal_conv1d_kernels()(gpu, x, weight, bias, doc_ids, Conv1dActivation::None, y);
        testing::expect_matches_reference(y, want, dtype, what);
        Tensor dx = testing::poisoned(x.shape(), dtype, gpu);
        Tensor dweight = testing::poisoned(weight.shape(), dtype, gpu);
        Tensor dbias = testing::poisoned({channels}, dtype, gpu);
        causal_conv1d_backward_kernels()(gpu, dy, x, weight, Tensor(), doc_ids,
                                         Conv1dActivation::None, dx, dweight, dbias);
        testing::expect_matches_reference(dx, want_grads.dx, dtype, what + " dx");
        testing::expect_matches_reference(dweight, want_grads.dweight, dtype, what + " dweight");
        testing::expect_matches_reference(dbias, want_grads.dbias, dtype, what + " dbias");
      }
    }
  }
}

// The span kernels (widths up to 8) against the CPU: spans of 1, 3, 16 and the automatic
// rows (a span shorter than the width reads dy across several spans ahead and x behind),
// and the per-element kernels at widths 4 and 8 (set_conv1d_spans off); widths 1 to 8 and
// 9 (the per-element kernels); documents of 1 to 40 tokens that start inside and at the
// edges of spans; the SiLU form (y recomputed in the backward); 70 channels (a partial last
// block of 32); each gradient asked for alone and all together; f32, bf16 and f64. Skips
// without a GPU.
TEST(CausalConv1d, GpuSpansMatchCpu) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting automatic(&cuda::set_conv1d_span_rows, 0);
  const testing::ScopedSetting spans_on(&cuda::set_conv1d_spans, true);
  const Device gpu = Device::cuda();
  const int64_t batch = 2, seq = 150, channels = 70;
  std::vector<int64_t> ids(size_t(batch * seq));
  for (int64_t t = 0, doc = 0, left = 1; t < seq; ++t, --left) {  // lengths 1, 2, 3, 5, 8, ...
    if (left == 0) left = ++doc < 8 ? int64_t(1) << (doc / 2) : 40;
    ids[size_t(t)] = doc % 2;  // alternating ids: A B A B ...
  }
  for (int64_t t = 0; t < seq; ++t) ids[size_t(seq + t)] = t < 16 ? 0 : t < 17 ? 1 : t / 37 + 2;
  uint64_t seed = 300;
  for (DType dtype : testing::kGpuDtypesAndF64) {
    for (int span_rows : {1, 3, 16, 0, -1}) {  // -1: the per-element kernels at every width
      for (int64_t width : {1, 2, 4, 5, 8, 9}) {
        if ((span_rows == 3 || span_rows == -1) && width != 4 && width != 8) continue;
        // no docs; docs (i64 ids); docs (i32 ids) and SiLU
        for (int variant = 0; variant < 3; ++variant) {
          const bool with_docs = variant > 0;
          const Conv1dActivation activation =
              variant == 2 ? Conv1dActivation::SiLU : Conv1dActivation::None;
          const std::string what =
              "causal_conv1d " + std::string(dtype_name(dtype)) +
              (span_rows < 0 ? " per element" : " span rows " + std::to_string(span_rows)) +
              " width " + std::to_string(width) + (with_docs ? " docs" : "") +
              (variant == 2 ? " silu" : "");
          cuda::set_conv1d_spans(span_rows >= 0);
          cuda::set_conv1d_span_rows(std::max(span_rows, 0));
          const DType ids_dtype = variant == 2 ? DType::I32 : DType::I64;
          Tensor doc_ids =
              with_docs ? Tensor::from_vector(ids, {batch, seq}).to(ids_dtype).to(gpu) : Tensor();
          Tensor doc_ids_cpu = with_docs ? doc_ids.to(Device::cpu()) : Tensor();
          Tensor x = testing::random_tensor({batch, seq, channels}, dtype, gpu, seed++);
          Tensor weight = testing::random_tensor({channels, width}, dtype, gpu, seed++);
          Tensor bias = testing::random_tensor({channels}, dtype, gpu, seed++);
          Tensor dy = testing::random_tensor({batch, seq, channels}, dtype, gpu, seed++);
          Tensor x_cpu = testing::cpu_reference(x), weight_cpu = testing::cpu_reference(weight);
          Tensor bias_cpu = testing::cpu_reference(bias);
          Tensor want = ops::causal_conv1d(x_cpu, weight_cpu, bias_cpu, doc_ids_cpu, activation);
          auto want_grads =
              ops::causal_conv1d_backward(testing::cpu_reference(dy), x_cpu, weight_cpu, true,
                                          true, true, doc_ids_cpu, bias_cpu, activation);
          Tensor y = testing::poisoned(x.shape(), dtype, gpu);
          causal_conv1d_kernels()(gpu, x, weight, bias, doc_ids, activation, y);
          testing::expect_matches_reference(y, want, dtype, what);
          // 0: all three; 1, 2, 3: dx, dweight or dbias alone.
          for (int wanted = 0; wanted < 4; ++wanted) {
            const std::string asked = what + (wanted == 0 ? "" : " alone");
            Tensor dx = wanted == 0 || wanted == 1 ? testing::poisoned(x.shape(), dtype, gpu)
                                                   : Tensor();
            Tensor dweight = wanted == 0 || wanted == 2
                                 ? testing::poisoned(weight.shape(), dtype, gpu)
                                 : Tensor();
            Tensor dbias =
                wanted == 0 || wanted == 3 ? testing::poisoned({channels}, dtype, gpu) : Tensor();
            causal_conv1d_backward_kernels()(gpu, dy, x, weight, bias, doc_ids, activation, dx,
                                             dweight, dbias);
            if (dx.defined()) {
              testing::expect_matches_reference(dx, want_grads.dx, dtype, asked + " dx");
            }
            if (dweight.defined()) {
              testing::expect_matches_reference(dweight, want_grads.dweight, dtype,
                                                asked + " dweight");
            }
            if (dbias.defined()) {
              testing::expect_matches_reference(dbias, want_grads.dbias, dtype, asked + " dbias");
            }
          }
        }
      }
    }
  }
  testing::expect_error([] { cuda::set_conv1d_span_rows(-1); }, {"set_conv1d_span_rows", "-1"});
  testing::expect_error([] { cuda::set_conv1d_span_rows(4097); },
                        {"set_conv1d_span_rows", "4097"});
#endif
}

// One channel: dbias (and at width 1 dweight) is a sum over rows of a single column, on
// the span kernels and on the per-element ones. Skips without a GPU.
TEST(CausalConv1d, GpuOneChannelMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting spans_on(&cuda::set_conv1d_spans, true);
  const Device gpu = Device::cuda();
  uint64_t seed = 500;
  for (DType dtype : testing::kGpuDtypesAndF64) {
    for (bool spans : {true, false}) {
      for (int64_t width : {1, 9}) {
        const std::string what = std::string(dtype_name(dtype)) + " width " +
                                 std::to_string(width) + (spans ? " spans" : " per element");
        cuda::set_conv1d_spans(spans);
        Tensor x = testing::random_tensor({2, 300, 1}, dtype, gpu, seed++);
        Tensor weight = testing::random_tensor({1, width}, dtype, gpu, seed++);
        Tensor bias = testing::random_tensor({1}, dtype, gpu, seed++);
        Tensor dy = testing::random_tensor({2, 300, 1}, dtype, gpu, seed++);
        Tensor x_cpu = testing::cpu_reference(x), weight_cpu = testing::cpu_reference(weight);
        auto want = ops::causal_conv1d_backward(testing::cpu_reference(dy), x_cpu, weight_cpu,
                                                true, true, true, Tensor(),
                                                testing::cpu_reference(bias));
        Tensor dx = testing::poisoned(x.shape(), dtype, gpu);
        Tensor dweight = testing::poisoned(weight.shape(), dtype, gpu);
        Tensor dbias = testing::poisoned({1}, dtype, gpu);
        causal_conv1d_backward_kernels()(gpu, dy, x, weight, bias, Tensor(),
                                         Conv1dActivation::None, dx, dweight, dbias);
        testing::expect_matches_reference(dx, want.dx, dtype, what + " dx");
        testing::expect_matches_reference(dweight, want.dweight, dtype, what + " dweight");
        testing::expect_matches_reference(dbias, want.dbias, dtype, what + " dbias");
      }
    }
  }
#endif
}

// A sequence of no rows: the span kernels have no spans, and dweight and dbias are zeros.
TEST(CausalConv1d, GpuEmptySequenceGivesZeroParameterGradients) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  for (int64_t width : {4, 9}) {
    Tensor x = Tensor::empty({2, 0, 5}, DType::F32, gpu);
    Tensor weight = testing::random_tensor({5, width}, DType::F32, gpu, 40);
    auto grads = ops::causal_conv1d_backward(x, x, weight, true, true, true);
    EXPECT_EQ(grads.dweight.to(Device::cpu()).to_vector<float>(),
              std::vector<float>(size_t(5 * width), 0.f));
    EXPECT_EQ(grads.dbias.to(Device::cpu()).to_vector<float>(), std::vector<float>(5, 0.f));
  }
}

}  // namespace
}  // namespace ham
