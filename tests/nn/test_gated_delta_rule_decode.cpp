// gated_delta_rule_decode: steps of a few tokens advance the state in place and give what
// the whole-sequence kernels give (CPU, f64); the CUDA kernel equals the CPU one and, token
// by token, the CUDA chunked kernel.
#include "core/ops/gated_delta_rule_decode.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/ops/gated_delta_rule.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::randn64;
using testing::relative_rms_error;
using testing::time_slice;

struct DecodeInputs {
  Tensor q, k, v, g, beta, h0;  // f64, CPU: [B, T, H, K] ... and h0 [B, H, K, V]
};

// q ~ N(0, 1/K), unit-norm k, v ~ N(0, 1), g = -s softplus(x) with s per token from
// {0.01, 0.1, 1, 10} (one in ten exactly 0), beta in (0, 1) (one in ten exactly 0).
DecodeInputs make_inputs(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::normal_distribution<double> normal(0.0, 1.0);
  DecodeInputs in;
  in.q = randn64({B, T, H, K}, seed + 1, 1.0 / std::sqrt(double(K)), false);
  std::vector<double> k = randn64({B, T, H, K}, seed + 2, 1.0, false).to_vector<double>();
  for (size_t row = 0; row < k.size() / size_t(K); ++row) {
    double norm2 = 0;
    for (int64_t a = 0; a < K; ++a) norm2 += k[row * size_t(K) + size_t(a)] * k[row * size_t(K) + size_t(a)];
    for (int64_t a = 0; a < K; ++a) k[row * size_t(K) + size_t(a)] /= std::sqrt(norm2);
  }
  in.k = Tensor::from_vector(k, {B, T, H, K});
  in.v = randn64({B, T, H, V}, seed + 3, 1.0, false);
  const double scales[] = {0.01, 0.1, 1.0, 10.0};
  std::vector<double> g(size_t(B * T * H)), beta(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const double s = scales[size_t(uni(rng) * 4) % 4];
    g[i] = uni(rng) < 0.1 ? 0.0 : -s * std::log1p(std::exp(normal(rng)));
    beta[i] = uni(rng) < 0.1 ? 0.0 : 0.02 + 0.96 * uni(rng);
  }
  in.g = Tensor::from_vector(g, {B, T, H});
  in.beta = Tensor::from_vector(beta, {B, T, H});
  in.h0 = randn64({B, H, K, V}, seed + 4, 0.5, false);
  return in;
}

// Pieces of dim 1 laid end to end (f64 host).
Tensor join_tokens(const std::vector<Tensor>& pieces) {
  const int64_t B = pieces[0].size(0);
  std::vector<std::vector<double>> rows(static_cast<size_t>(B));
  Shape shape = pieces[0].shape();
  shape[1] = 0;
  for (const Tensor& piece : pieces) {
    const int64_t n = piece.size(1), width = piece.numel() / (B * std::max<int64_t>(n, 1));
    std::vector<double> all = piece.to(Device::cpu()).to_vector<double>();
    for (int64_t b = 0; b < B; ++b) {
      rows[size_t(b)].insert(rows[size_t(b)].end(), all.begin() + b * n * width,
                             all.begin() + (b + 1) * n * width);
    }
    shape[1] += n;
  }
  std::vector<double> flat;
  for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
  return Tensor::from_vector(flat, shape);
}

// Steps the whole sequence through the decode op in pieces of the given sizes (cycled),
// starting from `state` (advanced in place); the pieces' o and fit_error, joined.
struct Stepped {
  Tensor o, fit_error;
};
Stepped step_through(Tensor& state, const GatedDeltaRuleArgs& seq, const std::vector<int64_t>& sizes,
                     DType dtype, Device device, DType gate_dtype) {
  std::vector<Tensor> os, fits;
  auto put = [&](const Tensor& t, DType d) { return t.to(d).to(device); };
  const int64_t T = seq.q.size(1);
  for (int64_t t = 0, piece = 0; t < T; ++piece) {
    const int64_t n = std::min(sizes[size_t(piece) % sizes.size()], T - t);
    const ops::GatedDeltaRuleStep s = ops::gated_delta_rule_decode(
        state, put(time_slice(seq.q, t, n), dtype), put(time_slice(seq.k, t, n), dtype),
        put(time_slice(seq.v, t, n), dtype), put(time_slice(seq.g, t, n), gate_dtype),
        put(time_slice(seq.beta, t, n), dtype));
    os.push_back(s.o);
    fits.push_back(s.fit_error);
    t += n;
  }
  return {join_tokens(os), join_tokens(fits)};
}

GatedDeltaRuleArgs args_of(const DecodeInputs& in, bool with_h0) {
  return {in.q, in.k, in.v, in.g, in.beta, with_h0 ? in.h0 : Tensor(), Tensor()};
}

TEST(GatedDeltaRuleDecode, StepsOfAFewTokensEqualTheRecurrenceInPlace) {
  const DecodeInputs in = make_inputs(2, 17, 3, 16, 12, 7);
  const GatedDeltaRuleResult want = ops::gated_delta_rule_naive(args_of(in, true));
  Tensor state = in.h0.clone();
  const void* storage = state.raw_data();
  const Stepped got = step_through(state, args_of(in, true), {1, 3, 5}, DType::F64, Device::cpu(),
                                   DType::F64);
  EXPECT_EQ(state.raw_data(), storage);  // in place
  EXPECT_LE(relative_rms_error(got.o, want.o), 1e-14);
  EXPECT_LE(relative_rms_error(got.fit_error, want.fit_error), 1e-14);
  EXPECT_LE(relative_rms_error(state, want.h_final), 1e-14);
}

// One token at a time from a zero state gives the chunked training forward's results.
TEST(GatedDeltaRuleDecode, TokenByTokenEqualsTheChunkedForward) {
  const DecodeInputs in = make_inputs(1, 130, 2, 32, 20, 9);
  const GatedDeltaRuleResult want = ops::gated_delta_rule_chunked(args_of(in, false));
  Tensor state = Tensor::zeros({1, 2, 32, 20}, DType::F64);
  const Stepped got = step_through(state, args_of(in, false), {1}, DType::F64, Device::cpu(), DType::F64);
  EXPECT_LE(relative_rms_error(got.o, want.o), 1e-12);
  EXPECT_LE(relative_rms_error(got.fit_error, want.fit_error), 1e-12);
  EXPECT_LE(relative_rms_error(state, want.h_final), 1e-12);
}

// bf16 inputs run on their f32 values with the f32 state untouched by rounding: the state
// equals the f32 run's bit for bit, o and fit_error are its values rounded once.
TEST(GatedDeltaRuleDecode, Bf16InputsKeepTheStateInF32) {
  const DecodeInputs in = make_inputs(2, 5, 2, 16, 8, 11);
  GatedDeltaRuleArgs bf{in.q.to(DType::BF16), in.k.to(DType::BF16), in.v.to(DType::BF16),
                        in.g.to(DType::F32), in.beta.to(DType::BF16), Tensor(), Tensor()};
  auto wide = [](const Tensor& t) { return t.to(DType::F32); };
  Tensor state = in.h0.to(DType::F32), state_f32 = in.h0.to(DType::F32);
  const ops::GatedDeltaRuleStep got = ops::gated_delta_rule_decode(state, bf.q, bf.k, bf.v, bf.g, bf.beta);
  const ops::GatedDeltaRuleStep want = ops::gated_delta_rule_decode(
      state_f32, wide(bf.q), wide(bf.k), wide(bf.v), bf.g, wide(bf.beta));
  EXPECT_EQ(got.o.dtype(), DType::BF16);
  EXPECT_EQ(state.dtype(), DType::F32);
  EXPECT_EQ(state.to_vector<float>(), state_f32.to_vector<float>());
  EXPECT_EQ(got.o.to_vector<float>(), want.o.to(DType::BF16).to_vector<float>());
  EXPECT_EQ(got.fit_error.to_vector<float>(), want.fit_error.to(DType::BF16).to_vector<float>());
}

TEST(GatedDeltaRuleDecode, BadInputsNameTheArgument) {
  const DecodeInputs in = make_inputs(2, 1, 3, 8, 4, 13);
  const char* op = "gated_delta_rule_decode";
  using testing::expect_error;
  Tensor bf16_state = in.h0.to(DType::BF16);
  expect_error([&] {
    ops::gated_delta_rule_decode(bf16_state, in.q.to(DType::BF16), in.k.to(DType::BF16),
                                 in.v.to(DType::BF16), in.g.to(DType::BF16), in.beta.to(DType::BF16));
  }, {op, "state is", "must be f32 for bf16 inputs"});
  Tensor wrong_shape = Tensor::zeros({2, 3, 8, 5}, DType::F64);
  expect_error([&] { ops::gated_delta_rule_decode(wrong_shape, in.q, in.k, in.v, in.g, in.beta); },
               {op, "state [2, 3, 8, 5]", "[B, H, K, V] = [2, 3, 8, 4]"});
  Tensor state = in.h0.clone();
  expect_error([&] { ops::gated_delta_rule_decode(state, in.q, in.k, in.v, in.g.to(DType::F32), in.beta); },
               {op, "g", "dtypes must match"});
  expect_error([&] { ops::gated_delta_rule_decode(state, in.q, in.k, randn64({2, 1, 2, 4}, 3, 1.0, false), in.g, in.beta); },
               {op, "v [2, 1, 2, 4]", "[B, T, H, V]"});
}

// ---- CUDA kernel -----------------------------------------------------------------------

struct GpuDecodeCase {
  int64_t batch, tokens, heads, key_dim, value_dim;
};

void PrintTo(const GpuDecodeCase& c, std::ostream* os) {
  *os << "B" << c.batch << "_n" << c.tokens << "_H" << c.heads << "_K" << c.key_dim << "_V"
      << c.value_dim;
}

// Relative RMS bounds of the issue: bf16 5e-3 for o and the state, 1e-2 for the fit
// error; f32 ten times tighter; f64 1e-10 for both.
double forward_bound(DType dtype) {
  return dtype == DType::BF16 ? 5e-3 : dtype == DType::F64 ? 1e-10 : 5e-4;
}
double fit_bound(DType dtype) {
  return dtype == DType::BF16 ? 1e-2 : dtype == DType::F64 ? 1e-10 : 1e-3;
}

class GatedDeltaRuleDecodeGpu : public ::testing::TestWithParam<GpuDecodeCase> {};

// The CUDA kernel against the CPU kernel in f64 on the same rounded values and the same
// start state; o and fit_error NaN-poisoned. f32, bf16, bf16 with f32 gates, and f64 (its
// state f64).
TEST_P(GatedDeltaRuleDecodeGpu, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const GpuDecodeCase& c = GetParam();
  const DecodeInputs in = make_inputs(c.batch, c.tokens, c.heads, c.key_dim, c.value_dim,
                                      100 + uint64_t(c.key_dim + c.value_dim));
  for (const auto& [dtype, gate_dtype] :
       {std::pair{DType::F32, DType::F32}, std::pair{DType::BF16, DType::BF16},
        std::pair{DType::BF16, DType::F32}, std::pair{DType::F64, DType::F64}}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " gates " + dtype_name(gate_dtype));
    auto put = [&](const Tensor& t, DType d) { return t.to(d).to(Device::cuda()); };
    const Tensor q = put(in.q, dtype), k = put(in.k, dtype), v = put(in.v, dtype),
                 g = put(in.g, gate_dtype), beta = put(in.beta, dtype);
    Tensor state = put(in.h0, dtype == DType::F64 ? DType::F64 : DType::F32);
    auto reference = [](const Tensor& t) { return testing::cpu_reference(t).to(DType::F64); };
    Tensor want_state = reference(state);
    const ops::GatedDeltaRuleStep want = ops::gated_delta_rule_decode(
        want_state, reference(q), reference(k), reference(v), reference(g), reference(beta));
    Tensor o = testing::poisoned(want.o.shape(), dtype, Device::cuda());
    Tensor fit = testing::poisoned(want.fit_error.shape(), dtype, Device::cuda());
    gated_delta_rule_decode_kernels()(Device::cuda(), q, k, v, g, beta, state, o, fit);
    EXPECT_LE(relative_rms_error(o, want.o), forward_bound(dtype));
    EXPECT_LE(relative_rms_error(fit, want.fit_error), fit_bound(dtype));
    EXPECT_LE(relative_rms_error(state, want_state), forward_bound(dtype));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GatedDeltaRuleDecodeGpu,
    ::testing::Values(GpuDecodeCase{1, 1, 2, 16, 12}, GpuDecodeCase{2, 1, 3, 32, 48},
                      GpuDecodeCase{2, 4, 2, 64, 64}, GpuDecodeCase{1, 1, 5, 256, 384},  // the paper's
                      GpuDecodeCase{1, 3, 2, 100, 40}, GpuDecodeCase{3, 1, 4, 128, 128},
                      GpuDecodeCase{1, 2, 1, 512, 33},
                      GpuDecodeCase{2, 2, 3, 8, 20}));  // K <= 8: one register of state a thread

// The decode kernel, one token per call from h0, equals the GPU's chunked kernel over the
// whole sequence: o, fit_error and the final state (rounded to the dtype by the chunked
// kernel), within the bounds of each dtype.
TEST(GatedDeltaRuleDecode, GpuTokenByTokenEqualsTheChunkedKernel) {
  HAM_SKIP_UNLESS_CUDA();
  const DecodeInputs in = make_inputs(2, 70, 2, 64, 40, 17);
  for (DType dtype : testing::kGpuDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    auto put = [&](const Tensor& t) { return t.to(dtype).to(Device::cuda()); };
    const GatedDeltaRuleArgs whole{put(in.q), put(in.k), put(in.v), put(in.g), put(in.beta),
                                   put(in.h0), Tensor()};
    const GatedDeltaRuleResult chunked = ops::gated_delta_rule_chunked(whole);
    Tensor state = whole.h0.to(DType::F32);
    const GatedDeltaRuleArgs rounded{testing::cpu_reference(whole.q).to(DType::F64),
                                     testing::cpu_reference(whole.k).to(DType::F64),
                                     testing::cpu_reference(whole.v).to(DType::F64),
                                     testing::cpu_reference(whole.g).to(DType::F64),
                                     testing::cpu_reference(whole.beta).to(DType::F64),
                                     Tensor(), Tensor()};
    const Stepped stepped = step_through(state, rounded, {1}, dtype, Device::cuda(), dtype);
    EXPECT_LE(relative_rms_error(stepped.o, chunked.o), forward_bound(dtype));
    EXPECT_LE(relative_rms_error(stepped.fit_error, chunked.fit_error), fit_bound(dtype));
    EXPECT_LE(relative_rms_error(state, chunked.h_final), forward_bound(dtype));
  }
}

}  // namespace
}  // namespace ham
