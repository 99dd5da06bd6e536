"""torch.profiler's profile: two CUDA kernels and one CPU event, however many calls ran."""
import torch


class ProfilerActivity:
    CPU, CUDA = "cpu", "cuda"


class _Range:
    def __init__(self, us):
        self.us = us

    def elapsed_us(self):
        return self.us


class _Event:
    def __init__(self, name, device_type, us):
        self.name, self.device_type, self.time_range = name, device_type, _Range(us)


class profile:
    def __init__(self, activities=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def events(self):
        cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
        return [_Event("stand_in_kernel_a", cuda, 30.0), _Event("stand_in_kernel_b", cuda, 10.0),
                _Event("aten::stand_in_op", cpu, 5.0)]
