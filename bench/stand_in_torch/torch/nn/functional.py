"""torch.nn.functional's calls of bench/'s reference scripts, on shapes alone."""
from torch import Tensor


def normalize(x, dim=-1):
    return Tensor(x.shape)


softplus = normalize


def scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=False):
    """[B, H, T, D] in, as torch's; fails as torch does on heads that differ without
    enable_gqa, and under sdpa_kernel(FLASH_ATTENTION) on head dims that differ."""
    import torch.nn.attention as attention
    if q.shape[1] != k.shape[1] and not enable_gqa:
        raise RuntimeError("scaled_dot_product_attention: query and key heads differ")
    if attention.forced_backend == attention.SDPBackend.FLASH_ATTENTION and \
            not q.shape[-1] == k.shape[-1] == v.shape[-1]:
        raise RuntimeError("No available kernel: the flash backend needs one head dim")
    return Tensor(q.shape[:-1] + v.shape[-1:])
