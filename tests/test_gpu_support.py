"""A GPU the installed torch has no code for is named before anything loads, with what to install; the CPU
still works. (This machine has no GPU: torch's device queries are set to what a given machine reports.)"""

import pytest
import torch

from gpu_machines import CUDA13, CUDA124, GTX_1060, RTX_4070, machine

from model_loader.errors import GpuUnsupportedError
from model_loader.gpu_support import code_runs_on, unsupported_gpu_reason


@pytest.mark.parametrize(
    "entry, capability, runs",
    [
        ("sm_80", 80, True),
        ("sm_80", 86, True),
        ("sm_80", 89, True),  # a cubin runs on its major's later minors
        ("sm_86", 80, False),
        ("sm_90", 100, False),
        ("sm_90", 120, False),  # not on earlier minors or other majors
        ("sm_90a", 90, True),
        ("sm_90a", 100, False),  # architecture-specific code: that GPU only
        ("sm_100f", 103, True),
        ("sm_100f", 120, False),  # a family: its major
        ("compute_90", 120, True),
        ("compute_90", 89, False),  # PTX: the driver compiles it for any later GPU
        ("compute_90a", 90, True),
        ("compute_90a", 100, False),
        ("compute_100f", 103, True),  # not past its kind
        ("compute_100f", 120, False),
    ],
)
def test_which_code_runs_on_which_gpu(entry, capability, runs):
    assert code_runs_on(entry, capability) is runs


def test_rocm_builds_are_not_judged_by_cudas_list(monkeypatch):
    from model_loader.gpu_support import check_cuda_device

    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["gfx1100"])
    assert check_cuda_device(0) is None


def test_an_unreadable_entry_is_no_verdict():
    assert code_runs_on("gfx90a", 90) is None
    assert unsupported_gpu_reason((6, 1), ["gfx90a"], "GPU", "2.13.0") is None  # nothing readable: no judgement
    assert unsupported_gpu_reason((6, 1), [], "GPU", "2.13.0") is None  # a build that lists nothing


@pytest.mark.parametrize(
    "capability, arch_list",
    [((8, 9), CUDA13), ((7, 5), CUDA13), ((12, 0), CUDA13), ((8, 6), CUDA124), ((12, 0), CUDA124 + ["compute_90"])],
)
def test_supported_gpus_pass(capability, arch_list):
    assert unsupported_gpu_reason(capability, arch_list, "GPU", "2.13.0+cu130") is None


def test_a_gpu_older_than_the_build_is_told_which_build_has_it():
    msg = unsupported_gpu_reason((6, 1), CUDA13, "NVIDIA GeForce GTX 1060 6GB", "2.13.0+cu130")
    assert "\n" not in msg
    for fragment in (
        "NVIDIA GeForce GTX 1060 6GB",
        "compute capability 6.1",
        "2.13.0+cu130",
        "built for compute capability 7.5, 8.0, 8.6, 9.0, 10.0, 12.0",
        "whl/cu126",
    ):
        assert fragment in msg, msg


def test_a_gpu_older_than_any_build_is_not_sent_to_one():
    msg = unsupported_gpu_reason((3, 5), CUDA13, "Tesla K40", "2.13.0+cu130")
    assert "start at compute capability 5.0" in msg and "pip install" not in msg


def test_a_gpu_newer_than_the_build_is_told_to_upgrade():
    msg = unsupported_gpu_reason((12, 0), CUDA124, "NVIDIA GeForce RTX 5070 Laptop GPU", "2.5.1+cu124")
    for fragment in (
        "RTX 5070 Laptop GPU",
        "compute capability 12.0",
        "2.5.1+cu124",
        "newer PyTorch build",
        "whl/cu130",
    ):
        assert fragment in msg, msg


@pytest.mark.parametrize("device", ["cuda", None])  # asked for, and the default (auto)
def test_loading_on_it_says_so_before_anything_runs(tiny_model, gtx_1060_with_cuda13_torch, device):
    from model_loader.engine import Engine

    with pytest.raises(GpuUnsupportedError, match="GTX 1060 6GB.*compute capability 6.1"):
        Engine.load(tiny_model, device=device)


def test_quantizing_on_it_says_so(tiny_model, tmp_path, gtx_1060_with_cuda13_torch):
    from model_loader.quantize import quantize

    with pytest.raises(GpuUnsupportedError, match="GTX 1060"):
        quantize(tiny_model, tmp_path / "out", group_size=32, samples=2, seq_len=64)
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_cli_names_the_cpu_way_out(tiny_model, gtx_1060_with_cuda13_torch, capsys):
    from model_loader.cli import main

    assert main(["chat", "--model", str(tiny_model), "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Your NVIDIA GeForce GTX 1060 6GB") and "whl/cu126" in err and "--device cpu" in err
    assert (
        main(
            ["chat", "--model", str(tiny_model), "--prompt", "Hi", "--device", "cpu", "--max-new-tokens", "2", "--json"]
        )
        == 0
    )  # the CPU still works


def test_the_cli_takes_a_gpu_number(tiny_model, monkeypatch, capsys):
    from model_loader.cli import main

    machine(monkeypatch, [GTX_1060, RTX_4070])
    assert main(["chat", "--model", str(tiny_model), "--prompt", "Hi", "--device", "cuda:0"]) == 2
    assert capsys.readouterr().err.startswith("error: Your NVIDIA GeForce GTX 1060 6GB")
    with pytest.raises(SystemExit):
        main(["chat", "--model", str(tiny_model), "--prompt", "Hi", "--device", "gpu1"])
    assert "expected auto, cpu, cuda or cuda:N" in capsys.readouterr().err
