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
    typed = Engine.load(tiny_model, device="cpu", context_length=1100)
    assert typed.info.context_length == typed.model.k_cache.shape[2] == 1104


def test_a_typed_context_is_rounded_up_to_a_multiple_of_16_within_the_models_positions():
    """The kernels take the context as an argument and Triton compiles another variant for an int that doesn't
    divide by 16, which the release's kernel store lacks: every explicit context is a multiple of 16 (none
    shorter than asked), at most the model's positions."""
    from model_loader.context import requested_context

    assert [requested_context(n, 32768) for n in (1, 16, 17, 1100, 5000, 32760, 40000)] == [
        16, 16, 32, 1104, 5008, 32768, 32768,
    ]  # fmt: skip
    assert requested_context("4097", 131072) == 4112


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


def test_an_8bit_cache_token_costs_a_byte_a_value_plus_a_scale_a_row():
    from model_loader.kv_cache import KV_8BIT

    # 28 layers x 2 x 2 heads x 128 values, a byte each plus a 4-byte scale per 128-value row, plus the RoPE row
    assert per_token_bytes(Cfg(), 2, KV_8BIT) == 28 * 2 * 2 * (128 + 4) + 512
    assert per_token_bytes(Cfg(head_dim=64, num_key_value_heads=4), 2, KV_8BIT) == 28 * 2 * 4 * (64 + 4) + 256


def test_an_8bit_cache_gets_a_longer_auto_context_from_the_same_memory(monkeypatch):
    import torch

    from model_loader.kv_cache import KV_8BIT

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (int(1.3 * GiB), 8 * GiB))  # 0.3 GiB past headroom
    sixteen = auto_context(torch.device("cuda"), Cfg(), 2)
    eight = auto_context(torch.device("cuda"), Cfg(), 2, KV_8BIT)
    assert sixteen == 11_008  # 29,184 B a token
    assert eight == 20_992  # 15,296 B a token: 21,059 fit, rounded down to 256s


def test_the_context_is_measured_on_the_device_the_model_is_loaded_on(monkeypatch):
    import torch

    second = torch.device("cuda", 1)
    # the second GPU is empty, the first is almost full: a model loaded on the second gets the full target
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda dev: (79 * GiB, 80 * GiB) if dev == second else (GiB, 80 * GiB)
    )
    assert auto_context(second, Cfg(), 2) == AUTO_TARGET


def test_the_cpu_context_comes_from_the_host_memory(monkeypatch):
    import torch

    from model_loader import context

    monkeypatch.setattr(context, "host_memory", lambda: (int(1.6 * GiB), 6 * GiB))
    assert auto_context(torch.device("cpu"), Cfg(), 2) == 22_016  # as for a 6 GB card with 1.6 GiB free


def test_the_cpu_context_falls_back_to_8192_tokens_where_the_host_memory_is_unknown(monkeypatch):
    import torch

    from model_loader import context

    monkeypatch.setattr(context, "host_memory", lambda: (None, None))
    assert auto_context(torch.device("cpu"), Cfg(), 2) == context.CPU_FALLBACK == 8192
    assert auto_context(torch.device("cpu"), Cfg(max_position_embeddings=2048), 2) == 2048  # never past the model


MEMINFO = "MemTotal:       16318212 kB\nMemFree:         1203456 kB\nMemAvailable:    9876544 kB\n\nBuffers: 1 kB\n"


def _files(monkeypatch, files):
    """open() in model_loader.context serves `files` (path -> text); any other path does not exist."""
    import io

    from model_loader import context

    def fake_open(path, *args, **kwargs):
        if path not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[path])

    monkeypatch.setattr(context, "open", fake_open, raising=False)


def test_host_memory_on_linux_is_memavailable_and_memtotal_in_bytes(monkeypatch):
    from model_loader.context import host_memory

    _files(monkeypatch, {"/proc/meminfo": MEMINFO})
    assert host_memory() == (9876544 * 1024, 16318212 * 1024)


def _sysconf(monkeypatch, values):
    import os

    def fake_sysconf(name):
        if name not in values:
            raise ValueError(f"unrecognized configuration name {name!r}")
        return values[name]

    monkeypatch.setattr(os, "sysconf", fake_sysconf)


def test_host_memory_without_proc_meminfo_counts_posix_pages(monkeypatch):
    from model_loader.context import host_memory

    _files(monkeypatch, {})  # macOS, the BSDs: no /proc/meminfo
    _sysconf(monkeypatch, {"SC_PAGE_SIZE": 16384, "SC_AVPHYS_PAGES": 1000, "SC_PHYS_PAGES": 5000})
    assert host_memory() == (1000 * 16384, 5000 * 16384)


def test_host_memory_with_a_meminfo_lacking_memavailable_counts_posix_pages(monkeypatch):
    from model_loader.context import host_memory

    _files(monkeypatch, {"/proc/meminfo": "MemTotal:       16318212 kB\nMemFree:         1203456 kB\n"})  # Linux < 3.14
    _sysconf(monkeypatch, {"SC_PAGE_SIZE": 4096, "SC_AVPHYS_PAGES": 300, "SC_PHYS_PAGES": 4000})
    assert host_memory() == (300 * 4096, 4000 * 4096)


def test_host_memory_is_unknown_where_neither_source_answers(monkeypatch):
    from model_loader.context import host_memory

    _files(monkeypatch, {})
    _sysconf(monkeypatch, {})  # Windows has no sysconf at all; an OS without these names raises ValueError
    assert host_memory() == (None, None)
