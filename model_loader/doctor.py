"""r1desk-cli doctor: what a user needs before filing a bug, as readable lines or JSON."""

from __future__ import annotations

import platform
import sys


def _gpu_facts() -> dict:
    import torch

    from model_loader.device import pick_dtype
    from model_loader.gpu_support import check_cuda_device, list_gpus

    facts: dict = {"cuda_available": torch.cuda.is_available(), "torch_cuda_build": torch.version.cuda}
    if not torch.cuda.is_available():
        facts["why_no_cuda"] = (
            "this torch is a CPU-only build; install the CUDA build (see README)"
            if torch.version.cuda is None
            else "no NVIDIA GPU or driver visible to torch"
        )
        return facts
    from model_loader.device import pick_device
    from model_loader.errors import GpuUnsupportedError

    try:
        index = pick_device("auto").index  # the GPU a load would take: the first one this torch supports
    except GpuUnsupportedError:
        index = 0
    props = torch.cuda.get_device_properties(index)
    facts.update(
        {
            "gpu": props.name,
            "cuda_device": f"cuda:{index}",
            "compute_capability": f"{props.major}.{props.minor}",
            "vram_gib": round(props.total_memory / 2**30, 2),
            # what r1desk computes in by default (device.pick_dtype): torch.cuda.is_bf16_supported() says yes on every
            # GPU (it only makes a tensor), while cuBLAS has no bf16 before Turing
            "default_precision": str(pick_dtype(torch.device("cuda", index))).removeprefix("torch."),
            "torch_gpu_code": " ".join(torch.cuda.get_arch_list()),
        }
    )
    problem = check_cuda_device(index)
    if problem:
        facts["gpu_problem"] = problem
    others = [gpu for gpu in list_gpus() if gpu["device"] != f"cuda:{index}"]
    if others:
        facts["other_gpus"] = [
            f"{gpu['device']} {gpu['name']}" + ("" if gpu["supported"] else " (not supported by this torch)")
            for gpu in others
        ]
    try:
        import pynvml

        pynvml.nvmlInit()
        facts["driver"] = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
    except Exception as err:  # nvidia-ml-py missing or NVML not loadable
        facts["driver"] = f"unknown (NVML: {err.__class__.__name__})"
    try:
        torch.cuda.set_device(index)  # the graph check below runs where a load would
        x = torch.zeros(8, device="cuda")
        graph = torch.cuda.CUDAGraph()
        from model_loader.kernels.side_stream import graph_capture, side_stream

        stream = side_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            x.add_(1)
        torch.cuda.current_stream().wait_stream(stream)
        with graph_capture(graph):
            x.add_(1)
        graph.replay()
        torch.cuda.synchronize()
        facts["cuda_graphs"] = bool(x[0].item() == 3)
    except Exception as err:
        facts["cuda_graphs"] = f"failed: {err}"
    return facts


def collect() -> dict:
    import torch

    from model_loader.kernels import triton_available
    from model_loader.locate import find_local_models, hf_cache_dir, user_models_dir

    info = {
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
    }
    info.update(_gpu_facts())
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    info["kernels"] = "triton" if triton_available("cuda" if torch.cuda.is_available() else "cpu") else "pytorch"
    from model_loader.awq import int4pack_supported
    from model_loader.variants import choose_int4_layout

    gpu = torch.device(info["cuda_device"]) if "cuda_device" in info else None
    path = choose_int4_layout(gpu or torch.device("cpu"), torch.bfloat16, info["kernels"] == "triton", None)
    if path == "torch":
        info["awq_path"] = "int4 kernel (torch _weight_int4pack_mm)" + (
            "; our Triton int4 kernels with --int4-kernel triton" if info["kernels"] == "triton" else ""
        )
    elif path == "triton":
        info["awq_path"] = "int4 Triton kernels (GEMV for decoding, dequantise + cuBLAS for prefill)" + (
            "; torch's int4 kernel with --int4-kernel torch" if gpu is not None and int4pack_supported(gpu) else ""
        )
    else:
        info["awq_path"] = (
            "dequantized to dense at load (4-bit kernels need an NVIDIA GPU with Triton, or compute capability 8.0+)"
        )
    if info["kernels"] == "triton" and gpu is not None:
        from model_loader.kernels.features import pdl_supported

        info["programmatic_launch"] = pdl_supported(gpu)  # sm90+: kernels overlap their neighbours' set-up
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except Exception:
        info["transformers"] = None
    info["model_folders_searched"] = [str(user_models_dir()), str(hf_cache_dir())]
    info["models_found"] = [
        {"name": m.name, "path": str(m.path), "layers": m.config.num_hidden_layers, "hidden": m.config.hidden_size}
        for m in find_local_models()
    ]
    return info


def format_report(info: dict) -> str:
    lines = []
    for key, value in info.items():
        if key == "models_found":
            lines.append(f"{'models_found':<24}{len(value)}")
            lines += [f"  - {m['name']}  ({m['path']})" for m in value]
        elif isinstance(value, list):
            lines.append(f"{key:<24}{value[0] if value else ''}")
            lines += [f"{'':<24}{v}" for v in value[1:]]
        else:
            lines.append(f"{key:<24}{value}")
    return "\n".join(lines)
