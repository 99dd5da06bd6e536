#include "nn/attention.h"

#include <cmath>
#include <limits>
#include <string>

#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::max_abs_diff;
using testing::randn64;

// One query at a time: scores over the visible keys, softmax, weighted sum of values.
std::vector<double> naive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    double scale, const std::vector<int64_t>& docs) {
  int64_t B = q.size(0), T = q.size(1), Hq = q.size(2), Dk = q.size(3);
  int64_t Hkv = k.size(2), Dv = v.size(3);
  std::vector<double> qv = q.to_vector<double>(), kv = k.to_vector<double>(),
                      vv = v.to_vector<double>();
  std::vector<double> out(size_t(B * T * Hq * Dv), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hq; ++h) {
        int64_t g = h / (Hq / Hkv);
        std::vector<int64_t> keys;
        std::vector<double> scores;
        for (int64_t s = 0; s <= t; ++s) {
          if (!docs.empty() && docs[size_t(b * T + s)] != docs[size_t(b * T + t)]) continue;
          double dot = 0;
          for (int64_t d = 0; d < Dk; ++d) {
            dot += qv[size_t(((b * T + t) * Hq + h) * Dk + d)] *
                   kv[size_t(((b * T + s) * Hkv + g) * Dk + d)];
          }
          keys.push_back(s);
          scores.push_back(dot * scale);
        }
        double total = 0;
        for (double& sc : scores) total += (sc = std::exp(sc));
        for (size_t i = 0; i < keys.size(); ++i)
          for (int64_t d = 0; d < Dv; ++d) {
            out[size_t(((b * T + t) * Hq + h) * Dv + d)] +=
                scores[i] / total * vv[size_t(((b * T + keys[i]) * Hkv + g) * Dv + d)];
          }
      }
  return out;
}

struct AttentionCase {
  int64_t batch, seq, q_heads, kv_heads, dk, dv;
  bool docs;
};
void PrintTo(const AttentionCase& c, std::ostream* os) {
  *os << "B" << c.batch << "_T" << c.seq << "_Hq" << c.q_heads << "_Hkv" << c.kv_heads << "_Dk"
      << c.dk << "_Dv" << c.dv << (c.docs ? "_docs" : "");
}

// Row b switches from document 7 to document 9 after b + 1 tokens.
Tensor make_doc_ids(int64_t B, int64_t T) {
  std::vector<int32_t> ids;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) ids.push_back(t <= b ? 7 : 9);
  return Tensor::from_vector(ids, {B, T});
}

class AttentionTest : public ::testing::TestWithParam<AttentionCase> {
 protected:
  Tensor q, k, v, doc_ids;
  double scale = 0;
  void make(bool grad) {
    const auto& c = GetParam();
    q = randn64({c.batch, c.seq, c.q_heads, c.dk}, 1, 1.0, grad);
    k = randn64({c.batch, c.seq, c.kv_heads, c.dk}, 2, 1.0, grad);
    v = randn64({c.batch, c.seq, c.kv_heads, c.dv}, 3, 1.0, grad);
    doc_ids = c.docs ? make_doc_ids(c.batch, c.seq) : Tensor();
    scale = 1.0 / std::sqrt(double(c.dk));
  }
};

TEST_P(AttentionTest, ForwardMatchesNaive) {
  make(false);
  const auto& c = GetParam();
  std::vector<int64_t> docs = c.docs ? doc_ids.to_vector<int64_t>() : std::vector<int64_t>();
  Tensor y = causal_attention(q, k, v, scale, doc_ids);
  ASSERT_EQ(y.shape(), Shape({c.batch, c.seq, c.q_heads, c.dv}));
  std::vector<double> expected = naive_attention(q, k, v, scale, docs);
  std::vector<double> out = y.to_vector<double>();
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], expected[i], 1e-13);
}

TEST_P(AttentionTest, Gradcheck) {
  make(true);
  double s = scale;
  Tensor docs = doc_ids;
  expect_gradcheck(
      [s, docs](const std::vector<Tensor>& x) {
        return std::vector{causal_attention(x[0], x[1], x[2], s, docs)};
      },
      {q, k, v});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Values(AttentionCase{2, 5, 2, 2, 4, 4, false},
                      AttentionCase{1, 4, 4, 2, 3, 3, false},  // grouped-query heads
                      AttentionCase{2, 3, 3, 1, 2, 2, false},  // all heads share one kv head
                      AttentionCase{2, 3, 2, 1, 4, 6, false},  // Dk != Dv
                      AttentionCase{1, 1, 2, 1, 2, 3, false},  // T = 1
                      AttentionCase{2, 5, 2, 1, 3, 2, true}));  // packed documents

TEST(Attention, PackedDocumentsEqualEachDocumentAlone) {
  // [doc A: 3 tokens | doc B: 2 tokens] in one row, with GQA and Dk != Dv.
  Tensor q = randn64({1, 5, 4, 3}, 4, 1.0, false);
  Tensor k = randn64({1, 5, 2, 3}, 5, 1.0, false);
  Tensor v = randn64({1, 5, 2, 5}, 6, 1.0, false);
  Tensor doc_ids = Tensor::from_vector<int64_t>({3, 3, 3, 8, 8}, {1, 5});
  Tensor packed = causal_attention(q, k, v, 0.7, doc_ids);
  auto part = [](const Tensor& t, int64_t begin, int64_t end) {
    Shape s = t.shape();
    s[1] = end - begin;
    return t.select(0).slice(begin, end).reshape(s);
  };
  Tensor alone_a = causal_attention(part(q, 0, 3), part(k, 0, 3), part(v, 0, 3), 0.7);
  Tensor alone_b = causal_attention(part(q, 3, 5), part(k, 3, 5), part(v, 3, 5), 0.7);
  EXPECT_LT(max_abs_diff(part(packed, 0, 3), alone_a), 1e-14);
  EXPECT_LT(max_abs_diff(part(packed, 3, 5), alone_b), 1e-14);
}

TEST(Attention, F32MatchesF64) {
  Tensor q = randn64({2, 6, 2, 4}, 7, 1.0, false), k = randn64({2, 6, 1, 4}, 8, 1.0, false),
         v = randn64({2, 6, 1, 4}, 9, 1.0, false);
  Tensor y64 = causal_attention(q, k, v, 0.5);
  Tensor y32 = causal_attention(q.to(DType::F32), k.to(DType::F32), v.to(DType::F32), 0.5);
  EXPECT_LT(max_abs_diff(y32, y64), 1e-5);
}

TEST(Attention, MaskIsCausalAndPerDocument) {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor doc_ids = Tensor::from_vector<int32_t>({0, 0, 1}, {1, 3});
  std::vector<double> m = attention_mask(3, doc_ids, DType::F64).to_vector<double>();
  EXPECT_EQ(m, (std::vector<double>{0, -inf, -inf, 0, 0, -inf, -inf, -inf, 0}));
  Tensor plain = attention_mask(2, Tensor(), DType::F32);
  EXPECT_EQ(plain.shape(), Shape({1, 1, 2, 2}));
  EXPECT_EQ(plain.to_vector<double>(), (std::vector<double>{0, -inf, 0, 0}));
}

TEST(Attention, BadShapesNameOpAndShapes) {
  auto expect_error = [](const std::function<void()>& fn, const std::vector<std::string>& parts) {
    try {
      fn();
      FAIL() << "expected an error";
    } catch (const Error& e) {
      std::string msg = e.what();
      for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
    }
  };
  Tensor q = Tensor::zeros({1, 4, 3, 2}, DType::F64);
  Tensor k = Tensor::zeros({1, 4, 2, 2}, DType::F64);
  expect_error([&] { causal_attention(q, k, k, 1.0); },
               {"causal_attention", "[1, 4, 3, 2]", "[1, 4, 2, 2]", "multiple"});
  expect_error([&] { causal_attention(q, Tensor::zeros({1, 4, 1, 3}, DType::F64), k, 1.0); },
               {"causal_attention", "[1, 4, 1, 3]"});
  expect_error([&] {
    causal_attention(q, q, q, 1.0, Tensor::zeros({1, 5}, DType::I64));
  }, {"causal_attention", "doc_ids", "[1, 5]"});
}

}  // namespace
}  // namespace ham
