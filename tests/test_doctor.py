"""`r1desk-cli doctor` (model_loader.doctor): what it reports about the GPU a load would take, the others, and a
GPU this torch has no code for. (No GPU here: torch's device queries are set, tests/gpu_machines.py.)"""

import torch
from gpu_machines import CUDA13, GTX_1060, RTX_4070, machine


def test_doctor_reports_it(gtx_1060_with_cuda13_torch, monkeypatch):
    from types import SimpleNamespace

    from model_loader import doctor

    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device=None: SimpleNamespace(
            name="NVIDIA GeForce GTX 1060 6GB", major=6, minor=1, total_memory=6 * 2**30
        ),
    )
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what torch says on any GPU
    info = doctor.collect()
    assert info["compute_capability"] == "6.1"
    assert info["default_precision"] == "float16"  # what r1desk computes in there (no bf16 GEMMs before Turing)
    assert info["torch_gpu_code"] == " ".join(CUDA13)
    assert "GTX 1060 6GB" in info["gpu_problem"] and "whl/cu126" in info["gpu_problem"]
    assert "gpu_problem" in doctor.format_report(info)


def test_doctor_reports_the_gpu_a_load_would_take_and_the_others(monkeypatch):
    from types import SimpleNamespace

    from model_loader import doctor

    gpus = [GTX_1060, RTX_4070]
    machine(monkeypatch, gpus)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index=0: SimpleNamespace(
            name=gpus[index][1], major=gpus[index][0][0], minor=gpus[index][0][1], total_memory=12 * 2**30
        ),
    )
    info = doctor.collect()
    assert (info["gpu"], info["cuda_device"], info["compute_capability"]) == (
        "NVIDIA GeForce RTX 4070",
        "cuda:1",
        "8.9",
    )
    assert info["default_precision"] == "bfloat16" and "gpu_problem" not in info
    assert info["other_gpus"] == ["cuda:0 NVIDIA GeForce GTX 1060 6GB (not supported by this torch)"]
    assert "cuda:0 NVIDIA GeForce GTX 1060" in doctor.format_report(info)
