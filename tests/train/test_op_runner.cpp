// `ham op` underneath: run_op reads inputs from safetensors, runs one op forward (and
// backward with upstream gradients) and writes the results under the argument names.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "core/ops/gated_delta_rule.h"
#include "core/ops/gated_delta_rule_decode.h"
#include "core/ops/routed_attention.h"
#include "core/ops/routed_attention_decode.h"
#include "nn/gated_delta_rule.h"
#include "nn/routed_attention.h"
#include "tests/testing.h"
#include "train/op_runner.h"

namespace ham {
namespace {

namespace fs = std::filesystem;
using testing::max_abs_diff;
using Named = std::vector<std::pair<std::string, Tensor>>;

// A fresh directory per test, removed afterwards.
class OpRunner : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("ham_op_runner_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& file, const Named& tensors) const {
    std::string path = (dir_ / file).string();
    save_safetensors(path, tensors);
    return path;
  }
  std::string path(const std::string& file) const { return (dir_ / file).string(); }

  fs::path dir_;
};

Tensor randn(const Shape& shape, uint64_t seed, double scale = 1.0) {
  return testing::randn64(shape, seed, scale, /*grad=*/false);
}
Tensor uniform(const Shape& shape, uint64_t seed, double lo, double hi) {
  return testing::uniform64(shape, seed, lo, hi, /*grad=*/false);
}

// Rows of the last dim scaled to unit length (the delta rule wants unit keys).
Tensor l2_rows(const Tensor& t) {
  std::vector<double> v = t.to_vector<double>();
  int64_t n = t.size(-1);
  for (size_t row = 0; row < v.size(); row += size_t(n)) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += v[row + size_t(i)] * v[row + size_t(i)];
    for (int64_t i = 0; i < n; ++i) v[row + size_t(i)] /= std::sqrt(s);
  }
  return Tensor::from_vector(v, t.shape());
}

const int64_t B = 2, T = 70, H = 2, K = 8, V = 6;  // T crosses a 64-token chunk

Named gdr_inputs(DType dtype, bool with_h0, bool with_docs) {
  Named in = {{"q", l2_rows(randn({B, T, H, K}, 1))},
              {"k", l2_rows(randn({B, T, H, K}, 2))},
              {"v", randn({B, T, H, V}, 3)},
              {"g", uniform({B, T, H}, 4, -0.5, 0.0)},
              {"beta", uniform({B, T, H}, 5, 0.1, 0.9)}};
  if (with_h0) in.emplace_back("h0", randn({B, H, K, V}, 6, 0.3));
  for (auto& [name, t] : in) t = t.to(dtype);
  if (with_docs) {
    std::vector<int64_t> docs(size_t(B * T));
    for (int64_t i = 0; i < B * T; ++i) docs[size_t(i)] = (i % T) < 30 ? 0 : 1;  // a start at t = 30
    in.emplace_back("doc_ids", Tensor::from_vector(docs, {B, T}));
  }
  return in;
}

Tensor find(const Named& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  ADD_FAILURE() << "no tensor '" << name << "'";
  return Tensor();
}

using testing::error_of;

TEST_F(OpRunner, GatedDeltaRuleForwardRoundTripsThroughFiles) {
  for (DType dtype : {DType::F64, DType::F32}) {
    SCOPED_TRACE(dtype_name(dtype));
    Named in = gdr_inputs(dtype, true, true);
    std::string in_path = write("in.safetensors", in), out_path = path("out.safetensors");
    run_op("gated_delta_rule", in_path, "", out_path);
    SafetensorsFile out = load_safetensors(out_path);
    GatedDeltaRuleResult direct = ops::gated_delta_rule_chunked(
        {find(in, "q"), find(in, "k"), find(in, "v"), find(in, "g"), find(in, "beta"),
         find(in, "h0"), find(in, "doc_ids")});
    ASSERT_EQ(out.tensors.size(), 3u) << "forward only: o, h_final, fit_error";
    EXPECT_EQ(out.at("o").dtype(), dtype);
    EXPECT_EQ(max_abs_diff(out.at("o"), direct.o), 0.0);
    EXPECT_EQ(max_abs_diff(out.at("h_final"), direct.h_final), 0.0);
    EXPECT_EQ(max_abs_diff(out.at("fit_error"), direct.fit_error), 0.0);
    EXPECT_EQ(out.metadata.at("op"), "gated_delta_rule");
    EXPECT_EQ(out.metadata.at("dtype"), dtype_name(dtype));
  }
}

TEST_F(OpRunner, GatedDeltaRuleBackwardMatchesAutograd) {
  Named in = gdr_inputs(DType::F64, true, true);
  Tensor grad_o = randn({B, T, H, V}, 7), grad_h = randn({B, H, K, V}, 8);
  std::string in_path = write("in.safetensors", in);
  std::string grad_path = write("grad.safetensors", {{"grad.o", grad_o}, {"grad.h_final", grad_h}});
  run_op("gated_delta_rule", in_path, grad_path, path("out.safetensors"));
  SafetensorsFile out = load_safetensors(path("out.safetensors"));

  std::vector<std::string> names = {"q", "k", "v", "g", "beta", "h0"};
  std::vector<Tensor> leaves;
  for (const auto& n : names) leaves.push_back(set_requires_grad(find(in, n).clone()));
  GatedDeltaRuleResult r = gated_delta_rule(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4],
                                            leaves[5], find(in, "doc_ids"));
  std::vector<Tensor> expected = gradients({r.o, r.h_final}, leaves, {grad_o, grad_h});
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(names[i]);
    EXPECT_LE(max_abs_diff(out.at("grad." + names[i]), expected[i]), 1e-12);
  }
  EXPECT_EQ(out.tensors.size(), 3u + names.size());
}

TEST_F(OpRunner, MissingUpstreamGradientsAreZeros) {
  Named in = gdr_inputs(DType::F64, false, false);
  Tensor grad_o = randn({B, T, H, V}, 9);
  SafetensorsFile inputs{"in", in, {}}, upstream{"grad", {{"grad.o", grad_o}}, {}};
  OpResult result = run_op("gated_delta_rule", inputs, &upstream);
  std::vector<Tensor> leaves;
  for (const char* n : {"q", "k", "v", "g", "beta"}) leaves.push_back(set_requires_grad(find(in, n).clone()));
  GatedDeltaRuleResult r = gated_delta_rule(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4]);
  std::vector<Tensor> expected = gradients({r.o}, leaves, {grad_o});
  EXPECT_LE(max_abs_diff(find(result.tensors, "grad.k"), expected[1]), 1e-12);
  EXPECT_LE(max_abs_diff(find(result.tensors, "grad.g"), expected[3]), 1e-12);
  for (const auto& [name, t] : result.tensors) EXPECT_NE(name, "grad.h0") << "no h0 was given";
}

Named attention_inputs(DType dtype) {
  const int64_t Hq = 4, Hkv = 2, Dk = 8, Dv = 5;
  std::vector<uint8_t> select(size_t(B * T));
  std::vector<int32_t> docs(size_t(B * T));
  for (int64_t i = 0; i < B * T; ++i) {
    select[size_t(i)] = (i * 7) % 3 != 0;
    docs[size_t(i)] = (i % T) < 40 ? 3 : 8;
  }
  Named in = {{"q", randn({B, T, Hq, Dk}, 11)},
              {"k", randn({B, T, Hkv, Dk}, 12)},
              {"v", randn({B, T, Hkv, Dv}, 13)},
              {"value_scale", uniform({B, T}, 14, 0.2, 1.0)}};
  for (auto& [name, t] : in) t = t.to(dtype);
  in.emplace_back("select", Tensor::from_vector(select, {B, T}));
  in.emplace_back("doc_ids", Tensor::from_vector(docs, {B, T}));
  return in;
}

TEST_F(OpRunner, RoutedAttentionForwardAndBackwardMatchTheOpAndAutograd) {
  Named in = attention_inputs(DType::F64);
  in.emplace_back("scale", Tensor::scalar(0.3, DType::F64));
  Tensor grad_o = randn({B, T, 4, 5}, 15);
  run_op("routed_attention", write("in.safetensors", in), write("grad.safetensors", {{"grad.o", grad_o}}),
         path("out.safetensors"));
  SafetensorsFile out = load_safetensors(path("out.safetensors"));
  EXPECT_EQ(out.metadata.at("scale"), "0.29999999999999999");

  std::vector<std::string> names = {"q", "k", "v", "value_scale"};
  std::vector<Tensor> leaves;
  for (const auto& n : names) leaves.push_back(set_requires_grad(find(in, n).clone()));
  Tensor o = routed_attention(leaves[0], leaves[1], leaves[2], find(in, "select"), leaves[3],
                              find(in, "doc_ids"), 0.3);
  EXPECT_EQ(max_abs_diff(out.at("o"), o), 0.0);
  std::vector<Tensor> expected = gradients({o}, leaves, {grad_o});
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(names[i]);
    EXPECT_LE(max_abs_diff(out.at("grad." + names[i]), expected[i]), 1e-12);
  }
}

TEST_F(OpRunner, RoutedAttentionScaleFlagDefaultAndSelectAsIntegers) {
  Named in = attention_inputs(DType::F32);
  SafetensorsFile inputs{"in", in, {}};
  // Default scale 1/sqrt(Dk); --scale gives another; both the flag and a tensor is an error.
  OpResult by_default = run_op("routed_attention", inputs, nullptr);
  EXPECT_EQ(std::stod(by_default.metadata.at("scale")), 1 / std::sqrt(8.0));
  OpResult flagged = run_op("routed_attention", inputs, nullptr, OpOptions{0.5});
  Tensor direct = routed_attention(find(in, "q"), find(in, "k"), find(in, "v"), find(in, "select"),
                                   find(in, "value_scale"), find(in, "doc_ids"), 0.5);
  EXPECT_EQ(max_abs_diff(find(flagged.tensors, "o"), direct), 0.0);
  Named with_tensor = in;
  with_tensor.emplace_back("scale", Tensor::scalar(0.5, DType::F32));
  SafetensorsFile both{"in", with_tensor, {}};
  EXPECT_NE(error_of([&] { run_op("routed_attention", both, nullptr, OpOptions{0.5}); })
                .find("scale is given twice"),
            std::string::npos);
  // select stored as i64 (PyTorch's bool does not exist in this reader): nonzero = selected.
  Named as_i64 = in;
  for (auto& [name, t] : as_i64) {
    if (name == "select") t = t.to(DType::I64);
  }
  SafetensorsFile int_select{"in", as_i64, {}};
  EXPECT_EQ(max_abs_diff(find(run_op("routed_attention", int_select, nullptr).tensors, "o"),
                         find(by_default.tensors, "o")),
            0.0);
}

TEST_F(OpRunner, NaiveReferencesAgreeWithTheKernels) {
  SafetensorsFile gdr{"in", gdr_inputs(DType::F64, true, true), {}};
  OpResult chunked = run_op("gated_delta_rule", gdr, nullptr);
  OpResult naive = run_op("gated_delta_rule_naive", gdr, nullptr);
  for (const char* name : {"o", "h_final", "fit_error"}) {
    EXPECT_LE(max_abs_diff(find(chunked.tensors, name), find(naive.tensors, name)), 1e-10) << name;
  }
  SafetensorsFile ra{"in", attention_inputs(DType::F64), {}};
  EXPECT_LE(max_abs_diff(find(run_op("routed_attention", ra, nullptr).tensors, "o"),
                         find(run_op("routed_attention_naive", ra, nullptr).tensors, "o")),
            1e-12);
}

// The decoding steps: one token of the recurrence from a given state (the state written
// out advanced, the input's untouched), and queries over a KV cache; forward only.
TEST_F(OpRunner, DecodingStepsMatchTheOps) {
  Named gdr = {{"q", l2_rows(randn({B, 1, H, K}, 31))}, {"k", l2_rows(randn({B, 1, H, K}, 32))},
               {"v", randn({B, 1, H, V}, 33)},          {"g", uniform({B, 1, H}, 34, -0.5, 0.0)},
               {"beta", uniform({B, 1, H}, 35, 0.1, 0.9)}, {"state", randn({B, H, K, V}, 36, 0.3)}};
  SafetensorsFile gdr_file{"in", gdr, {}};
  OpResult stepped = run_op("gated_delta_rule_decode", gdr_file, nullptr);
  Tensor state = find(gdr, "state").clone();
  ops::GatedDeltaRuleStep want = ops::gated_delta_rule_decode(
      state, find(gdr, "q"), find(gdr, "k"), find(gdr, "v"), find(gdr, "g"), find(gdr, "beta"));
  EXPECT_EQ(max_abs_diff(find(stepped.tensors, "o"), want.o), 0.0);
  EXPECT_EQ(max_abs_diff(find(stepped.tensors, "fit_error"), want.fit_error), 0.0);
  EXPECT_EQ(max_abs_diff(find(stepped.tensors, "state"), state), 0.0);
  EXPECT_GT(max_abs_diff(find(stepped.tensors, "state"), gdr_file.at("state")), 0.0);

  const int64_t C = 9;
  Named attn = {{"q", randn({B, 3, 4, K}, 41)},
                {"k_cache", randn({B, C, 2, K}, 42)},
                {"v_cache", randn({B, C, 2, V}, 43)},
                {"visible", Tensor::from_vector(std::vector<int32_t>{0, 4, 9, 2, 3, 5}, {B, 3})},
                {"value_scale", uniform({B, C}, 44, 0.1, 1.0)}};
  OpResult attended = run_op("routed_attention_decode", SafetensorsFile{"in", attn, {}}, nullptr);
  ops::RoutedAttentionOutput direct =
      ops::routed_attention_decode(find(attn, "q"), find(attn, "k_cache"), find(attn, "v_cache"),
                                   find(attn, "visible").to(DType::I64), find(attn, "value_scale"));
  EXPECT_EQ(max_abs_diff(find(attended.tensors, "o"), direct.out), 0.0);
  EXPECT_EQ(find(attended.tensors, "lse").to_vector<double>(), direct.lse.to_vector<double>());

  SafetensorsFile grad_o{"grad", {{"grad.o", Tensor::zeros({B, 1, H, V}, DType::F64)}}, {}};
  std::string e = error_of([&] { run_op("gated_delta_rule_decode", gdr_file, &grad_o); });
  EXPECT_NE(e.find("has no backward (a decoding step is inference only); drop --grad"),
            std::string::npos) << e;
}

TEST_F(OpRunner, ErrorsNameTheTensorTheOpAndTheFix) {
  Named in = gdr_inputs(DType::F64, false, false);
  // A missing input is named, with what the op takes.
  Named no_beta(in.begin(), in.end() - 1);
  std::string e = error_of([&] { run_op("gated_delta_rule", write("a.safetensors", no_beta), "", path("o")); });
  EXPECT_NE(e.find("has no tensor 'beta'"), std::string::npos) << e;
  EXPECT_NE(e.find("q, k, v, g, beta; optional h0, doc_ids"), std::string::npos) << e;
  // A float input whose dtype differs from q's.
  Named mixed = in;
  mixed[1].second = mixed[1].second.to(DType::F32);
  e = error_of([&] { run_op("gated_delta_rule", write("b.safetensors", mixed), "", path("o")); });
  EXPECT_NE(e.find("'k' is f32"), std::string::npos) << e;
  EXPECT_NE(e.find("q is f64"), std::string::npos) << e;
  // bf16 is a storage format: the op runs in f32 or f64.
  Named half = in;
  for (auto& [name, t] : half) t = t.to(DType::BF16);
  e = error_of([&] { run_op("gated_delta_rule", write("c.safetensors", half), "", path("o")); });
  EXPECT_NE(e.find("runs in f32 or f64"), std::string::npos) << e;
  // An unknown op lists the known ones, before any file is read.
  e = error_of([&] { run_op("gated_delta", path("missing.safetensors"), "", path("o")); });
  EXPECT_NE(e.find("unknown op 'gated_delta'"), std::string::npos) << e;
  EXPECT_NE(e.find("gated_delta_rule, gated_delta_rule_naive, routed_attention, routed_attention_naive"),
            std::string::npos) << e;
  // A tensor the op does not take (a typo) is not silently ignored.
  Named typo = in;
  typo.emplace_back("h_0", randn({B, H, K, V}, 20));
  e = error_of([&] { run_op("gated_delta_rule", write("d.safetensors", typo), "", path("o")); });
  EXPECT_NE(e.find("holds tensor 'h_0'"), std::string::npos) << e;
  // fit_error has no gradient; other grad names are listed.
  SafetensorsFile inputs{"in", in, {}}, fit{"grad", {{"grad.fit_error", Tensor::zeros({B, T, H}, DType::F64)}}, {}};
  e = error_of([&] { run_op("gated_delta_rule", inputs, &fit); });
  EXPECT_NE(e.find("accepted: grad.o, grad.h_final"), std::string::npos) << e;
  EXPECT_NE(e.find("fit_error has no gradient"), std::string::npos) << e;
  // An upstream gradient of the wrong shape.
  SafetensorsFile bad{"grad", {{"grad.o", Tensor::zeros({B, T, H, V + 1}, DType::F64)}}, {}};
  e = error_of([&] { run_op("gated_delta_rule", inputs, &bad); });
  EXPECT_NE(e.find("'grad.o' in grad is [2, 70, 2, 7] but output 'o' is [2, 70, 2, 6]"), std::string::npos) << e;
  // Forward-only references refuse --grad.
  SafetensorsFile grad_o{"grad", {{"grad.o", Tensor::zeros({B, T, H, V}, DType::F64)}}, {}};
  e = error_of([&] { run_op("gated_delta_rule_naive", inputs, &grad_o); });
  EXPECT_NE(e.find("has no backward"), std::string::npos) << e;
  // Shape errors come from the op's own checks.
  Named short_g = in;
  short_g[3].second = Tensor::zeros({B, T}, DType::F64);
  SafetensorsFile bad_g{"in", short_g, {}};
  e = error_of([&] { run_op("gated_delta_rule", bad_g, nullptr); });
  EXPECT_NE(e.find("g [2, 70] must be [B, T, H]"), std::string::npos) << e;
}

}  // namespace
}  // namespace ham
