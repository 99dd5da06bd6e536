#include "nn/embedding.h"

#include <string>

#include "autograd/engine.h"
#include "core/ops/embedding.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::randn64;

struct EmbeddingCase {
  int64_t vocab, dim;
  Shape ids;
  DType id_dtype;
};
void PrintTo(const EmbeddingCase& c, std::ostream* os) {
  *os << "V" << c.vocab << "_D" << c.dim << "_ids" << shape_str(c.ids) << "_"
      << dtype_name(c.id_dtype);
}

// Ids 0..V-1 cycled with a stride, so repeats occur whenever numel > V.
Tensor make_ids(const Shape& shape, int64_t vocab, DType dtype) {
  std::vector<int64_t> ids(size_t(shape_numel(shape)));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 3 + 1) % vocab;
  return Tensor::from_vector(ids, shape).to(dtype);
}

class EmbeddingTest : public ::testing::TestWithParam<EmbeddingCase> {};

TEST_P(EmbeddingTest, ForwardMatchesNaive) {
  const auto& c = GetParam();
  Tensor w = randn64({c.vocab, c.dim}, 1, 1.0, false);
  Tensor ids = make_ids(c.ids, c.vocab, c.id_dtype);
  Tensor y = embedding(w, ids);
  Shape expected_shape = c.ids;
  expected_shape.push_back(c.dim);
  ASSERT_EQ(y.shape(), expected_shape);
  std::vector<double> wv = w.to_vector<double>(), yv = y.to_vector<double>();
  std::vector<int64_t> iv = ids.to_vector<int64_t>();
  for (size_t p = 0; p < iv.size(); ++p) {
    for (int64_t d = 0; d < c.dim; ++d) {
      EXPECT_EQ(yv[p * size_t(c.dim) + size_t(d)], wv[size_t(iv[p] * c.dim + d)]);
    }
  }
}

TEST_P(EmbeddingTest, BackwardSumsRepeatedIds) {
  const auto& c = GetParam();
  Tensor w = randn64({c.vocab, c.dim}, 2);
  Tensor ids = make_ids(c.ids, c.vocab, c.id_dtype);
  Tensor y = embedding(w, ids);
  Tensor dy = randn64(y.shape(), 3, 1.0, false);
  std::vector<double> dw = gradients({y}, {w}, {dy})[0].to_vector<double>();
  std::vector<double> expected(size_t(c.vocab * c.dim), 0.0);
  std::vector<double> dyv = dy.to_vector<double>();
  std::vector<int64_t> iv = ids.to_vector<int64_t>();
  for (size_t p = 0; p < iv.size(); ++p) {
    for (int64_t d = 0; d < c.dim; ++d) {
      expected[size_t(iv[p] * c.dim + d)] += dyv[p * size_t(c.dim) + size_t(d)];
    }
  }
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(dw[i], expected[i], 1e-14);
}

TEST_P(EmbeddingTest, Gradcheck) {
  const auto& c = GetParam();
  Tensor w = randn64({c.vocab, c.dim}, 4);
  Tensor ids = make_ids(c.ids, c.vocab, c.id_dtype);
  expect_gradcheck(
      [ids](const std::vector<Tensor>& v) { return std::vector{embedding(v[0], ids)}; }, {w});
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmbeddingTest,
                         ::testing::Values(EmbeddingCase{5, 3, {7}, DType::I64},  // repeats
                                           EmbeddingCase{6, 4, {2, 3}, DType::I32},
                                           EmbeddingCase{4, 2, {2, 5}, DType::I64},
                                           EmbeddingCase{1, 1, {1, 1}, DType::I32},
                                           EmbeddingCase{3, 2, {2, 1, 2}, DType::I64},
                                           EmbeddingCase{5, 3, {0}, DType::I64}));  // no ids

TEST(Embedding, F32Lookup) {
  Tensor w = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor ids = Tensor::from_vector<int32_t>({2, 0, 2}, {3});
  EXPECT_EQ(embedding(w, ids).to_vector<float>(), (std::vector<float>{5, 6, 1, 2, 5, 6}));
}

void expect_embedding_error(const Tensor& ids, const std::vector<std::string>& parts) {
  Tensor w = Tensor::zeros({5, 3});
  try {
    embedding(w, ids);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

TEST(Embedding, OutOfRangeIdNamesIdPositionAndVocab) {
  expect_embedding_error(Tensor::from_vector<int64_t>({0, 1, 2, 3, 4, 5}, {2, 3}),
                         {"embedding", "id 5", "position [1, 2]", "V = 5"});
  expect_embedding_error(Tensor::from_vector<int32_t>({0, -1}, {2}),
                         {"embedding", "id -1", "position [1]", "V = 5"});
}

TEST(Embedding, BadArgumentsAreErrors) {
  expect_embedding_error(Tensor::zeros({2}), {"embedding", "i32 or i64"});
  try {
    embedding(Tensor::zeros({5}), Tensor::zeros({2}, DType::I64));
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("embedding"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[5]"), std::string::npos) << msg;
  }
}

// The CUDA kernels against the CPU reference: fresh random weights and gradients, ids
// with many repeats, f32, bf16 and f64, odd and aligned row sizes. The backward adds into
// zeros by contract, so it runs through ops::embedding_backward. Skips without a GPU.
TEST(Embedding, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  for (DType dtype : testing::kGpuDtypesAndF64) {
    uint64_t seed = 60;
    for (int64_t dim : {33, 256}) {
      for (DType index_dtype : {DType::I32, DType::I64}) {
        const int64_t vocab = 50;
        const std::string what = "embedding D=" + std::to_string(dim) + " " + dtype_name(index_dtype);
        Tensor weight = testing::random_tensor({vocab, dim}, dtype, gpu, seed++);
        Tensor ids = testing::random_indices({3, 170}, index_dtype, gpu, seed++, 0, vocab);
        Tensor ids_cpu = ids.to(Device::cpu());
        Tensor want = ops::embedding(testing::cpu_reference(weight), ids_cpu);
        Tensor out = testing::poisoned({3, 170, dim}, dtype, gpu);
        embedding_kernels()(gpu, weight, ids, out);
        testing::expect_matches_reference(out, want, dtype, what);

        Tensor dy = testing::random_tensor({3, 170, dim}, dtype, gpu, seed++);
        Tensor want_dw = ops::embedding_backward(testing::cpu_reference(dy), ids_cpu, vocab);
        Tensor dw = ops::embedding_backward(dy, ids, vocab);
        testing::expect_matches_reference(dw, want_dw, dtype, what + " backward");
      }
    }
  }
  // Rows of a byte table with an odd length: the copy moves one byte at a time.
  for (DType index_dtype : {DType::I32, DType::I64}) {
    Tensor bytes = testing::random_indices({50, 37}, DType::I64, gpu, 70, 0, 256).to(DType::U8);
    Tensor ids = testing::random_indices({3, 170}, index_dtype, gpu, 71, 0, 50);
    Tensor want = ops::embedding(bytes.to(Device::cpu()), ids.to(Device::cpu()));
    Tensor out = Tensor::full({3, 170, 37}, 255, DType::U8, gpu);
    embedding_kernels()(gpu, bytes, ids, out);
    EXPECT_EQ(out.to(Device::cpu()).to_vector<int64_t>(), want.to_vector<int64_t>())
        << "u8 rows, " << dtype_name(index_dtype) << " ids";
  }
  Tensor weight = testing::random_tensor({50, 8}, DType::F32, gpu, 1);
  Tensor ids = Tensor::from_vector(std::vector<int64_t>{1, 50, 2}, {3}).to(gpu);
  testing::expect_error([&] { ops::embedding(weight, ids); }, {"embedding", "id 50", "V = 50"});
}

}  // namespace
}  // namespace ham
