"""On a machine with several GPUs, NVML (utilization, free memory) numbers them by PCI bus and CUDA fastest
first: the engine's figures (model_loader.stats) must come from the GPU the model runs on, found by its UUID,
never by CUDA's index. (No GPU here: torch's device properties and NVML are set to what such a machine reports,
the two_gpus fixture.) The live panel's side: desktop/test_gpu_monitor.py."""

from types import SimpleNamespace

import torch


def test_the_utilization_is_the_model_gpus(two_gpus):
    from model_loader.stats import _nvml_utilization, gpu_uuid

    assert gpu_uuid(0) == "GPU-6b1c2a3e-0000-4000-8000-000000004070"
    assert _nvml_utilization(0) == 97  # the RTX 4070's, which NVML calls 1
    assert _nvml_utilization(1) == 3


def test_a_gpu_nvml_does_not_know_shows_nothing_rather_than_another(two_gpus, monkeypatch):
    from model_loader.stats import _nvml_utilization

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(uuid="not-a-gpu"))
    assert _nvml_utilization(0) is None
