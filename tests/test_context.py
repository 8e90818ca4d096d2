"""The automatic context: chosen from a given free-memory figure (model_loader.context), and Engine.load's
"auto" on the CPU."""

from __future__ import annotations

import pytest

from model_loader.context import (
    AUTO_TARGET,
    MIN_CONTEXT,
    NoRoomForContext,
    auto_context,
    choose_context,
    per_token_bytes,
)

GiB = 2**30
R1_1_5B = dict(num_hidden_layers=28, num_key_value_heads=2, head_dim=128)


class Cfg:
    def __init__(self, max_position_embeddings=131072, **kw):
        self.__dict__.update(R1_1_5B, max_position_embeddings=max_position_embeddings, **kw)


def test_a_token_of_the_1_5b_costs_28_kib_of_kv_plus_its_rope_row():
    assert per_token_bytes(Cfg(), 2) == 28 * 1024 + 512
    assert per_token_bytes(Cfg(), 4) == 56 * 1024 + 512  # fp32 on the CPU


@pytest.mark.parametrize(
    "free_gib, total_gib, expected",
    [
        (139.0, 140.0, AUTO_TARGET),  # an H200: the target, not more
        (10.5, 16.0, AUTO_TARGET),  # a 16 GB card after the bf16 weights
        (4.3, 6.0, AUTO_TARGET),  # a 6 GB laptop GPU after the 4-bit weights (~1.2 GB): 32k still fits
        (1.6, 6.0, 22_016),  # 1 GiB headroom; 0.6 GiB / 29,184 B = 22,075 tokens, rounded down to 256s
        (1.3, 8.0, 11_008),  # 0.3 GiB left: 11,037 tokens -> 11,008
        (0.9, 8.0, 0),  # less than the headroom
        (16.5, 160.0, 18_176),  # a big card mostly in use: the headroom is a tenth of it (16 GiB); 18,396 fit
    ],
)
def test_the_context_follows_the_free_memory(free_gib, total_gib, expected):
    ctx = choose_context(int(free_gib * GiB), int(total_gib * GiB), per_token_bytes(Cfg(), 2), 131072)
    assert ctx == expected


def test_the_context_never_exceeds_what_the_model_can_position():
    assert choose_context(100 * GiB, 140 * GiB, per_token_bytes(Cfg(), 2), 4096) == 4096


def test_no_room_is_a_clear_error_not_a_useless_context(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (int(1.02 * GiB), 6 * GiB))  # 512 tokens' room
    with pytest.raises(NoRoomForContext) as err:
        auto_context(torch.device("cuda"), Cfg(), 2)
    assert f"at least {MIN_CONTEXT:,}" in str(err.value) and "1.02 GiB" in str(err.value)
    assert err.value.tokens == 512
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (int(4.3 * GiB), 6 * GiB))
    assert auto_context(torch.device("cuda"), Cfg(), 2) == AUTO_TARGET


def test_engine_load_auto_on_the_cpu(tiny_model):
    from model_loader.engine import Engine

    engine = Engine.load(tiny_model, device="cpu", context_length="auto")
    assert engine.info.context_auto is True
    assert engine.info.context_length == min(AUTO_TARGET, engine.model.cfg.max_position_embeddings)
    assert engine.model.k_cache.shape[2] == engine.info.context_length
    explicit = Engine.load(tiny_model, device="cpu", context_length=1024)
    assert (explicit.info.context_length, explicit.info.context_auto) == (1024, False)


def test_exactly_the_minimum_context_loads_and_one_granule_less_does_not(monkeypatch):
    """The boundary itself: room for MIN_CONTEXT tokens is enough; room for one granule (256) fewer is not."""
    import torch

    from model_loader.context import GRANULE, HEADROOM_MIN_BYTES

    token = per_token_bytes(Cfg(), 2)
    total = 6 * GiB  # a tenth is under the 1 GiB minimum headroom: the headroom is 1 GiB

    def room_for(tokens):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (HEADROOM_MIN_BYTES + tokens * token, total))

    room_for(MIN_CONTEXT)
    assert auto_context(torch.device("cuda"), Cfg(), 2) == MIN_CONTEXT
    room_for(MIN_CONTEXT - 1)  # rounds down to the granule below
    with pytest.raises(NoRoomForContext) as err:
        auto_context(torch.device("cuda"), Cfg(), 2)
    assert err.value.tokens == MIN_CONTEXT - GRANULE
    # a model that positions fewer than MIN_CONTEXT tokens at all gets all it can, however little room is left
    room_for(300)
    assert auto_context(torch.device("cuda"), Cfg(max_position_embeddings=256), 2) == 256
