"""FlexAttention's two calls, on shapes alone. As on the H200 (docs/gpu_results.md), its
default backward tiles do not fit where q/k and v head dims differ: the call fails unless
the script passes kernel_options, which exercises the scripts' retry with smaller tiles."""
from torch import Tensor


def create_block_mask(mask_mod, batch, heads, q_len, kv_len, device=None):
    mask_mod(Tensor(()), Tensor(()), Tensor(()), Tensor(()))  # the mask's expression runs
    return Tensor((batch, q_len, kv_len))


def flex_attention(q, k, v, block_mask=None, enable_gqa=False, kernel_options=None):
    if q.shape[1] != k.shape[1] and not enable_gqa:
        raise RuntimeError("flex_attention: query and key heads differ without enable_gqa")
    if q.shape[-1] != v.shape[-1] and not kernel_options:
        raise RuntimeError("No valid triton configs. OutOfResources: out of resource: "
                           "shared memory, Required: 248320, Hardware limit: 232448")
    return Tensor(q.shape[:-1] + v.shape[-1:])
