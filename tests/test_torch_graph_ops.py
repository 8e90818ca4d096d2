"""The plain PyTorch path that a GPU without Triton captures in CUDA graphs (kernels/torch_graph_ops): positions
read on the device, the decode attention over a fixed span of the cache. Run here on the CPU in fp32 against the
eager reference path, which reads positions on the host; on a GPU the same ops are what the graphs record."""

import pytest
import torch

from model_loader.kernels.torch_graph_ops import SPANS, decode_spans
from model_loader.kv_cache import KV_8BIT, KV_16BIT
from model_loader.qwen2 import Qwen2Model

CONTEXT = 1024


def _pair(engine, kv_cache):
    """The reference model and one that reads positions on the device, on the engine's weights."""
    m = engine.model
    return [
        Qwen2Model(
            m.cfg, m.w, "cpu", torch.float32, CONTEXT, use_triton=False, kv_cache=kv_cache, positions_on_device=on
        )
        for on in (False, True)
    ]


def _span_for(length: int) -> int:
    return next(s for s in decode_spans(CONTEXT) if length <= s)


@pytest.mark.parametrize("kv_cache", [KV_16BIT, KV_8BIT])
def test_decoding_with_positions_on_the_device_matches_the_reference_across_a_span_boundary(cpu_engine, kv_cache):
    """Prefill, then greedy decode steps from position 500 to 520: the span grows from 512 to 1,024 on the way,
    and every step's logits (hence its cache writes, which later steps read) equal the reference path's."""
    ref, dev = _pair(cpu_engine, kv_cache)
    assert dev.ops.__name__.endswith("torch_graph_ops") and ref.ops.__name__.endswith("reference")
    ids = (cpu_engine.chat.render([{"role": "user", "content": "Count the odd numbers up to 99."}]).ids * 40)[:500]
    with torch.inference_mode():
        want, got = ref.prefill(torch.tensor(ids), 0), dev.prefill(torch.tensor(ids), 0)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        token = torch.argmax(want, dim=-1)
        spans = set()
        for pos in range(len(ids), len(ids) + 20):
            pos_t = torch.tensor([pos], dtype=torch.int32)
            dev.set_decode_attention_config(_span_for(pos + 1))
            spans.add(dev.decode_span)
            want = ref.decode(token, pos_t, pos)
            got = dev.decode(token, pos_t, -1)  # the host's position is not read: a graph replays it stale
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            token = torch.argmax(want, dim=-1)
    assert spans == {512, 1024}


def test_a_span_longer_than_the_context_masks_the_tail(cpu_engine):
    """The same step over the whole cache (stale rows past the position included) gives the same logits as over
    the smallest span: what lies past the position is never attended to."""
    _, dev = _pair(cpu_engine, KV_16BIT)
    ids = cpu_engine.chat.render([{"role": "user", "content": "Hello"}]).ids
    with torch.inference_mode():
        dev.prefill(torch.tensor(ids * 30), 0)  # K/V at many positions past the ones decoded below
        dev.prefill(torch.tensor(ids), 0)
        token, pos_t = torch.tensor([ids[-1]]), torch.tensor([len(ids)], dtype=torch.int32)
        outs = []
        for span in (512, 1024):
            dev.set_decode_attention_config(span)
            outs.append(dev.decode(token, pos_t, -1).clone())
            dev.k_cache[:, :, len(ids)].zero_()  # the step wrote its own row: undo it for the next span
    torch.testing.assert_close(outs[1], outs[0], atol=1e-6, rtol=1e-6)


def test_a_padded_fresh_prefill_reads_its_last_position_on_the_device(cpu_engine):
    """What the fresh prefill graphs run without Triton: the prompt padded to a bucket gives the last real token's
    logits exactly as an unpadded prefill, the last row's attention reading its position on the device."""
    ref, dev = _pair(cpu_engine, KV_16BIT)
    ids = cpu_engine.chat.render([{"role": "user", "content": "What is 2 + 2?"}]).ids
    n, bucket = len(ids), 64
    with torch.inference_mode():
        want = ref.prefill(torch.tensor(ids), 0)
        padded = torch.tensor(ids + [0] * (bucket - n))
        got = dev.prefill_static(padded, torch.tensor([n - 1]), torch.zeros(1, dtype=torch.int32))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dev.k_cache[:, :, :n], ref.k_cache[:, :, :n], atol=1e-6, rtol=1e-6)


def test_the_spans_cover_every_context_and_end_at_it():
    for ctx in (16, 512, 513, 4096, 5000, 32768, 131072):
        spans = decode_spans(ctx)
        assert spans[-1] == ctx and spans == sorted(set(spans))
        assert all(s in SPANS for s in spans[:-1])
