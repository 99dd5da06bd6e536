#include "nn/layers.h"

#include <string>

#include "autograd/node.h"
#include "tests/testing.h"

namespace ham {
namespace {

class TwoLayer : public Module {
 public:
  explicit TwoLayer(Generator& gen) {
    first = register_module("first", std::make_shared<Linear>(3, 4, true, gen));
    norm = register_module("norm", std::make_shared<RMSNorm>(4, 1e-6));
    mlp = register_module("mlp", std::make_shared<SwiGLU>(4, 6, gen));
  }
  std::shared_ptr<Linear> first;
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<SwiGLU> mlp;
};

TEST(Module, DottedNamesInRegistrationOrder) {
  Generator gen(1);
  TwoLayer m(gen);
  std::vector<std::string> names;
  for (const auto& [name, p] : m.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"first.weight", "first.bias", "norm.weight",
                                             "mlp.gate.weight", "mlp.up.weight",
                                             "mlp.down.weight"}));
  EXPECT_EQ(m.num_parameters(), 12 + 4 + 4 + 24 + 24 + 24);
  for (const Tensor& p : m.parameters()) EXPECT_TRUE(requires_grad(p));
}

TEST(Module, SameSeedSameWeights) {
  Generator g1(42), g2(42);
  TwoLayer a(g1), b(g2);
  EXPECT_EQ(a.parameter("mlp.up.weight").to_vector<float>(),
            b.parameter("mlp.up.weight").to_vector<float>());
}

TEST(Module, ToF64ConvertsEveryParameterAndKeepsGrad) {
  Generator gen(2);
  TwoLayer m(gen);
  m.to(DType::F64);
  for (const auto& [name, p] : m.named_parameters()) {
    EXPECT_EQ(p.dtype(), DType::F64) << name;
    EXPECT_TRUE(requires_grad(p)) << name;
  }
  EXPECT_EQ(m.first->weight.dtype(), DType::F64);  // the member itself was replaced
}

TEST(Module, LoadParametersChecksNamesAndShapes) {
  Generator gen(3);
  TwoLayer a(gen), b(gen);
  b.load_parameters(a.named_parameters());
  EXPECT_EQ(b.parameter("first.weight").to_vector<float>(),
            a.parameter("first.weight").to_vector<float>());
  try {
    b.load_parameters({{"first.weight", Tensor::zeros({2, 2})}}, /*strict=*/false);
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("first.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 2]"), std::string::npos) << msg;
  }
  EXPECT_THROW(b.load_parameters({{"nope", Tensor::zeros({1})}}), Error);
  EXPECT_THROW(b.load_parameters({{"first.weight", Tensor::zeros({4, 3})}}), Error);  // missing rest
}

TEST(Layers, SwiGLUGradcheck) {
  Generator gen(4);
  SwiGLU mlp(3, 5, gen, InitOptions{0.5});
  mlp.to(DType::F64);
  Tensor x = testing::randn64({2, 3}, 5);
  std::vector<Tensor> inputs = {x};
  for (const Tensor& p : mlp.parameters()) inputs.push_back(p);
  testing::expect_gradcheck([&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{mlp.forward(in[0])};
  }, inputs);
}

}  // namespace
}  // namespace ham
