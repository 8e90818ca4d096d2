"""`r1desk-cli bench --depths` and `--scenario chat` on the tiny model (CPU): what they measure and report."""

from __future__ import annotations

import json
import math

import pytest

from model_loader import bench_scenarios as sc
from model_loader.cli import main


def test_depths_prefill_each_depth_then_decode(cpu_engine):
    r = sc.run_depths(cpu_engine, [32, 600], new_tokens=6, runs=1)
    assert [row["depth"] for row in r["depths"]] == [32, 600]
    for row in r["depths"]:
        assert row["decode_tok_s_p50"] > 0 and row["prefill_ttft_ms_p50"] > 0
    assert r["depths"][0]["vs_first_depth"] == 1.0
    assert sc.context_for_depths([512, 32768], 256) >= 32768 + 256


def _checkpoint_numels(folder) -> dict:
    from safetensors import safe_open

    numels = {}
    for shard in folder.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            for name in f.keys():
                numels[name] = math.prod(f.get_slice(name).get_shape())
    return numels


def test_depths_say_what_a_step_reads_and_at_what_rate(cpu_engine, tiny_model):
    """Each depth's row: the bytes a decode step reads (every weight but the embedding table, of which it reads
    one row, and K and V of every cached token up to the current one, on average over the reply), those bytes
    times the speed, and the share of the first depth's speed a step bound by its bytes would keep. Counted here
    from the checkpoint and the config."""
    cfg = cpu_engine.model.cfg
    assert not cfg.tie_word_embeddings
    itemsize = cpu_engine.model.dtype.itemsize  # the checkpoint's tensors as loaded
    weights = sum(n for name, n in _checkpoint_numels(tiny_model).items() if name != "model.embed_tokens.weight")
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * itemsize
    r = sc.run_depths(cpu_engine, [32, 600], new_tokens=6, runs=1)
    for row in r["depths"]:
        # the 5 decode steps after the prefill's token read depth + 1 ... depth + 5 tokens: depth + 3 on average
        assert row["read_bytes_per_token"] == weights * itemsize + kv_per_token * (row["depth"] + 3)
        assert row["read_gb_s"] == pytest.approx(row["read_bytes_per_token"] * row["decode_tok_s_p50"] / 1e9)
    first, deep = r["depths"]
    assert first["vs_first_depth_at_bandwidth"] == 1.0
    assert deep["vs_first_depth_at_bandwidth"] == pytest.approx(
        (weights * itemsize + kv_per_token * 35) / (weights * itemsize + kv_per_token * 603)
    )
    text = sc.format_depths(r)
    assert (
        f"({deep['vs_first_depth']:.0%} of depth 32; {deep['vs_first_depth_at_bandwidth']:.0%} by bytes read)" in text
    )
    assert f"{deep['read_bytes_per_token'] / 1e9:.2f} GB read a token, {deep['read_gb_s']:,.0f} GB/s" in text


def test_a_replys_stats_say_what_its_decode_steps_read(cpu_engine, tiny_model):
    """A reply's GenerationStats carry what its average decode step read (the window's live panel shows it with
    the rate): the weights but the embedding table, and the cache up to the current token. 8 tokens after 40:
    the 7 decode steps after the prefill's token read 41 ... 47 tokens, 44 on average. One token: no step."""
    from model_loader.events import Finished, SamplingSettings

    cfg = cpu_engine.model.cfg
    itemsize = cpu_engine.model.dtype.itemsize
    weights = sum(n for name, n in _checkpoint_numels(tiny_model).items() if name != "model.embed_tokens.weight")
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * itemsize
    prompt = list(range(100, 140))
    for new, context in ((8, 44), (1, 0)):
        cpu_engine.reset_cache()
        settings = SamplingSettings(temperature=0, max_new_tokens=new, ignore_eos=True)
        stats = [ev for ev in cpu_engine.generate_ids(prompt, settings) if isinstance(ev, Finished)][0].stats
        assert stats.completion_tokens == new
        assert stats.decode_cache_read_bytes == kv_per_token * context
        assert stats.decode_read_bytes == (weights * itemsize + kv_per_token * context if context else 0.0)


def test_an_8bit_cache_step_reads_a_byte_a_value_and_each_rows_scale(tiny_model):
    """Over an 8-bit cache a step reads a byte a cached value plus the fp32 scale of each K and V row
    (kv_cache.py), and the same weights."""
    from model_loader.engine import Engine
    from model_loader.kv_cache import KV_8BIT

    engine = Engine.load(tiny_model, device="cpu", context_length=512, kv_cache=KV_8BIT)
    cfg = engine.model.cfg
    itemsize = engine.model.dtype.itemsize
    weights = sum(n for name, n in _checkpoint_numels(tiny_model).items() if name != "model.embed_tokens.weight")
    assert engine.model.kv_bytes_per_token == cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.head_dim + 4)
    assert sc.decode_read_bytes(engine, 100, 4) == weights * itemsize + engine.model.kv_bytes_per_token * 102
    engine.close()


def test_chat_scenario_carries_the_cache_and_drops_earlier_reasoning(cpu_engine):
    r = sc.run_chat(cpu_engine, user_tokens=20, reply_tokens=60, turns=4)
    turns = r["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3, 4]
    assert turns[0]["prefix_reused_tokens"] == 0
    for before, t in zip(turns, turns[1:]):
        assert t["completion_tokens"] == 60 and t["decode_tok_s"] > 0
        # the earlier turns' prompt is reused from the cache; only the new user turn (+ template tags) is prefilled
        assert t["prefix_reused_tokens"] >= before["prompt_tokens"] - 4
        assert 20 <= t["new_prompt_tokens"] <= 20 + 40
        # the random model never closes its reasoning, so none of a 60-token reply goes back into the prompt:
        # it grows by the new user turn only
        assert t["prompt_tokens"] - before["prompt_tokens"] < 60


def test_cli_json(tiny_model, capsys):
    assert (
        main(
            [
                "bench",
                "--model",
                str(tiny_model),
                "--device",
                "cpu",
                "--depths",
                "16,64",
                "--new-tokens",
                "4",
                "--runs",
                "1",
                "--json",
            ]
        )
        == 0
    )
    r = json.loads(capsys.readouterr().out)
    assert r["scenario"] == "depths" and [d["depth"] for d in r["depths"]] == [16, 64] and r["model"]
    assert (
        main(
            [
                "bench",
                "--model",
                str(tiny_model),
                "--device",
                "cpu",
                "--scenario",
                "chat",
                "--user-tokens",
                "40",
                "--reply-tokens",
                "4",
                "--json",
            ]
        )
        == 0
    )
    r = json.loads(capsys.readouterr().out)
    assert r["scenario"] == "chat" and len(r["turns"]) == 4 and r["turns"][3]["prefix_reused_tokens"] > 0


def test_depths_say_when_the_gpu_was_held_below_its_clock(cpu_engine, monkeypatch):
    """Each depth's timed replies carry NVML's SM clock; a power cap (what a long prefill tripped on the H200) is
    named in the row. NVML is set to what such a driver reports; the replies run on the CPU."""
    import sys

    from test_gpu_clocks import POWER_CAP, _nvml_module

    monkeypatch.setitem(sys.modules, "pynvml", _nvml_module([(1980, 0), (1845, POWER_CAP)]))
    monkeypatch.setattr(cpu_engine.info, "gpu_uuid", "GPU-x")
    r = sc.run_depths(cpu_engine, [32], new_tokens=4, runs=1)
    clock = r["depths"][0]["sm_clock"]
    assert clock["sm_mhz_min"] == 1845 and clock["slowdowns"] == ["power cap"]
    assert "SM clock mean 1,845 MHz (min 1,845) of 1,980; slowed by power cap" in sc.format_depths(r)
    monkeypatch.setattr(cpu_engine.info, "gpu_uuid", None)  # the CPU itself: nothing to say
    assert sc.run_depths(cpu_engine, [32], new_tokens=4, runs=1)["depths"][0]["sm_clock"] is None


def test_the_depth_bench_says_which_attention_each_bucket_runs_and_what_the_others_took(
    tiny_model, capsys, monkeypatch
):
    """On a GPU the warm-up times each decode attention shape per depth bucket (DecodeStep.tune); the bench's
    text names the one each bucket runs and every shape's time, fastest first, and its JSON carries the
    timings. The CPU tunes nothing, so the warm-up's record of a tuning is set here as a GPU's would be."""
    from model_loader.engine import Engine

    real_warm_up = Engine.warm_up

    def warm_up(self, *args, **kwargs):
        real_warm_up(self, *args, **kwargs)
        self.step.tuned_us = {1024: {"shape A": 1200.0, "shape B": 1150.5}}
        self.info.decode_attention = {"<=1024": "shape B"}

    monkeypatch.setattr(Engine, "warm_up", warm_up)
    args = [
        "bench",
        "--model",
        str(tiny_model),
        "--device",
        "cpu",
        "--depths",
        "16",
        "--new-tokens",
        "2",
        "--runs",
        "1",
    ]
    assert main(args) == 0
    assert (
        "decode attention for depth <=1024: shape B (the warm-up's us per step: shape B 1,150.5; shape A 1,200.0)"
    ) in capsys.readouterr().out
    assert main(args + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decode_attention_us"] == {
        "1024": {"shape A": 1200.0, "shape B": 1150.5}
    }
