"""What this GPU and this Triton allow the kernels, asked once per device: programmatic dependent launch
(pdl_supported, pdl_launch_args), the prefill attention's tensor descriptors (prefill_tma_supported), a program's
shared memory (max_shared_memory), and the first of several kernel shapes that launches here
(launch_first_that_fits).

On Hopper (sm90+) every kernel of small_ops, decode_attention, prefill_attention, gemv, int4_triton and paged_ops
is launched with programmatic dependent launch (pdl_launch_args): a kernel's grid is set up while the previous one
finishes, which at ~10 small kernels per layer is a large share of a decode step.
"""

from __future__ import annotations

import os

import torch
import triton.language as tl

_PDL_OK: dict = {}


def pdl_supported(device) -> bool:
    """Programmatic dependent launch: Hopper or newer, a Triton that exposes it, not the CPU interpreter.
    R1DESK_NO_PDL=1 turns it off (to rule it out when chasing a problem)."""
    device = torch.device(device)
    if device not in _PDL_OK:
        _PDL_OK[device] = (
            device.type == "cuda"
            and os.environ.get("TRITON_INTERPRET") != "1"
            and os.environ.get("R1DESK_NO_PDL") != "1"
            and torch.cuda.get_device_capability(device) >= (9, 0)
            and hasattr(getattr(tl.extra, "cuda", None), "gdc_wait")
        )
    return _PDL_OK[device]


_TMA_OK: dict = {}


def prefill_tma_supported(device) -> bool:
    """The prefill attention may read K/V through tensor descriptors (TMA): Hopper or newer, a Triton with
    host-side tensor descriptors, not the CPU interpreter. R1DESK_NO_TMA=1 turns it off."""
    device = torch.device(device)
    if device not in _TMA_OK:
        ok = (
            device.type == "cuda"
            and os.environ.get("TRITON_INTERPRET") != "1"
            and os.environ.get("R1DESK_NO_TMA") != "1"
            and torch.cuda.get_device_capability(device) >= (9, 0)
        )
        if ok:
            try:
                from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
            except ImportError:
                ok = False
        _TMA_OK[device] = ok
    return _TMA_OK[device]


def pdl_launch_args(device) -> dict:
    """Launch arguments for programmatic dependent launch: each decode kernel lets the next one start as soon as
    it has started itself, and waits for the previous one before reading what it wrote (weights and tables,
    never written, may be read before). Where pdl_supported is false: plain launches."""
    return {"PDL": True, "launch_pdl": True} if pdl_supported(device) else {"PDL": False}


def launch_first_that_fits(shapes: list, launch_one):
    """launch_one(shape) for each of `shapes` in turn until one launches: Triton refuses a kernel that needs more
    shared memory than this GPU has (OutOfResources) at launch, before anything runs. Returns (the shape that
    ran, what launch_one returned); the last shape's refusal is raised."""
    from triton.runtime.errors import OutOfResources

    for shape in shapes:
        try:
            return shape, launch_one(shape)
        except OutOfResources:
            if shape == shapes[-1]:
                raise


def max_shared_memory(device) -> int | None:
    """The most shared memory one program may have on this GPU (what Triton checks a launch against: the opt-in
    limit, 101,376 bytes on an RTX 30/40/50-series card, 232,448 on the H200); None off CUDA or where torch
    doesn't say."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    limit = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", None)
    return limit if limit and limit > 0 else None
