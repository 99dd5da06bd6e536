"""A stand-in for torch, for run_reference.py: the calls bench/'s reference scripts make,
with tensors that carry a shape and no values, and CUDA events that always time
EVENT_MS. Nothing here computes anything."""

EVENT_MS = 2.0  # every timed region, in ms (run_reference.py checks the ratios against it)
__version__ = "stand-in"
bfloat16, float32, long = "bfloat16", "float32", "long"


class Tensor:
    def __init__(self, shape):
        self.shape = tuple(shape)

    def _same(self, *args, **kwargs):
        return Tensor(self.shape)

    to = detach = cuda = requires_grad_ = bfloat16 = _same
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _same
    __pow__ = __neg__ = __le__ = __eq__ = __and__ = _same

    def __getitem__(self, index):
        return Tensor(())

    def repeat_interleave(self, repeats, dim):
        shape = list(self.shape)
        shape[dim] *= repeats
        return Tensor(shape)


def _shape(args):
    return args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args


def randn(*shape, **kwargs):
    return Tensor(_shape(shape))


rand = randn


def zeros_like(tensor):
    return Tensor(tensor.shape)


def tensor(values, **kwargs):
    return Tensor((len(values),))


def from_numpy(array):
    return Tensor(array.shape)


def sigmoid(tensor):
    return Tensor(tensor.shape)


def compile(fn):
    return fn


class Generator:
    def __init__(self, device=None):
        pass

    def manual_seed(self, seed):
        return self


class no_grad:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Event:
    def __init__(self, enable_timing=False):
        pass

    def record(self):
        pass

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return EVENT_MS


class cuda:
    Event = _Event

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def empty_cache():
        pass

    @staticmethod
    def get_device_name():
        return "stand-in"


class autograd:
    class DeviceType:
        CPU, CUDA = "cpu", "cuda"

    @staticmethod
    def grad(outputs, inputs, grad_outputs=None, retain_graph=False):
        return tuple(Tensor(x.shape) for x in inputs)


class _dynamo:
    @staticmethod
    def reset():
        pass
