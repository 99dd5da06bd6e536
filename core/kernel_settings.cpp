#include "core/kernel_settings.h"

#include <charconv>
#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace ham {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, KernelSetting> settings;
};

Registry& registry() {
  static Registry instance;  // backends register from their static initializers
  return instance;
}

}  // namespace

void register_kernel_setting(KernelSetting setting) {
  HAM_CHECK(!setting.name.empty() && setting.set, "register_kernel_setting: a setting needs a ",
            "name and a setter");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const std::string name = setting.name;
  HAM_CHECK(r.settings.emplace(name, std::move(setting)).second, "register_kernel_setting: '",
            name, "' is registered twice");
}

std::vector<KernelSetting> kernel_settings() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<KernelSetting> all;
  for (const auto& [name, setting] : r.settings) all.push_back(setting);
  return all;
}

std::string apply_kernel_setting(const std::string& name, const std::string& value) {
  return name + " " + exchange_kernel_setting(name, value) + " -> " + value;
}

std::string exchange_kernel_setting(const std::string& name, const std::string& value) {
  KernelSetting setting;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.settings.find(name);
    if (it == r.settings.end()) {
      std::string known;
      for (const auto& [other, unused] : r.settings) known += (known.empty() ? "" : ", ") + other;
      HAM_FAIL("unknown kernel setting '", name, "' (",
               known.empty() ? std::string("this build has none: it has no CUDA backend")
                             : "known: " + known,
               ")");
    }
    setting = it->second;
  }
  try {
    return setting.set(value);
  } catch (const std::exception& e) {
    HAM_FAIL(e.what(), " (", name, " takes ", setting.values, ")");
  }
}

namespace {

struct NoteSink {
  std::mutex mutex;
  std::function<void(const std::string&)> sink;
};

NoteSink& note_sink() {
  static NoteSink instance;
  return instance;
}

}  // namespace

void set_kernel_note_sink(std::function<void(const std::string& line)> sink) {
  NoteSink& n = note_sink();
  std::lock_guard<std::mutex> lock(n.mutex);
  n.sink = std::move(sink);
}

void write_kernel_note(const std::string& line) {
  NoteSink& n = note_sink();
  std::lock_guard<std::mutex> lock(n.mutex);
  if (n.sink) n.sink(line);
}

int parse_setting_int(const std::string& value, const std::string& what) {
  int parsed = 0;
  const char* end = value.data() + value.size();
  const auto [at, error] = std::from_chars(value.data(), end, parsed);
  HAM_CHECK(error == std::errc() && at == end && !value.empty(), what, ": '", value,
            "' is not an integer");
  return parsed;
}

bool parse_setting_bool(const std::string& value, const std::string& what) {
  if (value == "on" || value == "true" || value == "1") return true;
  if (value == "off" || value == "false" || value == "0") return false;
  HAM_FAIL(what, ": '", value, "' is not on or off");
}

}  // namespace ham
