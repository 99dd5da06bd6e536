// docs/kernel_settings.md against the CUDA headers: every setter they declare has a row
// there, and every setter a row names is declared. Reads the sources only (no GPU).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path << ": cannot be read";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Each capture of `pattern`'s first group, matched line by line.
std::set<std::string> captures(const std::string& text, const std::regex& pattern) {
  std::set<std::string> found;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::smatch match;
    if (std::regex_search(line, match, pattern)) found.insert(match[1]);
  }
  return found;
}

std::string listed(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += " " + name;
  return out.empty() ? " (none)" : out;
}

TEST(KernelSettingsDoc, ListsEverySetterOfTheCudaHeaders) {
  const std::filesystem::path root = HAM_SOURCE_DIR;
  // A declaration: a return type, then set_..., at the start of a line.
  const std::regex declaration(R"(^[A-Za-z0-9_:]+ (set_[a-z0-9_]+)\()");
  std::set<std::string> declared;
  for (const auto& entry : std::filesystem::directory_iterator(root / "cuda")) {
    if (entry.path().extension() != ".h") continue;
    for (const std::string& name : captures(read_text(entry.path()), declaration)) {
      declared.insert(name);
    }
  }
  ASSERT_GE(declared.size(), 10u) << "the pattern no longer finds the setters in cuda/*.h";
  // A row: a table cell that starts with the setter's name in backticks.
  const std::set<std::string> documented = captures(
      read_text(root / "docs" / "kernel_settings.md"), std::regex(R"(^\| `(set_[a-z0-9_]+)`)"));
  std::set<std::string> missing, stale;
  for (const std::string& name : declared) {
    if (!documented.count(name)) missing.insert(name);
  }
  for (const std::string& name : documented) {
    if (!declared.count(name)) stale.insert(name);
  }
  EXPECT_TRUE(missing.empty()) << "docs/kernel_settings.md has no row for" << listed(missing);
  EXPECT_TRUE(stale.empty()) << "docs/kernel_settings.md names setters no cuda/*.h declares:"
                             << listed(stale);
}

}  // namespace
