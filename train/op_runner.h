#pragma once
// `ham op`: run one op on tensors read from a safetensors file, forward and, when upstream
// gradients are given, backward; write the outputs and the gradients `grad.<input>` to
// another safetensors file. Tensor names are the op's argument names, so another
// implementation (FLA, PyTorch) can be compared with this one tensor by tensor.
// docs/ops.md lists every op with its tensors, shapes and dtypes.
//
// Rules shared by every op:
//   * floating inputs must all have q's dtype, f32 or f64; the op runs in that dtype;
//   * a required input that is missing, or a tensor whose name the op does not know, is
//     an error naming the file, the tensor and the names the op accepts;
//   * upstream gradients are named grad.<output> (grad.o, grad.h_final); an output without
//     one gets zeros; they must match the output's shape and dtype;
//   * gradients are written for every differentiable input given (grad.h0 only with h0).
// The ops run on the CPU (the reference kernels).
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/safetensors.h"

namespace ham {

struct OpTensorSpec {
  std::string name;
  std::string shape;  // e.g. "[B, T, H, K]"
  std::string dtype;  // "float" (the run's dtype), "i32/i64", "u8", ...
  bool required = true;
  bool differentiable = false;  // an input with grad.<name>, or an output taking grad.<name>
};

struct OpSpec {
  std::string name;
  std::string summary;
  std::vector<OpTensorSpec> inputs;
  std::vector<OpTensorSpec> outputs;
  bool has_backward = true;
};

// Every op `ham op` runs, in the order `ham op --help` and the errors list them.
const std::vector<OpSpec>& op_specs();
std::vector<std::string> op_names();
// Throws "ham op: unknown op 'x' (known: a, b, ...)".
const OpSpec& find_op_spec(const std::string& name);

struct OpOptions {
  // routed_attention's softmax scale (0 = 1/sqrt(head_dim)); or a 0-d tensor "scale" in
  // the inputs file (giving both is an error).
  std::optional<double> scale;
};

struct OpResult {
  std::vector<std::pair<std::string, Tensor>> tensors;  // outputs, then grad.<input>
  std::map<std::string, std::string> metadata;          // op, dtype, and e.g. the scale used
};

// In memory: `upstream` null means forward only.
OpResult run_op(const std::string& name, const SafetensorsFile& inputs,
                const SafetensorsFile* upstream, const OpOptions& options = {});

// From files: `grad_path` empty means forward only. Writes `out_path` and returns what it
// wrote.
OpResult run_op(const std::string& name, const std::string& in_path, const std::string& grad_path,
                const std::string& out_path, const OpOptions& options = {});

}  // namespace ham
