"""flash-linear-attention's chunk_gated_delta_rule and fused_recurrent_gated_delta_rule, on
shapes alone, with the parameters the scripts pass (the scripts keep those a signature
names)."""
from torch import Tensor


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                           output_final_state=False, cu_seqlens=None):
    batch, _, heads, key_dim = q.shape
    sequences = batch if cu_seqlens is None else cu_seqlens.shape[0] - 1
    final = Tensor((sequences, heads, key_dim, v.shape[-1])) if output_final_state else None
    return Tensor(v.shape), final


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                     output_final_state=False, cu_seqlens=None):
    batch, _, heads, key_dim = q.shape
    if initial_state is not None and initial_state.shape != (batch, heads, key_dim, v.shape[-1]):
        raise ValueError(f"initial_state {initial_state.shape} for q {q.shape}, v {v.shape}")
    final = Tensor((batch, heads, key_dim, v.shape[-1])) if output_final_state else None
    return Tensor(v.shape), final
