# flash-linear-attention 0.6.0's flags for its Hopper backward guard, set as on the H200
# (Triton 3.6), so that bench_gated_delta_rule_fla.py lifts the guard as it does there.
IS_NVIDIA_HOPPER = True
TRITON_ABOVE_3_4_0 = True
TRITON_ABOVE_3_7_1 = False
