#include "train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>

#include "autograd/node.h"
#include "models/transformer.h"

namespace ham {
namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.d_model = 32;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.d_ff = 64;
  return c;
}

TEST(Trainer, LossFallsOnTheEmbeddedCorpus) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.05, "embedded");
  Transformer model(small_config());
  TrainOptions opt;
  opt.steps = 60;
  opt.batch_size = 4;
  opt.seq_len = 32;
  opt.log_every = 20;
  opt.eval_every = 60;
  opt.eval_batches = 2;
  std::ostringstream log;
  TrainResult r = train(model, train_data, val_data, opt, log);
  EXPECT_NEAR(r.first_loss, std::log(257.0), 0.3) << log.str();
  EXPECT_LT(r.final_loss, 0.8 * r.first_loss) << log.str();
  EXPECT_LT(r.final_val_loss, r.initial_val_loss) << log.str();
  EXPECT_NE(log.str().find("tok/s"), std::string::npos);
}

TEST(Trainer, NonFiniteGradientStopsAndNamesTheParameter) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  Transformer model(small_config());
  Tensor w = model.parameter("layers.0.mlp.up.weight");
  register_hook(w, [](const Tensor& g) { return Tensor::full(g.shape(), NAN, g.dtype()); });
  Tensor before = w.clone();
  TrainOptions opt;
  opt.steps = 3;
  opt.batch_size = 2;
  opt.seq_len = 16;
  std::ostringstream log;
  try {
    train(model, train_data, val_data, opt, log);
    FAIL() << "expected the NaN gradient to stop training";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("layers.0.mlp.up.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step 1"), std::string::npos) << msg;
  }
  // The poisoned step changed nothing.
  EXPECT_EQ(w.to_vector<float>(), before.to_vector<float>());
}

TEST(Trainer, SkipNonFiniteKeepsGoing) {
  auto [train_data, val_data] = TokenStream::from_text(default_corpus(), 0.0, "embedded");
  Transformer model(small_config());
  Tensor w = model.parameter("lm_head.weight");
  int calls = 0;
  register_hook(w, [&calls](const Tensor& g) {
    return ++calls == 2 ? Tensor::full(g.shape(), INFINITY, g.dtype()) : Tensor();
  });
  TrainOptions opt;
  opt.steps = 4;
  opt.batch_size = 2;
  opt.seq_len = 16;
  opt.skip_nonfinite = true;
  std::ostringstream log;
  TrainResult r = train(model, train_data, val_data, opt, log);
  EXPECT_EQ(r.skipped_steps, 1);
  EXPECT_EQ(r.steps, 4);
  EXPECT_NE(log.str().find("skipped"), std::string::npos);
}

}  // namespace
}  // namespace ham
