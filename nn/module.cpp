#include "nn/module.h"

#include <algorithm>
#include <map>
#include <string>

#include "autograd/node.h"

namespace ham {

void Module::register_parameter(const std::string& name, Tensor& slot, Tensor value) {
  HAM_CHECK(name.find('.') == std::string::npos, "parameter name '", name, "' contains a dot");
  for (const auto& [existing, _] : params_) {
    HAM_CHECK(existing != name, "parameter '", name, "' registered twice");
  }
  slot = std::move(value);
  set_requires_grad(slot);
  params_.emplace_back(name, &slot);
}

void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, Tensor*>>& out) const {
  for (const auto& [name, slot] : params_) out.emplace_back(prefix + name, slot);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor*>> Module::parameter_slots() const {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, slot] : parameter_slots()) out.emplace_back(name, *slot);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (const auto& [name, slot] : parameter_slots()) out.push_back(*slot);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, slot] : parameter_slots()) n += slot->numel();
  return n;
}

Tensor Module::parameter(const std::string& dotted_name) const {
  for (const auto& [name, slot] : parameter_slots()) {
    if (name == dotted_name) return *slot;
  }
  HAM_FAIL("no parameter named '", dotted_name, "'");
}

void Module::to(DType dtype) {
  const DType target = full_precision_ && dtype == DType::BF16 ? DType::F32 : dtype;
  for (const auto& [name, slot] : params_) {
    const bool kept = std::find(full_precision_slots_.begin(), full_precision_slots_.end(),
                                slot) != full_precision_slots_.end();
    const DType wanted = kept && target == DType::BF16 ? DType::F32 : target;
    if (slot->dtype() == wanted) continue;
    *slot = slot->to(wanted);
    set_requires_grad(*slot);
  }
  for (const auto& [name, child] : children_) child->to(target);
}

void Module::to(Device device) {
  for (const auto& [name, slot] : parameter_slots()) {
    if (slot->device() == device) continue;
    *slot = slot->to(device);
    set_requires_grad(*slot);
  }
}

void Module::load_parameters(const std::vector<std::pair<std::string, Tensor>>& values,
                             bool strict) {
  std::map<std::string, Tensor*> slots;
  for (const auto& [name, slot] : parameter_slots()) slots[name] = slot;
  std::map<std::string, bool> loaded;
  for (const auto& [name, value] : values) {
    auto it = slots.find(name);
    if (it == slots.end()) {
      HAM_CHECK(!strict, "load_parameters: unexpected parameter '", name, "'");
      continue;
    }
    Tensor& slot = *it->second;
    HAM_CHECK(slot.shape() == value.shape(), "load_parameters: '", name, "' has shape ",
              shape_str(value.shape()), ", the model expects ", shape_str(slot.shape()));
    slot.copy_(value.to(slot.dtype()).to(slot.device()));
    loaded[name] = true;
  }
  if (!strict) return;
  for (const auto& [name, slot] : slots) {
    HAM_CHECK(loaded.count(name), "load_parameters: parameter '", name, "' is missing (",
              slots.size() - loaded.size(), " of ", slots.size(), " missing)");
  }
}

void Module::zero_grad() const {
  for (const auto& [name, slot] : parameter_slots()) clear_grad(*slot);
}

}  // namespace ham
