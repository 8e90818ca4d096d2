"""Loading a model folder (model_loader.loading), where it goes wrong in ways the locate/weights checks don't
cover."""

import pytest


def test_out_of_gpu_memory_while_loading_gives_advice(tiny_model, monkeypatch):
    import torch

    from model_loader import loading
    from model_loader.engine import Engine
    from model_loader.errors import OutOfMemoryError

    def exhausted(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(loading, "load_weights", exhausted)
    with pytest.raises(
        OutOfMemoryError, match="out of GPU memory while loading tiny-r1; try a shorter context length or 4-bit"
    ):
        Engine.load(tiny_model, device="cpu")
