// ham info: a model's parameters, by name and in total.
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "models/language_model.h"
#include "nn/layers.h"
#include "train/cli/commands.h"

namespace ham::cli {

namespace {

struct InfoArgs {
  std::string config_path;
  bool list = false;
};

int run_info(const InfoArgs& args) {
  ModelConfig config = args.config_path.empty() ? ModelConfig{} : ModelConfig::from_file(args.config_path);
  SkipInitGuard structure_only;  // shapes only: no time spent filling 800M weights
  auto model = make_model(config);
  if (args.list) {
    for (const auto& [name, p] : model->named_parameters()) {
      std::cout << fmt::format("  {:<48} {}\n", name, shape_str(p.shape()));
    }
  }
  std::cout << fmt::format("{} model: {} parameters\n", family_name(config.family),
                           model->num_parameters());
  return 0;
}

}  // namespace

Command add_info_command(CLI::App& root) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* cmd = root.add_subcommand("info", "Print a model's parameter count");
  cmd->add_option("config", args->config_path, "Model config JSON (default: the tiny built-in Transformer)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--list", args->list, "List every parameter with its shape");
  return {cmd, [args] { return run_info(*args); }};
}

}  // namespace ham::cli
