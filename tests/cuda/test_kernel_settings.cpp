// Kernel settings by name (core/kernel_settings.h): the registry's parsing and errors, the
// CUDA backend's registrations (cuda/kernel_settings.cpp) against the setters cuda/*.h
// declares, and docs/kernel_settings.md against the same setters.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/kernel_settings.h"
#include "tests/testing.h"

namespace ham {
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

// The setters cuda/*.h declare (a return type, then set_..., at the start of a line).
std::set<std::string> cuda_setters() {
  const std::regex declaration(R"(^[A-Za-z0-9_:]+ (set_[a-z0-9_]+)\()");
  std::set<std::string> declared;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(HAM_SOURCE_DIR) / "cuda")) {
    if (entry.path().extension() != ".h") continue;
    for (const std::string& name : captures(read_text(entry.path()), declaration)) {
      declared.insert(name);
    }
  }
  EXPECT_GE(declared.size(), 10u) << "the pattern no longer finds the setters in cuda/*.h";
  return declared;
}

// The names in `a` that `b` lacks, for a failure message.
std::string missing_from(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::string out;
  for (const std::string& name : a) {
    if (!b.count(name)) out += " " + name;
  }
  return out.empty() ? " (none)" : out;
}

TEST(KernelSettings, AppliesByNameAndNamesWhatIsWrong) {
  static int count = 1;
  static bool on = false;
  static const bool registered = [] {  // once a process, however often the test runs
    register_kernel_setting({"test_only_count", "1 to 3", [](const std::string& value) {
                               const int parsed = parse_setting_int(value, "test_only_count");
                               HAM_CHECK(parsed >= 1 && parsed <= 3, "test_only_count: ",
                                         parsed, " is out of range");
                               return std::to_string(std::exchange(count, parsed));
                             }});
    register_kernel_setting({"test_only_switch", "on or off", [](const std::string& value) {
                               const bool previous = std::exchange(
                                   on, parse_setting_bool(value, "test_only_switch"));
                               return std::string(previous ? "on" : "off");
                             }});
    return true;
  }();
  ASSERT_TRUE(registered);
  count = 1;
  on = false;
  EXPECT_EQ(apply_kernel_setting("test_only_count", "3"), "test_only_count 1 -> 3");
  EXPECT_EQ(count, 3);
  EXPECT_EQ(apply_kernel_setting("test_only_switch", "on"), "test_only_switch off -> on");
  EXPECT_EQ(apply_kernel_setting("test_only_switch", "false"), "test_only_switch on -> false");
  EXPECT_FALSE(on);
  testing::expect_error([] { apply_kernel_setting("test_only_cuont", "2"); },
                        {"unknown kernel setting 'test_only_cuont'", "test_only_count"});
  testing::expect_error([] { apply_kernel_setting("test_only_count", "2x"); },
                        {"test_only_count", "'2x' is not an integer", "takes 1 to 3"});
  testing::expect_error([] { apply_kernel_setting("test_only_count", "4"); },
                        {"test_only_count: 4 is out of range", "takes 1 to 3"});
  testing::expect_error([] { apply_kernel_setting("test_only_switch", "yes"); },
                        {"'yes' is not on or off", "takes on or off"});
  EXPECT_EQ(count, 3) << "a rejected value changed the setting";
  testing::expect_error(
      [] { register_kernel_setting({"test_only_count", "x", [](const std::string&) {
                                      return std::string();
                                    }}); },
      {"'test_only_count' is registered twice"});
}

// Where the CUDA backend is linked, each setter of cuda/*.h is settable by its name without
// "set_", and applying one changes what the setter holds.
TEST(KernelSettingsCuda, EverySetterOfTheCudaHeadersIsRegisteredByName) {
  HAM_SKIP_UNLESS_CUDA();
  std::set<std::string> registered, expected;
  for (const KernelSetting& setting : kernel_settings()) {
    if (setting.name.rfind("test_only_", 0) != 0) registered.insert("set_" + setting.name);
  }
  expected = cuda_setters();
  EXPECT_EQ(registered, expected) << "declared, not registered:"
                                  << missing_from(expected, registered)
                                  << "; registered, not declared:"
                                  << missing_from(registered, expected);
  // Each to another value and back to its default: the second reports the first's value.
  struct RoundTrip {
    std::string name, by_default, other;
  };
  for (const auto& [name, by_default, other] :
       {RoundTrip{"attention_backward_dq_keys", "32", "16"},
        RoundTrip{"gated_delta_rule_prepare_warps", "4", "8"},
        RoundTrip{"attention_backward_key_order", "off", "on"}}) {
    EXPECT_EQ(apply_kernel_setting(name, other), name + " " + by_default + " -> " + other);
    EXPECT_EQ(apply_kernel_setting(name, by_default), name + " " + other + " -> " + by_default);
  }
  testing::expect_error([] { apply_kernel_setting("attention_backward_dq_keys", "48"); },
                        {"set_attention_backward_dq_keys: 48", "takes 32, 64 or 16"});
}

// docs/kernel_settings.md has a row for every setter cuda/*.h declares (a table cell that
// starts with its name in backticks), and no row for one it does not.
TEST(KernelSettingsDoc, ListsEveryBackendSetter) {
  const std::set<std::string> declared = cuda_setters();
  const std::set<std::string> documented =
      captures(read_text(std::filesystem::path(HAM_SOURCE_DIR) / "docs" / "kernel_settings.md"),
               std::regex(R"(^\| `(set_[a-z0-9_]+)`)"));
  EXPECT_EQ(documented, declared) << "docs/kernel_settings.md lacks rows for"
                                  << missing_from(declared, documented)
                                  << "; and names setters no cuda/*.h declares:"
                                  << missing_from(documented, declared);
}

}  // namespace
}  // namespace ham
