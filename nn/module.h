#pragma once
// Module: a tree of named parameters. Names are dotted paths ("layers.3.mlp.up.weight"),
// the same in checkpoints, logs and gradient reports. Modules live behind shared_ptr and
// are neither copied nor moved, because the tree keeps pointers to their members.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ham {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter of this module and its children, in registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;
  // The parameter with this dotted name; throws listing nothing but the bad name.
  Tensor parameter(const std::string& dotted_name) const;

  // Replaces every parameter by a copy in `dtype`/on `device` (e.g. f64 for gradcheck).
  // to(bf16) leaves the parameters of full-precision modules (and their children) in f32.
  void to(DType dtype);
  void to(Device device);
  // Overwrites parameter values (shapes must match); used by checkpoint loading.
  void load_parameters(const std::vector<std::pair<std::string, Tensor>>& values,
                       bool strict = true);
  void zero_grad() const;

 protected:
  // Under mixed precision (to(bf16)) this module keeps f32 parameters; its forward must
  // accept bf16 inputs (cast them). For small, precision-sensitive parts such as HAM's
  // learned routers.
  void keep_full_precision() { full_precision_ = true; }
  // The same for one registered parameter (by its member slot), e.g. Gated DeltaNet's
  // A_log and dt_bias, from which the f32 log-decay gates are computed.
  void keep_full_precision(const Tensor& slot) { full_precision_slots_.push_back(&slot); }
  // `slot` must be a member of the module: the tree keeps its address.
  void register_parameter(const std::string& name, Tensor& slot, Tensor value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> child) {
    children_.emplace_back(name, child);
    return child;
  }

 private:
  void collect(const std::string& prefix,
               std::vector<std::pair<std::string, Tensor*>>& out) const;
  std::vector<std::pair<std::string, Tensor*>> parameter_slots() const;

  std::vector<std::pair<std::string, Tensor*>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool full_precision_ = false;
  std::vector<const Tensor*> full_precision_slots_;
};

}  // namespace ham
