// The `ham` command-line program: `ham <subcommand> --help` lists each one's options.
#include <iostream>

#include "train/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"ham: train and compare Transformer, GDN, GDN-GSA and HAM language models"};
  app.require_subcommand(1);
  std::vector<ham::cli::Command> commands = {
      ham::cli::add_train_command(app),
      ham::cli::add_info_command(app),
      ham::cli::add_tokenize_command(app),
      ham::cli::add_detokenize_command(app),
      ham::cli::add_train_tokenizer_command(app),
      ham::cli::add_op_command(app),
      ham::cli::add_generate_command(app),
      ham::cli::add_analyze_command(app),
      ham::cli::add_eval_command(app),
      ham::cli::add_gradcheck_command(app),
      ham::cli::add_compare_command(app),
  };
  CLI11_PARSE(app, argc, argv);
  try {
    for (const auto& command : commands) {
      if (command.app->parsed()) return command.run();
    }
  } catch (const std::exception& e) {
    std::cerr << "ham: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
