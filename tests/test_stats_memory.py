"""model_loader.stats beyond the percentiles: the decode context a reply's steps read, a GPU's NVML name and handle,
and memory_stats() on the CPU and on a CUDA device (torch's counters set to what a GPU reports; no GPU needed)."""

from types import SimpleNamespace

import pytest
import torch

from model_loader.stats import decode_context, gpu_uuid, memory_stats, nvml_handle

GiB = 2**30


@pytest.mark.parametrize(
    "prompt_tokens, new_tokens, expected",
    [
        (100, 0, 0.0),  # no token at all
        (100, 1, 0.0),  # the prefill made the only token: no decode step
        (100, 2, 101.0),  # one step, reading prompt + 1
        (100, 11, 105.5),  # ten steps reading 101 ... 110
        (0, 4, 2.0),
    ],
)
def test_the_decode_context_is_the_average_cache_a_decode_step_reads(prompt_tokens, new_tokens, expected):
    assert decode_context(prompt_tokens, new_tokens) == expected


@pytest.mark.parametrize(
    "torch_uuid, nvml_name",
    [
        ("6b1c2a3e-0000-4000-8000-000000004070", "GPU-6b1c2a3e-0000-4000-8000-000000004070"),  # torch's bare UUID
        ("GPU-6b1c2a3e-0000-4000-8000-000000004070", "GPU-6b1c2a3e-0000-4000-8000-000000004070"),  # already prefixed
        ("MIG-6b1c2a3e-0000-4000-8000-000000004070", "MIG-6b1c2a3e-0000-4000-8000-000000004070"),  # a MIG slice
    ],
)
def test_the_nvml_name_of_a_gpu_is_prefixed_once(monkeypatch, torch_uuid, nvml_name):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(uuid=torch_uuid))
    assert gpu_uuid(0) == nvml_name


def test_a_device_torch_cannot_describe_has_no_nvml_name(monkeypatch):
    def no_device(index):
        raise RuntimeError("Invalid device id")

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_device)
    assert gpu_uuid(3) is None


def test_the_nvml_handle_is_looked_up_by_uuid_and_none_where_unknown():
    known = {"GPU-a": "handle-a"}

    def by_uuid(uuid):
        if uuid not in known:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return known[uuid]

    nvml = SimpleNamespace(nvmlDeviceGetHandleByUUID=by_uuid)
    assert nvml_handle(nvml, "GPU-a") == "handle-a"
    assert nvml_handle(nvml, "GPU-b") is None
    assert nvml_handle(nvml, None) is None
    assert nvml_handle(SimpleNamespace(nvmlDeviceGetHandleByUUID=lambda uuid: "any"), "") is None  # no name at all


def test_memory_on_the_cpu_is_the_weights_and_the_cache():
    stats = memory_stats("cpu", weights_bytes=3 * GiB, kv_cache_bytes=GiB)
    assert (stats.device, stats.weights_bytes, stats.kv_cache_bytes) == ("cpu", 3 * GiB, GiB)
    assert stats.torch_allocated_bytes == 4 * GiB
    assert stats.device_total_bytes == 0 and stats.gpu_utilization_pct is None


@pytest.fixture
def gpus(monkeypatch):
    """torch's counters for two GPUs (index -> figures), the current device 1; NVML absent."""
    figures = {
        0: dict(allocated=1, reserved=2, peak=3, free=4, total=5),
        1: dict(allocated=10 * GiB, reserved=11 * GiB, peak=12 * GiB, free=20 * GiB, total=80 * GiB),
    }
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: figures[i]["allocated"])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: figures[i]["reserved"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i: figures[i]["peak"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (figures[i]["free"], figures[i]["total"]))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid="no-nvml-here"))
    return figures


def _figures(stats):
    return dict(
        allocated=stats.torch_allocated_bytes,
        reserved=stats.torch_reserved_bytes,
        peak=stats.peak_allocated_bytes,
        free=stats.device_free_bytes,
        total=stats.device_total_bytes,
    )


def test_memory_on_a_gpu_is_torchs_counters_for_that_gpu(gpus):
    stats = memory_stats("cuda:0", weights_bytes=3 * GiB, kv_cache_bytes=GiB)
    assert stats.device == "cuda:0" and (stats.weights_bytes, stats.kv_cache_bytes) == (3 * GiB, GiB)
    assert _figures(stats) == gpus[0]
    assert stats.gpu_utilization_pct is None  # no NVML


def test_memory_on_cuda_without_an_index_is_the_current_gpus(gpus):
    assert _figures(memory_stats("cuda", 0, 0)) == gpus[1]


def test_memory_on_a_gpu_includes_its_nvml_utilization(gpus, two_gpus):
    stats = memory_stats("cuda:0", 0, 0)  # CUDA's 0 is the RTX 4070, NVML's 1
    assert stats.gpu_utilization_pct == 97
