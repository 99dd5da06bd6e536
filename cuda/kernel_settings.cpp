// The CUDA kernels' variant switches (the set_* functions of cuda/*.h), registered with
// core by name at load time, so that a run chooses them without a rebuild:
// `ham train --set kernel.attention_backward_dq_keys=16`. What each trades and what the H200
// has shown of it: docs/kernel_settings.md.
#include <cstdint>
#include <string>

#include "core/kernel_settings.h"
#include "cuda/autotune.h"
#include "cuda/conv1d.h"
#include "cuda/cublas.h"
#include "cuda/dependent_launch.h"
#include "cuda/gated_delta_rule.h"
#include "cuda/norm.h"
#include "cuda/routed_attention.h"

namespace ham::cuda {

namespace {

const char* on_off(bool on) { return on ? "on" : "off"; }

template <class Int>  // int, or int64_t (set_rms_norm_row_groups)
void add_int(const char* name, const char* values, Int (*set)(Int)) {
  register_kernel_setting({name, values, [name, set](const std::string& value) {
                             return std::to_string(set(parse_setting_int(value, name)));
                           }});
}

void add_bool(const char* name, bool (*set)(bool)) {
  register_kernel_setting({name, "on or off", [name, set](const std::string& value) {
                             return std::string(on_off(set(parse_setting_bool(value, name))));
                           }});
}

const bool registered = [] {
  add_bool("autotune", &set_autotune);
  add_bool("dependent_launches", &set_dependent_launches);
  add_int("attention_forward_rows", "128 or 64", &set_attention_forward_rows);
  add_int("attention_forward_keys", "64 or 32", &set_attention_forward_keys);
  add_int("attention_forward_wgmma", "-1 (automatic), 0 (mma.sync), 1 or 2 (wgmma warpgroups)",
          &set_attention_forward_wgmma);
  add_int("attention_forward_persistent",
          "0 (off), -1 (as many blocks as the SMs hold) or a block count",
          &set_attention_forward_persistent);
  add_int("attention_backward_wgmma", "-1 (automatic), 0 (mma.sync), 1 or 2 (wgmma warpgroups)",
          &set_attention_backward_wgmma);
  add_int("attention_backward_dq_keys", "32, 64 or 16", &set_attention_backward_dq_keys);
  add_bool("attention_backward_overlap", &set_attention_backward_overlap);
  add_bool("attention_backward_dq_records", &set_attention_backward_dq_records);
  add_int("attention_backward_dq_persistent",
          "0 (off), -1 (as many blocks as the SMs hold) or a block count",
          &set_attention_backward_dq_persistent);
  add_int("attention_backward_dkdv_persistent",
          "0 (off), -1 (as many blocks as the SMs hold) or a block count",
          &set_attention_backward_dkdv_persistent);
  add_bool("attention_backward_key_order", &set_attention_backward_key_order);
  add_bool("attention_backward_zeros_in_dq", &set_attention_backward_zeros_in_dq);
  add_int("attention_decode_keys", "0 (automatic), 8, 16, 32 or 64", &set_attention_decode_keys);
  add_bool("conv1d_spans", &set_conv1d_spans);
  add_int("conv1d_span_rows", "0 (automatic) or 1 to 4096", &set_conv1d_span_rows);
  add_int("gated_delta_rule_state_columns", "0 (automatic), 32 or 64",
          &set_gated_delta_rule_state_columns);
  add_bool("gated_delta_rule_backward_keys_ahead", &set_gated_delta_rule_backward_keys_ahead);
  add_int("gated_delta_rule_state_partial_sums", "1 or 2",
          &set_gated_delta_rule_state_partial_sums);
  add_int("gated_delta_rule_prepare_warps", "4 or 8", &set_gated_delta_rule_prepare_warps);
  add_int("gated_delta_rule_forward_windows", "1 to 64 windows",
          &set_gated_delta_rule_forward_windows);
  add_bool("gated_delta_rule_forward_prepare_windows",
           &set_gated_delta_rule_forward_prepare_windows);
  add_int("gated_delta_rule_output_prefetch", "0 (off), -1 (one wave) or the blocks a row",
          &set_gated_delta_rule_output_prefetch);
  add_int("gated_delta_rule_recompute_windows", "1 to 64 windows",
          &set_gated_delta_rule_recompute_windows);
  add_int("gated_delta_rule_backward_windows", "1 to 64 windows",
          &set_gated_delta_rule_backward_windows);
  add_bool("gated_delta_rule_backward_overlap", &set_gated_delta_rule_backward_overlap);
  add_bool("gated_delta_rule_one_slot", &set_gated_delta_rule_one_slot);
  register_kernel_setting({"matmul_allow_tf32", "on or off", [](const std::string& value) {
                             const bool previous = matmul_allows_tf32();
                             set_matmul_allow_tf32(parse_setting_bool(value, "matmul_allow_tf32"));
                             return std::string(on_off(previous));
                           }});
  add_int("rms_norm_row_groups", "0 (as many as fit) or a positive count",
          &set_rms_norm_row_groups);
  return true;
}();

}  // namespace

}  // namespace ham::cuda
