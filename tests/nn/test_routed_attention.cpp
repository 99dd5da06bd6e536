#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/ops/routed_attention.h"
#include "nn/attention.h"
#include "nn/elementwise.h"
#include "nn/routed_attention.h"
#include "nn/view.h"
#include "tests/testing.h"
#ifdef HAM_WITH_CUDA
#include "cuda/autotune.h"
#include "cuda/block_timeline.h"
#include "cuda/dependent_launch.h"
#include "cuda/routed_attention.h"
#endif

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::max_abs_diff;
using testing::randn64;
using testing::uniform64;

// ---- Inputs -------------------------------------------------------------------------

enum class Docs { None, Runs, Interleaved };

const char* docs_name(Docs docs) {
  switch (docs) {
    case Docs::None:
      return "NoDocs";
    case Docs::Runs:
      return "DocRuns";  // packed: each document one run of tokens
    case Docs::Interleaved:
      return "DocsMixed";  // ids reappear: non-contiguous documents
  }
  return "?";
}

// select[b, t] ~ Bernoulli(density), as u8 0/1 (or 0/7: any nonzero value selects).
Tensor random_select(int64_t batch, int64_t seq_len, double density, uint64_t seed,
                     uint8_t selected_value = 1) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution pick(density);
  std::vector<uint8_t> s(size_t(batch * seq_len));
  for (uint8_t& x : s) x = pick(rng) ? selected_value : 0;
  return Tensor::from_vector(s, {batch, seq_len});
}

Tensor random_docs(int64_t batch, int64_t seq_len, Docs docs, uint64_t seed) {
  if (docs == Docs::None) return Tensor();
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(size_t(batch * seq_len));
  for (int64_t b = 0; b < batch; ++b) {
    int64_t doc = 10 * b;  // ids need not start at 0
    for (int64_t t = 0; t < seq_len; ++t) {
      if (docs == Docs::Runs) {
        if (t > 0 && std::uniform_int_distribution<int>(0, 4)(rng) == 0) ++doc;
        ids[size_t(b * seq_len + t)] = doc;
      } else {
        ids[size_t(b * seq_len + t)] = std::uniform_int_distribution<int64_t>(0, 2)(rng);
      }
    }
  }
  return Tensor::from_vector(ids, {batch, seq_len});
}

// S(b, t) by definition, with plain loops (independent of the compaction).
std::vector<std::vector<int64_t>> visible_sets(const Tensor& select, const Tensor& doc_ids) {
  const int64_t batch = select.size(0), seq_len = select.size(1);
  auto sel = select.to_vector<int64_t>();
  auto docs = doc_ids.defined() ? doc_ids.to_vector<int64_t>() : std::vector<int64_t>();
  std::vector<std::vector<int64_t>> sets(size_t(batch * seq_len));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq_len; ++t) {
      for (int64_t i = 0; i <= t; ++i) {
        bool same_doc =
            docs.empty() || docs[size_t(b * seq_len + i)] == docs[size_t(b * seq_len + t)];
        if (sel[size_t(b * seq_len + i)] != 0 && same_doc)
          sets[size_t(b * seq_len + t)].push_back(i);
      }
    }
  }
  return sets;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double x : t.to_vector<double>()) m = std::max(m, std::abs(x));
  return m;
}

// max |a - b| / max(max |b|, 1e-300): the error relative to the reference's scale.
double relative_error(const Tensor& a, const Tensor& reference) {
  return max_abs_diff(a, reference) / std::max(max_abs(reference), 1e-300);
}

bool all_exactly_zero(const Tensor& t) {
  auto v = t.to_vector<double>();
  return std::all_of(v.begin(), v.end(), [](double x) { return x == 0.0; });
}

// d(sum <dout, out>)/d(inputs) through routed_attention.
std::vector<Tensor> routed_gradients(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& select, const Tensor& p, const Tensor& docs,
                                     const Tensor& dout) {
  Tensor out = routed_attention(q, k, v, select, p, docs);
  std::vector<Tensor> inputs{q, k, v};
  if (p.defined()) inputs.push_back(p);
  return gradients({out}, inputs, {dout});
}

// ---- Against the dense masked reference ---------------------------------------------

struct RoutedCase {
  int64_t batch, seq_len, q_heads, kv_heads, key_dim, value_dim;
  double density;
  bool value_scale;
  Docs docs;
};

std::string case_name(const RoutedCase& c) {
  std::ostringstream name;
  name << "B" << c.batch << "_T" << c.seq_len << "_H" << c.q_heads << "x" << c.kv_heads << "_D"
       << c.key_dim << "x" << c.value_dim << "_rho" << std::lround(c.density * 100)
       << (c.value_scale ? "_p_" : "_") << docs_name(c.docs);
  return name.str();
}

void PrintTo(const RoutedCase& c, std::ostream* os) { *os << case_name(c); }

class RoutedAttentionVsNaive : public ::testing::TestWithParam<RoutedCase> {};

TEST_P(RoutedAttentionVsNaive, ForwardMatchesDenseMaskedReference) {
  const RoutedCase& c = GetParam();
  Tensor q = randn64({c.batch, c.seq_len, c.q_heads, c.key_dim}, 1, 1.0, false);
  Tensor k = randn64({c.batch, c.seq_len, c.kv_heads, c.key_dim}, 2, 1.0, false);
  Tensor v = randn64({c.batch, c.seq_len, c.kv_heads, c.value_dim}, 3, 1.0, false);
  Tensor p = c.value_scale ? uniform64({c.batch, c.seq_len}, 4, 0.2, 1.5, false) : Tensor();
  Tensor select = random_select(c.batch, c.seq_len, c.density, 5, /*selected_value=*/3);
  Tensor docs = random_docs(c.batch, c.seq_len, c.docs, 6);

  Tensor out = routed_attention(q, k, v, select, p, docs);
  Tensor ref = ops::masked_attention_naive(q, k, v, select, p, docs);
  ASSERT_EQ(out.shape(), Shape({c.batch, c.seq_len, c.q_heads, c.value_dim}));
  ASSERT_EQ(out.dtype(), DType::F64);
  EXPECT_LT(max_abs_diff(out, ref), 1e-12);
  EXPECT_LT(relative_error(out, ref), 1e-12);
  // An explicit scale is honoured the same way.
  Tensor out_scaled = routed_attention(q, k, v, select, p, docs, 0.37);
  EXPECT_LT(relative_error(out_scaled, ops::masked_attention_naive(q, k, v, select, p, docs, 0.37)),
            1e-12);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RoutedAttentionVsNaive,
    ::testing::Values(RoutedCase{2, 1, 4, 2, 6, 10, 0.5, true, Docs::None},
                      RoutedCase{2, 1, 4, 2, 6, 10, 1.0, false, Docs::Runs},
                      RoutedCase{2, 7, 4, 2, 6, 10, 0.5, true, Docs::None},
                      RoutedCase{2, 7, 4, 2, 6, 10, 0.3, false, Docs::Runs},
                      RoutedCase{2, 33, 4, 2, 6, 10, 0.1, true, Docs::Runs},
                      RoutedCase{2, 33, 4, 2, 6, 10, 0.25, false, Docs::None},
                      RoutedCase{2, 33, 4, 2, 6, 10, 0.5, true, Docs::Runs},
                      RoutedCase{2, 33, 4, 2, 6, 10, 0.9, true, Docs::Interleaved},
                      RoutedCase{2, 33, 4, 2, 6, 10, 1.0, false, Docs::Runs},
                      RoutedCase{2, 33, 2, 2, 10, 6, 0.5, true, Docs::Interleaved},
                      RoutedCase{2, 33, 4, 1, 8, 8, 0.5, true, Docs::Runs},
                      // Past one 64-query tile of the CPU kernels.
                      RoutedCase{2, 150, 4, 2, 6, 10, 0.3, true, Docs::Runs},
                      RoutedCase{1, 150, 4, 2, 6, 10, 0.5, true, Docs::Interleaved},
                      RoutedCase{1, 150, 2, 1, 8, 8, 0.5, false, Docs::None},
                      RoutedCase{1, 150, 2, 1, 8, 8, 1.0, true, Docs::None}),
    [](const ::testing::TestParamInfo<RoutedCase>& info) { return case_name(info.param); });

TEST(RoutedAttention, SavedLogSumExpMatchesDefinition) {
  // lse[b,t,h] = log sum_{i in S(b,t)} exp(scale <q_t, k_i>), -inf when S(b,t) is empty.
  const int64_t batch = 2, seq_len = 17, q_heads = 4, kv_heads = 2, key_dim = 5;
  const double scale = 0.7;
  Tensor q = randn64({batch, seq_len, q_heads, key_dim}, 7, 1.0, false);
  Tensor k = randn64({batch, seq_len, kv_heads, key_dim}, 8, 1.0, false);
  Tensor v = randn64({batch, seq_len, kv_heads, 3}, 9, 1.0, false);
  Tensor select = random_select(batch, seq_len, 0.4, 10);
  Tensor docs = random_docs(batch, seq_len, Docs::Runs, 11);
  ops::RoutedAttentionOutput r =
      ops::routed_attention_forward(q, k, v, ops::compact_selection(select, docs), Tensor(), scale);
  ASSERT_EQ(r.lse.shape(), Shape({batch, seq_len, q_heads}));
  auto lse = r.lse.to_vector<double>(), pq = q.to_vector<double>(), pk = k.to_vector<double>();
  auto sets = visible_sets(select, docs);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq_len; ++t) {
      for (int64_t h = 0; h < q_heads; ++h) {
        double total = 0;
        for (int64_t i : sets[size_t(b * seq_len + t)]) {
          double dot = 0;
          for (int64_t e = 0; e < key_dim; ++e) {
            dot += pq[size_t(((b * seq_len + t) * q_heads + h) * key_dim + e)] *
                   pk[size_t(((b * seq_len + i) * kv_heads + h / 2) * key_dim + e)];
          }
          total += std::exp(scale * dot);
        }
        double got = lse[size_t((b * seq_len + t) * q_heads + h)];
        if (total == 0)
          EXPECT_EQ(got, -INFINITY) << "b=" << b << " t=" << t;
        else
          EXPECT_NEAR(got, std::log(total), 1e-13) << "b=" << b << " t=" << t;
      }
    }
  }
}

// ---- Compaction ---------------------------------------------------------------------

TEST(RoutedAttentionCompaction, HandWorkedPackedDocuments) {
  // tokens   0 1 2 3 4 5
  // select   1 0 1 1 0 1
  // doc      0 0 0 1 1 1    -> compacted keys [0, 2 | 3, 5]
  Tensor select = Tensor::from_vector<uint8_t>({1, 0, 1, 1, 0, 1}, {1, 6});
  Tensor docs = Tensor::from_vector<int32_t>({0, 0, 0, 1, 1, 1}, {1, 6});
  CompactSelection s = ops::compact_selection(select, docs);
  EXPECT_EQ(s.key_positions.to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 3, 5, -1, -1}));
  EXPECT_EQ(s.key_counts.to_vector<int64_t>(), (std::vector<int64_t>{4}));
  EXPECT_EQ(s.max_key_count, 4);
  EXPECT_EQ(s.visible_begin.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0, 2, 2, 2}));
  EXPECT_EQ(s.visible_end.to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 2, 3, 3, 4}));
}

TEST(RoutedAttentionCompaction, HandWorkedInterleavedDocuments) {
  // doc ids 5 8 5 8, all selected: document 5's keys [0, 2] come first, then 8's [1, 3].
  Tensor select = Tensor::from_vector<uint8_t>({1, 1, 1, 1}, {1, 4});
  Tensor docs = Tensor::from_vector<int64_t>({5, 8, 5, 8}, {1, 4});
  CompactSelection s = ops::compact_selection(select, docs);
  EXPECT_EQ(s.key_positions.to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 1, 3}));
  EXPECT_EQ(s.visible_begin.to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 0, 2}));
  EXPECT_EQ(s.visible_end.to_vector<int64_t>(), (std::vector<int64_t>{1, 3, 2, 4}));
}

TEST(RoutedAttentionCompaction, RangesListExactlyTheVisibleKeys) {
  for (Docs layout : {Docs::None, Docs::Runs, Docs::Interleaved}) {
    const int64_t batch = 3, seq_len = 50;
    Tensor select = random_select(batch, seq_len, 0.4, 21);
    Tensor docs = random_docs(batch, seq_len, layout, 22);
    CompactSelection s = ops::compact_selection(select, docs);
    auto positions = s.key_positions.to_vector<int64_t>();
    auto begin = s.visible_begin.to_vector<int64_t>();
    auto end = s.visible_end.to_vector<int64_t>();
    auto expected = visible_sets(select, docs);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < seq_len; ++t) {
        size_t row = size_t(b * seq_len + t);
        std::vector<int64_t> listed(positions.begin() + b * seq_len + begin[row],
                                    positions.begin() + b * seq_len + end[row]);
        EXPECT_EQ(listed, expected[row]) << docs_name(layout) << " b=" << b << " t=" << t;
      }
    }
  }
}

// ---- Edge cases ---------------------------------------------------------------------

TEST(RoutedAttention, NothingSelectedGivesExactZerosAndZeroGradients) {
  const int64_t batch = 2, seq_len = 9;
  Tensor q = randn64({batch, seq_len, 4, 6}, 31), k = randn64({batch, seq_len, 2, 6}, 32);
  Tensor v = randn64({batch, seq_len, 2, 10}, 33), p = uniform64({batch, seq_len}, 34, 0.2, 1.5);
  Tensor select = Tensor::zeros({batch, seq_len}, DType::U8);
  Tensor docs = random_docs(batch, seq_len, Docs::Runs, 35);
  Tensor out = routed_attention(q, k, v, select, p, docs);
  EXPECT_TRUE(all_exactly_zero(out));
  EXPECT_EQ(ops::routed_attention_last_score_counts().forward, 0);
  EXPECT_EQ(ops::routed_attention_last_score_counts().forward_computed, 0);
  Tensor dout = randn64(out.shape(), 36, 1.0, false);
  auto g = routed_gradients(q, k, v, select, p, docs, dout);
  EXPECT_EQ(ops::routed_attention_last_score_counts().backward, 0);
  EXPECT_EQ(ops::routed_attention_last_score_counts().backward_computed, 0);
  for (const Tensor& grad : g) EXPECT_TRUE(all_exactly_zero(grad));
}

// Dense causal attention (softmax over every i <= t in t's document), plain loops.
Tensor dense_causal_by_loops(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                             const Tensor& doc_ids) {
  const int64_t batch = q.size(0), seq_len = q.size(1), q_heads = q.size(2);
  const int64_t kv_heads = k.size(2), key_dim = q.size(3), value_dim = v.size(3);
  auto pq = q.to_vector<double>(), pk = k.to_vector<double>(), pv = v.to_vector<double>();
  auto docs = doc_ids.defined() ? doc_ids.to_vector<int64_t>() : std::vector<int64_t>();
  std::vector<double> out(size_t(batch * seq_len * q_heads * value_dim), 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq_len; ++t) {
      for (int64_t h = 0; h < q_heads; ++h) {
        int64_t g = h / (q_heads / kv_heads);
        std::vector<double> weight(size_t(t + 1), 0.0);
        double largest = -INFINITY, total = 0;
        for (int64_t i = 0; i <= t; ++i) {
          if (!docs.empty() && docs[size_t(b * seq_len + i)] != docs[size_t(b * seq_len + t)])
            continue;
          double dot = 0;
          for (int64_t e = 0; e < key_dim; ++e) {
            dot += pq[size_t(((b * seq_len + t) * q_heads + h) * key_dim + e)] *
                   pk[size_t(((b * seq_len + i) * kv_heads + g) * key_dim + e)];
          }
          weight[size_t(i)] = scale * dot;
          largest = std::max(largest, weight[size_t(i)]);
        }
        for (int64_t i = 0; i <= t; ++i) {
          bool visible =
              docs.empty() || docs[size_t(b * seq_len + i)] == docs[size_t(b * seq_len + t)];
          weight[size_t(i)] = visible ? std::exp(weight[size_t(i)] - largest) : 0.0;
          total += weight[size_t(i)];
        }
        for (int64_t i = 0; i <= t; ++i) {
          for (int64_t e = 0; e < value_dim; ++e) {
            out[size_t(((b * seq_len + t) * q_heads + h) * value_dim + e)] +=
                weight[size_t(i)] / total *
                pv[size_t(((b * seq_len + i) * kv_heads + g) * value_dim + e)];
          }
        }
      }
    }
  }
  return Tensor::from_vector(out, {batch, seq_len, q_heads, value_dim});
}

TEST(RoutedAttention, EverythingSelectedIsDenseCausalAttention) {
  const int64_t batch = 2, seq_len = 13, key_dim = 6;
  const double scale = 1.0 / std::sqrt(double(key_dim));
  Tensor q = randn64({batch, seq_len, 4, key_dim}, 41),
         k = randn64({batch, seq_len, 2, key_dim}, 42);
  Tensor v = randn64({batch, seq_len, 2, 10}, 43), p = uniform64({batch, seq_len}, 44, 0.2, 1.5);
  Tensor select = Tensor::full({batch, seq_len}, 1, DType::U8);
  for (Docs layout : {Docs::None, Docs::Runs}) {
    Tensor docs = random_docs(batch, seq_len, layout, 45);
    Tensor out = routed_attention(q, k, v, select, Tensor(), docs);
    EXPECT_LT(relative_error(out, dense_causal_by_loops(q, k, v, scale, docs)), 1e-12)
        << docs_name(layout);
    EXPECT_LT(relative_error(out, causal_attention(q, k, v, scale, docs)), 1e-12)
        << docs_name(layout);

    // Gradients, value scaling included, against autograd through the dense composition
    // causal_attention(q, k, p * v).
    Tensor dout = randn64(out.shape(), 46, 1.0, false);
    auto routed = routed_gradients(q, k, v, select, p, docs, dout);
    Tensor scaled_v = mul(v, reshape(p, {batch, seq_len, 1, 1}));
    auto dense = gradients({causal_attention(q, k, scaled_v, scale, docs)}, {q, k, v, p}, {dout});
    const char* names[] = {"dq", "dk", "dv", "dp"};
    for (size_t j = 0; j < 4; ++j) {
      EXPECT_LT(relative_error(routed[j], dense[j]), 1e-12) << names[j] << " " << docs_name(layout);
    }
  }
}

TEST(RoutedAttention, OnlyFirstTokenSelectedCopiesItsScaledValue) {
  const int64_t batch = 2, seq_len = 8, q_heads = 4, kv_heads = 2, value_dim = 5;
  Tensor q = randn64({batch, seq_len, q_heads, 3}, 51),
         k = randn64({batch, seq_len, kv_heads, 3}, 52);
  Tensor v = randn64({batch, seq_len, kv_heads, value_dim}, 53);
  Tensor p = uniform64({batch, seq_len}, 54, 0.2, 1.5);
  std::vector<uint8_t> first_only(size_t(batch * seq_len), 0);
  for (int64_t b = 0; b < batch; ++b) first_only[size_t(b * seq_len)] = 1;
  Tensor select = Tensor::from_vector(first_only, {batch, seq_len});
  auto o = routed_attention(q, k, v, select, p).to_vector<double>();
  auto pv = p.to_vector<double>(), vv = v.to_vector<double>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq_len; ++t) {
      for (int64_t h = 0; h < q_heads; ++h) {
        for (int64_t e = 0; e < value_dim; ++e) {
          double expected = pv[size_t(b * seq_len)] *  // o_t = p_0 v_0 of h's kv head
                            vv[size_t((b * seq_len * kv_heads + h / 2) * value_dim + e)];
          EXPECT_NEAR(o[size_t(((b * seq_len + t) * q_heads + h) * value_dim + e)], expected,
                      1e-14);
        }
      }
    }
  }
  // One key per query: P = 1 whatever q and k are, so dq and dk vanish; only v_0 and p_0
  // get gradient, and every unselected position gets exactly zero.
  Tensor dout = randn64({batch, seq_len, q_heads, value_dim}, 55, 1.0, false);
  auto g = routed_gradients(q, k, v, select, p, Tensor(), dout);
  EXPECT_LT(max_abs(g[0]), 1e-14);
  EXPECT_LT(max_abs(g[1]), 1e-14);
  auto dv = g[2].to_vector<double>(), dp = g[3].to_vector<double>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 1; t < seq_len; ++t) {
      EXPECT_EQ(dp[size_t(b * seq_len + t)], 0.0);
      for (int64_t j = 0; j < kv_heads * value_dim; ++j) {
        EXPECT_EQ(dv[size_t((b * seq_len + t) * kv_heads * value_dim + j)], 0.0);
      }
    }
    EXPECT_NE(dp[size_t(b * seq_len)], 0.0);
  }
}

TEST(RoutedAttention, DocumentWithoutSelectionsOutputsZero) {
  // Document 7 (tokens 3..6) has no selected token; documents 4 and 9 have some.
  const int64_t seq_len = 9;
  Tensor select = Tensor::from_vector<uint8_t>({1, 0, 1, 0, 0, 0, 0, 1, 1}, {1, seq_len});
  Tensor docs = Tensor::from_vector<int32_t>({4, 4, 4, 7, 7, 7, 7, 9, 9}, {1, seq_len});
  Tensor q = randn64({1, seq_len, 2, 4}, 61), k = randn64({1, seq_len, 2, 4}, 62);
  Tensor v = randn64({1, seq_len, 2, 3}, 63), p = uniform64({1, seq_len}, 64, 0.2, 1.5);
  Tensor out = routed_attention(q, k, v, select, p, docs);
  EXPECT_LT(relative_error(out, ops::masked_attention_naive(q, k, v, select, p, docs)), 1e-12);
  auto o = out.to_vector<double>();
  const int64_t row = 2 * 3;  // heads x value_dim
  for (int64_t t = 0; t < seq_len; ++t) {
    bool in_empty_doc = t >= 3 && t <= 6;
    double largest = 0;
    for (int64_t j = 0; j < row; ++j) largest = std::max(largest, std::abs(o[size_t(t * row + j)]));
    if (in_empty_doc)
      EXPECT_EQ(largest, 0.0) << "t=" << t;
    else
      EXPECT_GT(largest, 0.0) << "t=" << t;
  }
  Tensor dout = randn64(out.shape(), 65, 1.0, false);
  auto dq = routed_gradients(q, k, v, select, p, docs, dout)[0].to_vector<double>();
  for (int64_t t = 3; t <= 6; ++t) {
    for (int64_t j = 0; j < 2 * 4; ++j) EXPECT_EQ(dq[size_t(t * 8 + j)], 0.0) << "t=" << t;
  }
}

// Document 3 comes first and has no selected key, so its range starts where document 8's
// does: its later queries, after document 8's, share that first key yet see nothing.
TEST(RoutedAttention, EmptyDocumentReturningAfterAnotherSeesNothing) {
  const int64_t seq_len = 7;
  Tensor select = Tensor::from_vector<uint8_t>({0, 1, 1, 0, 1, 0, 0}, {1, seq_len});
  Tensor docs = Tensor::from_vector<int64_t>({3, 8, 8, 3, 8, 3, 3}, {1, seq_len});
  const CompactSelection selection = ops::compact_selection(select, docs);
  EXPECT_EQ(selection.visible_begin.to_vector<int64_t>(), std::vector<int64_t>(7, 0));
  EXPECT_EQ(selection.visible_end.to_vector<int64_t>(),
            (std::vector<int64_t>{0, 1, 2, 0, 3, 0, 0}));
  Tensor q = randn64({1, seq_len, 2, 4}, 66), k = randn64({1, seq_len, 1, 4}, 67);
  Tensor v = randn64({1, seq_len, 1, 3}, 68), p = uniform64({1, seq_len}, 69, 0.2, 1.5);
  Tensor out = routed_attention(q, k, v, select, p, docs);
  EXPECT_LT(relative_error(out, ops::masked_attention_naive(q, k, v, select, p, docs)), 1e-12);
  expect_gradcheck(
      [&](const std::vector<Tensor>& x) {
        return std::vector{routed_attention(x[0], x[1], x[2], select, x[3], docs)};
      },
      {q, k, v, p});
}

// With one visible key per query the output is that key's value whatever q and k are, so
// dq and dk are exactly 0; the backward must give 0, not rounding noise. (HAM's first steps
// look like this: a layer selects only the first token. Noise there made a bf16 run's
// gradients disagree with the f32 run's.)
TEST(RoutedAttention, OneVisibleKeyGivesExactlyZeroQueryAndKeyGradients) {
  const int64_t batch = 2, seq_len = 70;
  std::vector<uint8_t> picks(size_t(batch * seq_len), 0);
  picks[0] = picks[size_t(seq_len)] = 1;  // each row's first token only
  Tensor select = Tensor::from_vector(picks, {batch, seq_len});
  for (DType dtype : {DType::F32, DType::F64}) {
    std::vector<Tensor> x{randn64({batch, seq_len, 4, 8}, 111, 3.0, false).to(dtype),
                          randn64({batch, seq_len, 2, 8}, 112, 3.0, false).to(dtype),
                          randn64({batch, seq_len, 2, 6}, 113, 1.0, false).to(dtype),
                          uniform64({batch, seq_len}, 114, 0.2, 1.5, false).to(dtype)};
    for (Tensor& t : x) set_requires_grad(t);
    Tensor out = routed_attention(x[0], x[1], x[2], select, x[3]);
    auto g = gradients({out}, x, {randn64(out.shape(), 115, 1.0, false).to(dtype)});
    EXPECT_TRUE(all_exactly_zero(g[0])) << dtype_name(dtype) << " dq";
    EXPECT_TRUE(all_exactly_zero(g[1])) << dtype_name(dtype) << " dk";
    EXPECT_GT(max_abs(g[2]), 0.0) << dtype_name(dtype) << " dv";
    EXPECT_GT(max_abs(g[3]), 0.0) << dtype_name(dtype) << " dp";
  }
}

// ---- Gradients ------------------------------------------------------------------------

struct GradCase {
  int64_t q_heads, kv_heads, key_dim, value_dim;
  bool value_scale;
  Docs docs;
};

std::string grad_case_name(const GradCase& c) {
  std::ostringstream name;
  name << "H" << c.q_heads << "x" << c.kv_heads << "_D" << c.key_dim << "x" << c.value_dim
       << (c.value_scale ? "_p_" : "_") << docs_name(c.docs);
  return name.str();
}

void PrintTo(const GradCase& c, std::ostream* os) { *os << grad_case_name(c); }

class RoutedAttentionGradcheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(RoutedAttentionGradcheck, QKVAndValueScale) {
  const GradCase& c = GetParam();
  const int64_t batch = 2, seq_len = 7;
  Tensor q = randn64({batch, seq_len, c.q_heads, c.key_dim}, 71);
  Tensor k = randn64({batch, seq_len, c.kv_heads, c.key_dim}, 72);
  Tensor v = randn64({batch, seq_len, c.kv_heads, c.value_dim}, 73);
  Tensor p = uniform64({batch, seq_len}, 74, 0.2, 1.5);
  // Token 0 unselected in both rows: that query (and others) sees no key.
  Tensor select = Tensor::from_vector<uint8_t>({0, 1, 0, 1, 1, 0, 1,  //
                                                0, 0, 1, 1, 0, 1, 1},
                                               {batch, seq_len});
  Tensor docs = random_docs(batch, seq_len, c.docs, 75);
  auto sets = visible_sets(select, docs);
  ASSERT_TRUE(std::any_of(sets.begin(), sets.end(), [](const auto& s) { return s.empty(); }));
  ASSERT_TRUE(std::any_of(sets.begin(), sets.end(), [](const auto& s) { return s.size() > 1; }));

  std::vector<Tensor> inputs{q, k, v};
  if (c.value_scale) inputs.push_back(p);
  expect_gradcheck(
      [&](const std::vector<Tensor>& x) {
        return std::vector{
            routed_attention(x[0], x[1], x[2], select, x.size() > 3 ? x[3] : Tensor(), docs)};
      },
      inputs);
}

INSTANTIATE_TEST_SUITE_P(Cases, RoutedAttentionGradcheck,
                         ::testing::Values(GradCase{4, 2, 3, 5, true, Docs::Runs},
                                           GradCase{4, 2, 3, 5, true, Docs::Interleaved},
                                           GradCase{4, 2, 3, 5, false, Docs::None},
                                           GradCase{2, 2, 4, 4, true, Docs::None},
                                           GradCase{3, 1, 5, 2, true, Docs::Runs}),
                         [](const ::testing::TestParamInfo<GradCase>& info) {
                           return grad_case_name(info.param);
                         });

TEST(RoutedAttention, ValueScaleGradientIsSumOverHeadsOfDvDotV) {
  // v' = p v  =>  dv_t = p_t dv'_t  and  dp_t = sum_g <dv'_{t,g}, v_{t,g}>,
  // hence p_t dp_t = sum_g <dv_{t,g}, v_{t,g}> (read from the same backward).
  const int64_t batch = 2, seq_len = 21, kv_heads = 2, value_dim = 10;
  Tensor q = randn64({batch, seq_len, 4, 6}, 81), k = randn64({batch, seq_len, kv_heads, 6}, 82);
  Tensor v = randn64({batch, seq_len, kv_heads, value_dim}, 83);
  Tensor p = uniform64({batch, seq_len}, 84, 0.2, 1.5);
  Tensor select = random_select(batch, seq_len, 0.5, 85);
  Tensor docs = random_docs(batch, seq_len, Docs::Runs, 86);
  Tensor dout = randn64({batch, seq_len, 4, value_dim}, 87, 1.0, false);
  auto g = routed_gradients(q, k, v, select, p, docs, dout);
  auto dv = g[2].to_vector<double>(), dp = g[3].to_vector<double>(), dk = g[1].to_vector<double>();
  auto vv = v.to_vector<double>(), pv = p.to_vector<double>();
  auto sel = select.to_vector<int64_t>();
  int64_t checked = 0;
  for (int64_t n = 0; n < batch * seq_len; ++n) {
    double dv_dot_v = 0;
    for (int64_t j = 0; j < kv_heads * value_dim; ++j) {
      dv_dot_v +=
          dv[size_t(n * kv_heads * value_dim + j)] * vv[size_t(n * kv_heads * value_dim + j)];
    }
    if (sel[size_t(n)] == 0) {  // unselected: exactly no gradient to p, v or k
      EXPECT_EQ(dp[size_t(n)], 0.0);
      EXPECT_EQ(dv_dot_v, 0.0);
      for (int64_t j = 0; j < kv_heads * 6; ++j) EXPECT_EQ(dk[size_t(n * kv_heads * 6 + j)], 0.0);
      continue;
    }
    EXPECT_NEAR(pv[size_t(n)] * dp[size_t(n)], dv_dot_v, 1e-12 * (1 + std::abs(dv_dot_v)));
    ++checked;
  }
  EXPECT_GT(checked, 5);
}

// Queries in three 64-query tiles, documents that cross a tile's edge, and a first
// visible key that comes late: gradients on a sample of each input's elements.
TEST(RoutedAttention, GradcheckAcrossQueryTiles) {
  const int64_t batch = 2, seq_len = 150;
  Tensor q = randn64({batch, seq_len, 2, 3}, 76), k = randn64({batch, seq_len, 1, 3}, 77);
  Tensor v = randn64({batch, seq_len, 1, 4}, 78), p = uniform64({batch, seq_len}, 79, 0.2, 1.5);
  std::vector<uint8_t> picks = random_select(batch, seq_len, 0.4, 80).to_vector<uint8_t>();
  std::vector<int64_t> ids(size_t(batch * seq_len));
  for (int64_t t = 0; t < seq_len; ++t) {
    ids[size_t(t)] = t < 90 ? 0 : 1;                   // row 0: documents [0, 90), [90, 150)
    ids[size_t(seq_len + t)] = t < 40 ? 5 : t < 70 ? 6 : 7;  // row 1: three
  }
  for (int64_t t = 0; t < 70; ++t) picks[size_t(t)] = 0;  // row 0: queries 0..69 see nothing
  Tensor select = Tensor::from_vector(picks, {batch, seq_len});
  Tensor docs = Tensor::from_vector(ids, {batch, seq_len});

  GradcheckOptions options;
  options.max_elements_per_input = 240;
  expect_gradcheck(
      [&](const std::vector<Tensor>& x) {
        return std::vector{routed_attention(x[0], x[1], x[2], select, x[3], docs)};
      },
      {q, k, v, p}, options);
}

// ---- Cost -----------------------------------------------------------------------------

TEST(RoutedAttention, ScoresEvaluatedEqualVisiblePairsNotTSquared) {
  const int64_t batch = 2, seq_len = 96, q_heads = 4;
  Tensor q = randn64({batch, seq_len, q_heads, 8}, 91), k = randn64({batch, seq_len, 2, 8}, 92);
  Tensor v = randn64({batch, seq_len, 2, 8}, 93);
  Tensor select = random_select(batch, seq_len, 0.2, 94);
  Tensor docs = random_docs(batch, seq_len, Docs::Runs, 95);
  int64_t visible_pairs = 0;
  for (const auto& s : visible_sets(select, docs)) visible_pairs += int64_t(s.size());
  const int64_t expected = q_heads * visible_pairs;
  const int64_t causal_pairs = q_heads * batch * seq_len * (seq_len + 1) / 2;

  // The CPU kernels score each segment (a 64-query tile's queries with the same first
  // visible key) against the union of its queries' keys: a rectangle, masked per row.
  const CompactSelection selection = ops::compact_selection(select, docs);
  auto begin = selection.visible_begin.to_vector<int64_t>();
  auto end = selection.visible_end.to_vector<int64_t>();
  const int64_t tile = ops::kRoutedAttentionCpuQueryTile;
  int64_t rectangles = 0, segments = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t first = 0; first < seq_len;) {
      const size_t row = size_t(b * seq_len);
      int64_t last = first, widest = 0;
      while (last < seq_len && last / tile == first / tile &&
             begin[row + size_t(last)] == begin[row + size_t(first)]) {
        widest = std::max(widest, end[row + size_t(last)] - begin[row + size_t(last)]);
        ++last;
      }
      rectangles += (last - first) * widest;
      ++segments;
      first = last;
    }
  }
  const int64_t expected_computed = q_heads * rectangles;
  ASSERT_GT(segments, 2 * batch);  // the documents and the tiles cut the rows
  ASSERT_GT(expected_computed, expected);

  Tensor out = routed_attention(q, k, v, select, Tensor(), docs);
  auto counts = ops::routed_attention_last_score_counts();
  EXPECT_EQ(counts.forward, expected);
  EXPECT_EQ(counts.forward_computed, expected_computed);
  gradients({out}, {q, k, v}, {randn64(out.shape(), 96, 1.0, false)});
  counts = ops::routed_attention_last_score_counts();
  EXPECT_EQ(counts.backward, expected);
  EXPECT_EQ(counts.backward_computed, expected_computed);
  EXPECT_LT(expected_computed * 3, causal_pairs);  // ~rho and the documents cut it below T^2
}

// The CPU backward's per-head dk, dv' buffers ([B, Hq, N, D] each, the largest scratch) are
// tensors from the pool, so a run's peak memory includes them.
TEST(RoutedAttention, CpuBackwardScratchCountsInPeakMemory) {
  const int64_t seq_len = 128, q_heads = 8, dim = 16;
  Tensor q = randn64({1, seq_len, q_heads, dim}, 121), k = randn64({1, seq_len, 1, dim}, 122);
  Tensor v = randn64({1, seq_len, 1, dim}, 123);
  Tensor select = Tensor::full({1, seq_len}, 1, DType::U8);
  Tensor out = routed_attention(q, k, v, select);
  Tensor dout = randn64(out.shape(), 124, 1.0, false);
  reset_peak_device_memory(Device::cpu());
  const size_t before = device_memory_stats(Device::cpu()).requested_bytes;
  auto g = gradients({out}, {q, k, v}, {dout});
  const size_t rise = device_memory_stats(Device::cpu()).peak_requested_bytes - before;
  const size_t scratch = size_t(2 * q_heads * seq_len * dim) * sizeof(double);
  size_t results = 0;
  for (const Tensor& t : g) results += size_t(t.numel()) * sizeof(double);
  EXPECT_GE(rise, scratch + results);
}

// ---- Precision ------------------------------------------------------------------------

TEST(RoutedAttention, Float32AgreesWithFloat64) {
  const int64_t batch = 2, seq_len = 40;
  Tensor q = randn64({batch, seq_len, 4, 6}, 101, 1.0, false);
  Tensor k = randn64({batch, seq_len, 2, 6}, 102, 1.0, false);
  Tensor v = randn64({batch, seq_len, 2, 10}, 103, 1.0, false);
  Tensor p = uniform64({batch, seq_len}, 104, 0.2, 1.5, false);
  Tensor select = random_select(batch, seq_len, 0.5, 105);
  Tensor docs = random_docs(batch, seq_len, Docs::Runs, 106).to(DType::I32);
  Tensor dout = randn64({batch, seq_len, 4, 10}, 107, 1.0, false);

  auto run = [&](DType dtype) {
    std::vector<Tensor> x{q.to(dtype), k.to(dtype), v.to(dtype), p.to(dtype)};
    for (Tensor& t : x) set_requires_grad(t);
    Tensor out = routed_attention(x[0], x[1], x[2], select, x[3], docs);
    std::vector<Tensor> all{out};
    for (Tensor& gi : gradients({out}, x, {dout.to(dtype)})) all.push_back(gi);
    return all;
  };
  auto single = run(DType::F32), twice = run(DType::F64);
  ASSERT_EQ(single[0].dtype(), DType::F32);
  const char* names[] = {"out", "dq", "dk", "dv", "dp"};
  for (size_t j = 0; j < single.size(); ++j) {
    EXPECT_LT(relative_error(single[j], twice[j]), 2e-5) << names[j];
  }
}

// ---- Errors ---------------------------------------------------------------------------

using testing::expect_error;

TEST(RoutedAttention, BadInputsNameOpArgumentAndShapes) {
  Tensor q = Tensor::zeros({1, 4, 3, 8}), k = Tensor::zeros({1, 4, 3, 8});
  Tensor select = Tensor::full({1, 4}, 1, DType::U8);
  expect_error(
      [&] {
        routed_attention(q, k, Tensor::zeros({1, 4, 2, 6}), select);
      },
      {"routed_attention", "v [1, 4, 2, 6]", "k [1, 4, 3, 8]"});
  expect_error(
      [&] {
        routed_attention(q, Tensor::zeros({1, 4, 2, 8}), Tensor::zeros({1, 4, 2, 8}), select);
      },
      {"routed_attention", "multiple", "[1, 4, 3, 8]", "[1, 4, 2, 8]"});
  expect_error(
      [&] {
        routed_attention(q, Tensor::zeros({1, 5, 3, 8}), Tensor::zeros({1, 5, 3, 8}), select);
      },
      {"routed_attention", "k [1, 5, 3, 8]", "q [1, 4, 3, 8]"});
  expect_error(
      [&] {
        routed_attention(Tensor::zeros({4, 3, 8}), k, k, select);
      },
      {"routed_attention", "q [4, 3, 8]"});
  expect_error(
      [&] {
        routed_attention(q, k, k, Tensor::full({1, 5}, 1, DType::U8));
      },
      {"routed_attention", "select [1, 5]", "q [1, 4, 3, 8]"});
  expect_error(
      [&] {
        routed_attention(q, k, k, select, Tensor::zeros({1, 4}, DType::F64));
      },
      {"routed_attention", "value_scale", "f64[1, 4]", "f32"});
  expect_error(
      [&] {
        routed_attention(q, k, k, select, Tensor(), Tensor::zeros({1, 4}, DType::F32));
      },
      {"routed_attention", "doc_ids", "i32 or i64"});
  expect_error(
      [&] {
        routed_attention(q, k, Tensor::zeros({1, 4, 3, 8}, DType::F64), select);
      },
      {"routed_attention", "dtype"});
  expect_error([&] { routed_attention(q, k, k, select, Tensor(), Tensor(), -0.5); },
               {"routed_attention", "scale", "positive", "-0.5"});
}

TEST(RoutedAttention, Float32SelectIsRejectedClearly) {
  Tensor q = Tensor::zeros({1, 4, 2, 8}), k = Tensor::zeros({1, 4, 2, 8});
  expect_error(
      [&] {
        routed_attention(q, k, k, Tensor::full({1, 4}, 1.0, DType::F32));
      },
      {"routed_attention", "select", "u8", "f32[1, 4]"});
  expect_error(
      [&] {
        ops::compact_selection(Tensor::full({1, 4}, 1.0, DType::F32));
      },
      {"routed_attention", "select", "u8"});
}

// ---- GPU kernels against the CPU reference ----------------------------------------------
// Fresh random inputs on the GPU, outputs poisoned with NaN (or a sentinel for indices),
// every output compared with the CPU kernels run on the same values (bf16 widened exactly
// to f32): relative RMS error <= 1e-2 for bf16, <= 1e-5 for f32 (testing::gpu_tolerance).

enum class GpuDocs { None, Runs, Interleaved, Packed20 };

const char* gpu_docs_name(GpuDocs docs) {
  switch (docs) {
    case GpuDocs::None: return "NoDocs";
    case GpuDocs::Runs: return "DocRuns";
    case GpuDocs::Interleaved: return "DocsMixed";
    case GpuDocs::Packed20: return "Packed20";
  }
  return "?";
}

struct GpuCase {
  int64_t batch, seq_len, q_heads, kv_heads, key_dim, value_dim;
  double density;
  bool value_scale;
  GpuDocs docs;
  bool first_unselected;  // token 0 of every row unselected: the first query sees nothing
};

std::string gpu_case_name(const GpuCase& c) {
  std::ostringstream name;
  name << "B" << c.batch << "_T" << c.seq_len << "_H" << c.q_heads << "x" << c.kv_heads << "_D"
       << c.key_dim << "x" << c.value_dim << "_rho" << std::lround(c.density * 100)
       << (c.value_scale ? "_p_" : "_") << gpu_docs_name(c.docs)
       << (c.first_unselected ? "_FirstEmpty" : "");
  return name.str();
}

void PrintTo(const GpuCase& c, std::ostream* os) { *os << gpu_case_name(c); }

// 20 documents per row, each one run of tokens, cut at random places (ids from 100 up).
Tensor packed_docs(int64_t batch, int64_t seq_len, int64_t documents, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(size_t(batch * seq_len));
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> cuts;
    for (int64_t t = 1; t < seq_len; ++t) cuts.push_back(t);
    std::shuffle(cuts.begin(), cuts.end(), rng);
    cuts.resize(size_t(std::min<int64_t>(documents - 1, int64_t(cuts.size()))));
    std::sort(cuts.begin(), cuts.end());
    int64_t doc = 100, next = 0;
    for (int64_t t = 0; t < seq_len; ++t) {
      if (next < int64_t(cuts.size()) && t == cuts[size_t(next)]) {
        ++doc;
        ++next;
      }
      ids[size_t(b * seq_len + t)] = doc;
    }
  }
  return Tensor::from_vector(ids, {batch, seq_len});
}

Tensor gpu_case_docs(const GpuCase& c, uint64_t seed) {
  switch (c.docs) {
    case GpuDocs::None: return Tensor();
    case GpuDocs::Runs: return random_docs(c.batch, c.seq_len, Docs::Runs, seed);
    case GpuDocs::Interleaved: return random_docs(c.batch, c.seq_len, Docs::Interleaved, seed);
    case GpuDocs::Packed20: return packed_docs(c.batch, c.seq_len, 20, seed).to(DType::I32);
  }
  return Tensor();
}

Tensor gpu_case_select(const GpuCase& c, uint64_t seed) {
  Tensor select = random_select(c.batch, c.seq_len, c.density, seed);
  if (!c.first_unselected) return select;
  std::vector<uint8_t> s = select.to_vector<uint8_t>();
  for (int64_t b = 0; b < c.batch; ++b) s[size_t(b * c.seq_len)] = 0;
  return Tensor::from_vector(s, {c.batch, c.seq_len});
}

CompactSelection poisoned_selection(int64_t batch, int64_t seq_len, Device device) {
  CompactSelection s;
  s.key_positions = Tensor::full({batch, seq_len}, 777, DType::I64, device);
  s.key_counts = Tensor::full({batch}, 777, DType::I64, device);
  s.visible_begin = Tensor::full({batch, seq_len}, 777, DType::I64, device);
  s.visible_end = Tensor::full({batch, seq_len}, 777, DType::I64, device);
  return s;
}

// Every value of `t` ([B, T, ...], read as f64) at the tokens n = b * T + t listed is 0.
bool rows_exactly_zero(const Tensor& t, const std::vector<int64_t>& tokens) {
  const int64_t per_token = t.numel() / (t.size(0) * t.size(1));
  std::vector<double> v = t.to_vector<double>();
  for (int64_t n : tokens) {
    for (int64_t j = 0; j < per_token; ++j) {
      if (v[size_t(n * per_token + j)] != 0.0) return false;
    }
  }
  return true;
}

double rms(const Tensor& t) {
  double sum = 0;
  const std::vector<double> v = t.to_vector<double>();
  for (double x : v) sum += x * x;
  return v.empty() ? 0.0 : std::sqrt(sum / double(v.size()));
}

// The GPU's compaction of `select` (and `docs`) is exactly the CPU's lists; returns it.
CompactSelection expect_gpu_compaction_matches_cpu(const Tensor& select, const Tensor& docs,
                                                   const std::string& what) {
  const Device gpu = Device::cuda();
  const int64_t batch = select.size(0), seq_len = select.size(1);
  CompactSelection want = ops::compact_selection(select, docs);
  CompactSelection sel = poisoned_selection(batch, seq_len, gpu);
  compact_selection_kernels()(gpu, select.to(gpu), docs.defined() ? docs.to(gpu) : Tensor(), sel);
  EXPECT_EQ(sel.key_positions.to_vector<int64_t>(), want.key_positions.to_vector<int64_t>())
      << what;
  EXPECT_EQ(sel.key_counts.to_vector<int64_t>(), want.key_counts.to_vector<int64_t>()) << what;
  EXPECT_EQ(sel.visible_begin.to_vector<int64_t>(), want.visible_begin.to_vector<int64_t>())
      << what;
  EXPECT_EQ(sel.visible_end.to_vector<int64_t>(), want.visible_end.to_vector<int64_t>()) << what;
  sel.max_key_count = seq_len;
  return sel;
}

// A poisoned gradient buffer whose NaNs a device-to-device copy writes, on the current
// stream: where that work is still in flight (held, in the emulator's default_late stream
// order) when the backward starts, a kernel of it that does not wait for the stream has its
// stores overwritten by the NaNs.
Tensor poisoned_on_the_stream(const Shape& shape, DType dtype, Device device) {
  Tensor buffer = Tensor::empty(shape, dtype, device);
  buffer.copy_(testing::poisoned(shape, dtype, device));
  return buffer;
}

// With offset_views, q, k, v and p are views one element into their buffers; with
// offset_outputs, the forward's out and lse and the backward's dq, dk, dv and dp are.
void expect_gpu_matches_cpu(const GpuCase& c, DType dtype, bool offset_views = false,
                            bool offset_outputs = false) {
  const Device gpu = Device::cuda();
  const std::string what = gpu_case_name(c) + " " + dtype_name(dtype) +
                           (offset_views ? " offset views" : "") +
                           (offset_outputs ? " offset outputs" : "");
  const DType lse_dtype = dtype == DType::F64 ? DType::F64 : DType::F32;
  uint64_t seed = 1000 + uint64_t(c.seq_len) * 7 + uint64_t(c.key_dim);
  Tensor q = testing::random_tensor({c.batch, c.seq_len, c.q_heads, c.key_dim}, dtype, gpu, seed++);
  Tensor k = testing::random_tensor({c.batch, c.seq_len, c.kv_heads, c.key_dim}, dtype, gpu, seed++);
  Tensor v = testing::random_tensor({c.batch, c.seq_len, c.kv_heads, c.value_dim}, dtype, gpu, seed++);
  Tensor p = c.value_scale
                 ? uniform64({c.batch, c.seq_len}, seed++, 0.2, 1.5, false).to(dtype).to(gpu)
                 : Tensor();
  if (offset_views) {
    q = testing::one_element_in(q);
    k = testing::one_element_in(k);
    v = testing::one_element_in(v);
    if (p.defined()) p = testing::one_element_in(p);
  }
  Tensor select_cpu = gpu_case_select(c, seed++);
  Tensor docs_cpu = gpu_case_docs(c, seed++);

  CompactSelection want_sel = ops::compact_selection(select_cpu, docs_cpu);
  CompactSelection sel = expect_gpu_compaction_matches_cpu(select_cpu, docs_cpu, what);

  // Forward.
  Tensor q_ref = testing::cpu_reference(q), k_ref = testing::cpu_reference(k);
  Tensor v_ref = testing::cpu_reference(v), p_ref = testing::cpu_reference(p);
  const double scale = ops::routed_attention_scale(0.0, c.key_dim);
  ops::RoutedAttentionOutput want =
      ops::routed_attention_forward(q_ref, k_ref, v_ref, want_sel, p_ref, scale);
  Tensor out = testing::poisoned({c.batch, c.seq_len, c.q_heads, c.value_dim}, dtype, gpu);
  Tensor lse = testing::poisoned({c.batch, c.seq_len, c.q_heads}, lse_dtype, gpu);
  if (offset_outputs) {
    out = testing::one_element_in(out);
    lse = testing::one_element_in(lse);
  }
  routed_attention_forward_kernels()(gpu, q, k, v, p, sel, scale, out, lse);
  testing::expect_matches_reference(out, want.out, dtype, what + " o");
  EXPECT_LE(testing::relative_rms_error(lse, want.lse), testing::gpu_tolerance(lse_dtype))
      << what << " lse";

  // Backward, from the reference's own forward on the CPU side.
  Tensor dout = testing::random_tensor(out.shape(), dtype, gpu, seed++);
  ops::RoutedAttentionGrads want_g = ops::routed_attention_backward(
      testing::cpu_reference(dout), q_ref, k_ref, v_ref, want_sel, want.out, want.lse, p_ref, scale);
  auto gradient_buffer = [&](const Shape& shape) {
    Tensor buffer = poisoned_on_the_stream(shape, dtype, gpu);
    return offset_outputs ? testing::one_element_in(buffer) : buffer;
  };
  Tensor dq = gradient_buffer(q.shape());
  Tensor dk = gradient_buffer(k.shape());
  Tensor dv = gradient_buffer(v.shape());
  Tensor dp = c.value_scale ? gradient_buffer(p.shape()) : Tensor();
  routed_attention_backward_kernels()(gpu, dout, q, k, v, p, sel, out, lse, scale, dq, dk, dv, dp);
  testing::expect_matches_reference(dv, want_g.dv, dtype, what + " dv");
  if (c.seq_len == 1) {
    // One visible key: the softmax is constant, so dq and dk are 0 in exact arithmetic and
    // the kernel's are rounding noise; bound them against the size of dv instead.
    const double noise_bound = testing::gpu_tolerance(dtype) * rms(want_g.dv);
    EXPECT_LE(rms(dq), noise_bound) << what << " dq";
    EXPECT_LE(rms(dk), noise_bound) << what << " dk";
  } else {
    testing::expect_matches_reference(dq, want_g.dq, dtype, what + " dq");
    testing::expect_matches_reference(dk, want_g.dk, dtype, what + " dk");
  }
  if (c.value_scale) testing::expect_matches_reference(dp, want_g.dvalue_scale, dtype, what + " dp");

  // Exact zeros: unselected keys get no gradient; queries that see nothing output 0, dq 0.
  std::vector<int64_t> unselected, blind;
  auto sel_values = select_cpu.to_vector<int64_t>();
  auto begin = want_sel.visible_begin.to_vector<int64_t>();
  auto end = want_sel.visible_end.to_vector<int64_t>();
  for (int64_t n = 0; n < c.batch * c.seq_len; ++n) {
    if (sel_values[size_t(n)] == 0) unselected.push_back(n);
    if (begin[size_t(n)] == end[size_t(n)]) blind.push_back(n);
  }
  if (c.first_unselected) {
    EXPECT_FALSE(blind.empty()) << what;
  }
  EXPECT_TRUE(rows_exactly_zero(dk, unselected)) << what << " dk of unselected keys";
  EXPECT_TRUE(rows_exactly_zero(dv, unselected)) << what << " dv of unselected keys";
  if (c.value_scale) {
    EXPECT_TRUE(rows_exactly_zero(dp, unselected))
        << what << " dp of unselected keys";
  }
  EXPECT_TRUE(rows_exactly_zero(out, blind)) << what << " o of queries that see nothing";
  EXPECT_TRUE(rows_exactly_zero(dq, blind)) << what << " dq of queries that see nothing";
}

class RoutedAttentionGpu : public ::testing::TestWithParam<GpuCase> {};

TEST_P(RoutedAttentionGpu, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  HAM_SKIP_LONG_SEQUENCE_ON_SIMT_EMULATOR(GetParam().seq_len);
  for (DType dtype : testing::kGpuDtypes) expect_gpu_matches_cpu(GetParam(), dtype);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RoutedAttentionGpu,
    ::testing::Values(
        // selection rates 0, 0.05, 0.25, 0.5, 1 (head dims 64), first query blind
        GpuCase{2, 300, 4, 2, 64, 64, 0.0, true, GpuDocs::Runs, true},
        GpuCase{2, 300, 4, 2, 64, 64, 0.05, true, GpuDocs::Runs, true},
        GpuCase{2, 300, 4, 2, 64, 64, 0.25, true, GpuDocs::Runs, true},
        GpuCase{2, 300, 4, 2, 64, 64, 0.5, false, GpuDocs::Runs, true},
        GpuCase{2, 300, 4, 2, 64, 64, 1.0, true, GpuDocs::Runs, false},
        // dense causal attention (everything selected, one document)
        GpuCase{1, 257, 2, 2, 64, 64, 1.0, false, GpuDocs::None, false},
        // head dims 128, grouped-query heads 8 x 2
        GpuCase{2, 200, 8, 2, 128, 128, 0.5, false, GpuDocs::None, true},
        GpuCase{1, 333, 4, 1, 128, 128, 0.25, true, GpuDocs::Runs, false},
        // unequal head dims that take the forward's 128-row blocks
        GpuCase{1, 150, 2, 1, 64, 128, 0.5, true, GpuDocs::Runs, false},
        GpuCase{1, 150, 2, 2, 128, 64, 1.0, false, GpuDocs::None, true},
        // v 192, 20 packed documents
        GpuCase{1, 700, 4, 2, 128, 192, 0.25, true, GpuDocs::Packed20, true},
        GpuCase{2, 640, 2, 1, 64, 192, 1.0, true, GpuDocs::Packed20, false},
        // head dims 256 (the smaller tiles; in bf16 the dK/dV pass splits in two kernels
        // where Dk + Dv > 320, and 256 x 64, 64 x 256 take one)
        GpuCase{1, 150, 2, 1, 256, 256, 0.5, true, GpuDocs::Runs, false},
        GpuCase{1, 200, 4, 2, 256, 128, 0.5, true, GpuDocs::Packed20, true},
        GpuCase{2, 130, 2, 2, 128, 256, 1.0, false, GpuDocs::None, false},
        GpuCase{1, 170, 2, 1, 256, 192, 0.25, true, GpuDocs::Runs, true},
        GpuCase{1, 140, 2, 1, 256, 64, 0.5, true, GpuDocs::Runs, false},
        GpuCase{1, 140, 2, 2, 64, 256, 0.5, true, GpuDocs::None, false},
        // documents that interleave (ids reappear)
        GpuCase{2, 180, 4, 2, 64, 64, 0.5, true, GpuDocs::Interleaved, false},
        // head dim 32 (the default configs' heads), tiled
        GpuCase{2, 200, 4, 2, 32, 32, 0.5, true, GpuDocs::Runs, true},
        GpuCase{1, 130, 2, 1, 32, 64, 0.25, false, GpuDocs::Packed20, false},
        // head dim 32 beside the others: the 64-row mma.sync and the tiled kernels
        GpuCase{1, 120, 2, 1, 32, 128, 0.5, true, GpuDocs::Runs, false},
        GpuCase{1, 110, 2, 2, 128, 32, 0.5, false, GpuDocs::None, true},
        GpuCase{1, 100, 2, 1, 64, 32, 0.25, true, GpuDocs::Packed20, false},
        GpuCase{1, 90, 2, 1, 32, 192, 0.5, true, GpuDocs::Runs, true},
        GpuCase{1, 90, 2, 1, 32, 256, 0.5, false, GpuDocs::None, false},
        GpuCase{1, 90, 2, 1, 256, 32, 0.5, true, GpuDocs::Runs, false},
        // generic kernels: head dims with no tiled instance
        GpuCase{2, 90, 4, 2, 40, 24, 0.5, true, GpuDocs::Runs, true},
        GpuCase{1, 70, 3, 1, 300, 20, 0.5, false, GpuDocs::None, false},
        // one token per row (a single decode query)
        GpuCase{3, 1, 4, 2, 64, 64, 1.0, true, GpuDocs::None, false},
        // the paper's HAM heads (128 / 192) at the lengths it trains on (GPU only): dense,
        // sparse with the first query blind, 20 packed documents
        GpuCase{1, 4096, 4, 2, 128, 192, 1.0, true, GpuDocs::None, false},
        GpuCase{1, 16384, 4, 2, 128, 192, 0.05, true, GpuDocs::None, true},
        GpuCase{1, 16384, 8, 2, 128, 128, 0.25, true, GpuDocs::Packed20, false}),
    [](const ::testing::TestParamInfo<GpuCase>& info) { return gpu_case_name(info.param); });

// Compaction alone on rows long enough that its per-position counters need opted-in
// shared memory (more than 48 KiB: T = 16384) or a global scratch buffer (past 160 KiB:
// T = 50003), and that its block takes in many steps, the last one part full: without
// documents and with packed ones (one scan of the row) and with interleaved ones (slots
// counted per document).
TEST(RoutedAttentionGpu, CompactionOfLongRowsMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  for (int64_t seq_len : {16384, 50003}) {
    for (GpuDocs docs : {GpuDocs::None, GpuDocs::Packed20, GpuDocs::Interleaved}) {
      const GpuCase c{2, seq_len, 1, 1, 8, 8, 0.3, false, docs, true};
      expect_gpu_compaction_matches_cpu(gpu_case_select(c, 61), gpu_case_docs(c, 62),
                                        gpu_case_name(c));
    }
  }
}

// Documents that interleave only where a run starts on a thread's first token of a step
// of the compaction's walks (tokens 4 j; 4096 j with 1,024 threads): A for [0, r), B for
// [r, 2r), A again from 2r, with runs r of 4, 8 and 4096, so that the reappearance is
// found only by comparing a token with the one before it in another thread's range.
TEST(RoutedAttentionGpu, CompactionFindsDocumentsThatReturnAtAStepBoundary) {
  HAM_SKIP_UNLESS_CUDA();
  for (int64_t run : {4, 8, 4096}) {
    const int64_t seq_len = 3 * run;
    std::vector<int64_t> ids(static_cast<size_t>(seq_len));
    for (int64_t t = 0; t < seq_len; ++t) ids[size_t(t)] = (t / run) % 2 == 1 ? 7 : 3;
    const GpuCase c{1, seq_len, 1, 1, 8, 8, 0.5, false, GpuDocs::None, false};
    expect_gpu_compaction_matches_cpu(gpu_case_select(c, 63),
                                      Tensor::from_vector(ids, {1, seq_len}),
                                      "documents returning at " + std::to_string(2 * run));
  }
}

// The CUDA kernels address a token's row of a head tensor by a signed 32-bit step
// (heads x head dim x 2 bytes): 2^20 query heads and more are refused before any launch.
TEST(RoutedAttentionGpu, TooManyQueryHeadsForTheKernelsIsAnError) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  const int64_t heads = int64_t(1) << 20, dim = 8;
  Tensor q = Tensor::zeros({1, 1, heads, dim}, DType::BF16, gpu);
  Tensor k = Tensor::zeros({1, 1, 1, dim}, DType::BF16, gpu);
  Tensor v = Tensor::zeros({1, 1, 1, dim}, DType::BF16, gpu);
  Tensor out = Tensor::zeros({1, 1, heads, dim}, DType::BF16, gpu);
  Tensor lse = Tensor::zeros({1, 1, heads}, DType::F32, gpu);
  Tensor select = Tensor::from_vector(std::vector<uint8_t>{1}, {1, 1});
  CompactSelection sel = expect_gpu_compaction_matches_cpu(select, Tensor(), "one token");
  testing::expect_error(
      [&] { routed_attention_forward_kernels()(gpu, q, k, v, Tensor(), sel, 1.0, out, lse); },
      {"routed_attention", "1048576 query heads", "too many for the CUDA kernels"});
}

#ifdef HAM_WITH_CUDA
// The bf16 cases against the CPU with a tuning setter (cuda/routed_attention.h)
// set to `value`, restored after; then the setter refuses `bad`, naming itself, the value
// and the choices.
void expect_bf16_setting_matches_cpu(int (*set)(int), const char* name, int value, int bad,
                                     const char* choices, const std::vector<GpuCase>& cases) {
  const testing::ScopedSetting setting(set, value);
  for (const GpuCase& c : cases) {
    SCOPED_TRACE(gpu_case_name(c));
    expect_gpu_matches_cpu(c, DType::BF16);
  }
  testing::expect_error([&] { set(bad); }, {name, std::to_string(bad), choices});
}
#endif

// The bf16 mma.sync forward with one 16-row tile per warp (64-row blocks), which key heads
// up to 128 wide beside value heads up to 192 take only when set so (the forward's wgmma
// kernel set aside, as in the test below).
TEST(RoutedAttentionGpu, Bf16ForwardWith64RowBlocksMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting mma_sync(&cuda::set_attention_forward_wgmma, 0);
  expect_bf16_setting_matches_cpu(
      &cuda::set_attention_forward_rows, "set_attention_forward_rows", 64, 96, "64 or 128",
      {GpuCase{2, 300, 4, 2, 64, 64, 0.25, true, GpuDocs::Runs, true},
       GpuCase{1, 333, 4, 1, 128, 128, 1.0, false, GpuDocs::None, false},
       GpuCase{1, 260, 4, 2, 128, 192, 0.5, true, GpuDocs::Packed20, true},
       GpuCase{1, 200, 2, 1, 64, 128, 0.5, true, GpuDocs::Runs, false},
       GpuCase{1, 180, 2, 1, 64, 192, 0.25, false, GpuDocs::None, true},
       GpuCase{1, 150, 2, 1, 128, 64, 0.5, true, GpuDocs::Runs, false}});
#endif
}

// The 128-row bf16 mma.sync forward with value heads of 128 in 32-key tiles, which it
// takes only when set so; the cases above run the default 64-key tiles.
TEST(RoutedAttentionGpu, Bf16ForwardWith32KeyTilesMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting mma_sync(&cuda::set_attention_forward_wgmma, 0);
  expect_bf16_setting_matches_cpu(
      &cuda::set_attention_forward_keys, "set_attention_forward_keys", 32, 48, "32 or 64",
      {GpuCase{2, 300, 4, 2, 64, 128, 0.25, true, GpuDocs::Runs, true},
       GpuCase{1, 333, 4, 1, 128, 128, 1.0, false, GpuDocs::None, false}});
#endif
}

#ifdef HAM_WITH_CUDA
// The wgmma kernels' head dims (64 and 128) in both sizes of each head, value scaling on
// and off, grouped-query heads, packed and interleaved documents, boundary tiles, a first
// query that sees nothing, several query tiles per key block.
const std::vector<GpuCase> kWgmmaHeadCases = {
    GpuCase{2, 300, 4, 2, 64, 64, 0.25, true, GpuDocs::Runs, true},
    GpuCase{1, 333, 4, 1, 128, 128, 1.0, false, GpuDocs::None, false},
    GpuCase{2, 200, 8, 2, 128, 128, 0.5, true, GpuDocs::Packed20, true},
    GpuCase{1, 150, 2, 1, 64, 128, 0.5, true, GpuDocs::Runs, false},
    GpuCase{1, 150, 2, 2, 128, 64, 1.0, false, GpuDocs::None, true},
    GpuCase{2, 180, 4, 2, 64, 64, 0.05, true, GpuDocs::Interleaved, false}};

// The wider head dims the wgmma kernels take: the paper's HAM heads (128 x 192) and
// 256 x 256, whose backward visits tiles of 32 rows, dK and dV of 256 x 256 coming from two
// kernels.
const std::vector<GpuCase> kWgmmaWideHeadCases = {
    GpuCase{1, 150, 4, 2, 128, 192, 0.5, true, GpuDocs::Packed20, true},
    GpuCase{2, 140, 2, 1, 128, 192, 1.0, false, GpuDocs::None, false},
    GpuCase{1, 140, 2, 2, 256, 256, 0.25, true, GpuDocs::Runs, true},
    GpuCase{1, 200, 2, 1, 256, 256, 1.0, false, GpuDocs::Interleaved, false}};

// A pass's wgmma kernels: their setter, its name, and the count of calls that ran on them.
struct WgmmaPass {
  int (*set)(int);
  const char* name;
  int64_t (*launches)();
};
const WgmmaPass kWgmmaBackward{&cuda::set_attention_backward_wgmma,
                               "set_attention_backward_wgmma",
                               &cuda::attention_backward_wgmma_launches};
const WgmmaPass kWgmmaForward{&cuda::set_attention_forward_wgmma, "set_attention_forward_wgmma",
                              &cuda::attention_forward_wgmma_launches};

// Why a wgmma test skips where attention_wgmma_available() is false.
constexpr const char* kNoWgmmaHere =
    "the wgmma kernels need sm_90a code (90a in CMAKE_CUDA_ARCHITECTURES) and a GPU of "
    "compute capability 9.0";

// Both passes' kernels chosen automatically (the default) for a scope, whatever an earlier
// test left set.
struct AutomaticKernels {
  testing::ScopedSetting<int> forward{&cuda::set_attention_forward_wgmma,
                                      cuda::kAttentionWgmmaAutomatic};
  testing::ScopedSetting<int> backward{&cuda::set_attention_backward_wgmma,
                                       cuda::kAttentionWgmmaAutomatic};
};

// The bf16 cases against the CPU with a pass's kernels set to wgmma (warpgroup tensor
// cores, sm_90a), with one and with two warpgroups a block; skips where this build or GPU
// has no such kernels. Each case must run on them.
void expect_wgmma_matches_cpu(const WgmmaPass& pass, const std::vector<GpuCase>& cases) {
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  for (int groups : {1, 2}) {  // warpgroups a block
    SCOPED_TRACE(std::to_string(groups) + " warpgroups a block");
    const int64_t before = pass.launches();
    expect_bf16_setting_matches_cpu(pass.set, pass.name, groups, 3,
                                    "-1 (automatic), 0 (mma.sync), 1 or 2", cases);
    EXPECT_EQ(pass.launches() - before, int64_t(cases.size()));
  }
}
#endif

// The backward's dK/dV and dQ on wgmma.
TEST(RoutedAttentionGpu, Bf16BackwardWithWgmmaMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  expect_wgmma_matches_cpu(kWgmmaBackward, kWgmmaHeadCases);
#endif
}

// The wgmma dQ kernel (one warpgroup a block, head dims of 64 and 128) in key tiles of 16,
// 32 and 64, each set so; each case must run on the tiles set.
TEST(RoutedAttentionGpu, Bf16BackwardWithWgmmaDqInEachKeyTileMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  const testing::ScopedSetting one_warpgroup(&cuda::set_attention_backward_wgmma, 1);
  for (int keys : {16, 32, 64}) {
    SCOPED_TRACE(std::to_string(keys) + " keys a tile");
    const int64_t before_32 = cuda::attention_backward_dq_32_key_launches();
    const int64_t before_16 = cuda::attention_backward_dq_16_key_launches();
    expect_bf16_setting_matches_cpu(&cuda::set_attention_backward_dq_keys,
                                    "set_attention_backward_dq_keys", keys, 48, "16, 32 or 64",
                                    kWgmmaHeadCases);
    const auto cases = int64_t(kWgmmaHeadCases.size());
    EXPECT_EQ(cuda::attention_backward_dq_32_key_launches() - before_32, keys == 32 ? cases : 0);
    EXPECT_EQ(cuda::attention_backward_dq_16_key_launches() - before_16, keys == 16 ? cases : 0);
  }
#endif
}

#ifdef HAM_WITH_CUDA
// The persistent kernels' cases: the wgmma head cases, then no key anywhere (rho 0: every
// query tile without a key tile), interleaved documents over a tail tile of one row, and
// dense attention over seven query tiles.
std::vector<GpuCase> persistent_kernel_cases() {
  std::vector<GpuCase> cases = kWgmmaHeadCases;
  cases.push_back(GpuCase{1, 130, 2, 1, 64, 64, 0.0, true, GpuDocs::Runs, false});
  cases.push_back(GpuCase{2, 129, 2, 1, 128, 128, 0.5, true, GpuDocs::Interleaved, true});
  cases.push_back(GpuCase{1, 400, 2, 2, 64, 64, 1.0, false, GpuDocs::None, false});
  return cases;
}

// The inputs of case c on the GPU, drawn from seeds 70 + T on; next_seed is the next seed.
struct GpuCaseInputs {
  Tensor q, k, v, p;
  CompactSelection selection;
  uint64_t next_seed;
};
GpuCaseInputs gpu_case_inputs(const GpuCase& c, DType dtype) {
  const Device gpu = Device::cuda();
  uint64_t seed = 70 + uint64_t(c.seq_len);
  GpuCaseInputs in;
  in.q = testing::random_tensor({c.batch, c.seq_len, c.q_heads, c.key_dim}, dtype, gpu, seed++);
  in.k = testing::random_tensor({c.batch, c.seq_len, c.kv_heads, c.key_dim}, dtype, gpu, seed++);
  in.v =
      testing::random_tensor({c.batch, c.seq_len, c.kv_heads, c.value_dim}, dtype, gpu, seed++);
  in.p = c.value_scale ? uniform64({c.batch, c.seq_len}, seed++, 0.2, 1.5, false).to(dtype).to(gpu)
                       : Tensor();
  Tensor docs = gpu_case_docs(c, seed++);
  in.selection = ops::compact_selection(gpu_case_select(c, seed++).to(gpu),
                                        docs.defined() ? docs.to(gpu) : Tensor());
  in.next_seed = seed;
  return in;
}

// The forward of case c (gpu_case_inputs), run as the current settings have it.
ops::RoutedAttentionOutput gpu_case_forward(const GpuCase& c) {
  const GpuCaseInputs in = gpu_case_inputs(c, DType::BF16);
  return ops::routed_attention_forward(in.q, in.k, in.v, in.selection, in.p);
}

// The gradients of a backward of case c (gpu_case_inputs), run as the current settings have
// it; with unaligned_out, the forward's out in a view off a 16-byte boundary (the wgmma dQ
// kernel then reads D from the backward's first pass instead of forming it).
ops::RoutedAttentionGrads gpu_case_gradients(const GpuCase& c, DType dtype,
                                             bool unaligned_out = false) {
  const GpuCaseInputs in = gpu_case_inputs(c, dtype);
  ops::RoutedAttentionOutput r = ops::routed_attention_forward(in.q, in.k, in.v, in.selection, in.p);
  Tensor dout = testing::random_tensor(r.out.shape(), dtype, Device::cuda(), in.next_seed);
  return ops::routed_attention_backward(dout, in.q, in.k, in.v, in.selection,
                                        unaligned_out ? testing::one_element_in(r.out) : r.out,
                                        r.lse, in.p);
}

// Two backwards' gradients are the same bit for bit.
void expect_same_gradients(const ops::RoutedAttentionGrads& a,
                           const ops::RoutedAttentionGrads& b) {
  EXPECT_EQ(max_abs_diff(a.dq, b.dq), 0.0);
  EXPECT_EQ(max_abs_diff(a.dk, b.dk), 0.0);
  EXPECT_EQ(max_abs_diff(a.dv, b.dv), 0.0);
  ASSERT_EQ(a.dvalue_scale.defined(), b.dvalue_scale.defined());
  if (a.dvalue_scale.defined()) {
    EXPECT_EQ(max_abs_diff(a.dvalue_scale, b.dvalue_scale), 0.0);
  }
}
#endif

// The wgmma dQ kernel in 16-key tiles gives the gradients of 32-key tiles bit for bit: it
// issues the same products in the same order (S and dP in k16 steps over the head dims,
// dQ += dS K in steps of 16 keys), and a key past the block's last adds a product of
// zeros, hidden (dS = 0) on a boundary tile of either size.
TEST(RoutedAttentionGpu, Bf16BackwardWithWgmmaDqIn16KeyTilesEqualsIn32) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  const testing::ScopedSetting one_warpgroup(&cuda::set_attention_backward_wgmma, 1);
  auto gradients_in = [](const GpuCase& c, int keys) {
    const testing::ScopedSetting dq_keys(&cuda::set_attention_backward_dq_keys, keys);
    return gpu_case_gradients(c, DType::BF16);
  };
  for (const GpuCase& c : kWgmmaHeadCases) {
    SCOPED_TRACE(gpu_case_name(c));
    const int64_t before = cuda::attention_backward_dq_16_key_launches();
    expect_same_gradients(gradients_in(c, 16), gradients_in(c, 32));
    EXPECT_EQ(cuda::attention_backward_dq_16_key_launches() - before, 1);
  }
#endif
}

// The bf16 passes with the autotuner on (cuda/autotune.h): the first call of a shape times
// their bit-equal variants and keeps the fastest, each variant's outputs checked against the
// defaults' to the bit as it first runs. Each pass as plain or dependent launches (where
// the GPU runs them; the emulator does). The forward, where it runs on one wgmma warpgroup
// (heads of 64 x 64 and 128 x 128 by default): persistent or not (4 combinations). The
// backward: the key order; where the wgmma dQ kernel runs on one warpgroup (heads of 64 and
// 128) its key tile, its start from records and whether it runs persistent (5 of their 8
// combinations differ: the persistent kernel takes 32-key tiles and starts from the
// records); and where it runs at all whether it writes the unselected keys' zeros (40
// combinations; 8 at 128 x 192, where the forward takes two warpgroups and is not tuned;
// without wgmma 4 and the forward untuned). Each tuned pass matches the CPU and equals the untuned one bit for
// bit; the settings are as they were after each call.
TEST(RoutedAttentionGpu, Bf16AutotunedPassesEqualTheDefaults) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const cuda::AutotunePlan plan = cuda::exchange_autotune_plan({1, 1, 0.02});
  cuda::forget_autotune_choices();
  const bool wgmma = cuda::attention_wgmma_available();
  const size_t dependent = cuda::dependent_launches_supported() ? 2 : 1;
  const std::string dependent_on = dependent == 2 ? " dependent_launches=on" : "";
  const std::vector<GpuCase> cases = {
      GpuCase{1, 150, 4, 2, 128, 128, 0.25, true, GpuDocs::Packed20, true},
      GpuCase{1, 150, 4, 2, 128, 192, 0.5, false, GpuDocs::Runs, false}};
  for (const GpuCase& c : cases) {
    SCOPED_TRACE(gpu_case_name(c));
    const ops::RoutedAttentionOutput untuned_forward = gpu_case_forward(c);
    const ops::RoutedAttentionGrads untuned = gpu_case_gradients(c, DType::BF16);
    cuda::set_autotune(true);
    expect_gpu_matches_cpu(c, DType::BF16);  // the shape's first forward and backward: tuned
    const ops::RoutedAttentionOutput tuned_forward = gpu_case_forward(c);
    const ops::RoutedAttentionGrads tuned = gpu_case_gradients(c, DType::BF16);
    cuda::set_autotune(false);
    EXPECT_EQ(max_abs_diff(tuned_forward.out, untuned_forward.out), 0.0);
    EXPECT_EQ(max_abs_diff(tuned_forward.lse, untuned_forward.lse), 0.0);
    expect_same_gradients(tuned, untuned);
  }
  const std::vector<cuda::AutotuneChoice> choices = cuda::autotune_choices();
  cuda::forget_autotune_choices();
  cuda::exchange_autotune_plan(plan);
  std::vector<cuda::AutotuneChoice> forward, backward;
  for (const cuda::AutotuneChoice& choice : choices) {
    (choice.op == "routed_attention forward" ? forward : backward).push_back(choice);
  }
  ASSERT_EQ(choices.size(), forward.size() + backward.size());
  ASSERT_EQ(forward.size(), wgmma ? 1u : 0u) << "the forward at 128 x 128 alone";
  if (wgmma) {
    EXPECT_EQ(forward[0].shape, "bf16 B1 T150 H4x2 D128x128, value scale");
    ASSERT_EQ(forward[0].variants.size(), 2 * dependent);
    EXPECT_EQ(forward[0].variants.back().label, "attention_forward_persistent=-1" + dependent_on);
  }
  ASSERT_EQ(backward.size(), 2u);
  EXPECT_EQ(backward[0].op, "routed_attention backward");
  EXPECT_EQ(backward[0].shape, "bf16 B1 T150 H4x2 D128x128, value scale");
  ASSERT_EQ(backward[0].variants.size(), (wgmma ? 20u : 2u) * dependent);
  EXPECT_EQ(backward[0].variants.back().label,
            (wgmma ? "attention_backward_dq_keys=16 attention_backward_dq_records=on "
                     "attention_backward_dq_persistent=0 attention_backward_key_order=on "
                     "attention_backward_zeros_in_dq=off"
                   : "attention_backward_key_order=on") +
                dependent_on);
  if (wgmma) {
    size_t persistent = 0;
    for (const cuda::TunedVariant& variant : backward[0].variants) {
      if (variant.label.find("dq_persistent=-1") == std::string::npos) continue;
      ++persistent;
      EXPECT_NE(variant.label.find("dq_keys=32 attention_backward_dq_records=off"),
                std::string::npos)
          << variant.label << ": persistent in 32-key tiles, records left at their default";
    }
    EXPECT_EQ(persistent, 4 * dependent);
  }
  EXPECT_EQ(backward[1].shape, "bf16 B1 T150 H4x2 D128x192");
  EXPECT_EQ(backward[1].variants.size(), (wgmma ? 4u : 2u) * dependent)
      << "at 128 x 192: the key order and the zeros";
  EXPECT_EQ(cuda::set_attention_backward_dq_keys(32), 32) << "restored after each call";
  EXPECT_EQ(cuda::set_attention_backward_dq_persistent(0), 0);
  EXPECT_EQ(cuda::set_attention_forward_persistent(0), 0);
  EXPECT_FALSE(cuda::set_dependent_launches(false));
  EXPECT_FALSE(cuda::set_attention_backward_key_order(false));
  EXPECT_TRUE(cuda::set_attention_backward_zeros_in_dq(true));
#endif
}

// The wgmma dQ kernel on one warpgroup a block started from its query tiles' records
// (set_attention_backward_dq_records): against the CPU, exact zeros included, and bit for
// bit the gradients its blocks give from their own rows' ranges. Besides the wgmma cases:
// nothing selected, a last query tile of one row, and a long document whose tiles see more
// keys than a record holds positions for. Each case runs from the records in key tiles of
// 32 and of 16; in tiles of 64 (set so) the setting leaves the kernel as it is.
TEST(RoutedAttentionGpu, Bf16BackwardWithDqFromQueryTileRecordsMatchesCpuAndItsOwnRanges) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  const testing::ScopedSetting one_warpgroup(&cuda::set_attention_backward_wgmma, 1);
  std::vector<GpuCase> cases = kWgmmaHeadCases;
  cases.push_back(GpuCase{1, 130, 2, 1, 64, 64, 0.0, true, GpuDocs::Runs, false});
  cases.push_back(GpuCase{2, 129, 2, 1, 128, 128, 0.5, true, GpuDocs::Interleaved, true});
  cases.push_back(GpuCase{1, 400, 2, 2, 64, 64, 0.6, false, GpuDocs::None, false});
  auto gradients_with = [&](const GpuCase& c, bool records) {
    const testing::ScopedSetting from_records(&cuda::set_attention_backward_dq_records, records);
    return gpu_case_gradients(c, DType::BF16);
  };
  for (int keys : {16, 32, 64}) {
    const testing::ScopedSetting dq_keys(&cuda::set_attention_backward_dq_keys, keys);
    for (const GpuCase& c : cases) {
      SCOPED_TRACE(gpu_case_name(c) + ", " + std::to_string(keys) + " keys a tile");
      const int64_t before = cuda::attention_backward_dq_record_launches();
      {
        const testing::ScopedSetting from_records(&cuda::set_attention_backward_dq_records,
                                                  true);
        expect_gpu_matches_cpu(c, DType::BF16);
      }
      const ops::RoutedAttentionGrads own = gradients_with(c, false);
      const ops::RoutedAttentionGrads recorded = gradients_with(c, true);
      EXPECT_EQ(cuda::attention_backward_dq_record_launches() - before, keys == 64 ? 0 : 2);
      expect_same_gradients(recorded, own);
    }
  }
  EXPECT_FALSE(cuda::set_attention_backward_dq_records(false)) << "off by default";
#endif
}

// The persistent dQ kernel (set_attention_backward_dq_persistent) bit for bit against the
// dQ kernel with a block a query tile: on 1 and 3 blocks, so that each block runs many query
// tiles (those that see no key among them), and on as many as the SMs hold. On 3 blocks also
// against the CPU, with the unselected keys' zeros from the first pass instead of its blocks
// (the default), and with D from the first pass (out off a 16-byte boundary). Each call must
// run it.
TEST(RoutedAttentionGpu, Bf16BackwardWithPersistentDqMatchesCpuAndABlockATile) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  const testing::ScopedSetting one_warpgroup(&cuda::set_attention_backward_wgmma, 1);
  const testing::ScopedSetting dq_keys(&cuda::set_attention_backward_dq_keys, 32);
  const std::vector<GpuCase> cases = persistent_kernel_cases();
  for (int blocks : {1, 3, -1}) {
    for (bool zeros_in_dq : {true, false}) {
      if (!zeros_in_dq && blocks != 3) continue;
      const testing::ScopedSetting zeros(&cuda::set_attention_backward_zeros_in_dq, zeros_in_dq);
      for (const GpuCase& c : cases) {
        SCOPED_TRACE(gpu_case_name(c) + ", " + std::to_string(blocks) + " blocks" +
                     (zeros_in_dq ? "" : ", zeros from the first pass"));
        const bool every_path = blocks == 3;
        const ops::RoutedAttentionGrads a_block_a_tile = gpu_case_gradients(c, DType::BF16);
        const ops::RoutedAttentionGrads a_block_a_tile_unaligned =
            every_path ? gpu_case_gradients(c, DType::BF16, true) : ops::RoutedAttentionGrads{};
        const testing::ScopedSetting persistent(&cuda::set_attention_backward_dq_persistent,
                                                blocks);
        const int64_t before = cuda::attention_backward_dq_persistent_launches();
        expect_same_gradients(gpu_case_gradients(c, DType::BF16), a_block_a_tile);
        if (every_path) {
          expect_gpu_matches_cpu(c, DType::BF16);
          expect_same_gradients(gpu_case_gradients(c, DType::BF16, true),
                                a_block_a_tile_unaligned);
        }
        EXPECT_EQ(cuda::attention_backward_dq_persistent_launches() - before, every_path ? 3 : 1);
      }
    }
  }
  testing::expect_error([] { cuda::set_attention_backward_dq_persistent(-2); },
                        {"set_attention_backward_dq_persistent", "-2", "0 (off)"});
  EXPECT_EQ(cuda::set_attention_backward_dq_persistent(0), 0) << "off by default";
#endif
}

// The persistent dK/dV kernel (set_attention_backward_dkdv_persistent) bit for bit against
// the dK/dV kernel with a block a key tile: on 1 and 3 blocks, so that each block runs many
// key tiles (those past a row's keys among them), and on as many as the SMs hold. On 3
// blocks also against the CPU; with D from the first pass (out off a 16-byte boundary); with
// the key tiles ordered by work (set_attention_backward_key_order), whose order the blocks
// take their ranks through; and in dependent launches, where the first tile's prologue runs
// before the wait. Each such call must run it; at 128 x 192 and on two warpgroups the
// setting leaves the kernel as it is.
TEST(RoutedAttentionGpu, Bf16BackwardWithPersistentDkDvMatchesCpuAndABlockATile) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  const testing::ScopedSetting one_warpgroup(&cuda::set_attention_backward_wgmma, 1);
  const std::vector<GpuCase> cases = persistent_kernel_cases();
  auto expect_persistent_equal = [](const GpuCase& c, int blocks, bool unaligned_out) {
    const ops::RoutedAttentionGrads a_block_a_tile =
        gpu_case_gradients(c, DType::BF16, unaligned_out);
    const testing::ScopedSetting persistent(&cuda::set_attention_backward_dkdv_persistent,
                                            blocks);
    const int64_t before = cuda::attention_backward_dkdv_persistent_launches();
    expect_same_gradients(gpu_case_gradients(c, DType::BF16, unaligned_out), a_block_a_tile);
    EXPECT_EQ(cuda::attention_backward_dkdv_persistent_launches() - before, 1);
  };
  for (int blocks : {1, 3, -1}) {
    for (const GpuCase& c : cases) {
      SCOPED_TRACE(gpu_case_name(c) + ", " + std::to_string(blocks) + " blocks");
      expect_persistent_equal(c, blocks, false);
      if (blocks != 3) continue;
      {
        const testing::ScopedSetting persistent(&cuda::set_attention_backward_dkdv_persistent,
                                                blocks);
        expect_gpu_matches_cpu(c, DType::BF16);
      }
      {
        SCOPED_TRACE("D from the first pass");
        expect_persistent_equal(c, blocks, true);
      }
      {
        SCOPED_TRACE("key tiles ordered by work");
        const testing::ScopedSetting order(&cuda::set_attention_backward_key_order, true);
        expect_persistent_equal(c, blocks, false);
      }
      {
        SCOPED_TRACE("dependent launches");
        const testing::ScopedSetting dependent(&cuda::set_dependent_launches, true);
        expect_persistent_equal(c, blocks, false);
      }
    }
  }
  for (const bool wide : {true, false}) {
    const GpuCase& c = wide ? kWgmmaWideHeadCases.front() : cases.front();
    SCOPED_TRACE(gpu_case_name(c) + (wide ? "" : ", two warpgroups"));
    const testing::ScopedSetting groups(&cuda::set_attention_backward_wgmma, wide ? 1 : 2);
    const testing::ScopedSetting persistent(&cuda::set_attention_backward_dkdv_persistent, -1);
    const int64_t before = cuda::attention_backward_dkdv_persistent_launches();
    expect_gpu_matches_cpu(c, DType::BF16);
    EXPECT_EQ(cuda::attention_backward_dkdv_persistent_launches(), before);
  }
  testing::expect_error([] { cuda::set_attention_backward_dkdv_persistent(-2); },
                        {"set_attention_backward_dkdv_persistent", "-2", "0 (off)"});
  EXPECT_EQ(cuda::set_attention_backward_dkdv_persistent(0), 0) << "off by default";
#endif
}

// The order the dK/dV blocks take their key tiles in (set_attention_backward_key_order),
// from the GPU's compaction, against the rule worked out on the CPU's: each row's tiles of
// `rows` keys by work falling (the query tiles of 64 rows whose visible keys meet the tile),
// in 1023 bins of equal width up to the row's greatest work, by index within a bin, the
// tiles past the row's keys last. Rows of tiles more than a block's 256 threads and more
// than its window of 4096 (tiles of one key), work of many values and none, packed,
// interleaved and no documents, and nothing selected.
TEST(RoutedAttentionGpu, KeyTileOrderTakesTheHeaviestTilesFirst) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  struct OrderCase {
    int64_t batch, seq_len;
    double density;
    GpuDocs docs;
    int rows;
  };
  const std::vector<OrderCase> cases = {
      {2, 5000, 0.5, GpuDocs::Packed20, 8},   {1, 4100, 1.0, GpuDocs::None, 16},
      {1, 9000, 1.0, GpuDocs::Packed20, 1},   {1, 4500, 0.6, GpuDocs::Interleaved, 1},
      {3, 700, 0.25, GpuDocs::Packed20, 64},  {2, 900, 0.3, GpuDocs::Interleaved, 32},
      {2, 600, 0.5, GpuDocs::Runs, 128},      {1, 300, 0.0, GpuDocs::Packed20, 64}};
  for (const OrderCase& oc : cases) {
    const GpuCase c{oc.batch, oc.seq_len, 1, 1, 64, 64, oc.density, false, oc.docs, false};
    SCOPED_TRACE(gpu_case_name(c) + ", tiles of " + std::to_string(oc.rows) + " keys");
    Tensor docs = gpu_case_docs(c, 5);
    Tensor select = gpu_case_select(c, 6);
    const CompactSelection want = ops::compact_selection(select, docs);
    const CompactSelection sel = expect_gpu_compaction_matches_cpu(select, docs, "order case");
    const std::vector<int32_t> order =
        cuda::attention_key_tile_order(sel, oc.rows).to(Device::cpu()).to_vector<int32_t>();
    const std::vector<int64_t> begin = want.visible_begin.to_vector<int64_t>();
    const std::vector<int64_t> end = want.visible_end.to_vector<int64_t>();
    const std::vector<int64_t> counts = want.key_counts.to_vector<int64_t>();
    const int64_t tiles = (oc.seq_len + oc.rows - 1) / oc.rows;
    ASSERT_EQ(int64_t(order.size()), oc.batch * tiles);
    for (int64_t b = 0; b < oc.batch; ++b) {
      std::vector<int64_t> work(size_t(tiles), 0);
      for (int64_t t0 = 0; t0 < oc.seq_len; t0 += 64) {  // the query tiles' visible keys
        int64_t lo = INT64_MAX, hi = 0;
        for (int64_t t = t0; t < std::min(t0 + 64, oc.seq_len); ++t) {
          const size_t n = size_t(b * oc.seq_len + t);
          if (begin[n] < end[n]) {
            lo = std::min(lo, begin[n]);
            hi = std::max(hi, end[n]);
          }
        }
        for (int64_t r = 0; lo < hi && r < tiles; ++r) {
          if (r * oc.rows < hi && (r + 1) * oc.rows > lo) ++work[size_t(r)];
        }
      }
      int64_t top = 1;
      for (int64_t r = 0; r < tiles; ++r) {
        if (r * oc.rows >= counts[size_t(b)]) work[size_t(r)] = -1;
        top = std::max(top, work[size_t(r)]);
      }
      std::vector<int32_t> want_order(static_cast<size_t>(tiles));
      std::iota(want_order.begin(), want_order.end(), 0);
      auto bin = [&](int32_t r) {
        const int64_t w = work[size_t(r)];
        return w < 0 ? 0 : 1 + w * 1022 / top;
      };
      std::stable_sort(want_order.begin(), want_order.end(),
                       [&](int32_t x, int32_t y) { return bin(x) > bin(y); });
      const std::vector<int32_t> got(order.begin() + b * tiles, order.begin() + (b + 1) * tiles);
      EXPECT_EQ(got, want_order) << "row " << b;
    }
  }
  const Tensor select = random_select(1, 10, 0.5, 1);
  const CompactSelection on_cpu = ops::compact_selection(select, Tensor());
  expect_error([&] { cuda::attention_key_tile_order(on_cpu, 64); },
               {"attention_key_tile_order", "cpu", "not a GPU"});
  const CompactSelection sel = expect_gpu_compaction_matches_cpu(select, Tensor(), "one row");
  expect_error([&] { cuda::attention_key_tile_order(sel, 0); },
               {"attention_key_tile_order", "0 rows"});
#endif
}

// The backward with its dK/dV blocks taking their key tiles by work
// (set_attention_backward_key_order): against the CPU, and bit for bit the gradients of the
// blocks in rank order, on every dK/dV kernel that takes the order (wgmma with one and two
// warpgroups, of 64 and 128 keys; mma.sync, split into dK and dV past 320 head dims; the
// f32 tiled kernel). Each case's backward must have run in that order.
TEST(RoutedAttentionGpu, BackwardWithKeyTilesByWorkMatchesCpuAndRankOrder) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  struct OrderedCase {
    GpuCase c;
    DType dtype;
    int wgmma;  // set_attention_backward_wgmma
  };
  std::vector<OrderedCase> cases = {
      {GpuCase{2, 200, 4, 2, 64, 64, 0.5, true, GpuDocs::Packed20, true}, DType::BF16, 0},
      {GpuCase{1, 150, 2, 1, 256, 256, 0.5, true, GpuDocs::Packed20, false}, DType::BF16, 0},
      {GpuCase{2, 180, 2, 2, 64, 64, 0.5, true, GpuDocs::Interleaved, false}, DType::F32, 0}};
  if (cuda::attention_wgmma_available()) {
    cases.push_back(
        {GpuCase{2, 200, 8, 2, 128, 128, 0.5, true, GpuDocs::Packed20, true}, DType::BF16, 1});
    cases.push_back(
        {GpuCase{1, 300, 4, 2, 64, 64, 0.25, true, GpuDocs::Runs, false}, DType::BF16, 2});
    cases.push_back(
        {GpuCase{1, 150, 4, 2, 128, 192, 0.5, true, GpuDocs::Packed20, true}, DType::BF16, 2});
  }
  for (const OrderedCase& oc : cases) {
    SCOPED_TRACE(gpu_case_name(oc.c) + " " + dtype_name(oc.dtype) + ", wgmma " +
                 std::to_string(oc.wgmma));
    const testing::ScopedSetting kernels(&cuda::set_attention_backward_wgmma, oc.wgmma);
    const int64_t before = cuda::attention_backward_key_order_launches();
    ops::RoutedAttentionGrads by_work;
    {
      const testing::ScopedSetting order(&cuda::set_attention_backward_key_order, true);
      expect_gpu_matches_cpu(oc.c, oc.dtype);
      by_work = gpu_case_gradients(oc.c, oc.dtype);
    }
    EXPECT_EQ(cuda::attention_backward_key_order_launches() - before, 2);
    expect_same_gradients(by_work, gpu_case_gradients(oc.c, oc.dtype));
    EXPECT_EQ(cuda::attention_backward_key_order_launches() - before, 2) << "off: rank order";
  }
  EXPECT_FALSE(cuda::set_attention_backward_key_order(false)) << "off by default";
#endif
}

// Dependent launches (cuda::set_dependent_launches, cuda/dependent_launch.h): the compaction,
// the forward and the backward match the CPU and give the gradients of plain launches bit
// for bit, on the wgmma kernels (one and two warpgroups), mma.sync and the f32 tiled ones,
// the zeroing pass beside the others, in order, or in the dQ blocks. On the emulator every
// thread of a dependent launch must pass its griddepcontrol.wait, and the racecheck holds
// what it touches before that against the kernel ahead of it.
TEST(RoutedAttentionGpu, DependentLaunchesMatchCpuAndPlainLaunches) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  struct LaunchCase {
    GpuCase c;
    DType dtype;
    int wgmma;  // set_attention_backward_wgmma and _forward_wgmma
    bool overlap;
    bool dq_records = false, key_order = false, zeros_in_dq = false;
  };
  std::vector<LaunchCase> cases = {
      {GpuCase{2, 200, 4, 2, 64, 64, 0.5, true, GpuDocs::Packed20, true}, DType::BF16, 0, true},
      {GpuCase{2, 180, 2, 2, 64, 64, 0.25, true, GpuDocs::Interleaved, false}, DType::F32, 0,
       false}};
  if (cuda::attention_wgmma_available()) {
    cases.push_back(
        {GpuCase{2, 200, 8, 2, 128, 128, 0.5, true, GpuDocs::Packed20, true}, DType::BF16, 1,
         true});
    cases.push_back(
        {GpuCase{1, 300, 4, 2, 64, 64, 0.25, true, GpuDocs::Runs, false}, DType::BF16, 2, false});
    // The dQ blocks from the query tiles' records (their wait first), the key tiles ordered
    // (the order kernel just ahead of the dK/dV kernel: its wait first), and the dK/dV pass
    // in two kernels (the second's prologue under the first).
    cases.push_back({GpuCase{2, 200, 8, 2, 128, 128, 0.25, true, GpuDocs::Packed20, true},
                     DType::BF16, 1, true, true, true});
    cases.push_back({GpuCase{1, 130, 2, 2, 256, 256, 0.5, true, GpuDocs::Runs, false},
                     DType::BF16, 2, false});
    cases.push_back({GpuCase{1, 130, 2, 2, 256, 256, 0.5, true, GpuDocs::Runs, true},
                     DType::BF16, 2, true, false, true});
    // The unselected keys' zeros in the dQ blocks (stored after their wait), no first pass.
    cases.push_back({GpuCase{2, 200, 8, 2, 128, 128, 0.25, true, GpuDocs::Packed20, true},
                     DType::BF16, 1, false, false, false, true});
  }
  const bool counted = cuda::dependent_launches_supported();
  for (const LaunchCase& lc : cases) {
    SCOPED_TRACE(gpu_case_name(lc.c) + " " + dtype_name(lc.dtype) + ", wgmma " +
                 std::to_string(lc.wgmma) + (lc.overlap ? ", overlapped" : "") +
                 (lc.dq_records ? ", dQ from records" : "") +
                 (lc.key_order ? ", key tiles ordered" : "") +
                 (lc.zeros_in_dq ? ", zeros in the dQ blocks" : ""));
    const testing::ScopedSetting backward(&cuda::set_attention_backward_wgmma, lc.wgmma);
    const testing::ScopedSetting forward(&cuda::set_attention_forward_wgmma, lc.wgmma);
    const testing::ScopedSetting overlap(&cuda::set_attention_backward_overlap, lc.overlap);
    const testing::ScopedSetting records(&cuda::set_attention_backward_dq_records,
                                         lc.dq_records);
    const testing::ScopedSetting order(&cuda::set_attention_backward_key_order, lc.key_order);
    const testing::ScopedSetting zeros(&cuda::set_attention_backward_zeros_in_dq,
                                       lc.zeros_in_dq);
    ops::RoutedAttentionGrads dependent;
    const int64_t before = cuda::dependent_launch_count();
    {
      const testing::ScopedSetting on(&cuda::set_dependent_launches, true);
      expect_gpu_matches_cpu(lc.c, lc.dtype);
      const int64_t early_before = cuda::attention_key_prologues_before_wait();
      dependent = gpu_case_gradients(lc.c, lc.dtype);
      // Each dK/dV wgmma kernel but one just after the order kernel.
      const int parts = lc.c.key_dim + lc.c.value_dim > 320 ? 2 : 1;
      EXPECT_EQ(cuda::attention_key_prologues_before_wait() - early_before,
                lc.wgmma == 0 ? 0 : lc.key_order ? parts - 1 : parts);
    }
    // Compaction, forward, and the backward's passes: at least one launch each.
    if (counted) {
      EXPECT_GE(cuda::dependent_launch_count() - before, 2 * 4);
    }
    const int64_t plain = cuda::dependent_launch_count();
    expect_same_gradients(dependent, gpu_case_gradients(lc.c, lc.dtype));
    EXPECT_EQ(cuda::dependent_launch_count(), plain) << "off: plain launches";
  }
  EXPECT_FALSE(cuda::set_dependent_launches(false)) << "off by default";
#endif
}

// The backward's first pass on the second stream (set_attention_backward_overlap, the
// default), where the wgmma dQ kernel forms D so that the pass only zeroes the unselected
// rows (with set_attention_backward_zeros_in_dq off: on, the default, no first pass runs),
// and in order (set so): the gradients into poisoned buffers, their exact zeros
// included, against the CPU. It runs beside the other kernels only there, on one warpgroup
// and on two; with mma.sync it stays in order. (On the emulator, HAM_EMULATOR_STREAMS=late
// holds the second stream's work until the join waits for it; that the streams overlap is
// the GPU's to show.)
TEST(RoutedAttentionGpu, Bf16BackwardWithItsZeroingBesideTheOtherPassesOrInOrderMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  const std::vector<GpuCase> cases = {
      GpuCase{2, 300, 4, 2, 64, 64, 0.25, true, GpuDocs::Runs, true},
      GpuCase{2, 200, 8, 2, 128, 128, 0.5, true, GpuDocs::Packed20, true},
      GpuCase{1, 150, 4, 2, 128, 192, 0.5, true, GpuDocs::Packed20, true}};
  const testing::ScopedSetting first_pass(&cuda::set_attention_backward_zeros_in_dq, false);
  for (bool beside : {true, false}) {
    const testing::ScopedSetting overlap(&cuda::set_attention_backward_overlap, beside);
    for (int kernels : {1, 2}) {
      const testing::ScopedSetting groups(&cuda::set_attention_backward_wgmma, kernels);
      const int64_t before = cuda::attention_overlapped_prologues();
      for (const GpuCase& c : cases) {
        SCOPED_TRACE(gpu_case_name(c) + ", " + std::to_string(kernels) +
                     " warpgroups a block, " + (beside ? "beside" : "in order"));
        expect_gpu_matches_cpu(c, DType::BF16);
      }
      EXPECT_EQ(cuda::attention_overlapped_prologues() - before,
                beside ? int64_t(cases.size()) : 0);
    }
  }
  const testing::ScopedSetting mma_sync(&cuda::set_attention_backward_wgmma, 0);
  const int64_t before = cuda::attention_overlapped_prologues();
  expect_gpu_matches_cpu(cases[0], DType::BF16);
  EXPECT_EQ(cuda::attention_overlapped_prologues(), before) << "mma.sync: D from the prologue";
#endif
}

// The unselected keys' zero gradients written by the wgmma dQ kernel
// (set_attention_backward_zeros_in_dq) in place of the backward's first pass: into
// poisoned buffers against the CPU, exact zeros included, and bit for bit the gradients of
// the first pass. On one warpgroup a block and on two, every wgmma head case (grouped
// query heads, value scales or none, rows past T), nothing selected and everything. Where
// D comes from the first pass (mma.sync) the setting leaves it running.
TEST(RoutedAttentionGpu, Bf16BackwardWithTheZerosInTheDqKernelMatchesCpuAndTheFirstPass) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  std::vector<GpuCase> cases = kWgmmaHeadCases;
  cases.insert(cases.end(), kWgmmaWideHeadCases.begin(), kWgmmaWideHeadCases.end());
  cases.push_back(GpuCase{2, 130, 4, 2, 128, 128, 0.0, true, GpuDocs::Packed20, true});
  auto gradients_with = [&](const GpuCase& c, bool in_dq) {
    const testing::ScopedSetting zeros(&cuda::set_attention_backward_zeros_in_dq, in_dq);
    return gpu_case_gradients(c, DType::BF16);
  };
  for (int kernels : {1, 2}) {
    const testing::ScopedSetting groups(&cuda::set_attention_backward_wgmma, kernels);
    for (const GpuCase& c : cases) {
      SCOPED_TRACE(gpu_case_name(c) + ", " + std::to_string(kernels) + " warpgroups a block");
      const int64_t launches = cuda::attention_backward_zeros_in_dq_launches();
      const int64_t beside = cuda::attention_overlapped_prologues();
      {
        const testing::ScopedSetting zeros(&cuda::set_attention_backward_zeros_in_dq, true);
        expect_gpu_matches_cpu(c, DType::BF16);
      }
      const ops::RoutedAttentionGrads in_dq = gradients_with(c, true);
      EXPECT_EQ(cuda::attention_backward_zeros_in_dq_launches() - launches, 2);
      EXPECT_EQ(cuda::attention_overlapped_prologues(), beside) << "no first pass to overlap";
      expect_same_gradients(in_dq, gradients_with(c, false));
    }
  }
  {
    const testing::ScopedSetting mma_sync(&cuda::set_attention_backward_wgmma, 0);
    const testing::ScopedSetting zeros(&cuda::set_attention_backward_zeros_in_dq, true);
    const int64_t launches = cuda::attention_backward_zeros_in_dq_launches();
    expect_gpu_matches_cpu(cases[0], DType::BF16);
    EXPECT_EQ(cuda::attention_backward_zeros_in_dq_launches(), launches)
        << "mma.sync: D and the zeros from the first pass";
  }
  EXPECT_TRUE(cuda::set_attention_backward_zeros_in_dq(true)) << "on by default";
#endif
}

TEST(RoutedAttentionGpu, Bf16BackwardWithWgmmaMatchesCpuOnALongSequence) {
  HAM_SKIP_UNLESS_CUDA();
  HAM_SKIP_LONG_SEQUENCE_ON_SIMT_EMULATOR(4096);
#ifdef HAM_WITH_CUDA
  expect_wgmma_matches_cpu(kWgmmaBackward,
                           {GpuCase{1, 4096, 8, 2, 128, 128, 0.5, true, GpuDocs::Packed20, true}});
#endif
}

// The forward on its wgmma kernel.
TEST(RoutedAttentionGpu, Bf16ForwardWithWgmmaMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  expect_wgmma_matches_cpu(kWgmmaForward, kWgmmaHeadCases);
#endif
}

// The persistent forward (set_attention_forward_persistent) against the CPU and, bit for
// bit, against the one-warpgroup forward with a block a query tile: on 1 and 3 blocks, so
// that each block runs many query tiles (those that see no key among them, in rounds of
// both directions), and on as many as the SMs hold. Each call must run persistent.
TEST(RoutedAttentionGpu, Bf16ForwardOnPersistentBlocksMatchesCpuAndABlockATile) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  const testing::ScopedSetting one_warpgroup(&cuda::set_attention_forward_wgmma, 1);
  const std::vector<GpuCase> cases = persistent_kernel_cases();
  for (int blocks : {1, 3, -1}) {
    for (const GpuCase& c : cases) {
      SCOPED_TRACE(gpu_case_name(c) + ", " + std::to_string(blocks) + " blocks");
      const ops::RoutedAttentionOutput a_block_a_tile = gpu_case_forward(c);
      const testing::ScopedSetting persistent(&cuda::set_attention_forward_persistent, blocks);
      const int64_t before = cuda::attention_forward_persistent_launches();
      expect_gpu_matches_cpu(c, DType::BF16);
      const ops::RoutedAttentionOutput persistent_blocks = gpu_case_forward(c);
      EXPECT_EQ(cuda::attention_forward_persistent_launches() - before, 2);
      EXPECT_EQ(persistent_blocks.out.to_vector<double>(), a_block_a_tile.out.to_vector<double>());
      EXPECT_EQ(persistent_blocks.lse.to_vector<double>(), a_block_a_tile.lse.to_vector<double>());
    }
  }
  testing::expect_error([] { cuda::set_attention_forward_persistent(-2); },
                        {"set_attention_forward_persistent", "-2", "0 (off)"});
  EXPECT_EQ(cuda::set_attention_forward_persistent(0), 0) << "off by default";
#endif
}

// The three persistent kernels (forward, dQ, dK/dV) under the settings the goals stage of
// scripts/gpu_check.sh times them with (as many blocks as the SMs hold, dependent launches,
// every other setting the default), at #8's two open cases, B4 T4096 H16 D128 rho 0.25
// and B1 T16384 rho 0.25 in 20 documents, and at a T4096 case small enough for the
// emulator: the output, lse and every gradient the same to the bit as the defaults'
// (kernels that other tests hold against the CPU at these lengths), and the smallest case
// against the CPU too. Each call must run persistent. So the goals stage's figures come
// from kernels shown right at the sizes they time, each block taking many tiles. The
// emulator skips cases beyond HAM_EMULATOR_LONGEST_SEQUENCE (1024 by default), so all of
// them; with 4096 the first two take 3 minutes there, with 16384 all three 4 minutes.
TEST(RoutedAttentionGpu, PersistentKernelsUnderTheGoalsSettingsEqualTheDefaultsAtGoalSizes) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  const std::vector<GpuCase> cases = {
      GpuCase{1, 4096, 2, 1, 128, 128, 0.25, true, GpuDocs::Packed20, true},
      GpuCase{4, 4096, 16, 16, 128, 128, 0.25, true, GpuDocs::None, false},
      GpuCase{1, 16384, 16, 16, 128, 128, 0.25, true, GpuDocs::Packed20, false}};
  int ran = 0;
  for (const GpuCase& c : cases) {
#ifdef HAM_TESTS_ON_SIMT_EMULATOR
    if (c.seq_len > testing::longest_emulated_sequence()) continue;
#endif
    SCOPED_TRACE(gpu_case_name(c));
    ++ran;
    const ops::RoutedAttentionOutput defaults_forward = gpu_case_forward(c);
    const ops::RoutedAttentionGrads defaults_backward = gpu_case_gradients(c, DType::BF16);
    const testing::ScopedSetting forward(&cuda::set_attention_forward_persistent, -1);
    const testing::ScopedSetting dq(&cuda::set_attention_backward_dq_persistent, -1);
    const testing::ScopedSetting dkdv(&cuda::set_attention_backward_dkdv_persistent, -1);
    const testing::ScopedSetting dependent(&cuda::set_dependent_launches, true);
    const int64_t forwards = cuda::attention_forward_persistent_launches();
    const int64_t dqs = cuda::attention_backward_dq_persistent_launches();
    const int64_t dkdvs = cuda::attention_backward_dkdv_persistent_launches();
    const ops::RoutedAttentionOutput persistent_forward = gpu_case_forward(c);
    EXPECT_EQ(max_abs_diff(persistent_forward.out, defaults_forward.out), 0.0);
    EXPECT_EQ(max_abs_diff(persistent_forward.lse, defaults_forward.lse), 0.0);
    expect_same_gradients(gpu_case_gradients(c, DType::BF16), defaults_backward);
    // gpu_case_gradients runs a forward too.
    EXPECT_EQ(cuda::attention_forward_persistent_launches() - forwards, 2);
    EXPECT_EQ(cuda::attention_backward_dq_persistent_launches() - dqs, 1);
    EXPECT_EQ(cuda::attention_backward_dkdv_persistent_launches() - dkdvs, 1);
    if (&c == &cases.front()) expect_gpu_matches_cpu(c, DType::BF16);
  }
  if (ran == 0) {
    GTEST_SKIP() << "T = 4096 and longer are too long for the SIMT emulator: runs on a GPU"
                 << " (scripts/gpu_check.sh), or here with HAM_EMULATOR_LONGEST_SEQUENCE";
  }
#endif
}

// Both passes on wgmma at the wider head dims.
TEST(RoutedAttentionGpu, Bf16BackwardWithWgmmaMatchesCpuAtWideHeads) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  expect_wgmma_matches_cpu(kWgmmaBackward, kWgmmaWideHeadCases);
#endif
}

TEST(RoutedAttentionGpu, Bf16ForwardWithWgmmaMatchesCpuAtWideHeads) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  expect_wgmma_matches_cpu(kWgmmaForward, kWgmmaWideHeadCases);
#endif
}

#ifdef HAM_WITH_CUDA
// The bf16 case against the CPU with a pass's kernels chosen automatically (the default);
// returns how many of its calls of that pass ran on wgmma.
int64_t wgmma_launches_by_default(const WgmmaPass& pass, const GpuCase& c) {
  const testing::ScopedSetting automatic(pass.set, cuda::kAttentionWgmmaAutomatic);
  const int64_t launches = pass.launches();
  expect_gpu_matches_cpu(c, DType::BF16);
  return pass.launches() - launches;
}
#endif

// The head dims the wgmma kernels take, as the benchmark asks them.
TEST(RoutedAttentionGpu, WgmmaHeadDimsAreTheCommonOnesAndTheWideOnes) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  for (int64_t dk : {64, 128}) {
    for (int64_t dv : {64, 128}) EXPECT_TRUE(cuda::attention_wgmma_takes_head_dims(dk, dv));
  }
  EXPECT_TRUE(cuda::attention_wgmma_takes_head_dims(128, 192));
  EXPECT_TRUE(cuda::attention_wgmma_takes_head_dims(256, 256));
  EXPECT_FALSE(cuda::attention_wgmma_takes_head_dims(64, 192));
  EXPECT_FALSE(cuda::attention_wgmma_takes_head_dims(256, 128));
  EXPECT_FALSE(cuda::attention_wgmma_takes_head_dims(96, 96));
#endif
}

// The warps' mma.sync kernels at the head dims that wgmma also takes, set so for each pass
// (a GPU with the wgmma kernels otherwise runs them only where the automatic choice keeps
// them; elsewhere they are the default): the wgmma tests' cases, none of them on wgmma.
TEST(RoutedAttentionGpu, Bf16WithMmaSyncMatchesCpuAtWgmmaHeads) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  std::vector<GpuCase> cases = kWgmmaHeadCases;
  cases.insert(cases.end(), kWgmmaWideHeadCases.begin(), kWgmmaWideHeadCases.end());
  for (const WgmmaPass& pass : {kWgmmaForward, kWgmmaBackward}) {
    SCOPED_TRACE(pass.name);
    const int64_t launches = pass.launches();
    expect_bf16_setting_matches_cpu(pass.set, pass.name, 0, -2,
                                    "-1 (automatic), 0 (mma.sync), 1 or 2", cases);
    EXPECT_EQ(pass.launches(), launches);
  }
#endif
}

// By default each bf16 pass runs on the wgmma kernels exactly where they are available
// (sm_90a code and a GPU of compute capability 9.0, or the SIMT emulator) and were the
// faster on the H200: the backward at every head dim they take, the forward at 64 x 64,
// 128 x 128, 128 x 192 and 256 x 256 but not at 64 x 128 (untimed); mma.sync elsewhere.
TEST(RoutedAttentionGpu, Bf16PassesTakeWgmmaByDefaultWhereFaster) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const int64_t available = cuda::attention_wgmma_available() ? 1 : 0;
  struct Expected {
    int64_t key_dim, value_dim, forward, backward;  // calls on wgmma where available
  };
  for (const Expected& e : {Expected{64, 64, 1, 1}, Expected{128, 128, 1, 1},
                            Expected{64, 128, 0, 1}, Expected{128, 192, 1, 1},
                            Expected{256, 256, 1, 1}, Expected{256, 128, 0, 0}}) {
    const GpuCase c{1, 100, 2, 1, e.key_dim, e.value_dim, 0.5, true, GpuDocs::Runs, true};
    SCOPED_TRACE(gpu_case_name(c));
    EXPECT_EQ(wgmma_launches_by_default(kWgmmaForward, c), available * e.forward);
    EXPECT_EQ(wgmma_launches_by_default(kWgmmaBackward, c), available * e.backward);
  }
#endif
}

// By default the wgmma passes take the warpgroups a block that the H200 timed faster
// (kWgmmaAutomaticForward and kWgmmaAutomaticBackward in cuda/routed_attention.cu), read
// from the kernels' names on the block timelines: one at 64 x 64 and 128 x 128 in both
// passes, at 128 x 192 two in the forward and one in the backward (sixty-eighth session),
// two at 256 x 256 (its dK and dV from two kernels).
TEST(RoutedAttentionGpu, Bf16PassesTakeTheWarpgroupsTimedFasterByDefault) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  const AutomaticKernels automatic;
  struct Expected {
    int64_t key_dim, value_dim;
    std::vector<std::string> kernels;  // the passes' tensor-core kernels, in launch order
  };
  const std::vector<Expected> expected = {
      {64, 64,
       {"forward_wgmma<64, 64, 1>", "backward_dq_wgmma<64, 64, 1, 32>",
        "backward_dkdv_wgmma<64, 64, 1, 0>"}},
      {128, 128,
       {"forward_wgmma<128, 128, 1>", "backward_dq_wgmma<128, 128, 1, 32>",
        "backward_dkdv_wgmma<128, 128, 1, 0>"}},
      {128, 192,
       {"forward_wgmma<128, 192, 2>", "backward_dq_wgmma<128, 192, 1, 32>",
        "backward_dkdv_wgmma<128, 192, 1, 0>"}},
      {256, 256,
       {"forward_wgmma<256, 256, 2>", "backward_dq_wgmma<256, 256, 2, 32>",
        "backward_dkdv_wgmma<256, 256, 2, 1>", "backward_dkdv_wgmma<256, 256, 2, 2>"}}};
  for (const Expected& e : expected) {
    const GpuCase c{1, 100, 2, 1, e.key_dim, e.value_dim, 0.5, true, GpuDocs::Runs, true};
    SCOPED_TRACE(gpu_case_name(c));
    cuda::record_block_timelines(true);
    gpu_case_gradients(c, DType::BF16);
    cuda::record_block_timelines(false);
    std::vector<std::string> kernels;
    for (const cuda::KernelTimeline& launch : cuda::take_block_timelines()) {
      if (launch.kernel.find("wgmma") != std::string::npos ||
          launch.kernel.find("_mma") != std::string::npos) {
        kernels.push_back(launch.kernel);
      }
    }
    EXPECT_EQ(kernels, e.kernels);
  }
#endif
}

// By default, where the backward runs on wgmma (its dQ kernel then forming D), that kernel
// takes 32-key tiles at head dims of 64 and 128 (one warpgroup a block; the faster on the
// H200, docs/gpu_results.md, thirty-sixth session) and writes the unselected keys' zeros
// itself, so that no first pass runs (the faster in the seventieth session). At 128 x 192
// the dQ kernel's own tile is 32 keys either way.
TEST(RoutedAttentionGpu, Bf16BackwardTakesThe32KeyDqWithTheZerosInItByDefault) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  const testing::ScopedSetting automatic(&cuda::set_attention_backward_wgmma,
                                         cuda::kAttentionWgmmaAutomatic);
  for (auto [key_dim, value_dim] : {std::pair{64, 64}, std::pair{128, 128}, std::pair{128, 192}}) {
    const GpuCase c{1, 100, 2, 1, key_dim, value_dim, 0.5, true, GpuDocs::Runs, true};
    SCOPED_TRACE(gpu_case_name(c));
    const int64_t dq_32 = cuda::attention_backward_dq_32_key_launches();
    const int64_t zeros_in_dq = cuda::attention_backward_zeros_in_dq_launches();
    const int64_t beside = cuda::attention_overlapped_prologues();
    expect_gpu_matches_cpu(c, DType::BF16);
    EXPECT_EQ(cuda::attention_backward_dq_32_key_launches() - dq_32, 1);
    EXPECT_EQ(cuda::attention_backward_zeros_in_dq_launches() - zeros_in_dq, 1);
    EXPECT_EQ(cuda::attention_overlapped_prologues(), beside) << "no first pass";
  }
#endif
}

// bf16 q, k and v that do not start on a 16-byte boundary cannot be read 16 bytes at a
// time, so neither tensor-core kernel takes them and the tiled kernels (as f32 runs them)
// do, at every head dim the op takes.
TEST(RoutedAttentionGpu, Bf16ViewsOffA16ByteBoundaryRunTheTiledKernels) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const int64_t forward = cuda::attention_forward_wgmma_launches();
  const int64_t backward = cuda::attention_backward_wgmma_launches();
  for (int64_t key_dim : {32, 64, 128, 256}) {
    for (int64_t value_dim : {32, 64, 128, 192, 256}) {
      expect_gpu_matches_cpu(
          GpuCase{1, 70, 2, 1, key_dim, value_dim, 0.5, true, GpuDocs::Runs, false},
          DType::BF16, true);
    }
  }
  EXPECT_EQ(cuda::attention_forward_wgmma_launches(), forward);
  EXPECT_EQ(cuda::attention_backward_wgmma_launches(), backward);
#endif
}

// The tensor-core kernels write the rows of out, dq, dk and dv 16 bytes at a time, so
// outputs off a 16-byte boundary take the tiled kernels too.
TEST(RoutedAttentionGpu, Bf16OutputsOffA16ByteBoundaryRunTheTiledKernels) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const int64_t forward = cuda::attention_forward_wgmma_launches();
  const int64_t backward = cuda::attention_backward_wgmma_launches();
  for (auto [key_dim, value_dim] : {std::pair{64, 64}, std::pair{128, 128}, std::pair{128, 192}}) {
    expect_gpu_matches_cpu(
        GpuCase{1, 70, 2, 1, key_dim, value_dim, 0.5, true, GpuDocs::Runs, true}, DType::BF16,
        false, true);
  }
  EXPECT_EQ(cuda::attention_forward_wgmma_launches(), forward);
  EXPECT_EQ(cuda::attention_backward_wgmma_launches(), backward);
#endif
}

TEST(RoutedAttentionGpu, Float64UsesTheGenericKernelsExactly) {
  HAM_SKIP_UNLESS_CUDA();
  expect_gpu_matches_cpu(GpuCase{2, 70, 4, 2, 64, 64, 0.4, true, GpuDocs::Runs, true}, DType::F64);
}

// f32 and f64 outputs off a 16-byte boundary: the backward's prologue (D and the unselected
// keys' zeros) moves one element at a time, as in no other test of those dtypes.
TEST(RoutedAttentionGpu, F32AndF64OutputsOffA16ByteBoundaryMatchCpu) {
  HAM_SKIP_UNLESS_CUDA();
  for (DType dtype : {DType::F32, DType::F64}) {
    expect_gpu_matches_cpu(GpuCase{1, 70, 2, 1, 64, 64, 0.5, true, GpuDocs::Runs, true}, dtype,
                           false, true);
  }
}

TEST(RoutedAttentionGpu, BackwardIsDeterministic) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  const int64_t batch = 2, seq_len = 260;
  Tensor q = testing::random_tensor({batch, seq_len, 4, 64}, DType::BF16, gpu, 1);
  Tensor k = testing::random_tensor({batch, seq_len, 2, 64}, DType::BF16, gpu, 2);
  Tensor v = testing::random_tensor({batch, seq_len, 2, 64}, DType::BF16, gpu, 3);
  Tensor p = uniform64({batch, seq_len}, 4, 0.2, 1.5, false).to(DType::BF16).to(gpu);
  Tensor select = random_select(batch, seq_len, 0.5, 5).to(gpu);
  Tensor docs = packed_docs(batch, seq_len, 20, 6).to(gpu);
  CompactSelection sel = ops::compact_selection(select, docs);
  ops::RoutedAttentionOutput r = ops::routed_attention_forward(q, k, v, sel, p);
  Tensor dout = testing::random_tensor(r.out.shape(), DType::BF16, gpu, 7);
  ops::RoutedAttentionGrads first = ops::routed_attention_backward(dout, q, k, v, sel, r.out, r.lse, p);
  ops::RoutedAttentionGrads second =
      ops::routed_attention_backward(dout, q, k, v, sel, r.out, r.lse, p);
  EXPECT_EQ(max_abs_diff(first.dq, second.dq), 0.0);
  EXPECT_EQ(max_abs_diff(first.dk, second.dk), 0.0);
  EXPECT_EQ(max_abs_diff(first.dv, second.dv), 0.0);
  EXPECT_EQ(max_abs_diff(first.dvalue_scale, second.dvalue_scale), 0.0);
}

// While recording (cuda/block_timeline.h), every block of the kernels the bf16 defaults run
// leaves its stamps, the tiled ones with the tiles they visited. One causal row of 256
// tokens, two heads of 64 (each pass on wgmma), four 64-row query tiles a head:
// - every token selected: four 64-key tiles, so the forward's and dQ's blocks visit 1, 2, 3
//   and 4 key tiles, the dK/dV blocks 4, 3, 2 and 1 query tiles;
// - every other token: 128 keys, so the query blocks visit 1, 1, 2 and 2 key tiles; the
//   first key block (tokens 0 .. 126) is seen by all four query tiles, the second (128 ..
//   254) by the last two, and the last two key blocks have no keys (they return at once,
//   stamped).
// A block that visits a tile stamps its first copies issued before it. Recording changes no
// output, and stopping it stops the stamps.
#ifdef HAM_WITH_CUDA
// The timeline tests' case: bf16, T 256, 2 heads of 64, value-scaled, inputs from seeds
// seed, seed + 1, ..., and every `every`-th token selected.
struct TimelineCase {
  static constexpr int64_t kSeqLen = 256, kHeads = 2, kDim = 64;
  Tensor q, k, v, p, dout;
  CompactSelection selection;

  TimelineCase(uint64_t seed, int64_t every) {
    const Device gpu = Device::cuda();
    q = testing::random_tensor({1, kSeqLen, kHeads, kDim}, DType::BF16, gpu, seed);
    k = testing::random_tensor({1, kSeqLen, kHeads, kDim}, DType::BF16, gpu, seed + 1);
    v = testing::random_tensor({1, kSeqLen, kHeads, kDim}, DType::BF16, gpu, seed + 2);
    p = uniform64({1, kSeqLen}, seed + 3, 0.2, 1.5, false).to(DType::BF16).to(gpu);
    dout = testing::random_tensor({1, kSeqLen, kHeads, kDim}, DType::BF16, gpu, seed + 4);
    std::vector<uint8_t> select(static_cast<size_t>(kSeqLen));
    for (int64_t t = 0; t < kSeqLen; ++t) select[size_t(t)] = t % every == 0;
    selection = ops::compact_selection(Tensor::from_vector(select, {1, kSeqLen}).to(gpu));
  }
  // A forward and a backward: their outputs.
  std::vector<Tensor> run() const {
    ops::RoutedAttentionOutput r = ops::routed_attention_forward(q, k, v, selection, p);
    ops::RoutedAttentionGrads g =
        ops::routed_attention_backward(dout, q, k, v, selection, r.out, r.lse, p);
    return {r.out, r.lse, g.dq, g.dk, g.dv, g.dvalue_scale};
  }
  // run() unrecorded, then recorded, with the same outputs to the bit: the recorded launches.
  std::vector<cuda::KernelTimeline> recorded() const {
    const std::vector<Tensor> unrecorded = run();
    EXPECT_FALSE(cuda::recording_block_timelines());
    cuda::record_block_timelines(true);
    EXPECT_TRUE(cuda::recording_block_timelines());
    const std::vector<Tensor> outputs = run();
    cuda::record_block_timelines(false);
    for (size_t i = 0; i < outputs.size(); ++i) {
      EXPECT_EQ(max_abs_diff(outputs[i], unrecorded[i]), 0.0) << "output " << i;
    }
    return cuda::take_block_timelines();
  }
};
#endif

// The persistent forward and dQ kernels stamp an entry a query tile (mark_entry), each with
// its key tiles, on 3 blocks that take the 8 query tiles in turn; the persistent dK/dV
// kernel an entry a key tile, each with its query tiles (none for the tiles past a row's
// keys); recording changes no output.
TEST(RoutedAttentionGpu, TimelineOfThePersistentKernelsStampsEveryTile) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  const AutomaticKernels automatic;
  const testing::ScopedSetting dq_keys(&cuda::set_attention_backward_dq_keys, 32);
  const testing::ScopedSetting forward(&cuda::set_attention_forward_persistent, 3);
  const testing::ScopedSetting dq(&cuda::set_attention_backward_dq_persistent, 3);
  const testing::ScopedSetting dkdv(&cuda::set_attention_backward_dkdv_persistent, 3);
  using Tiles = std::vector<uint32_t>;  // each entry's tiles, sorted
  struct Case {
    int64_t every;     // tokens selected: t % every == 0
    Tiles forward, dq;  // in key tiles of 64 and of 32
    Tiles dkdv;         // in query tiles of 64
    int dkdv_working;   // key tiles with a key
  };
  for (const Case& c :
       {Case{1, {1, 1, 2, 2, 3, 3, 4, 4}, {2, 2, 4, 4, 6, 6, 8, 8}, {1, 1, 2, 2, 3, 3, 4, 4}, 8},
        Case{2, {1, 1, 1, 1, 2, 2, 2, 2}, {1, 1, 2, 2, 3, 3, 4, 4}, {0, 0, 0, 0, 2, 2, 4, 4}, 4}}) {
    SCOPED_TRACE("every " + std::to_string(c.every) + " tokens selected");
    int found = 0;
    for (const cuda::KernelTimeline& launch : TimelineCase(21, c.every).recorded()) {
      const bool forward_kernel = launch.kernel == "forward_wgmma_persistent<64, 64>";
      const bool dkdv_kernel = launch.kernel == "backward_dkdv_wgmma_persistent<64, 64>";
      if (!forward_kernel && !dkdv_kernel &&
          launch.kernel != "backward_dq_wgmma_persistent<64, 64>") {
        continue;
      }
      SCOPED_TRACE(launch.kernel);
      ++found;
      ASSERT_EQ(launch.blocks.size(), 8u) << "an entry a tile: 4 tiles x 2 heads";
      const cuda::TimelineSummary summary = cuda::summarize_block_timeline(launch.blocks);
      EXPECT_EQ(summary.working_blocks, dkdv_kernel ? c.dkdv_working : 8);
      Tiles tiles;
      for (const cuda::BlockStamps& entry : launch.blocks) tiles.push_back(entry.tiles);
      std::sort(tiles.begin(), tiles.end());
      EXPECT_EQ(tiles, forward_kernel ? c.forward : dkdv_kernel ? c.dkdv : c.dq);
    }
    EXPECT_EQ(found, 3) << "the three persistent kernels recorded";
  }
#endif
}

TEST(RoutedAttentionGpu, TimelineStampsEveryBlockWithItsTiles) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  if (!cuda::attention_wgmma_available()) {
    GTEST_SKIP() << kNoWgmmaHere;
  }
  const AutomaticKernels automatic;
  const testing::ScopedSetting dq_keys(&cuda::set_attention_backward_dq_keys, 64);
  // The first pass (off by default: the zeros in the dQ blocks) must stamp its blocks too.
  const testing::ScopedSetting first_pass(&cuda::set_attention_backward_zeros_in_dq, false);
  // The forward's kernel, then the backward's: its first pass (16-byte packs), the query
  // tiles' summary, dQ, dK/dV and the router's gather. The three small kernels visit no
  // tiles; each of their blocks must be stamped (summarize_block_timeline checks it).
  const std::vector<std::string> kernels = {
      "forward_wgmma<64, 64, 1>",         "backward_prologue<8>",
      "summarize_query_tiles",            "backward_dq_wgmma<64, 64, 1, 64>",
      "backward_dkdv_wgmma<64, 64, 1, 0>", "gather_value_scale_grad"};
  // Their blocks: 4 query tiles x 2 heads; 256 tokens, 8 a block; 4 query tiles of 64, 8 a
  // block; as the forward; 4 key tiles x 2 heads; one block of 256 threads for 256 tokens.
  const std::vector<size_t> blocks = {8, 32, 1, 8, 8, 1};
  using Tiles = std::vector<uint32_t>;  // each block's, sorted
  struct Case {
    int64_t every;  // tokens selected: t % every == 0
    Tiles query_blocks, key_blocks;
    int64_t working_key_blocks;
  };
  // Each also as dependent launches: the dQ and dK/dV blocks stamp their start and first
  // copies before their wait (each block's Start writes its whole entry: no memset ahead).
  std::vector<std::pair<bool, Case>> runs;
  for (const bool dependent : {false, true}) {
    runs.push_back({dependent, Case{1, {1, 1, 2, 2, 3, 3, 4, 4}, {1, 1, 2, 2, 3, 3, 4, 4}, 8}});
    runs.push_back({dependent, Case{2, {1, 1, 1, 1, 2, 2, 2, 2}, {0, 0, 0, 0, 2, 2, 4, 4}, 4}});
  }
  for (const auto& [dependent, c] : runs) {
    SCOPED_TRACE("every " + std::to_string(c.every) + " tokens selected" +
                 (dependent ? ", dependent launches" : ""));
    const testing::ScopedSetting dependent_launches(&cuda::set_dependent_launches, dependent);
    const TimelineCase inputs(11, c.every);
    const std::vector<cuda::KernelTimeline> timelines = inputs.recorded();
    ASSERT_EQ(timelines.size(), kernels.size());
    for (size_t i = 0; i < kernels.size(); ++i) {
      const cuda::KernelTimeline& launch = timelines[i];
      SCOPED_TRACE(launch.kernel);
      EXPECT_EQ(launch.kernel, kernels[i]);
      EXPECT_EQ(launch.blocks.size(), blocks[i]);
      const cuda::TimelineSummary summary = cuda::summarize_block_timeline(launch.blocks);
      const bool tiled = i == 0 || i == 3 || i == 4, key_blocks = i == 4;
      if (!tiled) {
        EXPECT_EQ(summary.tiles, 0);
        continue;
      }
      Tiles tiles;
      for (const cuda::BlockStamps& block : launch.blocks) {
        tiles.push_back(block.tiles);
        // A block with a tile issued its copies before it (the summary checks the order).
        if (block.tiles > 0) {
          EXPECT_NE(block.copies_issued, 0u);
        }
      }
      std::sort(tiles.begin(), tiles.end());
      EXPECT_EQ(tiles, key_blocks ? c.key_blocks : c.query_blocks);
      EXPECT_EQ(summary.working_blocks, key_blocks ? c.working_key_blocks : 8);
    }
    inputs.run();  // not recording: nothing more to take
    EXPECT_TRUE(cuda::take_block_timelines().empty());
  }
#endif
}

TEST(RoutedAttentionGpu, AutogradOnGpuMatchesCpu) {
  // nn::routed_attention end to end on GPU tensors (compaction, forward, backward through
  // the autograd node) against the same call on the CPU, in f32.
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  const int64_t batch = 2, seq_len = 150;
  Tensor q = testing::random_tensor({batch, seq_len, 4, 64}, DType::F32, Device::cpu(), 11);
  Tensor k = testing::random_tensor({batch, seq_len, 2, 64}, DType::F32, Device::cpu(), 12);
  Tensor v = testing::random_tensor({batch, seq_len, 2, 128}, DType::F32, Device::cpu(), 13);
  Tensor p = uniform64({batch, seq_len}, 14, 0.2, 1.5, false).to(DType::F32);
  Tensor select = random_select(batch, seq_len, 0.3, 15);
  Tensor docs = random_docs(batch, seq_len, Docs::Runs, 16);
  Tensor dout = testing::random_tensor({batch, seq_len, 4, 128}, DType::F32, Device::cpu(), 17);
  auto run = [&](Device device) {
    std::vector<Tensor> x{q.to(device), k.to(device), v.to(device), p.to(device)};
    for (Tensor& t : x) set_requires_grad(t);
    Tensor out = routed_attention(x[0], x[1], x[2], select.to(device), x[3], docs.to(device));
    std::vector<Tensor> all{out};
    for (Tensor& g : gradients({out}, x, {dout.to(device)})) all.push_back(g);
    return all;
  };
  auto on_cpu = run(Device::cpu()), on_gpu = run(gpu);
  const char* names[] = {"out", "dq", "dk", "dv", "dp"};
  for (size_t j = 0; j < on_cpu.size(); ++j) {
    testing::expect_matches_reference(on_gpu[j], on_cpu[j], DType::F32, names[j]);
  }
}

}  // namespace
}  // namespace ham
