#pragma once
// Named switches of a backend's kernels (the cuda/*.h setters, docs/kernel_settings.md),
// settable by name at run time, e.g. `ham train --set kernel.attention_backward_dq_keys=16`.
// A backend registers its settings at load time, as it registers its kernels; core knows
// none of them. Each applies to the whole process.
#include <functional>
#include <string>
#include <vector>

namespace ham {

struct KernelSetting {
  std::string name;    // the setter's name without "set_": attention_backward_dq_keys
  std::string values;  // what it takes, as errors say it: "32, 64 or 16"
  // Sets it from `value`; returns the previous value as text. A value it does not take is
  // a one-line error.
  std::function<std::string(const std::string& value)> set;
};

// Registers a setting; a second one of the same name is an error.
void register_kernel_setting(KernelSetting setting);

// Every registered setting, by name.
std::vector<KernelSetting> kernel_settings();

// Sets `name` to `value` and returns "NAME OLD -> NEW". Errors: a name no backend registered
// (with the names that are), a value the setting does not take (with what it takes).
std::string apply_kernel_setting(const std::string& name, const std::string& value);

// The same, returning the previous value alone, as the setting writes it ("32", "on").
std::string exchange_kernel_setting(const std::string& name, const std::string& value);

// One-line notes a backend writes about what its kernels chose at run time (the autotuner's
// choices, cuda/autotune.h). A program that shows them sets a sink (ham train writes them
// to its log); without one they are dropped. The sink is called from the thread that made
// the choice.
void set_kernel_note_sink(std::function<void(const std::string& line)> sink);
void write_kernel_note(const std::string& line);

// Text values of the settings: an integer (the whole text), or on/off (also true/false,
// 1/0). `what` names the setting in an error.
int parse_setting_int(const std::string& value, const std::string& what);
bool parse_setting_bool(const std::string& value, const std::string& what);

}  // namespace ham
