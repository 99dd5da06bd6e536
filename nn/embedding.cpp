#include "nn/embedding.h"

#include <string>

#include "autograd/function.h"
#include "core/ops/embedding.h"

namespace ham {

namespace {

class EmbeddingBackward final : public Node {
 public:
  Tensor ids;
  int64_t vocab_size = 0;
  std::string name() const override { return "EmbeddingBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    return {ops::embedding_backward(grads[0], ids, vocab_size)};
  }
  void release_saved() override { ids = Tensor(); }
};

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  Tensor y = ops::embedding(weight, ids);
  if (any_requires_grad({weight})) {
    auto node = std::make_shared<EmbeddingBackward>();
    node->ids = ids;
    node->vocab_size = weight.size(0);
    connect(node, {weight}, {&y});
  }
  return y;
}

}  // namespace ham
