#pragma once
// The `ham` subcommands. Each file registers one: its options live in the returned
// closure, which main() runs when that subcommand was chosen.
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

#include <CLI/CLI.hpp>

namespace ham::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// Shared by the subcommands (common_options.cpp).
// "" when `text` names a device (cpu, cuda, cuda:N), else why not: a CLI11 check.
std::string device_check(const std::string& text);
// A CLI11 check: "--flag: must be a whole number >= MINIMUM, got TEXT".
CLI::Validator whole_number_at_least(int64_t minimum);
// --threads N, N >= 1; without it OpenMP chooses. use_threads applies it.
CLI::Option* add_threads_option(CLI::App* cmd, int* threads);
void use_threads(int threads);
// An output path is made ready before the work whose results it will hold, so that a path
// that cannot be written fails at once and not after hours of training or evaluation:
// the directory (and its parents) is created and must be writable; for a file, its
// directory. `option` names the flag in the one-line error.
void prepare_output_directory(const std::string& dir, const std::string& option);
void prepare_output_file(const std::string& path, const std::string& option);
// Training on a GPU tunes its kernels by default: each tuned op times its bit-equal variants
// at the first call of a shape and keeps the fastest (cuda/autotune.h), as Triton's kernels
// autotune. A run that sets any kernel setting itself (--set kernel.NAME=VALUE) keeps the
// process's defaults instead. Returns the setting applied ("autotune off -> on") or "".
std::string tune_kernels_by_default(const std::string& device, bool kernel_settings_given);
// Writes the kernels' run-time notes (the autotuner's choices, one line each) to `out` as
// they are made, until it is destroyed.
class KernelNotesTo {
 public:
  explicit KernelNotesTo(std::ostream& out);
  ~KernelNotesTo();
  KernelNotesTo(const KernelNotesTo&) = delete;
  KernelNotesTo& operator=(const KernelNotesTo&) = delete;
};

Command add_train_command(CLI::App& root);  // train_command.cpp
Command add_info_command(CLI::App& root);   // info_command.cpp
Command add_tokenize_command(CLI::App& root);    // tokenize_command.cpp
Command add_detokenize_command(CLI::App& root);  // tokenize_command.cpp
Command add_train_tokenizer_command(CLI::App& root);  // tokenize_command.cpp
Command add_op_command(CLI::App& root);          // op_command.cpp
Command add_generate_command(CLI::App& root);    // generate_command.cpp
Command add_analyze_command(CLI::App& root);     // analyze_command.cpp
Command add_eval_command(CLI::App& root);        // eval_command.cpp
Command add_gradcheck_command(CLI::App& root);   // gradcheck_command.cpp
Command add_compare_command(CLI::App& root);     // compare_command.cpp

}  // namespace ham::cli
