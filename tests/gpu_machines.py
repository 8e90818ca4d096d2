"""torch's (and NVML's) view of a given machine's GPUs, for tests on a machine without them (test_device,
test_doctor, test_gpu_support; the fixtures gtx_1060_with_cuda13_torch and two_gpus): their capabilities and names
in CUDA's order, the GPU code a torch build carries, and how NVML numbers them."""

import torch


# torch.cuda.get_arch_list() of real builds: PyPI's current Linux wheel (CUDA 13) and an older CUDA 12.4 one
CUDA13 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
CUDA124 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


def machine(monkeypatch, gpus: list[tuple[tuple[int, int], str]]):
    """torch's view of a machine with these GPUs (capability, name), in CUDA's order, and PyPI's CUDA 13 build."""

    def index(device) -> int:
        if device is None:
            return 0
        return device if isinstance(device, int) else (torch.device(device).index or 0)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(gpus))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: gpus[index(device)][0])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpus[index(device)][1])
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: CUDA13)
    monkeypatch.setattr(torch.version, "hip", None)


GTX_1060 = ((6, 1), "NVIDIA GeForce GTX 1060 6GB")
RTX_4070 = ((8, 9), "NVIDIA GeForce RTX 4070")


# CUDA's order (fastest first): cuda:0 the RTX 4070, cuda:1 the GTX 1060. NVML's (PCI bus): the other way round.
CUDA_UUIDS = ["6b1c2a3e-0000-4000-8000-000000004070", "0f9e8d7c-0000-4000-8000-000000001060"]
NVML = [  # (uuid, utilization %, free, total)
    ("GPU-0f9e8d7c-0000-4000-8000-000000001060", 3, 5 * 2**30, 6 * 2**30),
    ("GPU-6b1c2a3e-0000-4000-8000-000000004070", 97, 7 * 2**30, 12 * 2**30),
]
