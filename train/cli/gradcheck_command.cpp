// ham gradcheck: a model's loss gradient by autograd against central finite differences,
// per parameter tensor, in f64 on CPU (train/gradient_check.h has the method).
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "models/language_model.h"
#include "train/cli/commands.h"
#include "train/gradient_check.h"

namespace ham::cli {

namespace {

struct GradcheckArgs {
  std::string config_path;
  ModelGradcheckOptions options;
  int threads = 0;
};

int run_gradcheck(const GradcheckArgs& args) {
  use_threads(args.threads);
  ModelConfig config = ModelConfig::from_file(args.config_path);
  std::shared_ptr<LanguageModel> model = make_model(config);
  model->to(DType::F64);
  const ModelGradcheckOptions& o = args.options;
  TokenBatch batch = gradcheck_batch(config, o.batch_size, o.seq_len, o.seed);
  std::cout << fmt::format(
      "gradcheck: {} model ({}), {} parameters in {} tensors, f64; batch {} x {} (two documents "
      "per row), eps {:.1e}, {} entries per tensor, seed {}\n",
      family_name(config.family), args.config_path, model->num_parameters(),
      model->named_parameters().size(), o.batch_size, o.seq_len, o.eps,
      o.entries_per_tensor == 0 ? std::string("all") : std::to_string(o.entries_per_tensor), o.seed);
  ModelGradcheckReport report = check_model_gradients(*model, batch, o);
  std::cout << report.table();
  return report.passed ? 0 : 1;
}

}  // namespace

Command add_gradcheck_command(CLI::App& root) {
  auto args = std::make_shared<GradcheckArgs>();
  ModelGradcheckOptions& o = args->options;
  CLI::App* cmd = root.add_subcommand(
      "gradcheck",
      "Check a model's loss gradient against central finite differences, per parameter tensor, "
      "in f64 on CPU. Prints a table (gradient norm, entries checked, entries skipped because a "
      "probe flipped a HAM selection m_t = [e_t >= tau], relative error "
      "||autograd - numeric|| / max(||numeric||, 1e-3)) and exits 1 when a tensor exceeds the "
      "tolerance");
  cmd->add_option("config", args->config_path, "Model config JSON (e.g. configs/tiny/ham-fixed-tau.json)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--batch-size", o.batch_size, "Rows of random tokens")->capture_default_str();
  cmd->add_option("--seq-len", o.seq_len, "Tokens per row (two documents split at the middle)")
      ->capture_default_str();
  cmd->add_option("--entries", o.entries_per_tensor,
                  "Entries checked per tensor, seeded; half where autograd's gradient is non-zero "
                  "(0: every entry)")
      ->capture_default_str();
  cmd->add_option("--eps", o.eps, "Finite-difference step")->capture_default_str();
  cmd->add_option("--tolerance", o.tolerance, "Largest relative error a tensor may have")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the tokens and of the entries drawn")
      ->capture_default_str();
  add_threads_option(cmd, &args->threads);
  return {cmd, [args] { return run_gradcheck(*args); }};
}

}  // namespace ham::cli
