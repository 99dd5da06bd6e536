// bf16 on the CPU (core/bf16_widening.h): kernels see f32 stand-ins of bf16 tensors, and
// what they write is rounded back into the caller's bf16 tensors.
#include <gtest/gtest.h>

#include <vector>

#include "core/dispatch.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/elementwise.h"
#include "core/ops/gated_delta_rule.h"
#include "core/ops/optim.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::random_tensor;

Tensor rounded(const Tensor& x) { return x.to(DType::BF16); }

// ---- kernels made up for the tests, behind the same widening as every CPU kernel ----

struct Seen {
  std::vector<DType> dtypes;
  std::vector<const TensorImpl*> impls;
};
Seen& seen() {
  static Seen s;
  return s;
}

// Records what it was given; out = a + 1.
void record_and_add_one(const Tensor& a, Tensor& out) {
  seen().dtypes = {a.dtype(), out.dtype()};
  seen().impls = {a.impl(), out.impl()};
  const float* pa = a.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i) po[i] = pa[i] + 1.0f;
}
HAM_DEFINE_KERNEL_TABLE(test_record_and_add_one, &record_and_add_one,
                        void(const Tensor& a, Tensor& out))

// Points its output at a tensor of its own instead of writing the one it was given.
void replace_output(const Tensor& a, Tensor& out) {
  out = Tensor::full(a.shape(), 2.5, DType::F32, a.device());
}
HAM_DEFINE_KERNEL_TABLE(test_replace_output, &replace_output, void(const Tensor& a, Tensor& out))

// Returns a value and fills a list of outputs.
int64_t fill_list(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_NE(inputs[i].dtype(), DType::BF16);
    EXPECT_NE(outputs[i].dtype(), DType::BF16);
    outputs[i].fill_(double(i) + 0.5);
  }
  return int64_t(inputs.size());
}
HAM_DEFINE_KERNEL_TABLE(test_fill_list, &fill_list,
                        int64_t(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs))

TEST(Bf16Widening, KernelsSeeF32AndOutputsAreRoundedBack) {
  Tensor a = rounded(random_tensor({5, 7}, DType::F32, Device::cpu(), 1));
  Tensor out = Tensor::zeros({5, 7}, DType::BF16);
  const void* storage = out.raw_data();
  test_record_and_add_one_kernels()(Device::cpu(), a, out);
  EXPECT_EQ(seen().dtypes, (std::vector<DType>{DType::F32, DType::F32}));
  EXPECT_EQ(out.dtype(), DType::BF16);
  EXPECT_EQ(out.raw_data(), storage);  // written in place, not replaced
  std::vector<float> want = a.to_vector<float>();
  for (float& v : want) v = bf16_to_float(float_to_bf16(v + 1.0f));
  EXPECT_EQ(out.to_vector<float>(), want);
}

TEST(Bf16Widening, WithoutBf16TheKernelGetsTheCallersTensors) {
  Tensor a = random_tensor({3}, DType::F32, Device::cpu(), 2);
  Tensor out = Tensor::zeros({3}, DType::F32);
  test_record_and_add_one_kernels()(Device::cpu(), a, out);
  EXPECT_EQ(seen().impls, (std::vector<const TensorImpl*>{a.impl(), out.impl()}));
}

TEST(Bf16Widening, InputsAreNotWrittenAndMixedDtypesKeepTheirOwn) {
  Tensor a = rounded(random_tensor({4}, DType::F32, Device::cpu(), 3));
  const std::vector<float> before = a.to_vector<float>();
  Tensor out = Tensor::zeros({4}, DType::F32);
  test_record_and_add_one_kernels()(Device::cpu(), a, out);
  EXPECT_EQ(a.to_vector<float>(), before);
  EXPECT_EQ(seen().impls[1], out.impl());  // the f32 output is the caller's own
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(out.to_vector<float>()[i], before[i] + 1.0f);
}

TEST(Bf16Widening, AReplacedOutputComesBackInBf16) {
  Tensor a = Tensor::zeros({2, 2}, DType::BF16);
  Tensor out = Tensor::zeros({2, 2}, DType::BF16);
  test_replace_output_kernels()(Device::cpu(), a, out);
  EXPECT_EQ(out.dtype(), DType::BF16);
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>(4, 2.5f)));
}

TEST(Bf16Widening, ListsAndReturnValues) {
  std::vector<Tensor> inputs = {Tensor::zeros({2}, DType::BF16), Tensor::zeros({3}, DType::F32)};
  std::vector<Tensor> outputs = {Tensor::zeros({2}, DType::BF16), Tensor::zeros({1}, DType::BF16)};
  EXPECT_EQ(test_fill_list_kernels()(Device::cpu(), inputs, outputs), 2);
  EXPECT_EQ(outputs[0].to_vector<float>(), (std::vector<float>{0.5f, 0.5f}));
  EXPECT_EQ(outputs[1].to_vector<float>(), (std::vector<float>{1.5f}));
}

// ---- real ops: bf16 equals the f32 kernel on the rounded inputs, rounded once ----

TEST(Bf16Widening, BinaryOpIsTheRoundedF32Result) {
  Tensor a = rounded(random_tensor({6, 9}, DType::F32, Device::cpu(), 4));
  Tensor b = rounded(random_tensor({9}, DType::F32, Device::cpu(), 5));
  Tensor got = ops::mul(a, b);
  EXPECT_EQ(got.dtype(), DType::BF16);
  EXPECT_EQ(got.to_vector<float>(),
            rounded(ops::mul(a.to(DType::F32), b.to(DType::F32))).to_vector<float>());
}

TEST(Bf16Widening, InPlaceUpdateOfABf16Tensor) {
  Tensor dst = rounded(random_tensor({100}, DType::F32, Device::cpu(), 6));
  Tensor src = rounded(random_tensor({100}, DType::F32, Device::cpu(), 7));
  Tensor want = dst.to(DType::F32);
  ops::axpy_(0.5, src.to(DType::F32), want);
  ops::axpy_(0.5, src, dst);
  EXPECT_EQ(dst.to_vector<float>(), rounded(want).to_vector<float>());
}

// cross_entropy_backward may write dlogits over logits (the fused linear cross-entropy
// does): one stand-in serves both, so the kernel still reads each logit before writing it.
TEST(Bf16Widening, ATensorPassedAsInputAndOutputGetsOneStandIn) {
  Tensor logits = rounded(random_tensor({4, 11}, DType::F32, Device::cpu(), 8));
  Tensor targets = Tensor::from_vector<int64_t>({3, 0, 10, 5}, {4});
  ops::CrossEntropyResult r = ops::cross_entropy(logits, targets, -100);
  Tensor one = Tensor::scalar(1.0, DType::F32);
  Tensor want = ops::cross_entropy_backward(logits.to(DType::F32), targets,
                                            r.lse.to(DType::F32), -100, one, 1.0);
  Tensor in_place = logits.clone();
  cross_entropy_backward_kernels()(Device::cpu(), in_place, targets, r.lse, -100, one, 1.0,
                                   in_place);
  EXPECT_EQ(in_place.to_vector<float>(), rounded(want).to_vector<float>());
}

// f32 parameter and moments with a bf16 gradient: the mixed-precision optimizer step.
TEST(Bf16Widening, AdamWWithABf16Gradient) {
  Tensor param = random_tensor({64}, DType::F32, Device::cpu(), 9);
  Tensor g = rounded(random_tensor({64}, DType::F32, Device::cpu(), 10));
  Tensor m = random_tensor({64}, DType::F32, Device::cpu(), 11, 0.1);
  Tensor v = ops::mul(m, m);
  Tensor param2 = param.clone(), m2 = m.clone(), v2 = v.clone();
  AdamWHyper hyper{1e-2, 0.9, 0.95, 1e-8, 0.1, 3};
  ops::adamw_step(param, g, m, v, hyper);
  ops::adamw_step(param2, g.to(DType::F32), m2, v2, hyper);
  EXPECT_EQ(param.dtype(), DType::F32);
  EXPECT_EQ(param.to_vector<float>(), param2.to_vector<float>());
  EXPECT_EQ(m.to_vector<float>(), m2.to_vector<float>());
}

// Structs of tensors (the gated delta rule's arguments and results) widen member by member.
TEST(Bf16Widening, GatedDeltaRuleInBf16IsTheRoundedF32Result) {
  const int64_t B = 1, T = 70, H = 2, K = 8, V = 6;
  auto input = [&](const Shape& s, uint64_t seed, double scale = 1.0, double mean = 0.0) {
    return rounded(random_tensor(s, DType::F32, Device::cpu(), seed, scale, mean));
  };
  GatedDeltaRuleArgs bf;
  bf.q = input({B, T, H, K}, 20, 0.3);
  bf.k = input({B, T, H, K}, 21, 0.3);
  bf.v = input({B, T, H, V}, 22);
  bf.g = input({B, T, H}, 23, 0.05, -0.1);
  bf.beta = input({B, T, H}, 24, 0.1, 0.5);
  GatedDeltaRuleArgs f32 = bf;
  for (Tensor* t : {&f32.q, &f32.k, &f32.v, &f32.g, &f32.beta}) *t = t->to(DType::F32);
  GatedDeltaRuleResult got = ops::gated_delta_rule_chunked(bf);
  GatedDeltaRuleResult want = ops::gated_delta_rule_chunked(f32);
  EXPECT_EQ(got.o.dtype(), DType::BF16);
  EXPECT_EQ(got.o.to_vector<float>(), rounded(want.o).to_vector<float>());
  EXPECT_EQ(got.h_final.to_vector<float>(), rounded(want.h_final).to_vector<float>());
  EXPECT_EQ(got.fit_error.to_vector<float>(), rounded(want.fit_error).to_vector<float>());
}

}  // namespace
}  // namespace ham
