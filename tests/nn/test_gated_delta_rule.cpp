#include "nn/gated_delta_rule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "tests/testing.h"
#ifdef HAM_WITH_CUDA
#include "cuda/autotune.h"
#include "cuda/block_timeline.h"
#include "cuda/dependent_launch.h"
#include "cuda/device_limits.h"
#include "cuda/gated_delta_rule.h"
#endif

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::randn64;

struct GdnInputs {
  Tensor q, k, v, g, beta, h0, doc_ids;
};

// ||a - ref|| / ||ref|| over all elements.
double relative_error(const Tensor& a, const Tensor& ref) {
  EXPECT_EQ(a.shape(), ref.shape());
  auto va = a.to_vector<double>(), vr = ref.to_vector<double>();
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    diff2 += (va[i] - vr[i]) * (va[i] - vr[i]);
    ref2 += vr[i] * vr[i];
  }
  return std::sqrt(diff2) / std::max(std::sqrt(ref2), 1e-300);
}

// "1.234e-12", for RecordProperty (the measured errors land in --gtest_output=xml).
std::string sci(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3e", x);
  return text;
}

// Rows of the last dim scaled to unit L2 norm (the layer feeds L2-normalised keys).
Tensor unit_rows(const Shape& shape, uint64_t seed, bool grad) {
  std::vector<double> x = randn64(shape, seed, 1.0, false).to_vector<double>();
  const size_t width = size_t(shape.back());
  for (size_t r = 0; r < x.size() / width; ++r) {
    double norm2 = 0;
    for (size_t j = 0; j < width; ++j) norm2 += x[r * width + j] * x[r * width + j];
    for (size_t j = 0; j < width; ++j) x[r * width + j] /= std::sqrt(norm2);
  }
  Tensor t = Tensor::from_vector(x, shape);
  if (grad) set_requires_grad(t);
  return t;
}

// Log decays spanning the range the layer produces: exactly 0, near 0 (-1e-4), very
// negative (-20), and log-uniform in [-1, -1e-3] for the rest.
Tensor mixed_gates(const Shape& shape, uint64_t seed, bool grad) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<double> g(size_t(shape_numel(shape)));
  for (double& x : g) {
    double pick = uni(rng);
    if (pick < 0.1) x = 0.0;
    else if (pick < 0.2) x = -1e-4;
    else if (pick < 0.25) x = -20.0;
    else x = -std::exp(std::log(1e-3) + uni(rng) * (std::log(1.0) - std::log(1e-3)));
  }
  Tensor t = Tensor::from_vector(g, shape);
  if (grad) set_requires_grad(t);
  return t;
}

// beta in (0, 1), about one in ten exactly 0.
Tensor write_strengths(const Shape& shape, uint64_t seed, bool grad) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<double> beta(size_t(shape_numel(shape)));
  for (double& x : beta) x = uni(rng) < 0.1 ? 0.0 : 0.02 + 0.96 * uni(rng);
  Tensor t = Tensor::from_vector(beta, shape);
  if (grad) set_requires_grad(t);
  return t;
}

// Document ids for rows whose documents start at `starts[b]` (each > 0); consecutive
// documents alternate between two ids, so a reset must come from a change, not a new id.
template <class Index>
Tensor doc_ids_from_starts(int64_t batch, int64_t seq_len,
                          const std::vector<std::vector<int64_t>>& starts) {
  std::vector<Index> ids(size_t(batch * seq_len));
  for (int64_t b = 0; b < batch; ++b) {
    int64_t doc = 0;
    for (int64_t t = 0; t < seq_len; ++t) {
      for (int64_t s : starts[size_t(b)]) doc += s == t ? 1 : 0;
      ids[size_t(b * seq_len + t)] = Index(10 * b + doc % 2);
    }
  }
  return Tensor::from_vector(ids, {batch, seq_len});
}

GdnInputs make_inputs(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, uint64_t seed,
                      bool with_h0, bool grad) {
  GdnInputs in;
  in.q = randn64({B, T, H, K}, seed, 1.0 / std::sqrt(double(K)), grad);
  in.k = unit_rows({B, T, H, K}, seed + 1, grad);
  in.v = randn64({B, T, H, V}, seed + 2, 1.0, grad);
  in.g = mixed_gates({B, T, H}, seed + 3, grad);
  in.beta = write_strengths({B, T, H}, seed + 4, grad);
  if (with_h0) in.h0 = randn64({B, H, K, V}, seed + 5, 0.5, grad);
  return in;
}

GatedDeltaRuleArgs args_of(const GdnInputs& in) {
  return {in.q, in.k, in.v, in.g, in.beta, in.h0, in.doc_ids};
}

// ---- Chunked forward against the naive recurrence (f64) ------------------------------

struct ForwardCase {
  int64_t seq_len;
  bool with_h0, with_docs;
};

void PrintTo(const ForwardCase& c, std::ostream* os) {
  *os << "T" << c.seq_len << (c.with_h0 ? "_h0" : "") << (c.with_docs ? "_docs" : "");
}

// Document starts per row, kept where < T: row 0 has two length-1 documents at the front
// then two of exactly one chunk (64); row 1 starts documents at t = 5, at the absolute
// chunk edge 64, at 129, and a length-1 document at 199.
std::vector<std::vector<int64_t>> doc_starts_for(int64_t seq_len) {
  std::vector<std::vector<int64_t>> rows = {{1, 2, 66, 130}, {5, 64, 129, 199}};
  for (auto& row : rows) std::erase_if(row, [&](int64_t s) { return s >= seq_len; });
  return rows;
}

class GatedDeltaRuleChunkedVsNaive : public ::testing::TestWithParam<ForwardCase> {};

TEST_P(GatedDeltaRuleChunkedVsNaive, F64OutputsAgree) {
  const ForwardCase& c = GetParam();
  const int64_t B = 2, H = 2, K = 8, V = 12;
  GdnInputs in = make_inputs(B, c.seq_len, H, K, V, 100 + uint64_t(c.seq_len), c.with_h0, false);
  if (c.with_docs) in.doc_ids = doc_ids_from_starts<int64_t>(B, c.seq_len, doc_starts_for(c.seq_len));
  GatedDeltaRuleResult chunked = ops::gated_delta_rule_chunked(args_of(in));
  GatedDeltaRuleResult naive = ops::gated_delta_rule_naive(args_of(in));
  double err_o = relative_error(chunked.o, naive.o);
  double err_h = relative_error(chunked.h_final, naive.h_final);
  double err_fit = relative_error(chunked.fit_error, naive.fit_error);
  RecordProperty("rel_err_o", sci(err_o));
  RecordProperty("rel_err_h_final", sci(err_h));
  RecordProperty("rel_err_fit_error", sci(err_fit));
  EXPECT_LT(err_o, 1e-10);
  EXPECT_LT(err_h, 1e-10);
  EXPECT_LT(err_fit, 1e-10);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GatedDeltaRuleChunkedVsNaive,
    ::testing::Values(ForwardCase{1, false, false}, ForwardCase{1, true, false},
                      ForwardCase{63, false, false}, ForwardCase{63, true, true},
                      ForwardCase{64, false, true}, ForwardCase{64, true, false},
                      ForwardCase{65, true, true}, ForwardCase{65, false, false},
                      ForwardCase{200, false, true}, ForwardCase{200, true, true},
                      ForwardCase{200, true, false}));

TEST(GatedDeltaRule, ChunkedF32MatchesF64ForwardAndBackward) {
  const int64_t B = 2, T = 200, H = 2, K = 16, V = 24;
  GdnInputs in = make_inputs(B, T, H, K, V, 7, true, false);
  in.doc_ids = doc_ids_from_starts<int32_t>(B, T, doc_starts_for(T));
  GatedDeltaRuleResult ref = ops::gated_delta_rule_chunked(args_of(in));
  GatedDeltaRuleArgs a32{in.q.to(DType::F32), in.k.to(DType::F32), in.v.to(DType::F32),
                         in.g.to(DType::F32), in.beta.to(DType::F32), in.h0.to(DType::F32),
                         in.doc_ids};
  GatedDeltaRuleResult out = ops::gated_delta_rule_chunked(a32);
  EXPECT_EQ(out.o.dtype(), DType::F32);
  EXPECT_LT(relative_error(out.o, ref.o), 1e-4);
  EXPECT_LT(relative_error(out.h_final, ref.h_final), 1e-4);
  EXPECT_LT(relative_error(out.fit_error, ref.fit_error), 1e-4);

  Tensor grad_o = randn64(ref.o.shape(), 8, 1.0, false);
  Tensor grad_h_final = randn64(ref.h_final.shape(), 9, 1.0, false);
  GatedDeltaRuleGrads g64 = ops::gated_delta_rule_backward(args_of(in), grad_o, grad_h_final);
  GatedDeltaRuleGrads g32 = ops::gated_delta_rule_backward(a32, grad_o.to(DType::F32),
                                                           grad_h_final.to(DType::F32));
  EXPECT_LT(relative_error(g32.dq, g64.dq), 1e-4);
  EXPECT_LT(relative_error(g32.dk, g64.dk), 1e-4);
  EXPECT_LT(relative_error(g32.dv, g64.dv), 1e-4);
  EXPECT_LT(relative_error(g32.dg, g64.dg), 1e-4);
  EXPECT_LT(relative_error(g32.dbeta, g64.dbeta), 1e-4);
  EXPECT_LT(relative_error(g32.dh0, g64.dh0), 1e-4);
}

// ---- The naive recurrence against explicit loops ---------------------------------------

TEST(GatedDeltaRule, NaiveMatchesHandTrace) {
  // T = 3, K = V = 2, one head, initial state given.
  const std::vector<double> q = {0.5, -1.0, 2.0, 0.25, -0.75, 1.5};
  const std::vector<double> k = {0.6, 0.8, -0.8, 0.6, 1.0, 0.0};
  const std::vector<double> v = {1.0, 2.0, -3.0, 0.5, 0.25, -1.0};
  const std::vector<double> g = {-0.1, 0.0, -2.0};
  const std::vector<double> beta = {0.9, 0.5, 0.0};
  const std::vector<double> h0 = {0.3, -0.2, 0.1, 0.4};
  GatedDeltaRuleArgs args{Tensor::from_vector(q, {1, 3, 1, 2}),
                          Tensor::from_vector(k, {1, 3, 1, 2}),
                          Tensor::from_vector(v, {1, 3, 1, 2}),
                          Tensor::from_vector(g, {1, 3, 1}),
                          Tensor::from_vector(beta, {1, 3, 1}),
                          Tensor::from_vector(h0, {1, 1, 2, 2}),
                          Tensor()};
  GatedDeltaRuleResult got = ops::gated_delta_rule_naive(args);

  double S[2][2] = {{h0[0], h0[1]}, {h0[2], h0[3]}};
  std::vector<double> o(6), fit(3);
  for (int t = 0; t < 3; ++t) {
    for (auto& row : S) {
      for (double& s : row) s *= std::exp(g[size_t(t)]);
    }
    double p[2], r[2];
    for (int j = 0; j < 2; ++j) p[j] = S[0][j] * k[size_t(2 * t)] + S[1][j] * k[size_t(2 * t + 1)];
    double pv = p[0] * v[size_t(2 * t)] + p[1] * v[size_t(2 * t + 1)];
    double pn = std::hypot(p[0], p[1]), vn = std::hypot(v[size_t(2 * t)], v[size_t(2 * t + 1)]);
    fit[size_t(t)] = 1 - pv / (pn * vn + 1e-6);
    for (int j = 0; j < 2; ++j) r[j] = v[size_t(2 * t + j)] - p[j];
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j) S[i][j] += beta[size_t(t)] * k[size_t(2 * t + i)] * r[j];
    }
    for (int j = 0; j < 2; ++j) {
      o[size_t(2 * t + j)] = S[0][j] * q[size_t(2 * t)] + S[1][j] * q[size_t(2 * t + 1)];
    }
  }
  auto go = got.o.to_vector<double>(), gf = got.fit_error.to_vector<double>(),
       gh = got.h_final.to_vector<double>();
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(go[i], o[i], 1e-14) << "o[" << i << "]";
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(gf[i], fit[i], 1e-14) << "fit_error[" << i << "]";
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) EXPECT_NEAR(gh[size_t(2 * i + j)], S[i][j], 1e-14);
  }
}

TEST(GatedDeltaRule, FirstTokenWithoutStateIsOneWrite) {
  // From S = 0: p = 0, S_0 = beta k v^T, o_0 = beta (q . k) v.
  GdnInputs in = make_inputs(1, 1, 1, 3, 2, 5, false, false);
  GatedDeltaRuleResult r = ops::gated_delta_rule_naive(args_of(in));
  auto q = in.q.to_vector<double>(), k = in.k.to_vector<double>(), v = in.v.to_vector<double>();
  double beta = in.beta.item(), qk = q[0] * k[0] + q[1] * k[1] + q[2] * k[2];
  auto o = r.o.to_vector<double>();
  EXPECT_NEAR(o[0], beta * qk * v[0], 1e-15);
  EXPECT_NEAR(o[1], beta * qk * v[1], 1e-15);
  EXPECT_EQ(r.fit_error.item(), 1.0);
}

TEST(GatedDeltaRule, DocumentStartForgetsThePast) {
  // The second document of a row gives what it gives when run alone from a zero state.
  const int64_t T = 90, start = 37;
  GdnInputs in = make_inputs(1, T, 2, 4, 5, 31, true, false);
  in.doc_ids = doc_ids_from_starts<int64_t>(1, T, {{start}});
  GatedDeltaRuleResult joint = ops::gated_delta_rule_chunked(args_of(in));
  auto tail = [&](const Tensor& x) {  // tokens [start, T) of batch row 0, as [1, T - start, ...]
    Shape shape = x.shape();
    shape[1] = T - start;
    return x.select(0).slice(start, T).clone().reshape(shape);
  };
  GdnInputs alone{tail(in.q), tail(in.k), tail(in.v), tail(in.g), tail(in.beta), Tensor(), Tensor()};
  GatedDeltaRuleResult separate = ops::gated_delta_rule_naive(args_of(alone));
  EXPECT_LT(relative_error(tail(joint.o), separate.o), 1e-12);
  EXPECT_LT(relative_error(joint.h_final, separate.h_final), 1e-12);
}

TEST(GatedDeltaRule, EmptySequenceKeepsInitialState) {
  // T = 0: h_final = h0, so dh0 = grad_h_final (weights of the gradcheck contraction).
  GdnInputs in = make_inputs(1, 0, 2, 3, 4, 51, true, true);
  GatedDeltaRuleResult r = gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.h0);
  EXPECT_EQ(r.o.shape(), (Shape{1, 0, 2, 4}));
  EXPECT_EQ(testing::max_abs_diff(r.h_final, in.h0), 0.0);
  expect_gradcheck(
      [&](const std::vector<Tensor>& x) {
        return std::vector{gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, x[0]).h_final};
      },
      {in.h0});
}

// ---- fit_error -------------------------------------------------------------------------

TEST(GatedDeltaRule, FitErrorIsOneAtDocumentStartsWithoutState) {
  const int64_t B = 2, T = 200, H = 2;
  GdnInputs in = make_inputs(B, T, H, 8, 12, 11, false, false);
  auto starts = doc_starts_for(T);
  in.doc_ids = doc_ids_from_starts<int64_t>(B, T, starts);
  for (const auto& result :
       {ops::gated_delta_rule_chunked(args_of(in)), ops::gated_delta_rule_naive(args_of(in))}) {
    auto fit = result.fit_error.to_vector<double>();
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int64_t> row_starts = starts[size_t(b)];
      row_starts.push_back(0);
      for (int64_t t : row_starts) {
        for (int64_t h = 0; h < H; ++h) {
          EXPECT_EQ(fit[size_t((b * T + t) * H + h)], 1.0) << "b " << b << " t " << t;
        }
      }
    }
  }
}

TEST(GatedDeltaRule, FitErrorZeroWhenPredictedTwoWhenOpposed) {
  // Token 0 writes beta_0 k_0 v_0^T into an empty state; token 1's prediction is then
  // e^{g_1} beta_0 (k_0 . k_1) v_0, parallel to v_0 when k_0 . k_1 > 0.
  auto run = [](double sign) {
    std::vector<double> k = {0.6, 0.8, 0.8, 0.6}, v = {1.0, -2.0, 0.5, sign, -2.0 * sign, 0.5 * sign};
    GatedDeltaRuleArgs a{Tensor::from_vector(std::vector<double>{1, 0, 0, 1}, {1, 2, 1, 2}),
                         Tensor::from_vector(k, {1, 2, 1, 2}),
                         Tensor::from_vector(v, {1, 2, 1, 3}),
                         Tensor::from_vector(std::vector<double>{-0.3, -0.2}, {1, 2, 1}),
                         Tensor::from_vector(std::vector<double>{0.7, 0.4}, {1, 2, 1}),
                         Tensor(), Tensor()};
    return std::pair{ops::gated_delta_rule_chunked(a).fit_error.to_vector<double>()[1],
                     ops::gated_delta_rule_naive(a).fit_error.to_vector<double>()[1]};
  };
  auto [aligned_chunked, aligned_naive] = run(3.0);
  auto [opposed_chunked, opposed_naive] = run(-3.0);
  for (double e : {aligned_chunked, aligned_naive}) {
    EXPECT_GE(e, 0.0);
    EXPECT_LT(e, 1e-5);
  }
  for (double e : {opposed_chunked, opposed_naive}) {
    EXPECT_LE(e, 2.0);
    EXPECT_GT(e, 2.0 - 1e-5);
  }
}

TEST(GatedDeltaRule, FitErrorWithinZeroToTwo) {
  GdnInputs in = make_inputs(2, 200, 2, 8, 12, 21, true, false);
  in.doc_ids = doc_ids_from_starts<int64_t>(2, 200, doc_starts_for(200));
  GatedDeltaRuleResult r = ops::gated_delta_rule_chunked(args_of(in));
  for (double e : r.fit_error.to_vector<double>()) {
    EXPECT_GE(e, 0.0);
    EXPECT_LE(e, 2.0);
  }
}

TEST(GatedDeltaRule, FitErrorCarriesNoGradient) {
  GdnInputs in = make_inputs(1, 5, 2, 3, 4, 41, true, true);
  GatedDeltaRuleResult r = gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.h0);
  EXPECT_TRUE(requires_grad(r.o));
  EXPECT_TRUE(requires_grad(r.h_final));
  EXPECT_FALSE(requires_grad(r.fit_error));
}

// want_fit_error false (a GDN layer's forward): the chunked and the naive forward leave
// fit_error undefined and give the same o and final state to the bit; the layer's
// gradients are those of the forward with the fit error.
TEST(GatedDeltaRule, ForwardWithoutTheFitErrorLeavesItUndefined) {
  GdnInputs in = make_inputs(2, 150, 2, 8, 12, 47, true, true);
  in.doc_ids = doc_ids_from_starts<int64_t>(2, 150, doc_starts_for(150));
  GatedDeltaRuleArgs bare = args_of(in);
  bare.want_fit_error = false;
  for (auto forward : {&ops::gated_delta_rule_chunked, &ops::gated_delta_rule_naive}) {
    const GatedDeltaRuleResult with = forward(args_of(in)), without = forward(bare);
    EXPECT_TRUE(with.fit_error.defined());
    EXPECT_FALSE(without.fit_error.defined());
    EXPECT_EQ(testing::max_abs_diff(with.o, without.o), 0.0);
    EXPECT_EQ(testing::max_abs_diff(with.h_final, without.h_final), 0.0);
  }
  const Tensor grad_o = randn64({2, 150, 2, 12}, 48, 1.0, false);
  const Tensor grad_h_final = randn64({2, 2, 8, 12}, 49, 1.0, false);
  std::vector<Tensor> grads[2];
  for (bool want : {true, false}) {
    const GatedDeltaRuleResult r = gated_delta_rule(in.q, in.k, in.v, in.g, in.beta, in.h0,
                                                    in.doc_ids, GatedDeltaRuleKeep::Inverses, want);
    EXPECT_EQ(r.fit_error.defined(), want);
    grads[want] = gradients({r.o, r.h_final}, {in.q, in.k, in.v, in.g, in.beta, in.h0},
                            {grad_o, grad_h_final});
  }
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_EQ(testing::max_abs_diff(grads[0][i], grads[1][i]), 0.0);
  }
}

// ---- Gradients (f64 finite differences) ------------------------------------------------

struct GradCase {
  int64_t seq_len;
  bool with_h0, with_docs;
};

void PrintTo(const GradCase& c, std::ostream* os) {
  *os << "T" << c.seq_len << (c.with_h0 ? "_h0" : "") << (c.with_docs ? "_docs" : "");
}

class GatedDeltaRuleGradcheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(GatedDeltaRuleGradcheck, OutputsAndFinalState) {
  const GradCase& c = GetParam();
  const int64_t B = 1, H = 2, K = 3, V = 4;
  GdnInputs in = make_inputs(B, c.seq_len, H, K, V, 300 + uint64_t(c.seq_len), c.with_h0, true);
  Tensor doc_ids;
  if (c.with_docs) {
    // Length-1 document at t = 2, then one of 67 tokens crossing a chunk boundary.
    std::vector<int64_t> starts;
    for (int64_t s : {2, 3}) {
      if (s < c.seq_len) starts.push_back(s);
    }
    doc_ids = doc_ids_from_starts<int32_t>(B, c.seq_len, {starts});
  }
  GradcheckResult result = gradcheck(
      [doc_ids](const std::vector<Tensor>& x) {
        GatedDeltaRuleResult r = gated_delta_rule(x[0], x[1], x[2], x[3], x[4], x[5], doc_ids);
        return std::vector{r.o, r.h_final};
      },
      {in.q, in.k, in.v, in.g, in.beta, in.h0}, {}, {"q", "k", "v", "g", "beta", "h0"});
  RecordProperty("worst_relative_error", sci(result.worst_relative_error));
  EXPECT_TRUE(result.passed) << result.summary();
  EXPECT_LT(result.worst_relative_error, 1e-6) << result.summary();
}

INSTANTIATE_TEST_SUITE_P(Shapes, GatedDeltaRuleGradcheck,
                         ::testing::Values(GradCase{1, true, false}, GradCase{1, false, false},
                                           GradCase{5, true, false}, GradCase{5, false, true},
                                           GradCase{70, true, false}, GradCase{70, true, true},
                                           GradCase{70, false, true}));

TEST(GatedDeltaRule, GradcheckSomeInputsOnly) {
  // Only k and beta want gradients (the node must skip or drop the rest).
  GdnInputs in = make_inputs(1, 9, 2, 3, 4, 77, true, false);
  set_requires_grad(in.k);
  set_requires_grad(in.beta);
  expect_gradcheck(
      [&](const std::vector<Tensor>& x) {
        GatedDeltaRuleResult r = gated_delta_rule(in.q, x[0], in.v, in.g, x[1], in.h0);
        return std::vector{r.o, r.h_final};
      },
      {in.k, in.beta});
}

// ---- Bad inputs ------------------------------------------------------------------------

using testing::expect_error;

TEST(GatedDeltaRule, BadInputsNameOpArgumentAndShapes) {
  Tensor q = Tensor::zeros({2, 5, 3, 16}), k = Tensor::zeros({2, 5, 3, 16});
  Tensor v = Tensor::zeros({2, 5, 3, 4}), g = Tensor::zeros({2, 5, 3}), beta = Tensor::zeros({2, 5, 3});
  expect_error([&] { gated_delta_rule(q, Tensor::zeros({2, 5, 3, 8}), v, g, beta); },
                        {"gated_delta_rule", "k [2, 5, 3, 8]", "q [2, 5, 3, 16]"});
  expect_error([&] { gated_delta_rule(q, k, Tensor::zeros({2, 6, 3, 4}), g, beta); },
                        {"gated_delta_rule", "v [2, 6, 3, 4]", "q [2, 5, 3, 16]"});
  expect_error([&] { gated_delta_rule(q, k, v, Tensor::zeros({2, 5}), beta); },
                        {"gated_delta_rule", "g [2, 5]", "[2, 5, 3]"});
  expect_error([&] { gated_delta_rule(q, k, v, g, Tensor::zeros({2, 5, 3, 1})); },
                        {"gated_delta_rule", "beta [2, 5, 3, 1]", "[2, 5, 3]"});
  expect_error(
      [&] { gated_delta_rule(q, k, v, g, beta, Tensor::zeros({2, 3, 4, 16})); },
      {"gated_delta_rule", "h0 [2, 3, 4, 16]", "[2, 3, 16, 4]"});
  expect_error(
      [&] { gated_delta_rule(q, k, v, g, beta, Tensor(), Tensor::zeros({2, 5}, DType::F32)); },
      {"gated_delta_rule", "doc_ids", "i32 or i64"});
  expect_error(
      [&] { gated_delta_rule(q, k, v, g, beta, Tensor(), Tensor::zeros({2, 4}, DType::I64)); },
      {"gated_delta_rule", "doc_ids [2, 4]", "[2, 5]"});
  expect_error(
      [&] { gated_delta_rule(q, k, v, Tensor::zeros({2, 5, 3}, DType::F64), beta); },
      {"gated_delta_rule", "g", "f64", "f32"});
  expect_error([&] { gated_delta_rule(Tensor::zeros({5, 3, 16}), k, v, g, beta); },
                        {"gated_delta_rule", "q [5, 3, 16]", "[B, T, H, K]"});
}


// ---- CUDA kernels against the CPU reference (f64) --------------------------------------
// Inputs are drawn in f64, rounded to the dtype under test and placed on the GPU; the
// reference runs the CPU kernels in f64 on exactly those rounded values. Outputs are
// NaN-poisoned, so an element a kernel never writes fails the comparison. Bounds are
// relative RMS errors (FLA's test practice): bf16 5e-3 for o and the final state, 8e-3
// for dq dk dv dh0, 2e-2 for dg dbeta, 1e-2 for the fit error; f32 ten times tighter.

using testing::cpu_reference;
using testing::poisoned;
using testing::relative_rms_error;

struct GpuBounds {
  double forward, grad, gate_grad, fit;
};

GpuBounds gpu_bounds(DType dtype) {
  if (dtype == DType::BF16) return {5e-3, 8e-3, 2e-2, 1e-2};
  if (dtype == DType::F64) return {1e-10, 1e-10, 1e-10, 1e-10};
  return {5e-4, 8e-4, 2e-3, 1e-3};
}

// Log decays g = -s softplus(x), x ~ N(0, 1), the scale s drawn per token from
// {0.01, 0.1, 1, 10}; about one in ten exactly 0.
Tensor scaled_gates(const Shape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::normal_distribution<double> normal(0.0, 1.0);
  const double scales[] = {0.01, 0.1, 1.0, 10.0};
  std::vector<double> g(size_t(shape_numel(shape)));
  for (double& x : g) {
    const double scale = scales[size_t(uni(rng) * 4) % 4];
    const double z = normal(rng);
    x = uni(rng) < 0.1 ? 0.0 : -scale * std::log1p(std::exp(z));
  }
  return Tensor::from_vector(g, shape);
}

// `docs` documents per batch row, packed: docs - 1 distinct random starts in [1, T) (fewer
// when T is short), so some documents are one token long and some cross chunk edges.
template <class Index>
Tensor packed_doc_ids(int64_t batch, int64_t seq_len, int64_t docs, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int64_t>> starts(static_cast<size_t>(batch));
  for (auto& row : starts) {
    std::vector<int64_t> candidates;
    for (int64_t t = 1; t < seq_len; ++t) candidates.push_back(t);
    std::shuffle(candidates.begin(), candidates.end(), rng);
    candidates.resize(size_t(std::min<int64_t>(docs - 1, int64_t(candidates.size()))));
    std::sort(candidates.begin(), candidates.end());
    row = candidates;
  }
  return doc_ids_from_starts<Index>(batch, seq_len, starts);
}

struct GpuCase {
  int64_t batch, seq_len, heads, key_dim, value_dim;
  bool with_h0;
  int64_t docs;  // documents per row; 0: no doc_ids
};

void PrintTo(const GpuCase& c, std::ostream* os) {
  *os << "B" << c.batch << "_T" << c.seq_len << "_H" << c.heads << "_K" << c.key_dim << "_V"
      << c.value_dim << (c.with_h0 ? "_h0" : "") << (c.docs ? "_docs" + std::to_string(c.docs) : "");
}

// f64 host inputs of a case (q ~ N(0, 1/K), L2-normalised k).
GdnInputs gpu_case_inputs(const GpuCase& c, uint64_t seed) {
  GdnInputs in;
  const int64_t B = c.batch, T = c.seq_len, H = c.heads, K = c.key_dim, V = c.value_dim;
  in.q = randn64({B, T, H, K}, seed, 1.0 / std::sqrt(double(K)), false);
  in.k = unit_rows({B, T, H, K}, seed + 1, false);
  in.v = randn64({B, T, H, V}, seed + 2, 1.0, false);
  in.g = scaled_gates({B, T, H}, seed + 3);
  in.beta = write_strengths({B, T, H}, seed + 4, false);
  if (c.with_h0) in.h0 = randn64({B, H, K, V}, seed + 5, 0.5, false);
  if (c.docs > 0) {
    in.doc_ids = c.docs % 2 ? packed_doc_ids<int64_t>(B, T, c.docs, seed + 6)
                            : packed_doc_ids<int32_t>(B, T, c.docs, seed + 6);
  }
  return in;
}

// The inputs rounded to `dtype` on the GPU (doc_ids keep their index dtype).
GatedDeltaRuleArgs on_gpu(const GdnInputs& in, DType dtype) {
  auto put = [&](const Tensor& t) {
    return t.defined() ? t.to(dtype).to(Device::cuda()) : Tensor();
  };
  return {put(in.q), put(in.k), put(in.v), put(in.g), put(in.beta), put(in.h0),
          in.doc_ids.defined() ? in.doc_ids.to(Device::cuda()) : Tensor()};
}

// The f64 CPU copy of GPU tensors (the exact rounded values).
Tensor reference_copy(const Tensor& t) {
  return t.defined() ? cpu_reference(t).to(DType::F64) : Tensor();
}

GatedDeltaRuleArgs reference_args(const GatedDeltaRuleArgs& gpu) {
  return {reference_copy(gpu.q),  reference_copy(gpu.k),    reference_copy(gpu.v),
          reference_copy(gpu.g),  reference_copy(gpu.beta), reference_copy(gpu.h0),
          gpu.doc_ids.defined() ? gpu.doc_ids.to(Device::cpu()) : Tensor()};
}

// Preallocated, NaN-poisoned outputs of one forward on the GPU.
GatedDeltaRuleResult poisoned_result(const GatedDeltaRuleArgs& a) {
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), K = a.q.size(3),
                V = a.v.size(3);
  const DType dtype = a.q.dtype();
  return {poisoned({B, T, H, V}, dtype, Device::cuda()), poisoned({B, H, K, V}, dtype, Device::cuda()),
          poisoned({B, T, H}, dtype, Device::cuda())};
}

// Poisoned gradients; `want` picks dq, dk, dv, dg, dbeta, dh0 (dh0 only with h0).
GatedDeltaRuleGrads poisoned_grads(const GatedDeltaRuleArgs& a, const ops::GatedDeltaRuleWanted& want) {
  auto make = [&](bool wanted, const Tensor& like) {
    return wanted ? poisoned(like.shape(), like.dtype(), Device::cuda()) : Tensor();
  };
  return {make(want.q, a.q), make(want.k, a.k),       make(want.v, a.v),
          make(want.g, a.g), make(want.beta, a.beta), make(want.h0 && a.h0.defined(), a.h0)};
}

void expect_within(const Tensor& gpu, const Tensor& ref, double bound, const char* what) {
  const double err = relative_rms_error(gpu, ref);
  ::testing::Test::RecordProperty(std::string("rel_rms_") + what + "_" + dtype_name(gpu.dtype()),
                                  sci(err));
  EXPECT_LE(err, bound) << what << " (" << gpu.str() << ")";
}

// Mixed precision on the CPU: f32 gates with bf16 q, k, v, beta give the f32 op's results
// on the same values, rounded to bf16 once; dg is f32, the other gradients bf16.
TEST(GatedDeltaRule, F32GatesWithBf16InputsOnTheCpu) {
  const GpuCase c{2, 70, 2, 16, 12, true, 3};
  const GdnInputs in = gpu_case_inputs(c, 4000);
  auto bf = [](const Tensor& t) { return t.defined() ? t.to(DType::BF16) : Tensor(); };
  GatedDeltaRuleArgs mixed{bf(in.q), bf(in.k), bf(in.v), in.g.to(DType::F32), bf(in.beta),
                           bf(in.h0), in.doc_ids};
  GatedDeltaRuleArgs wide{mixed.q.to(DType::F32), mixed.k.to(DType::F32), mixed.v.to(DType::F32),
                          mixed.g, mixed.beta.to(DType::F32), mixed.h0.to(DType::F32), in.doc_ids};
  GatedDeltaRuleResult got = ops::gated_delta_rule_chunked(mixed);
  GatedDeltaRuleResult want = ops::gated_delta_rule_chunked(wide);
  EXPECT_EQ(got.o.dtype(), DType::BF16);
  EXPECT_EQ(got.o.to_vector<float>(), want.o.to(DType::BF16).to_vector<float>());
  Tensor grad_o = randn64(want.o.shape(), 81, 1.0, false).to(DType::BF16);
  Tensor grad_h = randn64(want.h_final.shape(), 82, 1.0, false).to(DType::BF16);
  GatedDeltaRuleGrads g = ops::gated_delta_rule_backward(mixed, grad_o, grad_h);
  GatedDeltaRuleGrads g_wide =
      ops::gated_delta_rule_backward(wide, grad_o.to(DType::F32), grad_h.to(DType::F32));
  EXPECT_EQ(g.dg.dtype(), DType::F32);
  EXPECT_EQ(g.dg.to_vector<float>(), g_wide.dg.to_vector<float>());
  EXPECT_EQ(g.dq.dtype(), DType::BF16);
  EXPECT_EQ(g.dq.to_vector<float>(), g_wide.dq.to(DType::BF16).to_vector<float>());
  // f32 gates go only with bf16 inputs: f64 q with f32 g stays an error.
  GatedDeltaRuleArgs bad{in.q, in.k, in.v, in.g.to(DType::F32), in.beta, Tensor(), Tensor()};
  testing::expect_error([&] { ops::gated_delta_rule_chunked(bad); }, {"gated_delta_rule", "g", "dtypes must match"});
}

// The CPU keeps nothing for its backward, whatever `keep` asks, and a saved state handed to
// the CPU backward (another backend's) is a one-line error.
TEST(GatedDeltaRule, CpuKeepsNoChunkStates) {
  const GpuCase c{1, 70, 2, 16, 12, false, 2};
  GatedDeltaRuleArgs args = args_of(gpu_case_inputs(c, 4300));
  for (GatedDeltaRuleKeep keep : {GatedDeltaRuleKeep::Inverses, GatedDeltaRuleKeep::ChunkStates}) {
    args.keep = keep;
    EXPECT_EQ(ops::gated_delta_rule_chunked(args).saved, nullptr);
  }
  const GatedDeltaRuleResult out = ops::gated_delta_rule_chunked(args);
  struct Foreign final : GatedDeltaRuleSaved {
    int64_t bytes() const override { return 0; }
  } foreign;
  const Tensor grad_o = randn64(out.o.shape(), 83, 1.0, false);
  const Tensor grad_h = randn64(out.h_final.shape(), 84, 1.0, false);
  testing::expect_error(
      [&] { ops::gated_delta_rule_backward(args, grad_o, grad_h, {}, &foreign); },
      {"gated_delta_rule_backward (cpu)", "saved forward state"});
}

// The backward keeps a segment's chunk terms (each at least a [K, V] start state and a
// [c, c] decay matrix) in a pool tensor, so the run's peak memory counts them.
TEST(GatedDeltaRule, CpuBackwardScratchCountsInPeakMemory) {
  const int64_t seq_len = 4 * kGatedDeltaRuleChunkSize, key_dim = 16, value_dim = 12;
  const GdnInputs in = make_inputs(1, seq_len, 1, key_dim, value_dim, 4400, true, false);
  const GatedDeltaRuleArgs args = args_of(in);
  const GatedDeltaRuleResult out = ops::gated_delta_rule_chunked(args);
  const Tensor grad_o = randn64(out.o.shape(), 4401, 1.0, false);
  const Tensor grad_h = randn64(out.h_final.shape(), 4402, 1.0, false);
  reset_peak_device_memory(Device::cpu());
  const size_t before = device_memory_stats(Device::cpu()).requested_bytes;
  const GatedDeltaRuleGrads grads = ops::gated_delta_rule_backward(args, grad_o, grad_h);
  const size_t rise = device_memory_stats(Device::cpu()).peak_requested_bytes - before;
  size_t results = 0;
  for (const Tensor* t : {&grads.dq, &grads.dk, &grads.dv, &grads.dg, &grads.dbeta, &grads.dh0}) {
    results += size_t(t->numel()) * sizeof(double);
  }
  const size_t chunk_terms =
      size_t(4 * (key_dim * value_dim + kGatedDeltaRuleChunkSize * kGatedDeltaRuleChunkSize)) *
      sizeof(double);
  EXPECT_GE(rise, results + chunk_terms);
}

class GatedDeltaRuleGpu : public ::testing::TestWithParam<GpuCase> {};

// The GPU forward and backward on `gpu` against the f64 CPU reference on the same values.
void expect_gpu_matches_reference(const GatedDeltaRuleArgs& gpu, const GpuBounds& bound,
                                  uint64_t seed) {
  const GatedDeltaRuleArgs ref = reference_args(gpu);
  GatedDeltaRuleResult out = poisoned_result(gpu);
  gated_delta_rule_chunked_kernels()(Device::cuda(), gpu, out);
  const GatedDeltaRuleResult expected = ops::gated_delta_rule_chunked(ref);
  expect_within(out.o, expected.o, bound.forward, "o");
  expect_within(out.h_final, expected.h_final, bound.forward, "h_final");
  expect_within(out.fit_error, expected.fit_error, bound.fit, "fit_error");

  const DType dtype = gpu.q.dtype();
  const Tensor grad_o = randn64(expected.o.shape(), seed, 1.0, false).to(dtype).to(Device::cuda());
  const Tensor grad_h_final =
      randn64(expected.h_final.shape(), seed + 1, 1.0, false).to(dtype).to(Device::cuda());
  GatedDeltaRuleGrads grads = poisoned_grads(gpu, {});
  EXPECT_EQ(grads.dg.dtype(), gpu.g.dtype());
  gated_delta_rule_backward_kernels()(Device::cuda(), gpu, grad_o, grad_h_final, nullptr, grads);
  const GatedDeltaRuleGrads want = ops::gated_delta_rule_backward(
      ref, reference_copy(grad_o), reference_copy(grad_h_final));
  expect_within(grads.dq, want.dq, bound.grad, "dq");
  expect_within(grads.dk, want.dk, bound.grad, "dk");
  expect_within(grads.dv, want.dv, bound.grad, "dv");
  if (gpu.h0.defined()) expect_within(grads.dh0, want.dh0, bound.grad, "dh0");
  expect_within(grads.dg, want.dg, bound.gate_grad, "dg");
  expect_within(grads.dbeta, want.dbeta, bound.gate_grad, "dbeta");
}

TEST_P(GatedDeltaRuleGpu, GpuMatchesCpuForwardAndBackward) {
  HAM_SKIP_UNLESS_CUDA();
  const GpuCase& c = GetParam();
  HAM_SKIP_LONG_SEQUENCE_ON_SIMT_EMULATOR(c.seq_len);
  const GdnInputs in = gpu_case_inputs(c, 1000 + uint64_t(c.seq_len * 7 + c.key_dim));
  for (DType dtype : testing::kGpuDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    expect_gpu_matches_reference(on_gpu(in, dtype), gpu_bounds(dtype), 77);
  }
}

// Slow decays, g = -0.02 softplus(x) (a chunk keeps about 40% of its start state), so
// that the terms carried by S0 and dS_end weigh as much as the in-chunk ones. (With the
// shared gates, a scale of 10 on a quarter of the tokens, e^G falls to ~0 within a few
// rows of a chunk's start: dropping dA's whole dW Kbg^T term left every bf16 output of
// GpuMatchesCpuForwardAndBackward unchanged, to the bit.)
TEST(GatedDeltaRule, GpuMatchesCpuWithSlowDecays) {
  HAM_SKIP_UNLESS_CUDA();
  const GpuCase cases[] = {{1, 200, 2, 64, 48, true, 0}, {1, 150, 2, 128, 40, true, 2}};
  for (const GpuCase& c : cases) {
    SCOPED_TRACE(c.key_dim);
    GdnInputs in = gpu_case_inputs(c, 4100 + uint64_t(c.key_dim));
    const Tensor x = randn64({c.batch, c.seq_len, c.heads}, 4200, 1.0, false);
    std::vector<double> g = x.to_vector<double>();
    for (double& v : g) v = -0.02 * std::log1p(std::exp(v));
    in.g = Tensor::from_vector(g, x.shape());
    for (DType dtype : testing::kGpuDtypes) {
      SCOPED_TRACE(dtype_name(dtype));
      expect_gpu_matches_reference(on_gpu(in, dtype), gpu_bounds(dtype), 85);
    }
  }
}

#ifdef HAM_WITH_CUDA
// The chunk table of one row as the CPU chunks it: a document begins at token 0 and
// wherever the id changes, a chunk at each document's first token and every 64 after.
cuda::GatedDeltaRuleChunkTableRow chunk_table_of(const std::vector<int64_t>& ids,
                                                 int64_t seq_len) {
  cuda::GatedDeltaRuleChunkTableRow row;
  int64_t doc_first = 0;
  for (int64_t t = 0; t < seq_len; ++t) {
    const bool starts_doc = t == 0 || ids[size_t(t)] != ids[size_t(t - 1)];
    if (starts_doc) {
      doc_first = t;
      row.doc_chunk.push_back(int32_t(row.chunk_begin.size()));
    }
    if ((t - doc_first) % 64 == 0) {
      row.chunk_begin.push_back(int32_t(t));
      row.chunk_doc_start.push_back(starts_doc ? 1 : 0);
    }
  }
  row.doc_chunk.push_back(int32_t(row.chunk_begin.size()));
  row.chunk_begin.push_back(int32_t(seq_len));
  return row;
}
#endif

// The chunk table on the GPU, each thread on 16 tokens and the block on 8,192 a tile, with
// the carries across tiles: lengths about the tile's, documents that end, begin or run
// across a tile's edge and a thread's 8 tokens, documents of one token, ids that come back
// (a document is a run of equal ids), i32 and i64 ids. Without ids there is no table.
TEST(GatedDeltaRule, GpuChunkTableMatchesTheDocumentsAcrossTiles) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  std::mt19937_64 rng(515);
  for (const int64_t seq_len : {1, 7, 8, 9, 63, 64, 65, 1000, 8191, 8192, 8193, 20000}) {
    SCOPED_TRACE("T = " + std::to_string(seq_len));
    // Row 0: documents of 1 to 300 tokens. Row 1: edges at threads' edges, documents that
    // begin in the last thread of a tile and run past it (8190, 16383), or begin with a
    // tile (16384). Row 2: 40 one-token documents of ids 3, 4, 3, 4, ..., then one
    // document across the tiles.
    std::vector<std::vector<int64_t>> rows(3);
    int64_t id = 0, left = 0;
    for (int64_t t = 0; t < seq_len; ++t) {
      if (left-- == 0) {
        ++id;
        left = int64_t(rng() % 300);
      }
      rows[0].push_back(id);
    }
    for (int64_t t = 0; t < seq_len; ++t) {
      const int64_t edges[] = {9, 16, 17, 8190, 8300, 16383, 16384, 16385, 19999};
      rows[1].push_back(int64_t(std::upper_bound(std::begin(edges), std::end(edges), t) -
                                std::begin(edges)));
      rows[2].push_back(t < 40 ? 3 + t % 2 : 7);
    }
    const auto expect_table = [&](const Tensor& doc_ids) {
      const std::vector<cuda::GatedDeltaRuleChunkTableRow> table =
          cuda::gated_delta_rule_chunk_table(doc_ids, 3, seq_len);
      ASSERT_EQ(table.size(), 3u);
      for (size_t b = 0; b < 3; ++b) {
        SCOPED_TRACE("row " + std::to_string(b));
        const cuda::GatedDeltaRuleChunkTableRow want = chunk_table_of(rows[b], seq_len);
        EXPECT_EQ(table[b].chunk_begin, want.chunk_begin);
        EXPECT_EQ(table[b].chunk_doc_start, want.chunk_doc_start);
        EXPECT_EQ(table[b].doc_chunk, want.doc_chunk);
      }
    };
    std::vector<int64_t> ids;
    for (const auto& row : rows) ids.insert(ids.end(), row.begin(), row.end());
    const Tensor ids64 = Tensor::from_vector(ids, {3, seq_len}).to(Device::cuda());
    expect_table(ids64);
    expect_table(ids64.to(DType::I32));
  }
  expect_error([] { cuda::gated_delta_rule_chunk_table(Tensor(), 3, 100); },
               {"gated_delta_rule_chunk_table", "no doc_ids"});
#endif
}

// Mixed precision: bf16 q, k, v, beta with f32 gates (dg comes back f32), within the bf16
// bounds of the f64 reference on the same values.
TEST_P(GatedDeltaRuleGpu, GpuF32GatesWithBf16Inputs) {
  HAM_SKIP_UNLESS_CUDA();
  const GpuCase& c = GetParam();
  HAM_SKIP_LONG_SEQUENCE_ON_SIMT_EMULATOR(c.seq_len);
  const GdnInputs in = gpu_case_inputs(c, 3000 + uint64_t(c.seq_len * 7 + c.key_dim));
  GatedDeltaRuleArgs gpu = on_gpu(in, DType::BF16);
  gpu.g = in.g.to(DType::F32).to(Device::cuda());
  expect_gpu_matches_reference(gpu, gpu_bounds(DType::BF16), 79);
}

// The decoding kernel (the _naive table on CUDA) against the CPU recurrence; its result.
GatedDeltaRuleResult expect_recurrent_matches_cpu(const GatedDeltaRuleArgs& gpu,
                                                  const GpuBounds& bound) {
  GatedDeltaRuleResult recurrent = poisoned_result(gpu);
  gated_delta_rule_naive_kernels()(Device::cuda(), gpu, recurrent);
  const GatedDeltaRuleResult expected = ops::gated_delta_rule_naive(reference_args(gpu));
  expect_within(recurrent.o, expected.o, bound.forward, "o");
  expect_within(recurrent.h_final, expected.h_final, bound.forward, "h_final");
  expect_within(recurrent.fit_error, expected.fit_error, bound.fit, "fit_error");
  return recurrent;
}

// The decoding kernel against the CPU recurrence and against the GPU chunked kernel.
TEST_P(GatedDeltaRuleGpu, GpuRecurrentMatchesCpuAndChunked) {
  HAM_SKIP_UNLESS_CUDA();
  const GpuCase& c = GetParam();
  HAM_SKIP_LONG_SEQUENCE_ON_SIMT_EMULATOR(c.seq_len);
  const GdnInputs in = gpu_case_inputs(c, 2000 + uint64_t(c.seq_len * 7 + c.key_dim));
  for (DType dtype : testing::kGpuDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const GpuBounds bound = gpu_bounds(dtype);
    const GatedDeltaRuleArgs gpu = on_gpu(in, dtype);
    const GatedDeltaRuleResult recurrent = expect_recurrent_matches_cpu(gpu, bound);
    GatedDeltaRuleResult chunked = poisoned_result(gpu);
    gated_delta_rule_chunked_kernels()(Device::cuda(), gpu, chunked);
    EXPECT_LE(relative_rms_error(recurrent.o, chunked.o), bound.forward);
    EXPECT_LE(relative_rms_error(recurrent.h_final, chunked.h_final), bound.forward);
    EXPECT_LE(relative_rms_error(recurrent.fit_error, chunked.fit_error), bound.fit);
  }
}

// f64, which only the generic kernels take (the tensor-core ones take bf16 and f32): the
// chunked forward and backward, and the recurrent kernel, against the CPU in f64. Short
// rows: with and without documents and h0, and a key dim of no power of two.
TEST(GatedDeltaRule, GpuF64MatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  for (const GpuCase& c : {GpuCase{2, 63, 3, 32, 48, false, 3}, GpuCase{2, 65, 2, 64, 40, true, 4},
                           GpuCase{1, 70, 2, 48, 40, true, 0}}) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const GdnInputs in = gpu_case_inputs(c, 6000 + uint64_t(c.key_dim));
    const GatedDeltaRuleArgs gpu = on_gpu(in, DType::F64);
    const GpuBounds bound = gpu_bounds(DType::F64);
    expect_gpu_matches_reference(gpu, bound, 87);
    expect_recurrent_matches_cpu(gpu, bound);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GatedDeltaRuleGpu,
    ::testing::Values(GpuCase{1, 1, 2, 16, 16, true, 0}, GpuCase{2, 1, 3, 32, 24, false, 0},
                      GpuCase{2, 63, 3, 32, 48, false, 3}, GpuCase{2, 64, 2, 64, 64, true, 0},
                      GpuCase{2, 65, 5, 64, 128, true, 4}, GpuCase{1, 300, 5, 128, 128, true, 20},
                      GpuCase{2, 300, 2, 16, 12, false, 7}, GpuCase{1, 300, 2, 64, 96, true, 0},
                      GpuCase{1, 130, 5, 256, 384, true, 3}, GpuCase{1, 70, 2, 256, 256, false, 0},
                      GpuCase{1, 65, 1, 128, 512, true, 2},
                      // a key dim the tensor-core kernels do not take (they take powers of
                      // 2 from 16 to 256): bf16 runs the generic kernels too
                      GpuCase{2, 130, 2, 48, 40, true, 3},
                      // the paper's heads at the lengths it trains on (GPU only)
                      GpuCase{1, 4096, 5, 256, 384, true, 0},
                      GpuCase{1, 16384, 5, 256, 384, false, 20}));

// Rows with different document counts (1, 6 and 3; one-token documents, a document
// ending on a chunk edge): the state passes give each document its own blocks, and the
// rows with fewer documents leave some idle. With h0, so only each row's first document
// starts from it, and grad_h_final reaches only its last.
TEST(GatedDeltaRule, GpuRowsWithDifferentDocumentCounts) {
  HAM_SKIP_UNLESS_CUDA();
  const GpuCase c{3, 200, 2, 64, 96, true, 0};
  GdnInputs in = gpu_case_inputs(c, 5100);
  in.doc_ids = doc_ids_from_starts<int64_t>(c.batch, c.seq_len,
                                            {{}, {5, 6, 64, 128, 190}, {1, 100}});
  for (DType dtype : testing::kGpuDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    expect_gpu_matches_reference(on_gpu(in, dtype), gpu_bounds(dtype), 83);
  }
}

TEST(GatedDeltaRule, GpuBackwardSomeGradientsOnlyAndDeterministic) {
  HAM_SKIP_UNLESS_CUDA();
  const GpuCase c{2, 150, 3, 64, 80, true, 5};
  const GdnInputs in = gpu_case_inputs(c, 31);
  for (DType dtype : testing::kGpuDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const GpuBounds bound = gpu_bounds(dtype);
    const GatedDeltaRuleArgs gpu = on_gpu(in, dtype);
    const GatedDeltaRuleArgs ref = reference_args(gpu);
    const Shape o_shape{c.batch, c.seq_len, c.heads, c.value_dim};
    const Shape state_shape{c.batch, c.heads, c.key_dim, c.value_dim};
    const Tensor grad_o = randn64(o_shape, 5, 1.0, false).to(dtype).to(Device::cuda());
    const Tensor grad_h_final = randn64(state_shape, 6, 1.0, false).to(dtype).to(Device::cuda());
    const GatedDeltaRuleGrads want = ops::gated_delta_rule_backward(
        ref, reference_copy(grad_o), reference_copy(grad_h_final));

    ops::GatedDeltaRuleWanted some;
    some.q = some.v = some.g = some.h0 = false;  // dk and dbeta only
    GatedDeltaRuleGrads grads = poisoned_grads(gpu, some);
    gated_delta_rule_backward_kernels()(Device::cuda(), gpu, grad_o, grad_h_final, nullptr, grads);
    EXPECT_FALSE(grads.dq.defined());
    expect_within(grads.dk, want.dk, bound.grad, "dk");
    expect_within(grads.dbeta, want.dbeta, bound.gate_grad, "dbeta");

    GatedDeltaRuleGrads first = poisoned_grads(gpu, {}), second = poisoned_grads(gpu, {});
    gated_delta_rule_backward_kernels()(Device::cuda(), gpu, grad_o, grad_h_final, nullptr, first);
    gated_delta_rule_backward_kernels()(Device::cuda(), gpu, grad_o, grad_h_final, nullptr, second);
    EXPECT_EQ(testing::max_abs_diff(first.dq, second.dq), 0.0);
    EXPECT_EQ(testing::max_abs_diff(first.dk, second.dk), 0.0);
    EXPECT_EQ(testing::max_abs_diff(first.dg, second.dg), 0.0);
    EXPECT_EQ(testing::max_abs_diff(first.dbeta, second.dbeta), 0.0);
    EXPECT_EQ(testing::max_abs_diff(first.dh0, second.dh0), 0.0);
  }
}

TEST(GatedDeltaRule, GpuEmptySequenceKeepsInitialState) {
  HAM_SKIP_UNLESS_CUDA();
  const GpuCase c{1, 0, 2, 8, 12, true, 0};
  const GdnInputs in = gpu_case_inputs(c, 41);
  const GatedDeltaRuleArgs gpu = on_gpu(in, DType::F32);
  GatedDeltaRuleResult out = poisoned_result(gpu);
  gated_delta_rule_chunked_kernels()(Device::cuda(), gpu, out);
  EXPECT_EQ(testing::max_abs_diff(out.h_final, gpu.h0), 0.0);
  const Tensor grad_o = Tensor::zeros({1, 0, 2, 12}, DType::F32, Device::cuda());
  const Tensor grad_h_final = randn64({1, 2, 8, 12}, 7, 1.0, false).to(DType::F32).to(Device::cuda());
  GatedDeltaRuleGrads grads = poisoned_grads(gpu, {});
  gated_delta_rule_backward_kernels()(Device::cuda(), gpu, grad_o, grad_h_final, nullptr, grads);
  EXPECT_EQ(testing::max_abs_diff(grads.dh0, grad_h_final), 0.0);
}

// GatedDeltaRuleKeep on the bf16 tensor-core path: the forward's outputs are unchanged, and
// the backward that reads what the forward kept (every chunk state; or each chunk's A and,
// with documents, the chunk table, from which it forms the rest) equals, to the bit, the
// one that recomputes everything (the same kernels make the same terms). Packed documents,
// h0, several value tiles, K = 256 beside V = 384. Kept A takes 64 bf16 a token and head,
// beside any table.
void expect_kept_backward_equals_recomputing_one(const std::vector<GpuCase>& cases) {
  for (const GpuCase& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    GatedDeltaRuleArgs gpu = on_gpu(gpu_case_inputs(c, 4400 + uint64_t(c.key_dim)), DType::BF16);
    GatedDeltaRuleResult plain = poisoned_result(gpu);
    gated_delta_rule_chunked_kernels()(Device::cuda(), gpu, plain);
    EXPECT_EQ(plain.saved, nullptr);
    const Tensor grad_o = randn64(plain.o.shape(), 86, 1.0, false).to(DType::BF16).to(Device::cuda());
    const Tensor grad_h = randn64(plain.h_final.shape(), 87, 1.0, false).to(DType::BF16).to(Device::cuda());
    GatedDeltaRuleGrads recomputed = poisoned_grads(gpu, {});
    gated_delta_rule_backward_kernels()(Device::cuda(), gpu, grad_o, grad_h, nullptr, recomputed);

    for (GatedDeltaRuleKeep keep : {GatedDeltaRuleKeep::Inverses, GatedDeltaRuleKeep::ChunkStates}) {
      const bool states = keep == GatedDeltaRuleKeep::ChunkStates;
      SCOPED_TRACE(states ? "every chunk state kept" : "A kept");
      gpu.keep = keep;
      GatedDeltaRuleResult kept = poisoned_result(gpu);
      gated_delta_rule_chunked_kernels()(Device::cuda(), gpu, kept);
      ASSERT_NE(kept.saved, nullptr);
      // A of every chunk slot ([B, H, most chunks of a row, 64, 64] bf16), with documents
      // the table's four i32 arrays ([B, T + 1] three times, [2, B]; without them there is
      // no table); every chunk term besides at least v's size more.
      const int64_t B = c.batch, T = c.seq_len, H = c.heads;
      const int64_t chunks = c.docs > 0 ? -1 : (T + 63) / 64;
      const int64_t table_bytes = c.docs > 0 ? 4 * (3 * B * (T + 1) + 2 * B) : 0;
      if (states) {
        EXPECT_GT(kept.saved->bytes(), gpu.v.numel() * 2 + table_bytes);
      } else if (chunks > 0) {
        EXPECT_EQ(kept.saved->bytes(), B * H * chunks * 64 * 64 * 2 + table_bytes);
      } else {  // documents add chunks: at least the undivided row's, at most one a document more
        EXPECT_GE(kept.saved->bytes(), B * H * ((T + 63) / 64) * 64 * 64 * 2 + table_bytes);
        EXPECT_LE(kept.saved->bytes(), B * H * ((T + 63) / 64 + c.docs) * 64 * 64 * 2 + table_bytes);
      }
      EXPECT_EQ(testing::max_abs_diff(kept.o, plain.o), 0.0);
      EXPECT_EQ(testing::max_abs_diff(kept.h_final, plain.h_final), 0.0);
      EXPECT_EQ(testing::max_abs_diff(kept.fit_error, plain.fit_error), 0.0);

      GatedDeltaRuleGrads from_kept = poisoned_grads(gpu, {});
#ifdef HAM_WITH_CUDA
      const int64_t reads = cuda::gated_delta_rule_kept_inverse_reads();
#endif
      gated_delta_rule_backward_kernels()(Device::cuda(), gpu, grad_o, grad_h, kept.saved.get(),
                                          from_kept);
#ifdef HAM_WITH_CUDA
      // Kept A is read, not formed again; kept states need neither.
      EXPECT_EQ(cuda::gated_delta_rule_kept_inverse_reads() - reads, states ? 0 : 1);
#endif
      EXPECT_EQ(testing::max_abs_diff(from_kept.dq, recomputed.dq), 0.0);
      EXPECT_EQ(testing::max_abs_diff(from_kept.dk, recomputed.dk), 0.0);
      EXPECT_EQ(testing::max_abs_diff(from_kept.dv, recomputed.dv), 0.0);
      EXPECT_EQ(testing::max_abs_diff(from_kept.dg, recomputed.dg), 0.0);
      EXPECT_EQ(testing::max_abs_diff(from_kept.dbeta, recomputed.dbeta), 0.0);
      if (c.with_h0) {
        EXPECT_EQ(testing::max_abs_diff(from_kept.dh0, recomputed.dh0), 0.0);
      }
      if (states) continue;
      // The kept A is what that backward's prepare kernel uses: with other keys than its
      // forward's (against the contract, which the shape check cannot see) dq, which
      // depends on A only through the W and U that kernel forms (the states and v_new of
      // the recompute), is not that of forming A from those keys.
      GatedDeltaRuleArgs other_keys = gpu;
      other_keys.k = on_gpu(gpu_case_inputs(c, 4490 + uint64_t(c.key_dim)), DType::BF16).k;
      GatedDeltaRuleGrads with_kept = poisoned_grads(gpu, {}), own = poisoned_grads(gpu, {});
      gated_delta_rule_backward_kernels()(Device::cuda(), other_keys, grad_o, grad_h,
                                          kept.saved.get(), with_kept);
      gated_delta_rule_backward_kernels()(Device::cuda(), other_keys, grad_o, grad_h, nullptr,
                                          own);
      EXPECT_GT(testing::max_abs_diff(with_kept.dq, own.dq), 0.0);
    }
  }
}

TEST(GatedDeltaRule, GpuBackwardFromKeptChunkStatesEqualsTheRecomputingOne) {
  HAM_SKIP_UNLESS_CUDA();
  expect_kept_backward_equals_recomputing_one(
      {{2, 150, 2, 64, 48, true, 3}, {1, 200, 2, 128, 160, false, 0},
       {1, 70, 1, 256, 384, true, 2}});
}

// The same at the paper's heads and a training length with 20 packed documents (the chunk
// table and kept A sized by the chunk count read back from the GPU).
TEST(GatedDeltaRule, GpuBackwardFromKeptChunkStatesEqualsTheRecomputingOneAtPaperLength) {
  HAM_SKIP_UNLESS_CUDA();
  HAM_SKIP_LONG_SEQUENCE_ON_SIMT_EMULATOR(4096);
  expect_kept_backward_equals_recomputing_one({{1, 4096, 5, 256, 384, true, 20}});
}

// By default the bf16 backward that recomputes the state pass runs its P^T dO kernel beside
// it, the faster on the H200 (docs/gpu_results.md, thirty-sixth session), with the state
// pass on a stream of the device's greatest priority (the count says so).
TEST(GatedDeltaRule, GpuBackwardRunsBesideTheStatePassByDefault) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const GpuCase c{1, 130, 2, 64, 48, false, 0};
  GatedDeltaRuleArgs gpu = on_gpu(gpu_case_inputs(c, 4700), DType::BF16);
  gpu.keep = GatedDeltaRuleKeep::Nothing;
  GatedDeltaRuleResult out = poisoned_result(gpu);
  const Device device = Device::cuda();
  gated_delta_rule_chunked_kernels()(device, gpu, out);
  const Tensor grad_o = randn64(out.o.shape(), 4701, 1.0, false).to(DType::BF16).to(device);
  const Tensor grad_h = randn64(out.h_final.shape(), 4702, 1.0, false).to(DType::BF16).to(device);
  GatedDeltaRuleGrads grads = poisoned_grads(gpu, {});
  const int64_t overlapped = cuda::gated_delta_rule_overlapped_local_passes();
  gated_delta_rule_backward_kernels()(device, gpu, grad_o, grad_h, out.saved.get(), grads);
  EXPECT_EQ(cuda::gated_delta_rule_overlapped_local_passes() - overlapped, 1);
#endif
}

// set_gated_delta_rule_backward_overlap: the P^T dO kernel beside the recomputed state pass
// (that pass on a high-priority second stream) gives the gradients of the serial order, to
// the bit, whether the forward kept nothing or each chunk's A; where it kept every chunk
// state nothing is recomputed, and the kernel runs in order.
TEST(GatedDeltaRule, GpuBackwardBesideTheStatePassEqualsTheSerialOne) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting overlap_guard(&cuda::set_gated_delta_rule_backward_overlap, false);
  const GpuCase cases[] = {{2, 150, 2, 64, 48, true, 3}, {1, 200, 2, 128, 160, false, 0}};
  for (const GpuCase& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    GatedDeltaRuleArgs gpu = on_gpu(gpu_case_inputs(c, 4600 + uint64_t(c.key_dim)), DType::BF16);
    for (GatedDeltaRuleKeep keep : {GatedDeltaRuleKeep::Nothing, GatedDeltaRuleKeep::Inverses,
                                    GatedDeltaRuleKeep::ChunkStates}) {
      SCOPED_TRACE(int(keep));
      gpu.keep = keep;
      GatedDeltaRuleResult out = poisoned_result(gpu);
      gated_delta_rule_chunked_kernels()(Device::cuda(), gpu, out);
      // Each keep its own dO, and the overlapped call first, so that no earlier call left
      // this call's P^T dO in the scratch the caching allocator hands out again: a pass that
      // writes none of it shows.
      const uint64_t seed = 88 + 2 * uint64_t(keep);
      const Tensor grad_o = randn64(out.o.shape(), seed, 1.0, false).to(DType::BF16).to(Device::cuda());
      const Tensor grad_h = randn64(out.h_final.shape(), seed + 1, 1.0, false).to(DType::BF16).to(Device::cuda());
      GatedDeltaRuleGrads serial = poisoned_grads(gpu, {}), beside = poisoned_grads(gpu, {});
      cuda::set_gated_delta_rule_backward_overlap(true);
      const int64_t overlapped = cuda::gated_delta_rule_overlapped_local_passes();
      gated_delta_rule_backward_kernels()(Device::cuda(), gpu, grad_o, grad_h, out.saved.get(),
                                          beside);
      cuda::set_gated_delta_rule_backward_overlap(false);
      gated_delta_rule_backward_kernels()(Device::cuda(), gpu, grad_o, grad_h, out.saved.get(),
                                          serial);
      EXPECT_EQ(cuda::gated_delta_rule_overlapped_local_passes() - overlapped,
                keep == GatedDeltaRuleKeep::ChunkStates ? 0 : 1);
      for (auto [name, got, want] : {std::tuple{"dq", &beside.dq, &serial.dq},
                                     std::tuple{"dk", &beside.dk, &serial.dk},
                                     std::tuple{"dv", &beside.dv, &serial.dv},
                                     std::tuple{"dg", &beside.dg, &serial.dg},
                                     std::tuple{"dbeta", &beside.dbeta, &serial.dbeta}}) {
        EXPECT_EQ(testing::max_abs_diff(*got, *want), 0.0) << name;
      }
      if (c.with_h0) {
        EXPECT_EQ(testing::max_abs_diff(beside.dh0, serial.dh0), 0.0);
      }
    }
  }
#endif
}

// A kept state meets only the inputs it was made for: other shapes, or the f32 inputs the
// SIMT kernels take (whose forward keeps nothing), are one-line errors naming the shapes.
// Both kinds the tensor-core forward keeps.
TEST(GatedDeltaRule, GpuKeptChunkStatesFitOnlyTheirInputs) {
  HAM_SKIP_UNLESS_CUDA();
  const GdnInputs in = gpu_case_inputs({1, 100, 2, 32, 24, false, 0}, 4500);
  const GatedDeltaRuleArgs other = on_gpu(gpu_case_inputs({1, 90, 2, 32, 24, false, 0}, 4501),
                                          DType::BF16);
  for (GatedDeltaRuleKeep keep : {GatedDeltaRuleKeep::Inverses, GatedDeltaRuleKeep::ChunkStates}) {
    SCOPED_TRACE(keep == GatedDeltaRuleKeep::Inverses ? "A kept" : "every chunk state kept");
    GatedDeltaRuleArgs gpu = on_gpu(in, DType::BF16);
    gpu.keep = keep;
    GatedDeltaRuleResult kept = poisoned_result(gpu);
    gated_delta_rule_chunked_kernels()(Device::cuda(), gpu, kept);
    ASSERT_NE(kept.saved, nullptr);
    auto backward = [&](const GatedDeltaRuleArgs& a) {
      const Tensor grad_o = Tensor::zeros(a.v.shape(), a.q.dtype(), Device::cuda());
      const Tensor grad_h = Tensor::zeros(Shape{a.q.size(0), a.q.size(2), a.q.size(3),
                                                a.v.size(3)}, a.q.dtype(), Device::cuda());
      GatedDeltaRuleGrads grads = poisoned_grads(a, {});
      gated_delta_rule_backward_kernels()(Device::cuda(), a, grad_o, grad_h, kept.saved.get(),
                                          grads);
    };
    testing::expect_error([&] { backward(other); },
                          {"gated_delta_rule_backward (cuda", "[1, 100, 2, 32, 24]",
                           "[1, 90, 2, 32, 24]"});

    GatedDeltaRuleArgs wide = on_gpu(in, DType::F32);
    wide.keep = keep;
    GatedDeltaRuleResult simt = poisoned_result(wide);
    gated_delta_rule_chunked_kernels()(Device::cuda(), wide, simt);
    EXPECT_EQ(simt.saved, nullptr);
    testing::expect_error([&] { backward(wide); },
                          {"gated_delta_rule_backward (cuda)", "saved forward state"});
  }
}

// Decoding: one token per call, the state threaded through h0 -> h_final, equals one
// chunked call over the whole sequence.
TEST(GatedDeltaRule, GpuTokenByTokenDecodingEqualsChunked) {
  HAM_SKIP_UNLESS_CUDA();
  const GpuCase c{2, 9, 3, 32, 40, true, 0};
  const GdnInputs in = gpu_case_inputs(c, 51);
  const DType dtype = DType::F32;
  const GatedDeltaRuleArgs whole = on_gpu(in, dtype);
  GatedDeltaRuleResult chunked = poisoned_result(whole);
  gated_delta_rule_chunked_kernels()(Device::cuda(), whole, chunked);

  // Token t of a [B, T, ...] f64 host tensor as [B, 1, ...].
  auto token = [&](const Tensor& x, int64_t t) {
    Shape shape = x.shape();
    const int64_t T = shape[1], width = shape_numel(shape) / (shape[0] * T);
    std::vector<double> all = x.to_vector<double>(), one;
    for (int64_t b = 0; b < shape[0]; ++b) {
      for (int64_t j = 0; j < width; ++j) one.push_back(all[size_t((b * T + t) * width + j)]);
    }
    shape[1] = 1;
    return Tensor::from_vector(one, shape).to(dtype).to(Device::cuda());
  };
  Tensor state = whole.h0;
  std::vector<double> o_steps(size_t(chunked.o.numel()));
  for (int64_t t = 0; t < c.seq_len; ++t) {
    GatedDeltaRuleArgs step{token(in.q, t), token(in.k, t), token(in.v, t), token(in.g, t),
                            token(in.beta, t), state, Tensor()};
    GatedDeltaRuleResult r = poisoned_result(step);
    gated_delta_rule_naive_kernels()(Device::cuda(), step, r);
    std::vector<double> o = r.o.to_vector<double>();
    const size_t width = size_t(c.heads * c.value_dim);
    for (int64_t b = 0; b < c.batch; ++b) {
      for (size_t j = 0; j < width; ++j) {
        o_steps[size_t(b * c.seq_len + t) * width + j] = o[size_t(b) * width + j];
      }
    }
    state = r.h_final;
  }
  const Tensor o_decoded = Tensor::from_vector(o_steps, chunked.o.shape());
  EXPECT_LE(relative_rms_error(o_decoded, chunked.o.to(Device::cpu()).to(DType::F64)), 5e-5);
  EXPECT_LE(relative_rms_error(state, chunked.h_final), 5e-5);
}

#ifdef HAM_WITH_CUDA
// Runs case c in bf16 once per value of a setting (set(value) before each run, inputs from
// `seed`): each run matches the CPU, forward and backward, and every run's outputs and
// gradients equal the first's bit for bit.
void expect_settings_agree_bitwise(const GpuCase& c, uint64_t seed,
                                   std::initializer_list<int> values,
                                   const std::function<void(int)>& set) {
  const GatedDeltaRuleArgs gpu = on_gpu(gpu_case_inputs(c, seed), DType::BF16);
  const Tensor grad_o = randn64({c.batch, c.seq_len, c.heads, c.value_dim}, seed + 21, 1.0, false)
                            .to(DType::BF16)
                            .to(Device::cuda());
  const Tensor grad_h_final =
      randn64({c.batch, c.heads, c.key_dim, c.value_dim}, seed + 22, 1.0, false)
          .to(DType::BF16)
          .to(Device::cuda());
  std::vector<GatedDeltaRuleResult> results;
  std::vector<GatedDeltaRuleGrads> grads;
  for (int value : values) {
    SCOPED_TRACE(value);
    set(value);
    expect_gpu_matches_reference(gpu, gpu_bounds(DType::BF16), seed + 20);
    results.push_back(poisoned_result(gpu));
    gated_delta_rule_chunked_kernels()(Device::cuda(), gpu, results.back());
    grads.push_back(poisoned_grads(gpu, {}));
    gated_delta_rule_backward_kernels()(Device::cuda(), gpu, grad_o, grad_h_final, nullptr,
                                        grads.back());
  }
  for (size_t run = 1; run < results.size(); ++run) {
    EXPECT_EQ(testing::max_abs_diff(results[0].o, results[run].o), 0.0);
    EXPECT_EQ(testing::max_abs_diff(results[0].h_final, results[run].h_final), 0.0);
    EXPECT_EQ(testing::max_abs_diff(results[0].fit_error, results[run].fit_error), 0.0);
    for (auto field : {&GatedDeltaRuleGrads::dq, &GatedDeltaRuleGrads::dk,
                       &GatedDeltaRuleGrads::dv, &GatedDeltaRuleGrads::dg,
                       &GatedDeltaRuleGrads::dbeta, &GatedDeltaRuleGrads::dh0}) {
      if (field == &GatedDeltaRuleGrads::dh0 && !c.with_h0) continue;  // no h0, no dh0
      EXPECT_EQ(testing::max_abs_diff(grads[0].*field, grads[run].*field), 0.0);
    }
  }
}
#endif

#ifdef HAM_WITH_CUDA
// The launches recorded since `record_block_timelines(true)`, each summarized (which fails
// on a block without its start or end stamp), by kernel name without its arguments: the
// chunks its blocks visited in all, and its launches.
struct RecordedKernels {
  std::vector<std::string> names;               // in launch order
  std::map<std::string, int64_t> tiles, launches;  // by name
};
RecordedKernels take_recorded_kernels() {
  RecordedKernels recorded;
  for (const cuda::KernelTimeline& launch : cuda::take_block_timelines()) {
    const std::string name = launch.kernel.substr(0, launch.kernel.find('<'));
    recorded.names.push_back(name);
    const cuda::TimelineSummary summary = cuda::summarize_block_timeline(launch.blocks);
    EXPECT_EQ(summary.blocks, int64_t(launch.blocks.size())) << launch.kernel;
    recorded.tiles[name] += summary.tiles;
    ++recorded.launches[name];
  }
  return recorded;
}
#endif

// The tensor-core passes' block timelines (cuda/block_timeline.h), forward and backward, in
// one launch and in windows of chunks: recording leaves every output the same to the bit;
// every block of every launch stamps its start and end (whichever return it takes); the
// kernels come in launch order; the per-chunk kernels visit each chunk of each head once,
// and the state passes each chunk once per value tile.
TEST(GatedDeltaRule, GpuBlockTimelinesOfTheTensorCorePasses) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const GpuCase c{2, 300, 2, 64, 96, true, 3};
  const GatedDeltaRuleArgs gpu = on_gpu(gpu_case_inputs(c, 173), DType::BF16);
  const Tensor grad_o = randn64({c.batch, c.seq_len, c.heads, c.value_dim}, 174, 1.0, false)
                            .to(DType::BF16)
                            .to(Device::cuda());
  const Tensor grad_h = randn64({c.batch, c.heads, c.key_dim, c.value_dim}, 175, 1.0, false)
                            .to(DType::BF16)
                            .to(Device::cuda());
  int64_t chunks = 0;  // over the rows
  for (const auto& row : cuda::gated_delta_rule_chunk_table(gpu.doc_ids, c.batch, c.seq_len)) {
    chunks += int64_t(row.chunk_doc_start.size());
  }
  const int64_t head_chunks = chunks * c.heads;
  struct Pass {
    GatedDeltaRuleResult out;
    GatedDeltaRuleGrads grads;
  };
  auto run = [&] {
    Pass pass{poisoned_result(gpu), poisoned_grads(gpu, {})};
    gated_delta_rule_chunked_kernels()(Device::cuda(), gpu, pass.out);
    gated_delta_rule_backward_kernels()(Device::cuda(), gpu, grad_o, grad_h, nullptr,
                                        pass.grads);
    return pass;
  };
  const Pass unrecorded = run();
  for (const int windows : {1, 3}) {
    SCOPED_TRACE(std::to_string(windows) + " windows");
    const testing::ScopedSetting forward_windows(&cuda::set_gated_delta_rule_forward_windows,
                                                 windows);
    const testing::ScopedSetting backward_windows(&cuda::set_gated_delta_rule_backward_windows,
                                                  windows);
    cuda::record_block_timelines(true);
    const Pass recorded = run();
    cuda::record_block_timelines(false);
    EXPECT_EQ(testing::max_abs_diff(recorded.out.o, unrecorded.out.o), 0.0);
    EXPECT_EQ(testing::max_abs_diff(recorded.out.fit_error, unrecorded.out.fit_error), 0.0);
    EXPECT_EQ(testing::max_abs_diff(recorded.grads.dq, unrecorded.grads.dq), 0.0);
    EXPECT_EQ(testing::max_abs_diff(recorded.grads.dg, unrecorded.grads.dg), 0.0);
    const RecordedKernels k = take_recorded_kernels();
    ASSERT_GE(k.names.size(), 4u);
    // The forward: its chunk table first (the backward, with nothing kept, builds its own).
    EXPECT_EQ(std::vector<std::string>(k.names.begin(), k.names.begin() + 2),
              (std::vector<std::string>{"chunk_table_kernel", "gdr_prepare_mma"}));
    EXPECT_EQ(k.launches.at("chunk_table_kernel"), 2);
    EXPECT_EQ(k.tiles.at("chunk_table_kernel"), 2 * c.batch);  // one tile of a row a launch
    // Forward and the backward's recompute: prepare by windows (the default) and the state
    // pass by windows where asked, the output kernel a window.
    EXPECT_EQ(k.launches.at("gdr_prepare_mma"), windows + 1);
    EXPECT_EQ(k.launches.at("gdr_output_mma"), windows);
    for (const char* per_chunk : {"gdr_output_mma", "gdr_bwd_local_mma", "gdr_bwd_values_mma",
                                  "gdr_bwd_keys_mma", "gdr_bwd_wy_mma"}) {
      EXPECT_EQ(k.tiles.at(per_chunk), head_chunks) << per_chunk;
    }
    EXPECT_EQ(k.tiles.at("gdr_prepare_mma"), 2 * head_chunks);
    // The state passes: each chunk once per value tile (96 columns: 2 of 64 or 3 of 32), the
    // forward's twice (the backward recomputes it).
    for (const int64_t visited :
         {k.tiles.at("gdr_state_mma") / 2, k.tiles.at("gdr_bwd_state_mma")}) {
      EXPECT_TRUE(visited == 2 * head_chunks || visited == 3 * head_chunks)
          << visited << " chunks for " << head_chunks;
    }
    EXPECT_EQ(k.tiles.at("gdr_state_mma") % 2, 0);
    EXPECT_EQ(k.launches.at("gdr_bwd_state_mma"), windows);
  }
  run();  // not recording: nothing more to take
  EXPECT_TRUE(cuda::take_block_timelines().empty());

  // Without doc_ids no chunk table is built: the forward starts with its prepare kernel,
  // and each state pass block takes one row's chunks (the state pass visits every chunk of
  // every head once per value tile).
  const GpuCase one_document{2, 300, 2, 64, 96, true, 0};
  const GatedDeltaRuleArgs plain = on_gpu(gpu_case_inputs(one_document, 176), DType::BF16);
  GatedDeltaRuleResult out = poisoned_result(plain);
  cuda::record_block_timelines(true);
  gated_delta_rule_chunked_kernels()(Device::cuda(), plain, out);
  cuda::record_block_timelines(false);
  const RecordedKernels k = take_recorded_kernels();
  ASSERT_FALSE(k.names.empty());
  EXPECT_EQ(k.names.front(), "gdr_prepare_mma");
  EXPECT_EQ(k.launches.count("chunk_table_kernel"), 0u);
  const int64_t plain_head_chunks = 2 * 5 * 2;  // 2 rows of 5 chunks, 2 heads
  EXPECT_EQ(k.tiles.at("gdr_output_mma"), plain_head_chunks);
  const int64_t visited = k.tiles.at("gdr_state_mma");
  EXPECT_TRUE(visited == 2 * plain_head_chunks || visited == 3 * plain_head_chunks) << visited;
#endif
}

// The bf16 state passes, forward and backward, forced to 32- and to 64-column tiles (the
// default picks one per call): each matches the CPU, forward and backward, and their
// outputs and gradients agree bit for bit (a column's sums do not depend on the tile
// holding it).
TEST(GatedDeltaRule, GpuStatePassTileWidthsAgree) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting columns_guard(&cuda::set_gated_delta_rule_state_columns, 0);
  // K = 16 and 32 (narrow keys), 64 (4-warp state passes), 128 (8-warp state passes) and
  // the paper's 256, where the forward's 64-column pass is the default at B = 4 (5 heads of
  // 384 values: 240 blocks of 32 columns, past the H200's 132 SMs) and the backward's tiles
  // are 32 columns either way.
  for (const GpuCase& c :
       {GpuCase{1, 90, 3, 16, 40, true, 2}, GpuCase{2, 100, 2, 32, 72, true, 0},
        GpuCase{2, 150, 3, 64, 80, true, 5}, GpuCase{1, 140, 2, 128, 72, true, 3},
        GpuCase{1, 130, 1, 256, 96, true, 2}}) {
    SCOPED_TRACE(c.key_dim);
    expect_settings_agree_bitwise(c, 61, {32, 64}, [](int columns) {
      cuda::set_gated_delta_rule_state_columns(columns);
    });
  }
  testing::expect_error([] { cuda::set_gated_delta_rule_state_columns(48); },
                        {"set_gated_delta_rule_state_columns", "48", "32 or 64"});
#endif
}

// The bf16 backward's sequential pass at K = 256, where two slots of chunk tiles do not fit:
// with K and dvl copied a chunk ahead (set_gated_delta_rule_backward_keys_ahead) and with
// one slot, each matches the CPU and the two agree bit for bit. Whole value tiles (96, the
// streamed copies) and part ones (72, issue_tile), packed documents, a last chunk cut short.
TEST(GatedDeltaRule, GpuBackwardWithTheKeysAheadAgrees) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting ahead_guard(&cuda::set_gated_delta_rule_backward_keys_ahead,
                                           false);
  for (const GpuCase& c : {GpuCase{1, 200, 2, 256, 96, true, 2},
                           GpuCase{2, 150, 1, 256, 72, true, 0}}) {
    SCOPED_TRACE(c.value_dim);
    const int64_t before = cuda::gated_delta_rule_keys_ahead_passes();
    expect_settings_agree_bitwise(c, 73, {0, 1}, [](int ahead) {
      cuda::set_gated_delta_rule_backward_keys_ahead(ahead != 0);
    });
    // the keys ahead in both backwards of the second setting (the CPU check's, the
    // comparison's), none in the first
    EXPECT_EQ(cuda::gated_delta_rule_keys_ahead_passes() - before, 2);
  }
#endif
}

// The bf16 forward and backward with the autotuner on (cuda/autotune.h): the first call of
// the shape times each combination of the tuned settings and keeps the fastest. Both passes
// match the CPU and equal the untuned ones bit for bit. Each tunes once, the forward over 16
// combinations and the backward over 8 (each called once untimed, once timed, then once
// more under the choice), and later calls of the shape run under the choice untimed.
TEST(GatedDeltaRule, GpuAutotunedEqualsDefaults) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const cuda::AutotunePlan plan = cuda::exchange_autotune_plan({1, 1, 0.02});
  cuda::forget_autotune_choices();
  const int64_t trials = cuda::autotune_trial_calls();
  const GpuCase c{1, 130, 2, 64, 72, true, 2};
  expect_settings_agree_bitwise(c, 83, {0, 1}, [](int on) { cuda::set_autotune(on != 0); });
  EXPECT_TRUE(cuda::set_autotune(false));
  const std::vector<cuda::AutotuneChoice> choices = cuda::autotune_choices();
  cuda::forget_autotune_choices();
  cuda::exchange_autotune_plan(plan);
  EXPECT_EQ(cuda::autotune_trial_calls() - trials, (16 * 2 + 1) + (8 * 2 + 1));
  ASSERT_EQ(choices.size(), 2u);
  EXPECT_EQ(choices[0].op, "gated_delta_rule forward");
  EXPECT_EQ(choices[0].shape, "bf16 B1 T130 H2 K64 V72, documents, h0, fit error");
  EXPECT_EQ(choices[0].variants.size(), 16u);
  EXPECT_EQ(choices[0].variants[0].label,
            "gated_delta_rule_prepare_warps=4 gated_delta_rule_forward_windows=1 "
            "gated_delta_rule_output_prefetch=0");
  EXPECT_EQ(choices[1].op, "gated_delta_rule backward");
  EXPECT_EQ(choices[1].shape, "bf16 B1 T130 H2 K64 V72, documents, h0");
  ASSERT_EQ(choices[1].variants.size(), 8u);
  EXPECT_EQ(choices[1].variants[7].label,
            "gated_delta_rule_prepare_warps=8 gated_delta_rule_recompute_windows=4 "
            "gated_delta_rule_backward_windows=4");
  EXPECT_EQ(cuda::set_gated_delta_rule_prepare_warps(4), 4) << "restored after each call";
  EXPECT_EQ(cuda::set_gated_delta_rule_forward_windows(1), 1);
  EXPECT_EQ(cuda::set_gated_delta_rule_output_prefetch(0), 0);
#endif
}

// The bf16 state passes' first product (v_new forward, du backward) in two partial sums
// over K (set_gated_delta_rule_state_partial_sums), where they apply (8 warps on 32
// columns: K of 128 and 256): the forward and the backward match the CPU with one partial
// sum and with two, on whole and part value tiles (64, 72), packed documents and h0, the
// backward at K = 256 with one slot of chunk tiles and with the keys ahead; the count of
// passes that took two grows by the forward's, the recomputed forward's and the
// backward's pass of each call. At K = 64 (4 warps) the setting takes no effect.
TEST(GatedDeltaRule, GpuStatePassesInPartialSumsMatchCpu) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting sums_guard(&cuda::set_gated_delta_rule_state_partial_sums, 1);
  const testing::ScopedSetting columns_guard(&cuda::set_gated_delta_rule_state_columns, 32);
  const testing::ScopedSetting ahead_guard(&cuda::set_gated_delta_rule_backward_keys_ahead,
                                           false);
  struct Case {
    GpuCase shape;
    bool keys_ahead;
    int64_t passes;  // state passes in two partial sums per forward and backward pair
  };
  for (const Case& c : {Case{{1, 200, 2, 128, 72, true, 2}, false, 3},
                        Case{{2, 130, 1, 256, 64, true, 0}, false, 3},
                        Case{{1, 150, 1, 256, 72, true, 3}, true, 3},
                        Case{{1, 100, 2, 64, 64, true, 0}, false, 0}}) {
    SCOPED_TRACE(::testing::PrintToString(c.shape));
    cuda::set_gated_delta_rule_backward_keys_ahead(c.keys_ahead);
    const GatedDeltaRuleArgs gpu = on_gpu(gpu_case_inputs(c.shape, 101), DType::BF16);
    for (int sums : {1, 2}) {
      SCOPED_TRACE(sums);
      cuda::set_gated_delta_rule_state_partial_sums(sums);
      const int64_t before = cuda::gated_delta_rule_partial_sum_passes();
      expect_gpu_matches_reference(gpu, gpu_bounds(DType::BF16), 103);
      EXPECT_EQ(cuda::gated_delta_rule_partial_sum_passes() - before, sums == 2 ? c.passes : 0);
    }
  }
  testing::expect_error([] { cuda::set_gated_delta_rule_state_partial_sums(4); },
                        {"set_gated_delta_rule_state_partial_sums", "4 partial sums", "1 or 2"});
#endif
}

// The bf16 prepare kernel in 4 and in 8 warps (set_gated_delta_rule_prepare_warps; with 8,
// warps w and w + 4 split each product's columns): each matches the CPU, forward and
// backward, and the two agree bit for bit. K from 16 (4 of W's 8 columns a warp) to 256;
// value widths of a part tile (40: the right half 8 columns), a whole and a part tile
// (72: the part tile has no right half; its warps form no U), 36 (U's rows off 16-byte
// boundaries: the direct stores) and 96; packed documents and h0. With 8 warps the backward
// that reads the A a forward kept (the 8-warp kernel's loads of it) equals the recomputing
// one, and a forward and a backward launch one 8-warp prepare kernel each.
TEST(GatedDeltaRule, GpuPrepareInEightWarpsAgrees) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting warps_guard(&cuda::set_gated_delta_rule_prepare_warps, 4);
  for (const GpuCase& c :
       {GpuCase{1, 90, 3, 16, 40, true, 2}, GpuCase{2, 100, 2, 32, 72, true, 0},
        GpuCase{1, 150, 2, 64, 36, false, 3}, GpuCase{1, 140, 2, 128, 72, true, 3},
        GpuCase{1, 130, 1, 256, 96, true, 2}}) {
    SCOPED_TRACE(::testing::PrintToString(c));
    expect_settings_agree_bitwise(c, 131, {4, 8}, [](int warps) {
      cuda::set_gated_delta_rule_prepare_warps(warps);
    });
  }
  cuda::set_gated_delta_rule_prepare_warps(8);
  expect_kept_backward_equals_recomputing_one({{2, 150, 2, 64, 48, true, 3}});

  const GpuCase c{1, 100, 2, 128, 64, false, 0};
  const GatedDeltaRuleArgs gpu = on_gpu(gpu_case_inputs(c, 137), DType::BF16);
  GatedDeltaRuleResult forward = poisoned_result(gpu);
  for (int warps : {4, 8}) {
    SCOPED_TRACE(warps);
    cuda::set_gated_delta_rule_prepare_warps(warps);
    const int64_t before = cuda::gated_delta_rule_eight_warp_prepares();
    gated_delta_rule_chunked_kernels()(Device::cuda(), gpu, forward);
    EXPECT_EQ(cuda::gated_delta_rule_eight_warp_prepares() - before, warps == 8 ? 1 : 0);
    GatedDeltaRuleGrads grads = poisoned_grads(gpu, {});
    gated_delta_rule_backward_kernels()(Device::cuda(), gpu, forward.o, forward.h_final, nullptr,
                                        grads);
    EXPECT_EQ(cuda::gated_delta_rule_eight_warp_prepares() - before, warps == 8 ? 2 : 0);
  }
  testing::expect_error([] { cuda::set_gated_delta_rule_prepare_warps(16); },
                        {"set_gated_delta_rule_prepare_warps", "16 warps", "4 or 8"});
#endif
}

// The bf16 output kernel with its blocks taking every gridDim.x-th chunk of their row and
// copying the next chunk's first two value tiles ahead (set_gated_delta_rule_output_prefetch:
// 1 and 2 blocks a row here, so that each block takes many chunks; -1, about one wave, takes
// one chunk a block at these lengths). V of 64 (one tile: no copies ahead), 128 (two), 150
// (three, the last part: the copies through issue_tile) and the paper's 384 (six), packed
// documents, h0: each matches the CPU, with the fit error, and equals a block a chunk bit
// for bit (expect_settings_agree_bitwise; two forwards a setting counted). The forward
// without the fit error and in 3 windows of chunks equals it too.
TEST(GatedDeltaRule, GpuOutputWithNextChunksAheadAgrees) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting prefetch_guard(&cuda::set_gated_delta_rule_output_prefetch, 0);
  for (const GpuCase& c :
       {GpuCase{1, 300, 2, 64, 64, false, 0}, GpuCase{2, 200, 2, 128, 128, true, 3},
        GpuCase{1, 260, 1, 64, 150, false, 2}, GpuCase{1, 150, 1, 256, 384, true, 0},
        GpuCase{1, 130, 2, 16, 24, true, 2}, GpuCase{1, 130, 2, 32, 40, false, 0}}) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const int64_t before = cuda::gated_delta_rule_prefetching_output_passes();
    expect_settings_agree_bitwise(c, 151, {0, 1, 2}, [](int blocks) {
      cuda::set_gated_delta_rule_output_prefetch(blocks);
    });
    EXPECT_EQ(cuda::gated_delta_rule_prefetching_output_passes() - before, 4);
  }
  // Without the fit error (every warp on O, its rows staged in K's), alone and in windows,
  // at every key dim of the tensor-core kernels.
  for (const GpuCase& c :
       {GpuCase{2, 300, 2, 128, 128, true, 3}, GpuCase{1, 130, 2, 16, 24, true, 2},
        GpuCase{1, 130, 2, 32, 40, false, 0}, GpuCase{1, 130, 2, 64, 48, true, 0},
        GpuCase{1, 70, 1, 256, 96, false, 0}}) {
    SCOPED_TRACE(::testing::PrintToString(c) + " without the fit error");
    GatedDeltaRuleArgs gpu = on_gpu(gpu_case_inputs(c, 157), DType::BF16);
    gpu.want_fit_error = false;
    auto forward_o = [&](int blocks, int windows) {
      const testing::ScopedSetting prefetch(&cuda::set_gated_delta_rule_output_prefetch,
                                            blocks);
      const testing::ScopedSetting in_windows(&cuda::set_gated_delta_rule_forward_windows,
                                              windows);
      GatedDeltaRuleResult out = poisoned_result(gpu);
      out.fit_error = Tensor();
      gated_delta_rule_chunked_kernels()(Device::cuda(), gpu, out);
      return out;
    };
    const GatedDeltaRuleResult one = forward_o(0, 1);
    for (const auto& [blocks, windows] : {std::pair{1, 1}, std::pair{2, 3}, std::pair{-1, 3}}) {
      SCOPED_TRACE(std::to_string(blocks) + " blocks a row, " + std::to_string(windows) +
                   " windows");
      const GatedDeltaRuleResult ahead = forward_o(blocks, windows);
      EXPECT_EQ(testing::max_abs_diff(ahead.o, one.o), 0.0);
      EXPECT_EQ(testing::max_abs_diff(ahead.h_final, one.h_final), 0.0);
    }
  }
  testing::expect_error([] { cuda::set_gated_delta_rule_output_prefetch(-2); },
                        {"set_gated_delta_rule_output_prefetch: -2", "takes 0 (off), -1"});
#endif
}

// At K = 256 the forward's state pass, its output kernel and the backward's state pass in
// one slot of chunk tiles (set_gated_delta_rule_one_slot), as they run on a GPU with less
// shared memory a block than Hopper's 227 KiB: each matches the CPU, and equals two slots
// to the bit. The cases take the state pass's 32-column tiles (whole: TileStreams) with
// documents and h0, its 64-column ones on part tiles, and its partial sums; two value tiles
// of the output kernel, with the fit error and without. Each run of one slot launches 4
// such kernels twice (the CPU check's call and the comparison's): forward state and output,
// and the backward's recompute and reverse pass. Below 227 KiB (an A100's 163, which
// EmulatedGpu.gated_delta_rule_one_slot_on_an_a100s_shared_memory emulates) the defaults
// take one slot too.
TEST(GatedDeltaRule, GpuOneSlotAtKeyDim256Agrees) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting one_slot_guard(&cuda::set_gated_delta_rule_one_slot, false);
  const testing::ScopedSetting columns_guard(&cuda::set_gated_delta_rule_state_columns, 0);
  const testing::ScopedSetting sums_guard(&cuda::set_gated_delta_rule_state_partial_sums, 1);
  const int64_t by_default = cuda::max_shared_per_block() >= 227 * 1024 ? 0 : 8;
  struct OneSlotCase {
    GpuCase c;
    int state_columns, partial_sums;
  };
  for (const OneSlotCase& one : {OneSlotCase{GpuCase{1, 200, 1, 256, 96, true, 3}, 32, 1},
                                 OneSlotCase{GpuCase{1, 130, 1, 256, 80, false, 0}, 64, 1},
                                 OneSlotCase{GpuCase{1, 130, 1, 256, 96, false, 2}, 32, 2}}) {
    SCOPED_TRACE(::testing::PrintToString(one.c) + " on " + std::to_string(one.state_columns) +
                 " columns, " + std::to_string(one.partial_sums) + " partial sums");
    cuda::set_gated_delta_rule_state_columns(one.state_columns);
    cuda::set_gated_delta_rule_state_partial_sums(one.partial_sums);
    const int64_t before = cuda::gated_delta_rule_one_slot_launches();
    expect_settings_agree_bitwise(one.c, 163, {0, 1}, [](int on) {
      cuda::set_gated_delta_rule_one_slot(on != 0);
    });
    EXPECT_EQ(cuda::gated_delta_rule_one_slot_launches() - before, by_default + 8);
  }
  // Without the fit error (every warp on O, two value tiles), which fits two slots in
  // 163 KiB: below 227 only the defaults' state pass takes one.
  GatedDeltaRuleArgs gpu = on_gpu(gpu_case_inputs(GpuCase{1, 70, 1, 256, 96, false, 0}, 167),
                                  DType::BF16);
  gpu.want_fit_error = false;
  auto forward_o = [&](bool on) {
    const testing::ScopedSetting one_slot(&cuda::set_gated_delta_rule_one_slot, on);
    GatedDeltaRuleResult out = poisoned_result(gpu);
    out.fit_error = Tensor();
    gated_delta_rule_chunked_kernels()(Device::cuda(), gpu, out);
    return out;
  };
  const int64_t before = cuda::gated_delta_rule_one_slot_launches();
  const GatedDeltaRuleResult two = forward_o(false), one = forward_o(true);
  EXPECT_EQ(cuda::gated_delta_rule_one_slot_launches() - before, by_default > 0 ? 3 : 2);
  EXPECT_EQ(testing::max_abs_diff(one.o, two.o), 0.0);
  EXPECT_EQ(testing::max_abs_diff(one.h_final, two.h_final), 0.0);
#endif
}

// The SIMT kernels (f32, f64) on a GPU with less shared memory a block than Hopper's:
// - from 163 KiB (an A100's, as
//   EmulatedGpu.gated_delta_rule_one_slot_on_an_a100s_shared_memory emulates), where a
//   chunk's K and Q rows in f32 at K = 256 do not fit with the rest, they read Q's rows from
//   global memory: forward and backward match the CPU; so do f64 at K = 32 and f64's
//   forward at K = 128.
// - below that (99 KiB, EmulatedGpu.gated_delta_rule_f32_past_a_99_kib_gpu_points_to_bf16),
//   f32 at K = 256 does not fit even so: one line naming the bytes and pointing to bf16.
TEST(GatedDeltaRule, GpuSimtKernelsOnASmallerGpu) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const size_t limit = cuda::max_shared_per_block();
  if (limit >= 227 * 1024) {
    GTEST_SKIP() << "this GPU's blocks hold the SIMT kernels with Q's rows (it runs on the "
                    "emulator at 163 and 99 KiB)";
  }
  const GatedDeltaRuleArgs f32 =
      on_gpu(gpu_case_inputs(GpuCase{1, 130, 1, 256, 40, true, 2}, 171), DType::F32);
  if (limit >= 163 * 1024) {
    expect_gpu_matches_reference(f32, gpu_bounds(DType::F32), 172);
    expect_gpu_matches_reference(
        on_gpu(gpu_case_inputs(GpuCase{1, 130, 2, 32, 24, false, 0}, 173), DType::F64),
        gpu_bounds(DType::F64), 174);
    // f64's forward at K = 128 reads Q from global memory there too (its backward does not
    // fit even so).
    const GatedDeltaRuleArgs f64 =
        on_gpu(gpu_case_inputs(GpuCase{1, 70, 1, 128, 16, true, 0}, 175), DType::F64);
    GatedDeltaRuleResult out = poisoned_result(f64);
    gated_delta_rule_chunked_kernels()(Device::cuda(), f64, out);
    const GatedDeltaRuleResult expected = ops::gated_delta_rule_chunked(reference_args(f64));
    const GpuBounds bound = gpu_bounds(DType::F64);
    expect_within(out.o, expected.o, bound.forward, "o");
    expect_within(out.h_final, expected.h_final, bound.forward, "h_final");
    expect_within(out.fit_error, expected.fit_error, bound.fit, "fit_error");
    return;
  }
  testing::expect_error(
      [&] {
        GatedDeltaRuleResult out = poisoned_result(f32);
        gated_delta_rule_chunked_kernels()(Device::cuda(), f32, out);
      },
      {"gated_delta_rule (cuda): K = 256 needs", "bytes of shared memory per block",
       "bf16 inputs (ham train --precision bf16)", "fit an A100's 163 KiB"});
#endif
}

#ifdef HAM_WITH_CUDA
// A state pass in 1, 3 and 7 windows of chunks (`set`) on packed documents that cross
// windows' ends (the state carried in f32), rows with two documents crossing in one
// window (one reading its carry while the other writes its own), rows of different chunk
// counts, h0, part value tiles (72), a last chunk cut short, more windows than chunks
// (7 on 5 and on 4), K of 64, 128 and 256: expect_settings_agree_bitwise, and `windowed`
// counts the two calls (the CPU check's, the comparison's) of each setting in windows.
void expect_windows_agree(uint64_t seed, int (*set)(int), int64_t (*windowed)()) {
  for (const GpuCase& c :
       {GpuCase{2, 300, 2, 64, 72, true, 5}, GpuCase{1, 200, 1, 128, 64, true, 0},
        GpuCase{1, 200, 1, 256, 96, true, 3}}) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const int64_t before = windowed();
    expect_settings_agree_bitwise(c, seed, {1, 3, 7}, [&](int windows) { set(windows); });
    EXPECT_EQ(windowed() - before, 4);
  }
}
#endif

// The bf16 forward with its state pass in windows of chunks
// (set_gated_delta_rule_forward_windows), each window's output kernel beside the next
// window's pass: every window count matches the CPU, and o, the final state and the fit
// error equal those of one launch bit for bit; with the prepare kernel by the same windows
// (the default, counted: two forwards in windows a setting and case) and, on the first
// case, once over every chunk (set_gated_delta_rule_forward_prepare_windows).
TEST(GatedDeltaRule, GpuForwardInWindowsAgrees) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting windows_guard(&cuda::set_gated_delta_rule_forward_windows, 1);
  const testing::ScopedSetting prepare_guard(
      &cuda::set_gated_delta_rule_forward_prepare_windows, true);
  const int64_t prepares_before = cuda::gated_delta_rule_windowed_prepares();
  expect_windows_agree(83, &cuda::set_gated_delta_rule_forward_windows,
                       &cuda::gated_delta_rule_windowed_forwards);
  EXPECT_EQ(cuda::gated_delta_rule_windowed_prepares() - prepares_before, 12);
  {
    SCOPED_TRACE("the prepare kernel once over every chunk");
    cuda::set_gated_delta_rule_forward_prepare_windows(false);
    const int64_t before = cuda::gated_delta_rule_windowed_prepares();
    expect_settings_agree_bitwise(GpuCase{2, 300, 2, 64, 72, true, 5}, 83, {1, 3, 7},
                                  [](int windows) {
                                    cuda::set_gated_delta_rule_forward_windows(windows);
                                  });
    EXPECT_EQ(cuda::gated_delta_rule_windowed_prepares() - before, 0);
  }
  testing::expect_error([] { cuda::set_gated_delta_rule_forward_windows(0); },
                        {"set_gated_delta_rule_forward_windows", "0 windows", "1 to 64"});
#endif
}

// Dependent launches (cuda::set_dependent_launches, cuda/dependent_launch.h): the tensor-core
// forward and backward match the CPU and equal plain launches' bit for bit, in one launch a
// pass (K = 64 with 5 documents, K = 128) and, at K = 64, with the forward's state pass in 3
// windows (the output kernels on the current stream beside the passes on a fork). On the
// emulator every thread of a dependent launch must pass its griddepcontrol.wait.
TEST(GatedDeltaRule, GpuDependentLaunchesAgree) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const bool counted = cuda::dependent_launches_supported();
  const std::pair<GpuCase, int> cases[] = {{GpuCase{2, 300, 2, 64, 72, true, 5}, 1},
                                           {GpuCase{2, 300, 2, 64, 72, true, 5}, 3},
                                           {GpuCase{1, 200, 1, 128, 64, true, 0}, 1}};
  for (const auto& [c, windows] : cases) {
    const testing::ScopedSetting windows_guard(&cuda::set_gated_delta_rule_forward_windows,
                                               windows);
    SCOPED_TRACE(::testing::PrintToString(c) + ", windows " + std::to_string(windows));
    const int64_t before = cuda::dependent_launch_count();
    expect_settings_agree_bitwise(c, 91, {1, 0}, [](int on) {
      cuda::set_dependent_launches(on != 0);
    });
    // The forward's prepare, state and output kernels (and the chunk table with
    // documents), at least.
    if (counted) {
      EXPECT_GE(cuda::dependent_launch_count() - before, 4);
    }
  }
  EXPECT_FALSE(cuda::set_dependent_launches(false)) << "off by default, and left off";
#endif
}

// The bf16 backward's recompute of the forward's state pass in windows of chunks
// (set_gated_delta_rule_recompute_windows; the P^T dO kernel beside it, the default), each
// window's pass after its own window's prepare kernel: every window count matches the CPU,
// and the gradients equal one launch's bit for bit; the backward that reads the A a
// forward kept (the prepare kernel reading it by windows) equals the recomputing one.
// Without the overlap the recompute runs in one launch (not counted).
TEST(GatedDeltaRule, GpuBackwardRecomputeInWindowsAgrees) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting windows_guard(&cuda::set_gated_delta_rule_recompute_windows, 1);
  const testing::ScopedSetting overlap_guard(&cuda::set_gated_delta_rule_backward_overlap, true);
  expect_windows_agree(89, &cuda::set_gated_delta_rule_recompute_windows,
                       &cuda::gated_delta_rule_windowed_recomputes);
  cuda::set_gated_delta_rule_recompute_windows(3);
  expect_kept_backward_equals_recomputing_one({{2, 150, 2, 64, 48, true, 3}});

  cuda::set_gated_delta_rule_backward_overlap(false);
  const GpuCase c{1, 200, 1, 64, 48, true, 2};
  const int64_t before = cuda::gated_delta_rule_windowed_recomputes();
  expect_gpu_matches_reference(on_gpu(gpu_case_inputs(c, 97), DType::BF16),
                               gpu_bounds(DType::BF16), 98);
  EXPECT_EQ(cuda::gated_delta_rule_windowed_recomputes() - before, 0);
  testing::expect_error([] { cuda::set_gated_delta_rule_recompute_windows(65); },
                        {"set_gated_delta_rule_recompute_windows", "65 windows", "1 to 64"});
#endif
}

// The forward without the fit error (GatedDeltaRuleArgs::want_fit_error false; the bf16
// output kernel then splits O's columns between its two halves of warps and copies no v):
// fit_error stays undefined, o and the final state equal the forward's with the fit error
// bit for bit, in bf16 (the tensor-core path) and f32; K from 16 to 256, value widths of
// one part tile (40: the right half 8 columns), a whole and a part tile (72: the part tile
// has no right half; 96: exactly the left half), two whole tiles (128, streamed copies),
// and 36 at K = 128 (o's rows off 16-byte boundaries: not staged in K's rows); one launch
// and 3 windows of chunks. The backward reading what each bf16 forward kept gives the
// same gradients.
TEST(GatedDeltaRule, GpuForwardWithoutTheFitErrorAgrees) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  // Equal values, element by element; a NaN (an element left poisoned) never equals.
  auto expect_equal = [](const Tensor& a, const Tensor& b, const char* what) {
    ASSERT_EQ(a.defined(), b.defined()) << what;
    if (!a.defined()) return;
    ASSERT_EQ(a.shape(), b.shape()) << what;
    const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
    size_t unequal = 0;
    for (size_t i = 0; i < va.size(); ++i) unequal += va[i] == vb[i] ? 0 : 1;
    EXPECT_EQ(unequal, 0u) << what;
  };
  const testing::ScopedSetting windows_guard(&cuda::set_gated_delta_rule_forward_windows, 1);
  const GpuCase cases[] = {{1, 130, 2, 16, 40, true, 2},  {2, 100, 1, 32, 72, false, 0},
                           {1, 150, 2, 64, 96, true, 3},  {1, 140, 1, 128, 128, true, 0},
                           {1, 130, 1, 256, 72, true, 2}, {1, 140, 2, 128, 36, true, 2}};
  for (const GpuCase& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const GdnInputs in = gpu_case_inputs(c, 97);
    for (DType dtype : testing::kGpuDtypes) {
      SCOPED_TRACE(dtype_name(dtype));
      GatedDeltaRuleArgs with = on_gpu(in, dtype);
      with.keep = GatedDeltaRuleKeep::Inverses;
      GatedDeltaRuleArgs without = with;
      without.want_fit_error = false;
      const GatedDeltaRuleResult expected = ops::gated_delta_rule_chunked(reference_args(with));
      for (int windows : {1, 3}) {
        SCOPED_TRACE(windows);
        cuda::set_gated_delta_rule_forward_windows(windows);
        GatedDeltaRuleResult a = poisoned_result(with), b = poisoned_result(without);
        b.fit_error = Tensor();
        gated_delta_rule_chunked_kernels()(Device::cuda(), with, a);
        gated_delta_rule_chunked_kernels()(Device::cuda(), without, b);
        EXPECT_FALSE(b.fit_error.defined());
        expect_within(b.o, expected.o, gpu_bounds(dtype).forward, "o");
        expect_within(b.h_final, expected.h_final, gpu_bounds(dtype).forward, "h_final");
        expect_equal(a.o, b.o, "o");
        expect_equal(a.h_final, b.h_final, "h_final");
        if (dtype != DType::BF16) continue;
        ASSERT_TRUE(a.saved && b.saved);
        const Tensor grad_o = randn64(a.o.shape(), 98, 1.0, false).to(dtype).to(Device::cuda());
        const Tensor grad_h_final =
            randn64(a.h_final.shape(), 99, 1.0, false).to(dtype).to(Device::cuda());
        GatedDeltaRuleGrads ga = poisoned_grads(with, {}), gb = poisoned_grads(with, {});
        gated_delta_rule_backward_kernels()(Device::cuda(), with, grad_o, grad_h_final,
                                            a.saved.get(), ga);
        gated_delta_rule_backward_kernels()(Device::cuda(), with, grad_o, grad_h_final,
                                            b.saved.get(), gb);
        for (auto [field, what] :
             {std::pair{&GatedDeltaRuleGrads::dq, "dq"}, std::pair{&GatedDeltaRuleGrads::dk, "dk"},
              std::pair{&GatedDeltaRuleGrads::dv, "dv"}, std::pair{&GatedDeltaRuleGrads::dg, "dg"},
              std::pair{&GatedDeltaRuleGrads::dbeta, "dbeta"},
              std::pair{&GatedDeltaRuleGrads::dh0, "dh0"}}) {
          expect_equal(ga.*field, gb.*field, what);
        }
      }
    }
  }
#endif
}

// The bf16 backward with its reverse state pass in windows of chunks, the last first
// (set_gated_delta_rule_backward_windows), the values, keys and WY kernels of each window
// beside the pass over the window before: every window count matches the CPU, and the
// gradients equal those of one launch bit for bit (dS carried across windows in f32, dh0
// through the first window).
TEST(GatedDeltaRule, GpuBackwardInWindowsAgrees) {
  HAM_SKIP_UNLESS_CUDA();
#ifdef HAM_WITH_CUDA
  const testing::ScopedSetting windows_guard(&cuda::set_gated_delta_rule_backward_windows, 1);
  expect_windows_agree(89, &cuda::set_gated_delta_rule_backward_windows,
                       &cuda::gated_delta_rule_windowed_backwards);
  testing::expect_error([] { cuda::set_gated_delta_rule_backward_windows(65); },
                        {"set_gated_delta_rule_backward_windows", "65 windows", "1 to 64"});
#endif
}

}  // namespace
}  // namespace ham
