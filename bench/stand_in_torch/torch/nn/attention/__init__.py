"""torch.nn.attention's SDPA backend selection: the stand-in SDPA fails as the forced
backend would (torch.nn.functional.scaled_dot_product_attention)."""


class SDPBackend:
    FLASH_ATTENTION = "flash"


forced_backend = None


class sdpa_kernel:
    def __init__(self, backend):
        self.backend = backend

    def __enter__(self):
        global forced_backend
        self.previous, forced_backend = forced_backend, self.backend
        return self

    def __exit__(self, *exc):
        global forced_backend
        forced_backend = self.previous
        return False
