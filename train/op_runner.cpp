#include "train/op_runner.h"

#include <algorithm>
#include <set>
#include <string>

#include <fmt/format.h>

#include "core/ops/gated_delta_rule.h"
#include "core/ops/gated_delta_rule_decode.h"
#include "core/ops/routed_attention.h"
#include "core/ops/routed_attention_decode.h"

namespace ham {

namespace {

constexpr const char* kFloat = "f32|f64 (all alike)";

OpSpec gated_delta_rule_spec(const std::string& name, const std::string& summary, bool backward) {
  return {name,
          summary,
          {{"q", "[B, T, H, K]", kFloat, true, backward},
           {"k", "[B, T, H, K]", kFloat, true, backward},
           {"v", "[B, T, H, V]", kFloat, true, backward},
           {"g", "[B, T, H]", kFloat, true, backward},
           {"beta", "[B, T, H]", kFloat, true, backward},
           {"h0", "[B, H, K, V]", kFloat, false, backward},
           {"doc_ids", "[B, T]", "i32 or i64", false, false}},
          {{"o", "[B, T, H, V]", kFloat, true, backward},
           {"h_final", "[B, H, K, V]", kFloat, true, backward},
           {"fit_error", "[B, T, H]", kFloat, true, false}},
          backward};
}

OpSpec routed_attention_spec(const std::string& name, const std::string& summary, bool backward) {
  return {name,
          summary,
          {{"q", "[B, T, Hq, Dk]", kFloat, true, backward},
           {"k", "[B, T, Hkv, Dk]", kFloat, true, backward},
           {"v", "[B, T, Hkv, Dv]", kFloat, true, backward},
           {"select", "[B, T]", "u8 (i32/i64 accepted: nonzero = selected)", true, false},
           {"value_scale", "[B, T]", kFloat, false, backward},
           {"doc_ids", "[B, T]", "i32 or i64", false, false},
           {"scale", "[] (0-d) or [1]", "f32 or f64 (or --scale)", false, false}},
          {{"o", "[B, T, Hq, Dv]", kFloat, true, backward}},
          backward};
}

OpSpec gated_delta_rule_decode_spec() {
  return {"gated_delta_rule_decode",
          "the decoding step: n tokens advance a carried state (the recurrence); forward only",
          {{"q", "[B, n, H, K]", kFloat, true, false},
           {"k", "[B, n, H, K]", kFloat, true, false},
           {"v", "[B, n, H, V]", kFloat, true, false},
           {"g", "[B, n, H]", kFloat, true, false},
           {"beta", "[B, n, H]", kFloat, true, false},
           {"state", "[B, H, K, V]", kFloat, true, false}},
          {{"o", "[B, n, H, V]", kFloat, true, false},
           {"fit_error", "[B, n, H]", kFloat, true, false},
           {"state", "[B, H, K, V]", kFloat, true, false}},
          false};
}

OpSpec routed_attention_decode_spec() {
  return {"routed_attention_decode",
          "n queries over a KV cache of C tokens, query i seeing the first visible[b, i]; "
          "forward only",
          {{"q", "[B, n, Hq, Dk]", kFloat, true, false},
           {"k_cache", "[B, C, Hkv, Dk]", kFloat, true, false},
           {"v_cache", "[B, C, Hkv, Dv]", kFloat, true, false},
           {"visible", "[B, n]", "i64 or i32, in [0, C]", true, false},
           {"value_scale", "[B, C]", kFloat, false, false},
           {"scale", "[] (0-d) or [1]", "f32 or f64 (or --scale)", false, false}},
          {{"o", "[B, n, Hq, Dv]", kFloat, true, false},
           {"lse", "[B, n, Hq]", kFloat, true, false}},
          false};
}

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// The inputs of one run, checked against the op's spec.
class OpInputs {
 public:
  OpInputs(const OpSpec& spec, const SafetensorsFile& file) : spec_(spec), file_(file) {
    std::set<std::string> known;
    for (const auto& in : spec.inputs) known.insert(in.name);
    for (const auto& [name, tensor] : file.tensors) {
      HAM_CHECK(known.count(name), "ham op ", spec.name, ": ", file.label, " holds tensor '", name,
                "', which ", spec.name, " does not take (inputs: ", describe_inputs(), ")");
    }
    for (const auto& in : spec.inputs) {
      HAM_CHECK(!in.required || file.contains(in.name), "ham op ", spec.name, ": ", file.label,
                " has no tensor '", in.name, "' (", spec.name, " takes ", describe_inputs(), ")");
    }
    // The run's dtype is q's; every other float input must match it.
    dtype_ = file.at("q").dtype();
    HAM_CHECK(dtype_ == DType::F32 || dtype_ == DType::F64, "ham op ", spec.name,
              ": runs in f32 or f64, but q is ", file.at("q").str());
    for (const auto& in : spec.inputs) {
      if (in.dtype != kFloat || !file.contains(in.name)) continue;
      const Tensor& t = file.at(in.name);
      HAM_CHECK(t.dtype() == dtype_, "ham op ", spec.name, ": '", in.name, "' is ", t.str(),
                " but q is ", dtype_name(dtype_), " (every float input must have q's dtype)");
    }
  }

  Tensor get(const std::string& name) const {
    return file_.contains(name) ? file_.at(name) : Tensor();
  }
  DType dtype() const { return dtype_; }

  std::string describe_inputs() const {
    std::vector<std::string> required, optional;
    for (const auto& in : spec_.inputs) (in.required ? required : optional).push_back(in.name);
    return join(required) + (optional.empty() ? "" : "; optional " + join(optional));
  }

 private:
  const OpSpec& spec_;
  const SafetensorsFile& file_;
  DType dtype_ = DType::F32;
};

// Upstream gradients grad.<output>: known names only, shapes and dtypes of the outputs;
// zeros for an output without one.
std::map<std::string, Tensor> read_upstream(const OpSpec& spec, const SafetensorsFile& upstream,
                                            const std::vector<std::pair<std::string, Tensor>>& outputs) {
  std::vector<std::string> accepted;
  for (const auto& out : spec.outputs) {
    if (out.differentiable) accepted.push_back("grad." + out.name);
  }
  for (const auto& [name, tensor] : upstream.tensors) {
    bool known = std::find(accepted.begin(), accepted.end(), name) != accepted.end();
    HAM_CHECK(known, "ham op ", spec.name, ": ", upstream.label, " holds '", name,
              "', which is not an upstream gradient of ", spec.name, " (accepted: ", join(accepted),
              name == "grad.fit_error" ? "; fit_error has no gradient: it feeds a hard threshold"
                                       : "",
              ")");
  }
  std::map<std::string, Tensor> grads;
  for (const auto& [name, output] : outputs) {
    std::string grad_name = "grad." + name;
    if (std::find(accepted.begin(), accepted.end(), grad_name) == accepted.end()) continue;
    if (!upstream.contains(grad_name)) {
      grads[name] = Tensor::zeros(output.shape(), output.dtype());
      continue;
    }
    const Tensor& g = upstream.at(grad_name);
    HAM_CHECK(g.shape() == output.shape(), "ham op ", spec.name, ": '", grad_name, "' in ",
              upstream.label, " is ", shape_str(g.shape()), " but output '", name, "' is ",
              shape_str(output.shape()));
    HAM_CHECK(g.dtype() == output.dtype(), "ham op ", spec.name, ": '", grad_name, "' in ",
              upstream.label, " is ", dtype_name(g.dtype()), " but the op runs in ",
              dtype_name(output.dtype()));
    grads[name] = g;
  }
  return grads;
}

// select as u8 0/1, from u8, i32 or i64 (nonzero = selected).
Tensor select_as_u8(const OpSpec& spec, const Tensor& select) {
  if (select.dtype() == DType::U8) return select;
  HAM_CHECK(select.dtype() == DType::I32 || select.dtype() == DType::I64, "ham op ", spec.name,
            ": 'select' must be u8 (or i32/i64), got ", select.str());
  std::vector<int64_t> values = select.to_vector<int64_t>();
  std::vector<uint8_t> flags(values.size());
  for (size_t i = 0; i < values.size(); ++i) flags[i] = values[i] != 0;
  return Tensor::from_vector(flags, select.shape());
}

double read_scale(const OpSpec& spec, const OpInputs& in, const OpOptions& options) {
  Tensor scale = in.get("scale");
  if (!scale.defined()) return options.scale.value_or(0.0);
  HAM_CHECK(!options.scale.has_value(), "ham op ", spec.name,
            ": the scale is given twice (a 'scale' tensor and --scale); give one");
  HAM_CHECK(scale.numel() == 1 && scale.dim() <= 1, "ham op ", spec.name,
            ": 'scale' must be a 0-d (or [1]) tensor, got ", scale.str());
  HAM_CHECK(scale.dtype() == DType::F32 || scale.dtype() == DType::F64, "ham op ", spec.name,
            ": 'scale' must be f32 or f64, got ", scale.str());
  return scale.item();
}

OpResult run_gated_delta_rule(const OpSpec& spec, const OpInputs& in,
                              const SafetensorsFile* upstream, bool chunked) {
  GatedDeltaRuleArgs args{in.get("q"), in.get("k"),  in.get("v"),      in.get("g"),
                          in.get("beta"), in.get("h0"), in.get("doc_ids")};
  ops::check_gated_delta_rule_args(spec.name.c_str(), args);
  GatedDeltaRuleResult r =
      chunked ? ops::gated_delta_rule_chunked(args) : ops::gated_delta_rule_naive(args);
  OpResult result;
  result.tensors = {{"o", r.o}, {"h_final", r.h_final}, {"fit_error", r.fit_error}};
  result.metadata["chunk_size"] = chunked ? std::to_string(kGatedDeltaRuleChunkSize) : "none";
  if (!upstream) return result;
  auto grads = read_upstream(spec, *upstream, result.tensors);
  GatedDeltaRuleGrads d = ops::gated_delta_rule_backward(args, grads.at("o"), grads.at("h_final"));
  result.tensors.insert(result.tensors.end(), {{"grad.q", d.dq},
                                               {"grad.k", d.dk},
                                               {"grad.v", d.dv},
                                               {"grad.g", d.dg},
                                               {"grad.beta", d.dbeta}});
  if (args.h0.defined()) result.tensors.emplace_back("grad.h0", d.dh0);
  return result;
}

OpResult run_routed_attention(const OpSpec& spec, const OpInputs& in, const SafetensorsFile* upstream,
                              const OpOptions& options, bool compacted) {
  Tensor q = in.get("q"), k = in.get("k"), v = in.get("v"), value_scale = in.get("value_scale");
  Tensor doc_ids = in.get("doc_ids");
  Tensor select = select_as_u8(spec, in.get("select"));
  double scale = read_scale(spec, in, options);
  ops::check_routed_attention_inputs(q, k, v, select, value_scale, doc_ids, scale);
  OpResult result;
  result.metadata["scale"] = fmt::format("{:.17g}", ops::routed_attention_scale(scale, q.size(3)));
  if (!compacted) {
    result.tensors = {{"o", ops::masked_attention_naive(q, k, v, select, value_scale, doc_ids, scale)}};
    return result;
  }
  CompactSelection selection = ops::compact_selection(select, doc_ids);
  ops::RoutedAttentionOutput r = ops::routed_attention_forward(q, k, v, selection, value_scale, scale);
  result.tensors = {{"o", r.out}};
  if (!upstream) return result;
  auto grads = read_upstream(spec, *upstream, result.tensors);
  ops::RoutedAttentionGrads d = ops::routed_attention_backward(grads.at("o"), q, k, v, selection,
                                                               r.out, r.lse, value_scale, scale);
  result.tensors.insert(result.tensors.end(), {{"grad.q", d.dq}, {"grad.k", d.dk}, {"grad.v", d.dv}});
  if (value_scale.defined()) result.tensors.emplace_back("grad.value_scale", d.dvalue_scale);
  return result;
}

OpResult run_gated_delta_rule_decode(const OpInputs& in) {
  Tensor state = in.get("state").clone();  // advanced in place: the input file's stays as read
  ops::GatedDeltaRuleStep r = ops::gated_delta_rule_decode(state, in.get("q"), in.get("k"),
                                                           in.get("v"), in.get("g"), in.get("beta"));
  OpResult result;
  result.tensors = {{"o", r.o}, {"fit_error", r.fit_error}, {"state", state}};
  return result;
}

OpResult run_routed_attention_decode(const OpSpec& spec, const OpInputs& in,
                                     const OpOptions& options) {
  const Tensor visible = in.get("visible");
  HAM_CHECK(visible.dtype() == DType::I64 || visible.dtype() == DType::I32, "ham op ", spec.name,
            ": 'visible' must be i64 or i32, got ", visible.str());
  const double scale = read_scale(spec, in, options);
  ops::RoutedAttentionOutput r = ops::routed_attention_decode(
      in.get("q"), in.get("k_cache"), in.get("v_cache"), visible.to(DType::I64),
      in.get("value_scale"), scale);
  OpResult result;
  result.metadata["scale"] =
      fmt::format("{:.17g}", ops::routed_attention_scale(scale, in.get("q").size(3)));
  result.tensors = {{"o", r.out}, {"lse", r.lse}};
  return result;
}

}  // namespace

const std::vector<OpSpec>& op_specs() {
  static const std::vector<OpSpec> specs = {
      gated_delta_rule_spec("gated_delta_rule",
                            "Gated DeltaNet recurrence, chunked (C = 64) forward with the fit "
                            "error, hand-derived backward",
                            true),
      gated_delta_rule_spec("gated_delta_rule_naive",
                            "the same recurrence token by token (the test reference); forward only",
                            false),
      routed_attention_spec("routed_attention",
                            "softmax attention over the selected tokens (compacted), with backward",
                            true),
      routed_attention_spec("routed_attention_naive",
                            "the same from the full [T, T] mask (the test reference); forward only",
                            false),
      gated_delta_rule_decode_spec(),
      routed_attention_decode_spec(),
  };
  return specs;
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const auto& spec : op_specs()) names.push_back(spec.name);
  return names;
}

const OpSpec& find_op_spec(const std::string& name) {
  for (const auto& spec : op_specs()) {
    if (spec.name == name) return spec;
  }
  HAM_FAIL("ham op: unknown op '", name, "' (known: ", join(op_names()), ")");
}

OpResult run_op(const std::string& name, const SafetensorsFile& inputs,
                const SafetensorsFile* upstream, const OpOptions& options) {
  const OpSpec& spec = find_op_spec(name);
  const bool decoding = name.size() > 7 && name.compare(name.size() - 7, 7, "_decode") == 0;
  HAM_CHECK(!upstream || spec.has_backward, "ham op ", name, ": has no backward (",
            decoding ? "a decoding step is inference only" : "it is a forward-only reference",
            "); drop --grad", decoding ? "" : " or run " + name.substr(0, name.rfind("_naive")));
  HAM_CHECK(!options.scale || spec.name.rfind("routed_attention", 0) == 0, "ham op ", name,
            ": --scale applies to routed_attention only");
  OpInputs in(spec, inputs);
  OpResult result;
  if (name == "gated_delta_rule" || name == "gated_delta_rule_naive") {
    result = run_gated_delta_rule(spec, in, upstream, name == "gated_delta_rule");
  } else if (name == "gated_delta_rule_decode") {
    result = run_gated_delta_rule_decode(in);
  } else if (name == "routed_attention_decode") {
    result = run_routed_attention_decode(spec, in, options);
  } else {
    result = run_routed_attention(spec, in, upstream, options, name == "routed_attention");
  }
  result.metadata["op"] = name;
  result.metadata["dtype"] = dtype_name(in.dtype());
  result.metadata["backward"] = upstream ? "true" : "false";
  return result;
}

OpResult run_op(const std::string& name, const std::string& in_path, const std::string& grad_path,
                const std::string& out_path, const OpOptions& options) {
  find_op_spec(name);  // an unknown name fails before any file is read
  SafetensorsFile inputs = load_safetensors(in_path);
  std::optional<SafetensorsFile> upstream;
  if (!grad_path.empty()) upstream = load_safetensors(grad_path);
  OpResult result = run_op(name, inputs, upstream ? &*upstream : nullptr, options);
  save_safetensors(out_path, result.tensors, result.metadata);
  return result;
}

}  // namespace ham
