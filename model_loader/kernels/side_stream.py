"""One side stream per GPU, for the warm-up runs before a CUDA-graph capture, the capture itself, and timing
kernels.

torch gives a stream its own cuBLAS workspace the first time cuBLAS runs on it and keeps it until the process
ends (a map from (handle, stream) to a block of the caching allocator). A new torch.cuda.Stream() per capture
or per timing would draw fresh streams from torch's pool of 32 per device, so each warm-up could leave more
workspaces behind: memory that Engine.close() cannot give back, growing with every model reload. One stream reused
for all of it keeps that to one workspace, made once.
"""

from __future__ import annotations

import torch

_STREAMS: dict[int, torch.cuda.Stream] = {}


def side_stream(device=None) -> torch.cuda.Stream:
    """The side stream of `device` (a CUDA device; default: the current one), made on first use."""
    device = torch.device("cuda") if device is None else torch.device(device)
    index = torch.cuda.current_device() if device.index is None else device.index
    stream = _STREAMS.get(index)
    if stream is None:
        stream = _STREAMS[index] = torch.cuda.Stream(device=index)
    return stream


def graph_capture(graph: torch.cuda.CUDAGraph, device=None, pool=None):
    """torch.cuda.graph(graph) on `device`'s side stream (a context manager). Without a stream torch captures
    on one it makes at the process's first capture, on whichever GPU was current then, and entering it makes
    that GPU current: a model loaded later on another GPU would have its Triton kernels captured on the first."""
    return torch.cuda.graph(graph, pool=pool, stream=side_stream(device))
