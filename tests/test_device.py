"""The device and precision a model runs on (model_loader.device): the GPU picked among several, a GPU this
torch has no code for passed over or named, and the default precision per GPU generation. (This machine has no
GPU: torch's device queries are set to what a given machine reports, tests/gpu_machines.py.)"""

import pytest
import torch
from gpu_machines import GTX_1060, RTX_4070, machine

from model_loader.device import pick_dtype
from model_loader.errors import GpuUnsupportedError, ModelError


@pytest.mark.parametrize(
    "capability, expected",
    [
        ((9, 0), torch.bfloat16),
        ((8, 6), torch.bfloat16),
        ((7, 5), torch.bfloat16),
        ((7, 0), torch.float16),
        ((6, 1), torch.float16),
    ],
)
def test_the_default_precision_is_one_the_gpu_multiplies(monkeypatch, capability, expected):
    """bf16 from Turing on (emulated there by cuBLAS); fp16 on Pascal and Volta, whose cuBLAS refuses bf16 GEMMs
    although torch.cuda.is_bf16_supported() says yes (it only makes a tensor)."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert pick_dtype(torch.device("cuda"), None) is expected
    assert pick_dtype(torch.device("cuda"), "bf16") is torch.bfloat16  # an explicit choice is kept


def test_the_gpu_asked_for_is_the_one_checked(monkeypatch):
    """Two GPUs: an RTX 4070 (cuda:0) and a GTX 1060 (cuda:1) under the CUDA 13 build. Loading on cuda:1 names
    the GTX 1060; a GPU number the machine doesn't have is a clear error too."""
    from model_loader.device import pick_device

    machine(monkeypatch, [RTX_4070, GTX_1060])
    assert pick_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(GpuUnsupportedError, match="GTX 1060"):
        pick_device("cuda:1")
    with pytest.raises(ModelError, match="cuda:2 was requested but this machine has 2 NVIDIA GPU"):
        pick_device("cuda:2")


@pytest.mark.parametrize("device", ["auto", None, "cuda"])
def test_an_unsupported_first_gpu_is_passed_over_for_one_that_works(monkeypatch, device):
    """A desktop that kept its GTX 1060 (cuda:0) beside a new RTX 4070 (cuda:1): the default and a bare "cuda"
    run on the RTX 4070 instead of stopping at the first GPU and offering the CPU; the device comes back with
    its number, which the engine makes its threads' current device (Triton and CUDA graphs run there)."""
    from model_loader.device import pick_device

    machine(monkeypatch, [GTX_1060, RTX_4070])
    assert pick_device(device) == torch.device("cuda", 1)


def test_a_bare_cuda_is_numbered(monkeypatch):
    from model_loader.device import pick_device

    machine(monkeypatch, [RTX_4070, RTX_4070])
    assert pick_device("cuda") == torch.device("cuda", 0)  # CUDA's order: the first that works


def test_no_supported_gpu_names_the_first_and_counts_the_rest(monkeypatch):
    from model_loader.device import pick_device

    machine(monkeypatch, [GTX_1060, ((6, 1), "NVIDIA GeForce GTX 1070")])
    with pytest.raises(GpuUnsupportedError, match="GTX 1060 6GB.*whl/cu126.* other GPU is not supported either"):
        pick_device("auto")
