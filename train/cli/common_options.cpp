// Options and checks every subcommand shares: --threads, --device, output paths that are
// created before the work whose results they will hold, and the kernels' default tuning.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/kernel_settings.h"
#include "train/cli/commands.h"

namespace ham::cli {

namespace fs = std::filesystem;

std::string device_check(const std::string& text) {
  try {
    Device::parse(text);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string();
}

CLI::Validator whole_number_at_least(int64_t minimum) {
  auto check = [minimum](const std::string& text) {
    int64_t value = 0;
    const bool is_whole = CLI::detail::lexical_cast(text, value);
    return is_whole && value >= minimum
               ? std::string()
               : "must be a whole number >= " + std::to_string(minimum) + ", got " + text;
  };
  return CLI::Validator(check, "INT>=" + std::to_string(minimum));
}

CLI::Option* add_threads_option(CLI::App* cmd, int* threads) {
  return cmd->add_option("--threads", *threads, "CPU threads (default: OpenMP's choice)")
      ->check(whole_number_at_least(1));
}

void use_threads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}

void prepare_output_directory(const std::string& dir, const std::string& option) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  HAM_CHECK(!ec, option, " ", dir, ": cannot create the directory: ", ec.message());
  HAM_CHECK(fs::is_directory(dir), option, " ", dir, ": exists and is not a directory");
  HAM_CHECK(::access(dir.c_str(), W_OK) == 0, option, " ", dir, ": not writable: ",
            std::strerror(errno));
}

void prepare_output_file(const std::string& path, const std::string& option) {
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    HAM_CHECK(!ec, option, " ", path, ": cannot create its directory ", parent.string(), ": ",
              ec.message());
  }
  HAM_CHECK(!fs::is_directory(path), option, " ", path, ": is a directory, not a file");
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  HAM_CHECK(::access(dir.c_str(), W_OK) == 0, option, " ", path, ": its directory ", dir,
            " is not writable: ", std::strerror(errno));
}

std::string tune_kernels_by_default(const std::string& device, bool kernel_settings_given) {
  if (kernel_settings_given || !Device::parse(device).is_cuda()) return "";
  // Without a CUDA backend there is no autotuner; the run then fails where it asks for the
  // device, with that error.
  const std::vector<KernelSetting> settings = kernel_settings();
  const bool has_autotune = std::any_of(settings.begin(), settings.end(), [](const auto& s) {
    return s.name == "autotune";
  });
  return has_autotune ? apply_kernel_setting("autotune", "on") : "";
}

KernelNotesTo::KernelNotesTo(std::ostream& out) {
  set_kernel_note_sink([&out](const std::string& line) { out << line << "\n"; });
}

KernelNotesTo::~KernelNotesTo() { set_kernel_note_sink(nullptr); }

}  // namespace ham::cli
