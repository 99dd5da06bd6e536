#include "train/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "core/file_io.h"
#include "core/safetensors.h"

namespace ham {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFile = "state.json";

void fsync_path(const fs::path& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  HAM_CHECK(fd >= 0, path.string(), ": cannot open to sync: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some filesystems refuse fsync on directories; the rename is still ordered after it.
  HAM_CHECK(rc == 0 || (directory && err == EINVAL), path.string(), ": fsync failed: ",
            std::strerror(err));
}

void write_text_file(const fs::path& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    HAM_CHECK(out, path.string(), ": cannot open for writing: ", std::strerror(errno));
    out << text;
    out.flush();
    HAM_CHECK(out, path.string(), ": write failed: ", std::strerror(errno));
  }
  fsync_path(path, false);
}

std::string step_dir_name(int64_t step) { return fmt::format("step-{:08d}", step); }

// Complete checkpoints in out_dir, oldest first.
std::vector<fs::path> complete_checkpoints(const fs::path& out_dir) {
  std::vector<fs::path> found;
  if (!fs::is_directory(out_dir)) return found;
  for (const auto& entry : fs::directory_iterator(out_dir)) {
    std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step-", 0) == 0 &&
        fs::exists(entry.path() / kStateFile)) {
      found.push_back(entry.path());
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

// The complete checkpoint just older than `dir` in the same output directory, if any.
std::optional<fs::path> checkpoint_before(fs::path dir) {
  if (dir.filename().empty()) dir = dir.parent_path();  // given with a trailing slash
  std::optional<fs::path> earlier;
  for (const fs::path& other : complete_checkpoints(dir.parent_path())) {
    if (other.filename() >= dir.filename()) break;
    earlier = other;
  }
  return earlier;
}

// Removes temporary directories left by writers that died mid-write (their pid is gone).
void remove_abandoned_temporaries(const fs::path& root) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(".tmp-step-", 0) != 0) continue;
    size_t dash = name.rfind('-');
    pid_t pid = pid_t(std::atol(name.c_str() + dash + 1));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) fs::remove_all(entry.path(), ec);
  }
}

}  // namespace

std::string checkpoint_temporary_dir(const std::string& out_dir, int64_t step, int64_t pid) {
  return (fs::path(out_dir) / fmt::format(".tmp-{}-{}", step_dir_name(step), pid)).string();
}

std::string save_checkpoint(const std::string& out_dir, int64_t step,
                            const CheckpointContents& contents, int64_t keep_last,
                            const std::function<void(const std::string&)>& write_more) {
  fs::path root(out_dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  HAM_CHECK(!ec, out_dir, ": cannot create the checkpoint directory: ", ec.message());
  remove_abandoned_temporaries(root);
  fs::path final_dir = root / step_dir_name(step);
  fs::path tmp_dir = checkpoint_temporary_dir(out_dir, step, ::getpid());
  fs::remove_all(tmp_dir);
  fs::create_directory(tmp_dir, ec);
  HAM_CHECK(!ec, tmp_dir.string(), ": cannot create: ", ec.message());
  try {
    save_safetensors((tmp_dir / "model.safetensors").string(), contents.model);
    save_safetensors((tmp_dir / "optimizer.safetensors").string(), contents.optimizer);
    if (!contents.tokenizer_json.empty()) write_text_file(tmp_dir / kTokenizerFile, contents.tokenizer_json);
    if (write_more) write_more(tmp_dir.string());
    // state.json last: its presence marks the checkpoint complete.
    write_text_file(tmp_dir / kStateFile, contents.state.dump(2));
    fsync_path(tmp_dir, true);
    if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a rerun of the same step
    fs::rename(tmp_dir, final_dir);
    fsync_path(root, true);
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    throw;
  }
  if (keep_last > 0) {
    std::vector<fs::path> all = complete_checkpoints(root);
    for (size_t i = 0; i + size_t(keep_last) < all.size(); ++i) fs::remove_all(all[i], ec);
  }
  return final_dir.string();
}

std::vector<std::string> list_checkpoints(const std::string& out_dir) {
  std::vector<std::string> out;
  for (const fs::path& dir : complete_checkpoints(out_dir)) out.push_back(dir.string());
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& out_dir) {
  std::vector<fs::path> all = complete_checkpoints(out_dir);
  if (all.empty()) return std::nullopt;
  return all.back().string();
}

void remove_checkpoints(const std::string& out_dir) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 || name.rfind(".tmp-step-", 0) == 0) {
      doomed.push_back(entry.path());
    }
  }
  HAM_CHECK(!ec || ec == std::errc::no_such_file_or_directory, out_dir, ": cannot list: ",
            ec.message());
  for (const fs::path& path : doomed) {
    fs::remove_all(path, ec);
    HAM_CHECK(!ec, path.string(), ": cannot remove: ", ec.message());
  }
}

nlohmann::json load_checkpoint_state(const std::string& path) {
  fs::path dir(path);
  HAM_CHECK(fs::exists(dir), path, ": no such checkpoint directory");
  if (!fs::exists(dir / kStateFile)) {
    auto latest = latest_checkpoint(path);
    HAM_CHECK(latest, path, ": holds no complete checkpoint (no step-*/", kStateFile, ")");
    dir = *latest;
  }
  std::ifstream in(dir / kStateFile);
  HAM_CHECK(in, (dir / kStateFile).string(), ": cannot open");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    HAM_FAIL((dir / kStateFile).string(), ": invalid JSON: ", e.what());
  }
  state["checkpoint_dir"] = dir.string();
  return state;
}

CheckpointContents load_checkpoint(const std::string& path) {
  CheckpointContents c;
  c.state = load_checkpoint_state(path);
  const fs::path dir(c.state.at("checkpoint_dir").get<std::string>());
  try {
    c.model = load_safetensors((dir / "model.safetensors").string()).tensors;
    c.optimizer = load_safetensors((dir / "optimizer.safetensors").string()).tensors;
  } catch (const Error& e) {
    // A damaged file (its checksum, say) need not cost the run: name the one before it.
    const std::optional<fs::path> earlier = checkpoint_before(dir);
    if (!earlier) throw;
    HAM_FAIL(e.what(), " (the checkpoint before it: ", earlier->string(), ")");
  }
  if (fs::exists(dir / kTokenizerFile)) c.tokenizer_json = read_file((dir / kTokenizerFile).string(), "the run's tokenizer");
  return c;
}

std::string tokenizer_file_text(const std::string& tokenizer) {
  return tokenizer == "bytes" ? std::string() : read_file(tokenizer, "the tokenizer file");
}

void export_weights(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& params,
                    const nlohmann::json& config, const std::string& tokenizer_json) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  HAM_CHECK(!ec, dir, ": cannot create: ", ec.message());
  save_safetensors((fs::path(dir) / "model.safetensors").string(), params,
                   {{"format", "ham"}});
  write_file_atomically((fs::path(dir) / "config.json").string(), config.dump(2));
  const fs::path tokenizer = fs::path(dir) / kTokenizerFile;
  if (!tokenizer_json.empty()) {
    write_file_atomically(tokenizer.string(), tokenizer_json);
  } else {
    fs::remove(tokenizer, ec);  // a bytes model: no tokenizer of an earlier export stays
    HAM_CHECK(!ec, tokenizer.string(), ": cannot remove: ", ec.message());
  }
}

}  // namespace ham
