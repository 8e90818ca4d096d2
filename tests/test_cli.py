"""r1desk-cli end to end, as a user runs it (a subprocess, the installed entry point's module)."""

import json
import subprocess
import sys

import pytest


def cli(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "model_loader.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_chat_json_one_turn(tiny_model, cpu_engine):
    out = json.loads(cli("chat", "--model", tiny_model, "--device", "cpu", "--prompt", "Hi 你好 🎉",
                         "--max-new-tokens", "12", "--temperature", "0", "--json").stdout)
    assert set(out) >= {"text", "reasoning", "answer", "prompt_tokens", "completion_tokens", "token_ids",
                        "finish_reason", "ttft_ms", "decode_tok_s"}
    assert out["completion_tokens"] == len(out["token_ids"]) == 12
    assert out["finish_reason"] == "max_new_tokens"
    assert out["reasoning"] == out["text"]  # random weights: the reasoning never closes
    # same greedy ids as the in-process engine
    from model_loader.events import Finished, SamplingSettings

    final = [e for e in cpu_engine.generate([{"role": "user", "content": "Hi 你好 🎉"}],
                                            SamplingSettings(temperature=0, max_new_tokens=12))
             if isinstance(e, Finished)][0]
    assert final.token_ids == out["token_ids"]


def test_interactive_chat_two_turns_reuses_the_prefix(tiny_model):
    proc = subprocess.run([sys.executable, "-m", "model_loader.cli", "chat", "--model", str(tiny_model),
                           "--device", "cpu", "--max-new-tokens", "6", "--temperature", "0"],
                          input="first question\nsecond question\n\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    stats = [line for line in proc.stderr.splitlines() if line.startswith("[max_new_tokens")]
    assert len(stats) == 2
    assert "prefix reused 0]" in stats[0] and "prefix reused 0]" not in stats[1]


def test_bad_model_exits_2_with_the_message(tmp_path):
    proc = cli("chat", "--model", tmp_path / "missing", "--prompt", "x", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {tmp_path / 'missing'}: no such folder"


def test_bench_json_on_cpu(tiny_model):
    out = json.loads(cli("bench", "--model", tiny_model, "--device", "cpu", "--prompt-tokens", "40",
                         "--new-tokens", "8", "--runs", "2", "--json").stdout)
    assert out["prompt_tokens"] == 40 and out["new_tokens"] == 8
    for key in ("ttft_ms_p50", "ttft_ms_p95", "decode_tok_s_p50", "ready_s", "load_s", "warmup_s", "weights_gib"):
        assert out[key] > 0, key


def test_bench_with_the_8bit_kv_cache_says_so_and_holds_less(tiny_model):
    """--kv-cache 8-bit reaches the engine: the report names the format and its cache is smaller; a format that
    does not exist is refused by the argument parser with the choices."""
    args = ("bench", "--model", tiny_model, "--device", "cpu", "--prompt-tokens", "40", "--new-tokens", "4",
            "--runs", "1", "--context", "256", "--json")
    eight = json.loads(cli(*args, "--kv-cache", "8-bit").stdout)
    sixteen = json.loads(cli(*args).stdout)
    assert (eight["kv_cache"], sixteen["kv_cache"]) == ("8-bit", "16-bit")
    assert eight["kv_cache_gib"] < sixteen["kv_cache_gib"] / 2
    bad = cli("chat", "--model", tiny_model, "--kv-cache", "4-bit", "--prompt", "x", check=False)
    assert bad.returncode == 2 and "16-bit" in bad.stderr and "8-bit" in bad.stderr


def test_make_test_model_is_loadable_by_transformers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path / "m"
    assert cli("make-test-model", folder, "--preset", "tiny", "--seed", "3").stdout.strip() == str(folder)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert len(tok) == 151665
    assert tok.convert_ids_to_tokens([151643, 151646, 151648, 151649]) == [
        "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", "<think>", "</think>"]
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == 151936


def test_doctor_reports_the_essentials(tiny_model, tmp_path, monkeypatch):
    """Values, not only keys: what doctor says must be what is true in this very environment."""
    import platform
    import shutil

    import torch

    models = tmp_path / "hf-home" / "hub" / "models--deepseek-ai--DeepSeek-R1-Distill-Qwen-1.5B" / "snapshots" / "abc"
    shutil.copytree(tiny_model, models)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    out = json.loads(cli("doctor", "--json").stdout)
    for key in ("os", "python", "torch", "cuda_available", "kernels", "model_folders_searched", "models_found"):
        assert key in out
    assert out["python"] == platform.python_version()
    assert out["torch"] == torch.__version__
    assert out["cuda_available"] == torch.cuda.is_available()
    assert out["torch_cuda_build"] == torch.version.cuda
    if torch.version.cuda is None:  # CI's CPU build: doctor must say why there is no GPU and what runs instead
        assert out["kernels"] == "pytorch" and "CPU-only" in out["why_no_cuda"]
    assert str(tmp_path / "hf-home" / "hub") in out["model_folders_searched"]
    assert any(str(models) in str(m) for m in out["models_found"]), out["models_found"]


@pytest.mark.parametrize("args", [["chat"], ["bench"], ["make-test-model"]])
def test_missing_arguments_are_usage_errors(args):
    assert cli(*args, check=False).returncode == 2


def test_weights_progress_is_monotonic_and_complete(tiny_model):
    from model_loader.engine import Engine

    calls = []
    Engine.load(tiny_model, device="cpu", progress=lambda done, total: calls.append((done, total)))
    assert calls[0][0] == 0 and calls[-1][0] == calls[-1][1] > 0
    assert all(a[0] <= b[0] for a, b in zip(calls, calls[1:]))
