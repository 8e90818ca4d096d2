"""On a machine with several GPUs, NVML (utilization, free memory) numbers them by PCI bus and CUDA fastest
first: the live figures must come from the GPU the model runs on, found by its UUID, never by CUDA's index.
(No GPU here: torch's device properties and NVML are set to what such a machine reports.)"""

import sys
import types
from types import SimpleNamespace

import pytest
import torch

# CUDA's order (fastest first): cuda:0 the RTX 4070, cuda:1 the GTX 1060. NVML's (PCI bus): the other way round.
CUDA_UUIDS = ["6b1c2a3e-0000-4000-8000-000000004070", "0f9e8d7c-0000-4000-8000-000000001060"]
NVML = [  # (uuid, utilization %, free, total)
    ("GPU-0f9e8d7c-0000-4000-8000-000000001060", 3, 5 * 2**30, 6 * 2**30),
    ("GPU-6b1c2a3e-0000-4000-8000-000000004070", 97, 7 * 2**30, 12 * 2**30),
]


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(uuid=CUDA_UUIDS[index]))
    nvml = types.ModuleType("pynvml")
    handles = {uuid: (util, free, total) for uuid, util, free, total in NVML}

    def by_uuid(uuid):
        if uuid not in handles:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return uuid

    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetHandleByUUID = by_uuid
    nvml.nvmlDeviceGetHandleByIndex = lambda i: NVML[i][0]
    nvml.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=handles[h][0])
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(free=handles[h][1], total=handles[h][2])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


def test_the_utilization_is_the_model_gpus(two_gpus):
    from model_loader.stats import _nvml_utilization, gpu_uuid

    assert gpu_uuid(0) == "GPU-6b1c2a3e-0000-4000-8000-000000004070"
    assert _nvml_utilization(0) == 97  # the RTX 4070's, which NVML calls 1
    assert _nvml_utilization(1) == 3


def test_a_gpu_nvml_does_not_know_shows_nothing_rather_than_another(two_gpus, monkeypatch):
    from model_loader.stats import _nvml_utilization

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(uuid="not-a-gpu"))
    assert _nvml_utilization(0) is None


def test_the_live_panel_watches_the_gpu_it_is_told(two_gpus):
    from desktop.gpu_monitor import GpuMonitor

    monitor = GpuMonitor()
    assert monitor.poll() == (None, None, None, None)  # no model on a GPU yet
    monitor.select("GPU-6b1c2a3e-0000-4000-8000-000000004070")
    assert monitor.poll()[:3] == (97, 7 * 2**30, 12 * 2**30)
    monitor.select("GPU-0f9e8d7c-0000-4000-8000-000000001060")  # a model loaded on the other GPU
    assert monitor.poll()[:3] == (3, 5 * 2**30, 6 * 2**30)
    assert monitor.poll().clocks is None  # this NVML has no clock queries: the row says nothing
