#include "nn/shape.h"

#include <string>

#include "core/ops/shape.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::randn64;

// Row-major flat offset of a multi-index.
int64_t flat_index(const Shape& shape, const std::vector<int64_t>& idx) {
  int64_t flat = 0;
  for (size_t k = 0; k < shape.size(); ++k) flat = flat * shape[k] + idx[k];
  return flat;
}

// Multi-index of a row-major flat offset.
std::vector<int64_t> unflatten(const Shape& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = flat % shape[k];
    flat /= shape[k];
  }
  return idx;
}

using testing::expect_error;

// ---- concat / split ----------------------------------------------------------------

struct ConcatCase {
  std::vector<Shape> shapes;
  int64_t dim;
};
void PrintTo(const ConcatCase& c, std::ostream* os) {
  for (const auto& s : c.shapes) *os << shape_str(s);
  *os << "_dim" << c.dim;
}

class ConcatTest : public ::testing::TestWithParam<ConcatCase> {};

TEST_P(ConcatTest, ForwardMatchesNaiveAndGradcheck) {
  const auto& c = GetParam();
  std::vector<Tensor> xs;
  for (size_t i = 0; i < c.shapes.size(); ++i) xs.push_back(randn64(c.shapes[i], 10 + i));
  Tensor y = concat(xs, c.dim);
  int64_t rank = int64_t(c.shapes[0].size());
  size_t d = size_t(c.dim < 0 ? c.dim + rank : c.dim);
  // Naive: every element of x_i lands at its own index shifted by the sizes before it.
  std::vector<double> out = y.to_vector<double>();
  int64_t shift = 0;
  for (const Tensor& x : xs) {
    std::vector<double> in = x.to_vector<double>();
    for (int64_t f = 0; f < x.numel(); ++f) {
      auto idx = unflatten(x.shape(), f);
      idx[d] += shift;
      EXPECT_EQ(out[size_t(flat_index(y.shape(), idx))], in[size_t(f)]);
    }
    shift += x.size(int64_t(d));
  }
  EXPECT_EQ(y.size(int64_t(d)), shift);
  int64_t dim = c.dim;
  expect_gradcheck([dim](const std::vector<Tensor>& v) { return std::vector{concat(v, dim)}; },
                   xs);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConcatTest,
    ::testing::Values(ConcatCase{{{2, 3}, {4, 3}}, 0}, ConcatCase{{{2, 3}, {2, 1}, {2, 2}}, 1},
                      ConcatCase{{{2, 1, 3}, {2, 2, 3}}, -2},
                      ConcatCase{{{1, 2, 2}, {1, 2, 3}}, -1},
                      ConcatCase{{{2, 0, 3}, {2, 2, 3}}, 1},  // an empty input
                      ConcatCase{{{3}}, 0}));                 // a single input

struct SplitCase {
  Shape shape;
  std::vector<int64_t> sizes;
  int64_t dim;
};
void PrintTo(const SplitCase& c, std::ostream* os) {
  *os << shape_str(c.shape) << "_into" << shape_str(c.sizes) << "_dim" << c.dim;
}

class SplitTest : public ::testing::TestWithParam<SplitCase> {};

TEST_P(SplitTest, ForwardMatchesNaiveAndGradcheck) {
  const auto& c = GetParam();
  Tensor x = randn64(c.shape, 3);
  std::vector<Tensor> ys = split(x, c.sizes, c.dim);
  ASSERT_EQ(ys.size(), c.sizes.size());
  size_t d = size_t(c.dim < 0 ? c.dim + int64_t(c.shape.size()) : c.dim);
  std::vector<double> in = x.to_vector<double>();
  int64_t shift = 0;
  for (size_t i = 0; i < ys.size(); ++i) {
    EXPECT_EQ(ys[i].size(int64_t(d)), c.sizes[i]);
    std::vector<double> out = ys[i].to_vector<double>();
    for (int64_t f = 0; f < ys[i].numel(); ++f) {
      auto idx = unflatten(ys[i].shape(), f);
      idx[d] += shift;
      EXPECT_EQ(out[size_t(f)], in[size_t(flat_index(c.shape, idx))]);
    }
    shift += c.sizes[i];
  }
  auto sizes = c.sizes;
  int64_t dim = c.dim;
  expect_gradcheck([=](const std::vector<Tensor>& v) { return split(v[0], sizes, dim); }, {x});
  // Only the first output used: the others get zero gradient.
  expect_gradcheck(
      [=](const std::vector<Tensor>& v) { return std::vector{split(v[0], sizes, dim)[0]}; }, {x});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SplitTest,
    ::testing::Values(SplitCase{{5, 2}, {2, 3}, 0}, SplitCase{{2, 6}, {1, 2, 3}, 1},
                      SplitCase{{2, 3, 4}, {3, 0, 1}, -1},  // a zero-size piece
                      SplitCase{{2, 3, 4}, {1, 2}, 1}, SplitCase{{1, 1}, {1}, 0}));

TEST(Concat, InvertsSplit) {
  Tensor x = randn64({3, 7, 2}, 4, 1.0, false);
  EXPECT_EQ(concat(split(x, {2, 4, 1}, 1), 1).to_vector<double>(), x.to_vector<double>());
}

TEST(Concat, WorksOnIntegerTensors) {
  Tensor a = Tensor::from_vector<int32_t>({1, 2}, {1, 2});
  Tensor b = Tensor::from_vector<int32_t>({3, 4}, {1, 2});
  EXPECT_EQ(concat({a, b}, 0).to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3, 4}));
}

TEST(Concat, ErrorsNameOpAndShapes) {
  expect_error([] { concat({Tensor::zeros({2, 3}), Tensor::zeros({3, 3})}, 1); },
                        {"concat", "[2, 3]", "[3, 3]"});
  expect_error([] { concat({Tensor::zeros({2, 3})}, 2); }, {"concat", "dim 2", "[2, 3]"});
  expect_error([] { concat({}, 0); }, {"concat"});
  expect_error(
      [] { concat({Tensor::zeros({2}), Tensor::zeros({2}, DType::F64)}, 0); }, {"concat", "f64"});
}

TEST(Split, ErrorsNameOpAndShapes) {
  expect_error([] { split(Tensor::zeros({2, 5}), {2, 2}, 1); },
                        {"split", "[2, 2]", "[2, 5]"});
  expect_error([] { split(Tensor::zeros({2, 5}), {6, -1}, 1); }, {"split", "negative"});
  expect_error([] { split(Tensor::zeros({2, 5}), {2}, -3); }, {"split", "dim -3"});
}

// ---- permute / transpose -----------------------------------------------------------

struct PermuteCase {
  Shape shape;
  std::vector<int64_t> dims;
};
void PrintTo(const PermuteCase& c, std::ostream* os) {
  *os << shape_str(c.shape) << "_by" << shape_str(c.dims);
}

class PermuteTest : public ::testing::TestWithParam<PermuteCase> {};

TEST_P(PermuteTest, ForwardMatchesNaiveAndGradcheck) {
  const auto& c = GetParam();
  Tensor x = randn64(c.shape, 5);
  Tensor y = permute(x, c.dims);
  size_t rank = c.shape.size();
  std::vector<int64_t> dims(rank);
  for (size_t k = 0; k < rank; ++k) dims[k] = c.dims[k] < 0 ? c.dims[k] + int64_t(rank) : c.dims[k];
  for (size_t k = 0; k < rank; ++k) EXPECT_EQ(y.size(int64_t(k)), c.shape[size_t(dims[k])]);
  std::vector<double> in = x.to_vector<double>(), out = y.to_vector<double>();
  for (int64_t f = 0; f < y.numel(); ++f) {
    auto out_idx = unflatten(y.shape(), f);
    std::vector<int64_t> in_idx(rank);
    for (size_t k = 0; k < rank; ++k) in_idx[size_t(dims[k])] = out_idx[k];
    EXPECT_EQ(out[size_t(f)], in[size_t(flat_index(c.shape, in_idx))]);
  }
  auto pd = c.dims;
  expect_gradcheck([pd](const std::vector<Tensor>& v) { return std::vector{permute(v[0], pd)}; },
                   {x});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PermuteTest,
    ::testing::Values(PermuteCase{{2, 3}, {1, 0}}, PermuteCase{{2, 3, 4}, {2, 0, 1}},
                      PermuteCase{{2, 3, 2, 4}, {0, 2, 1, 3}},  // attention's head swap
                      PermuteCase{{2, 1, 3, 2}, {3, -2, 0, 1}}, PermuteCase{{4}, {0}},
                      PermuteCase{{1, 1, 1}, {2, 1, 0}}));

TEST(Transpose, SwapsTwoDimsAndGradchecks) {
  Tensor x = randn64({2, 3, 4}, 6);
  Tensor y = transpose(x, 0, -1);
  ASSERT_EQ(y.shape(), Shape({4, 3, 2}));
  std::vector<double> in = x.to_vector<double>(), out = y.to_vector<double>();
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t c = 0; c < 4; ++c) {
        EXPECT_EQ(out[size_t((c * 3 + b) * 2 + a)], in[size_t((a * 3 + b) * 4 + c)]);
      }
  expect_gradcheck([](const std::vector<Tensor>& v) { return std::vector{transpose(v[0], 1, 2)}; },
                   {x});
}

TEST(Permute, ErrorsNameOpAndShapes) {
  expect_error([] { permute(Tensor::zeros({2, 3}), {0, 0}); },
                        {"permute", "[0, 0]", "[2, 3]"});
  expect_error([] { permute(Tensor::zeros({2, 3}), {0}); }, {"permute", "[0]", "[2, 3]"});
  expect_error([] { permute(Tensor::zeros({2, 3}), {0, 2}); }, {"permute", "[2, 3]"});
}

// ---- gather / index_select ---------------------------------------------------------

struct GatherCase {
  Shape x, index;
  int64_t dim;
  DType index_dtype;
};
void PrintTo(const GatherCase& c, std::ostream* os) {
  *os << shape_str(c.x) << "_" << shape_str(c.index) << "_dim" << c.dim << "_"
      << dtype_name(c.index_dtype);
}

// Deterministic indices in [0, limit), with repeats.
Tensor make_index(const Shape& shape, int64_t limit, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> v(size_t(shape_numel(shape)));
  for (auto& e : v) e = int64_t(rng() % uint64_t(limit));
  return Tensor::from_vector(v, shape).to(dtype);
}

class GatherTest : public ::testing::TestWithParam<GatherCase> {};

TEST_P(GatherTest, ForwardMatchesNaiveAndGradcheck) {
  const auto& c = GetParam();
  Tensor x = randn64(c.x, 7);
  size_t d = size_t(c.dim < 0 ? c.dim + int64_t(c.x.size()) : c.dim);
  Tensor index = make_index(c.index, c.x[d], c.index_dtype, 8);
  Tensor y = gather(x, c.dim, index);
  ASSERT_EQ(y.shape(), c.index);
  std::vector<double> in = x.to_vector<double>(), out = y.to_vector<double>();
  std::vector<int64_t> idx = index.to_vector<int64_t>();
  for (int64_t f = 0; f < y.numel(); ++f) {
    auto pos = unflatten(c.index, f);
    pos[d] = idx[size_t(f)];
    EXPECT_EQ(out[size_t(f)], in[size_t(flat_index(c.x, pos))]);
  }
  int64_t dim = c.dim;
  expect_gradcheck(
      [dim, index](const std::vector<Tensor>& v) { return std::vector{gather(v[0], dim, index)}; },
      {x});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GatherTest,
    ::testing::Values(GatherCase{{3, 4}, {3, 6}, 1, DType::I64},  // more picks than size
                      GatherCase{{3, 4}, {2, 4}, 0, DType::I32},
                      GatherCase{{3, 4}, {2, 3}, -1, DType::I64},  // smaller outside dim
                      GatherCase{{2, 3, 4}, {2, 5, 3}, 1, DType::I32},
                      GatherCase{{2, 3, 1}, {2, 3, 1}, 2, DType::I64},
                      GatherCase{{5}, {8}, 0, DType::I64}));

TEST(Gather, PicksTargetsLikeTorch) {
  Tensor x = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor index = Tensor::from_vector<int64_t>({2, 0, 1, 1}, {2, 2});
  EXPECT_EQ(gather(x, 1, index).to_vector<double>(), (std::vector<double>{3, 1, 5, 5}));
}

TEST(Gather, Errors) {
  Tensor x = Tensor::zeros({3, 4});
  expect_error([&] { gather(x, 1, Tensor::from_vector<int64_t>({0, 4, 1}, {3, 1})); },
                        {"gather", "index 4", "position [1, 0]", "[0, 4)"});
  expect_error([&] { gather(x, 1, Tensor::from_vector<int64_t>({-1}, {1, 1})); },
                        {"gather", "index -1"});
  expect_error([&] { gather(x, 1, Tensor::zeros({3}, DType::I64)); },
                        {"gather", "[3]", "[3, 4]"});
  expect_error([&] { gather(x, 1, Tensor::zeros({4, 1}, DType::I64)); },
                        {"gather", "[4, 1]", "[3, 4]"});
  expect_error([&] { gather(x, 1, Tensor::zeros({3, 1})); }, {"gather", "i32 or i64"});
  expect_error([&] { gather(x, 2, Tensor::zeros({3, 1}, DType::I64)); },
                        {"gather", "dim 2", "[3, 4]"});
}

struct IndexSelectCase {
  Shape x;
  int64_t dim;
  int64_t count;
  DType index_dtype;
};
void PrintTo(const IndexSelectCase& c, std::ostream* os) {
  *os << shape_str(c.x) << "_dim" << c.dim << "_pick" << c.count << "_"
      << dtype_name(c.index_dtype);
}

class IndexSelectTest : public ::testing::TestWithParam<IndexSelectCase> {};

TEST_P(IndexSelectTest, ForwardMatchesNaiveAndGradcheck) {
  const auto& c = GetParam();
  Tensor x = randn64(c.x, 9);
  size_t d = size_t(c.dim < 0 ? c.dim + int64_t(c.x.size()) : c.dim);
  Tensor index = make_index({c.count}, c.x[d], c.index_dtype, 10);
  Tensor y = index_select(x, c.dim, index);
  Shape expected = c.x;
  expected[d] = c.count;
  ASSERT_EQ(y.shape(), expected);
  std::vector<double> in = x.to_vector<double>(), out = y.to_vector<double>();
  std::vector<int64_t> idx = index.to_vector<int64_t>();
  for (int64_t f = 0; f < y.numel(); ++f) {
    auto pos = unflatten(expected, f);
    pos[d] = idx[size_t(pos[d])];
    EXPECT_EQ(out[size_t(f)], in[size_t(flat_index(c.x, pos))]);
  }
  int64_t dim = c.dim;
  expect_gradcheck(
      [dim, index](const std::vector<Tensor>& v) {
        return std::vector{index_select(v[0], dim, index)};
      },
      {x});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, IndexSelectTest,
    ::testing::Values(IndexSelectCase{{4, 3}, 0, 6, DType::I64},  // repeats
                      IndexSelectCase{{2, 5, 3}, 1, 3, DType::I32},
                      IndexSelectCase{{2, 3, 4}, -1, 5, DType::I64},
                      IndexSelectCase{{1, 1}, 1, 2, DType::I32},
                      IndexSelectCase{{3, 2}, 0, 0, DType::I64}));  // empty pick

TEST(IndexSelect, Errors) {
  Tensor x = Tensor::zeros({3, 4});
  expect_error([&] { index_select(x, 0, Tensor::from_vector<int32_t>({0, 3}, {2})); },
                        {"index_select", "index 3", "position [1]", "[0, 3)"});
  expect_error([&] { index_select(x, 0, Tensor::zeros({2, 1}, DType::I64)); },
                        {"index_select", "1-D", "[2, 1]", "[3, 4]"});
  expect_error([&] { index_select(x, -3, Tensor::zeros({2}, DType::I64)); },
                        {"index_select", "dim -3"});
}

// The CUDA layout kernels against the CPU reference: fresh random inputs, NaN-poisoned
// outputs, f32, bf16 and f64. The scatter-add backwards add into zeros by contract, so they
// run through ops::. Skips without a GPU.
TEST(Shape, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  for (DType dtype : testing::kGpuDtypesAndF64) {
    uint64_t seed = 100;
    for (int64_t dim = 0; dim < 3; ++dim) {
      const std::string what = "concat/split dim " + std::to_string(dim);
      Shape s1{2, 3, 4}, s2{2, 3, 4};
      s2[size_t(dim)] = 5;
      Tensor a = testing::random_tensor(s1, dtype, gpu, seed++);
      Tensor b = testing::random_tensor(s2, dtype, gpu, seed++);
      Tensor want = ops::concat({testing::cpu_reference(a), testing::cpu_reference(b)}, dim);
      Tensor out = testing::poisoned(want.shape(), dtype, gpu);
      concat_kernels()(gpu, std::vector<Tensor>{a, b}, dim, out);
      testing::expect_matches_reference(out, want, dtype, what);
      std::vector<Tensor> parts = {testing::poisoned(s1, dtype, gpu), testing::poisoned(s2, dtype, gpu)};
      split_kernels()(gpu, out, dim, parts);
      testing::expect_matches_reference(parts[0], testing::cpu_reference(a), dtype, what + " split 0");
      testing::expect_matches_reference(parts[1], testing::cpu_reference(b), dtype, what + " split 1");
    }
    Tensor x = testing::random_tensor({2, 3, 4, 5}, dtype, gpu, seed++);
    const std::vector<int64_t> dims = {2, 0, 3, 1};
    Tensor want_p = ops::permute(testing::cpu_reference(x), dims);
    Tensor permuted = testing::poisoned(want_p.shape(), dtype, gpu);
    permute_kernels()(gpu, x, dims, permuted);
    testing::expect_matches_reference(permuted, want_p, dtype, "permute");

    Tensor src = testing::random_tensor({2, 5, 4}, dtype, gpu, seed++);
    Tensor src_cpu = testing::cpu_reference(src);
    for (DType index_dtype : {DType::I64, DType::I32}) {
      const std::string what = std::string(dtype_name(index_dtype)) + " indices: ";
      Tensor index = testing::random_indices({2, 6, 3}, index_dtype, gpu, seed++, 0, 5);
      Tensor index_cpu = index.to(Device::cpu());
      Tensor want_g = ops::gather(src_cpu, 1, index_cpu);
      Tensor gathered = testing::poisoned({2, 6, 3}, dtype, gpu);
      gather_kernels()(gpu, src, 1, index, gathered);
      testing::expect_matches_reference(gathered, want_g, dtype, what + "gather");
      Tensor dy = testing::random_tensor({2, 6, 3}, dtype, gpu, seed++);
      testing::expect_matches_reference(
          ops::gather_backward(dy, 1, index, src.shape()),
          ops::gather_backward(testing::cpu_reference(dy), 1, index_cpu, src.shape()), dtype,
          what + "gather_backward");

      Tensor rows = testing::random_indices({9}, index_dtype, gpu, seed++, 0, 5);
      Tensor rows_cpu = rows.to(Device::cpu());
      Tensor want_s = ops::index_select(src_cpu, 1, rows_cpu);
      Tensor selected = testing::poisoned(want_s.shape(), dtype, gpu);
      index_select_kernels()(gpu, src, 1, rows, selected);
      testing::expect_matches_reference(selected, want_s, dtype, what + "index_select");
      Tensor dsel = testing::random_tensor(want_s.shape(), dtype, gpu, seed++);
      testing::expect_matches_reference(ops::index_select_backward(dsel, 1, rows, src.shape()),
                                        ops::index_select_backward(testing::cpu_reference(dsel), 1,
                                                                   rows_cpu, src.shape()),
                                        dtype, what + "index_select_backward");
    }
  }
}

// The copies of one-byte elements (u8: the routers' selection masks), exactly. Skips
// without a GPU.
TEST(Shape, GpuByteLayoutsMatchCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  auto random_bytes = [&](const Shape& shape, uint64_t seed) {
    return testing::random_indices(shape, DType::I64, gpu, seed, 0, 256).to(DType::U8);
  };
  auto expect_equal = [](const Tensor& gpu_out, const Tensor& want, const std::string& what) {
    EXPECT_EQ(gpu_out.to(Device::cpu()).to_vector<int64_t>(), want.to_vector<int64_t>()) << what;
  };
  Tensor x = random_bytes({2, 3, 4, 5}, 200);
  const std::vector<int64_t> dims = {2, 0, 3, 1};
  Tensor want_p = ops::permute(x.to(Device::cpu()), dims);
  Tensor permuted = Tensor::full(want_p.shape(), 255, DType::U8, gpu);
  permute_kernels()(gpu, x, dims, permuted);
  expect_equal(permuted, want_p, "permute");
  Tensor src = random_bytes({2, 5, 4}, 201);
  for (DType index_dtype : {DType::I64, DType::I32}) {
    const std::string what = std::string(dtype_name(index_dtype)) + " indices: ";
    Tensor index = testing::random_indices({2, 6, 3}, index_dtype, gpu, 202, 0, 5);
    Tensor gathered = Tensor::full({2, 6, 3}, 255, DType::U8, gpu);
    gather_kernels()(gpu, src, 1, index, gathered);
    expect_equal(gathered, ops::gather(src.to(Device::cpu()), 1, index.to(Device::cpu())),
                 what + "gather");
    Tensor rows = testing::random_indices({9}, index_dtype, gpu, 203, 0, 5);
    Tensor selected = Tensor::full({2, 9, 4}, 255, DType::U8, gpu);
    index_select_kernels()(gpu, src, 1, rows, selected);
    expect_equal(selected, ops::index_select(src.to(Device::cpu()), 1, rows.to(Device::cpu())),
                 what + "index_select");
  }
}

}  // namespace
}  // namespace ham
