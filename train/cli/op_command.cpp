// ham op: run one op from safetensors files (forward, and backward given upstream
// gradients), so another implementation can be compared tensor by tensor. docs/ops.md.
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "train/cli/commands.h"
#include "train/op_runner.h"

namespace ham::cli {

namespace {

struct OpArgs {
  std::string name, in_path, grad_path, out_path;
  double scale = 0;
  bool list = false;
};

void print_op_list() {
  for (const auto& spec : op_specs()) {
    std::cout << fmt::format("{}: {}\n", spec.name, spec.summary);
    for (const auto& in : spec.inputs) {
      std::cout << fmt::format("  in  {:<12} {:<16} {}{}{}\n", in.name, in.shape, in.dtype,
                               in.required ? "" : ", optional",
                               in.differentiable ? ", gets grad." + in.name : "");
    }
    for (const auto& out : spec.outputs) {
      std::cout << fmt::format("  out {:<12} {:<16} {}{}\n", out.name, out.shape, out.dtype,
                               out.differentiable ? ", takes grad." + out.name : "");
    }
  }
}

int run_op_command(const OpArgs& args, bool scale_given) {
  if (args.list) {
    print_op_list();
    return 0;
  }
  HAM_CHECK(!args.name.empty() && !args.in_path.empty() && !args.out_path.empty(),
            "ham op: give NAME, --in and --out (ham op --list shows the ops)");
  OpOptions options;
  if (scale_given) options.scale = args.scale;
  OpResult result = run_op(args.name, args.in_path, args.grad_path, args.out_path, options);
  std::cout << fmt::format("{} ({}, {}): wrote {} tensors to {}\n", args.name,
                           result.metadata["dtype"],
                           args.grad_path.empty() ? "forward" : "forward and backward",
                           result.tensors.size(), args.out_path);
  for (const auto& [name, tensor] : result.tensors) {
    std::cout << fmt::format("  {:<18} {}\n", name, tensor.str());
  }
  return 0;
}

}  // namespace

Command add_op_command(CLI::App& root) {
  auto args = std::make_shared<OpArgs>();
  CLI::App* cmd = root.add_subcommand(
      "op", "Run one op on tensors from a safetensors file (forward, and backward with --grad)");
  cmd->add_option("name", args->name, "Op name (--list shows them)");
  cmd->add_option("--in", args->in_path, "Inputs, named after the op's arguments")
      ->check(CLI::ExistingFile);
  cmd->add_option("--grad", args->grad_path,
                  "Upstream gradients grad.<output>; runs the backward and writes grad.<input>")
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", args->out_path, "Where to write the outputs (and gradients)");
  CLI::Option* scale = cmd->add_option(
      "--scale", args->scale, "routed_attention softmax scale (default 1/sqrt(head_dim))");
  cmd->add_flag("--list", args->list, "List the ops with their tensor names, shapes and dtypes");
  return {cmd, [args, scale] { return run_op_command(*args, scale->count() > 0); }};
}

}  // namespace ham::cli
