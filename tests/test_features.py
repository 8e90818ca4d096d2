"""What a GPU and this Triton allow the kernels (kernels.features), as asked of a given device."""

import torch

from model_loader.kernels import features


def test_tensor_descriptors_only_where_tma_runs(monkeypatch):
    """The prefill attention's TMA path needs a GPU of compute capability 9 or newer and a compiled kernel (not
    the interpreter); R1DESK_NO_TMA=1 turns it off."""
    monkeypatch.setattr(features, "_TMA_OK", {})
    assert not features.prefill_tma_supported("cpu")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert features.prefill_tma_supported("cuda:0")
    monkeypatch.setattr(features, "_TMA_OK", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    assert not features.prefill_tma_supported("cuda:0")  # RTX 40: no TMA
    monkeypatch.setattr(features, "_TMA_OK", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setenv("R1DESK_NO_TMA", "1")
    assert not features.prefill_tma_supported("cuda:0")
