#include "nn/swiglu.h"

#include <cmath>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/ops/swiglu.h"
#include "nn/elementwise.h"
#include "nn/reduce.h"
#include "nn/unary.h"
#include "tests/testing.h"

namespace ham {
namespace {

using testing::expect_gradcheck;
using testing::randn64;

// silu(g) u and its gradients written out in f64 from <cmath>.
struct SwigluReference {
  std::vector<double> out, dgate, dup;
};

SwigluReference reference(const Tensor& dout, const Tensor& gate, const Tensor& up) {
  const std::vector<double> d = dout.to_vector<double>(), g = gate.to_vector<double>(),
                            u = up.to_vector<double>();
  SwigluReference r;
  for (size_t i = 0; i < g.size(); ++i) {
    const double s = 1.0 / (1.0 + std::exp(-g[i]));
    r.out.push_back(g[i] * s * u[i]);
    r.dgate.push_back(d[i] * u[i] * s * (1.0 + g[i] * (1.0 - s)));
    r.dup.push_back(d[i] * g[i] * s);
  }
  return r;
}

void expect_near_all(const std::vector<double>& got, const std::vector<double>& want,
                     double relative, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], relative * (1.0 + std::abs(want[i]))) << what << " " << i;
  }
}

// The op against the formulas in f64 and f32, gates far into both tails included (where
// sigmoid is 0 or 1 to the last bit), 37 elements (no multiple of a packet: the padded tail).
TEST(Swiglu, MatchesTheFormulasForwardAndBackward) {
  for (DType dtype : {DType::F64, DType::F32}) {
    Tensor gate = randn64({37}, 1, 4.0, false).to(dtype);
    Tensor up = randn64({37}, 2, 1.0, false).to(dtype);
    Tensor dout = randn64({37}, 3, 1.0, false).to(dtype);
    const SwigluReference want = reference(dout, gate, up);
    const double tolerance = dtype == DType::F64 ? 1e-15 : 1e-6;
    const std::string what = dtype_name(dtype);
    expect_near_all(ops::swiglu(gate, up).to_vector<double>(), want.out, tolerance, what + " out");
    const ops::SwigluGrads g = ops::swiglu_backward(dout, gate, up, true, true);
    expect_near_all(g.dgate.to_vector<double>(), want.dgate, tolerance, what + " dgate");
    expect_near_all(g.dup.to_vector<double>(), want.dup, tolerance, what + " dup");
    // Each gradient alone is the same, bit for bit; the other stays undefined.
    const ops::SwigluGrads only_gate = ops::swiglu_backward(dout, gate, up, true, false);
    const ops::SwigluGrads only_up = ops::swiglu_backward(dout, gate, up, false, true);
    EXPECT_FALSE(only_gate.dup.defined());
    EXPECT_FALSE(only_up.dgate.defined());
    EXPECT_EQ(only_gate.dgate.to_vector<double>(), g.dgate.to_vector<double>()) << what;
    EXPECT_EQ(only_up.dup.to_vector<double>(), g.dup.to_vector<double>()) << what;
  }
}

// On the CPU the op is mul(silu(gate), up) bit for bit, value and both gradients, in f64
// and f32 (its kernels round as the unary silu and the product do), so fusing changes no
// CPU run's numbers.
TEST(Swiglu, EqualsSiluTimesUpBitForBitOnTheCpu) {
  for (DType dtype : {DType::F64, DType::F32}) {
    auto leaf = [&](uint64_t seed, double scale) {
      Tensor t = randn64({3, 37}, seed, scale, false).to(dtype);
      set_requires_grad(t);
      return t;
    };
    Tensor gate = leaf(4, 4.0), up = leaf(5, 1.0);
    Tensor gate2 = gate.clone(), up2 = up.clone();
    set_requires_grad(gate2);
    set_requires_grad(up2);
    Tensor weights = randn64({3, 37}, 8, 1.0, false).to(dtype);
    Tensor fused = swiglu(gate, up), composed = mul(silu(gate2), up2);
    EXPECT_EQ(fused.to_vector<double>(), composed.to_vector<double>()) << dtype_name(dtype);
    backward(sum(mul(fused, weights)));
    backward(sum(mul(composed, weights)));
    EXPECT_EQ(grad(gate).to_vector<double>(), grad(gate2).to_vector<double>())
        << dtype_name(dtype);
    EXPECT_EQ(grad(up).to_vector<double>(), grad(up2).to_vector<double>()) << dtype_name(dtype);
  }
}

TEST(Swiglu, Gradcheck) {
  expect_gradcheck(
      [](const std::vector<Tensor>& v) { return std::vector{swiglu(v[0], v[1])}; },
      {randn64({2, 3, 4}, 6, 2.0), randn64({2, 3, 4}, 7)});
}

TEST(Swiglu, BadInputsNameTheOpAndWhatIsWrong) {
  testing::expect_error([] { ops::swiglu(Tensor::zeros({2, 3}), Tensor::zeros({3, 2})); },
                        {"swiglu", "gate [2, 3]", "up [3, 2]", "shape"});
  testing::expect_error(
      [] { ops::swiglu(Tensor::zeros({4}), Tensor::zeros({4}, DType::F64)); },
      {"swiglu", "dtypes differ", "f32", "f64"});
  testing::expect_error([] { ops::swiglu(Tensor(), Tensor::zeros({4})); },
                        {"swiglu", "gate", "undefined"});
  testing::expect_error(
      [] { ops::swiglu(Tensor::zeros({4}, DType::I64), Tensor::zeros({4}, DType::I64)); },
      {"swiglu", "floating"});
  testing::expect_error(
      [] {
        ops::swiglu_backward(Tensor::zeros({5}), Tensor::zeros({4}), Tensor::zeros({4}), true,
                             true);
      },
      {"swiglu_backward", "dout [5]", "gate [4]"});
}

// The CUDA kernels against the CPU on fresh random inputs, f32, bf16 and f64: sizes with and
// without a tail past the 16-byte packs, a view one element in (the element-by-element
// kernels), each gradient alone and both, into NaN-poisoned outputs. Skips without a GPU.
TEST(Swiglu, GpuMatchesCpu) {
  HAM_SKIP_UNLESS_CUDA();
  const Device gpu = Device::cuda();
  uint64_t seed = 50;
  for (DType dtype : testing::kGpuDtypesAndF64) {
    for (int64_t n : {int64_t(1), int64_t(8), int64_t(4099), int64_t(70000)}) {
      for (bool offset : {false, true}) {
        auto make = [&](double scale) {
          Tensor whole = testing::random_tensor({n + 1}, dtype, gpu, seed++, scale);
          return offset ? whole.slice(1, n + 1) : whole.slice(0, n);
        };
        const Tensor gate = make(3.0), up = make(1.0), dout = make(1.0);
        const std::string what = std::string("swiglu ") + dtype_name(dtype) + " n " +
                                 std::to_string(n) + (offset ? " offset" : "");
        const Tensor gate_cpu = testing::cpu_reference(gate), up_cpu = testing::cpu_reference(up);
        const Tensor dout_cpu = testing::cpu_reference(dout);
        Tensor out = testing::poisoned({n}, dtype, gpu);
        swiglu_kernels()(gpu, gate, up, out);
        testing::expect_matches_reference(out, ops::swiglu(gate_cpu, up_cpu), dtype, what);
        const ops::SwigluGrads want = ops::swiglu_backward(dout_cpu, gate_cpu, up_cpu, true, true);
        for (int wanted = 0; wanted < 3; ++wanted) {  // both, dgate alone, dup alone
          Tensor dgate = wanted != 2 ? testing::poisoned({n}, dtype, gpu) : Tensor();
          Tensor dup = wanted != 1 ? testing::poisoned({n}, dtype, gpu) : Tensor();
          swiglu_backward_kernels()(gpu, dout, gate, up, dgate, dup);
          if (dgate.defined()) {
            testing::expect_matches_reference(dgate, want.dgate, dtype, what + " dgate");
          }
          if (dup.defined()) {
            testing::expect_matches_reference(dup, want.dup, dtype, what + " dup");
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace ham
