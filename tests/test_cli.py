"""r1desk-cli end to end, as a user runs it (a subprocess, the installed entry point's module)."""

import json
import subprocess
import sys

import pytest


def cli(*args, check=True):
    proc = subprocess.run(
        [sys.executable, "-m", "desktop.cli", *map(str, args)], capture_output=True, text=True, timeout=300
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_chat_json_one_turn(tiny_model, cpu_engine):
    out = json.loads(
        cli(
            "chat",
            "--model",
            tiny_model,
            "--device",
            "cpu",
            "--prompt",
            "Hi 你好 🎉",
            "--max-new-tokens",
            "12",
            "--temperature",
            "0",
            "--json",
        ).stdout
    )
    assert set(out) >= {
        "text",
        "reasoning",
        "answer",
        "prompt_tokens",
        "completion_tokens",
        "token_ids",
        "finish_reason",
        "ttft_ms",
        "decode_tok_s",
    }
    assert out["completion_tokens"] == len(out["token_ids"]) == 12
    assert out["finish_reason"] == "max_new_tokens"
    assert out["reasoning"] == out["text"]  # random weights: the reasoning never closes
    # same greedy ids as the in-process engine
    from model_loader.events import Finished, SamplingSettings

    final = [
        e
        for e in cpu_engine.generate(
            [{"role": "user", "content": "Hi 你好 🎉"}], SamplingSettings(temperature=0, max_new_tokens=12)
        )
        if isinstance(e, Finished)
    ][0]
    assert final.token_ids == out["token_ids"]


def test_interactive_chat_two_turns_reuses_the_prefix(tiny_model):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "model_loader.cli",
            "chat",
            "--model",
            str(tiny_model),
            "--device",
            "cpu",
            "--max-new-tokens",
            "6",
            "--temperature",
            "0",
        ],
        input="first question\nsecond question\n\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    stats = [line for line in proc.stderr.splitlines() if line.startswith("[max_new_tokens")]
    assert len(stats) == 2
    assert "prefix reused 0]" in stats[0] and "prefix reused 0]" not in stats[1]


def test_bad_model_exits_2_with_the_message(tmp_path):
    proc = cli("chat", "--model", tmp_path / "missing", "--prompt", "x", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {tmp_path / 'missing'}: no such folder"


def test_bench_json_on_cpu(tiny_model):
    out = json.loads(
        cli(
            "bench",
            "--model",
            tiny_model,
            "--device",
            "cpu",
            "--prompt-tokens",
            "40",
            "--new-tokens",
            "8",
            "--runs",
            "2",
            "--json",
        ).stdout
    )
    assert out["prompt_tokens"] == 40 and out["new_tokens"] == 8
    for key in ("ttft_ms_p50", "ttft_ms_p95", "decode_tok_s_p50", "ready_s", "load_s", "warmup_s", "weights_gib"):
        assert out[key] > 0, key


def test_bench_with_the_8bit_kv_cache_says_so_and_holds_less(tiny_model):
    """--kv-cache 8-bit reaches the engine: the report names the format and its cache is smaller; a format that
    does not exist is refused by the argument parser with the choices."""
    args = (
        "bench",
        "--model",
        tiny_model,
        "--device",
        "cpu",
        "--prompt-tokens",
        "40",
        "--new-tokens",
        "4",
        "--runs",
        "1",
        "--context",
        "256",
        "--json",
    )
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
        "<｜end▁of▁sentence｜>",
        "<｜begin▁of▁sentence｜>",
        "<think>",
        "</think>",
    ]
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


def _chat(tiny_model, *extra, env=None):
    import os

    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "model_loader.cli",
            "chat",
            "--model",
            str(tiny_model),
            "--device",
            "cpu",
            "--temperature",
            "0",
            "--context",
            "4096",
            *extra,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


def _interrupt_once_writing(proc, prompt: bytes = b"") -> None:
    """SIGINT as Ctrl+C sends it, once the reply's first text is out (the CLI flushes every delta), after the
    chat's prompt where there is one."""
    import signal

    assert proc.stdout.read(len(prompt) + 1)[: len(prompt)] == prompt
    proc.send_signal(signal.SIGINT)


def test_ctrl_c_during_a_reply_stops_the_reply_not_the_program(tiny_model):
    """The KeyboardInterrupt used to be raised inside the reply's generator, which ended with it: --prompt then
    died on a missing result (a traceback), and the interactive chat lost the reply and sent its next turn after
    two user messages in a row. Now Ctrl+C only asks the engine to stop: the reply ends "cancelled" with what it
    wrote, and the chat goes on."""
    proc = _chat(tiny_model, "--prompt", "Count to a thousand", "--max-new-tokens", "400")
    _interrupt_once_writing(proc)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "Traceback" not in err.decode(), err.decode()
    assert "[cancelled;" in err.decode()
    proc = _chat(tiny_model, "--max-new-tokens", "400")
    proc.stdin.write(b"Count to a thousand\n")
    proc.stdin.flush()
    _interrupt_once_writing(proc, prompt=b"\n> ")
    out, err = proc.communicate(b"hello again\n\n", timeout=300)
    stats = [line for line in err.decode().splitlines() if line.startswith("[")]
    assert proc.returncode == 0 and stats[0].startswith("[cancelled;") and len(stats) == 2, err.decode()
    assert "prefix reused 0]" not in stats[1]  # the second turn continued the conversation's cache


def test_chat_errors_keep_the_chat_and_odd_terminals_get_no_traceback(tiny_model):
    """A message past the context or not in UTF-8 used to end the interactive chat (or print a traceback); an
    output that can't encode the model's text (PYTHONIOENCODING=ascii, a Windows redirect's cp1252) killed
    it after the first reply."""
    proc = _chat(tiny_model, "--max-new-tokens", "4", env={"PYTHONIOENCODING": "ascii"})
    out, err = proc.communicate(b"word " * 5000 + b"\n\xff\xfe\nhello \xe4\xbd\xa0\xe5\xa5\xbd\n\n", timeout=300)
    err = err.decode(errors="replace")
    assert proc.returncode == 0 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and "context" in errors[0] and "not UTF-8" in errors[1], errors
    assert len([line for line in err.splitlines() if line.startswith("[max_new_tokens")]) == 1


def test_output_that_closes_early_ends_quietly(tiny_model):
    """`r1desk-cli chat ... | head -c 20`: a BrokenPipeError traceback."""
    proc = _chat(tiny_model, "--prompt", "Hi", "--max-new-tokens", "3000")
    assert proc.stdout.read(20)
    proc.stdout.close()  # as head does once it has its 20 bytes
    _, err = proc.communicate(timeout=300)
    assert "Traceback" not in err.decode() and proc.returncode in (0, 141), err.decode()


@pytest.mark.parametrize(
    "args",
    [
        ["chat", "--model", "m", "--json"],
        ["chat", "--model", "m", "--temperature", "nan"],
        ["chat", "--model", "m", "--top-p", "0"],
        ["chat", "--model", "m", "--max-new-tokens", "0"],
        ["bench", "--model", "m", "--runs", "0"],
        ["bench", "--model", "m", "--new-tokens", "-3"],
        ["serve", "--model", "m", "--port", "99999"],
        ["serve", "--model", "m", "--max-waiting", "0"],
        ["serve", "--model", "m", "--max-parallel", "0"],
        ["serve", "--model", "m", "--max-parallel", "many"],
        ["quantize", "--model", "m", "--out", "o", "--seq-len", "0"],
    ],
)
def test_out_of_range_arguments_are_usage_errors(args):
    """They were tracebacks (IndexError, ZeroDivisionError, OverflowError) or silent nonsense (nan as greedy,
    0 new tokens as the whole context, every API request refused with 429)."""
    proc = cli(*args, check=False)
    assert proc.returncode == 2 and "usage:" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_huge_seed_is_taken_as_the_api_takes_it(tiny_model):
    a = json.loads(
        cli(
            "chat",
            "--model",
            tiny_model,
            "--device",
            "cpu",
            "--prompt",
            "Hi",
            "--max-new-tokens",
            "5",
            "--seed",
            str(2**64 + 7),
            "--json",
        ).stdout
    )
    b = json.loads(
        cli(
            "chat",
            "--model",
            tiny_model,
            "--device",
            "cpu",
            "--prompt",
            "Hi",
            "--max-new-tokens",
            "5",
            "--seed",
            "7",
            "--json",
        ).stdout
    )
    assert a["token_ids"] == b["token_ids"]


def test_make_test_model_never_writes_over_a_folder(tiny_model, tmp_path):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(tiny_model, folder)
    before = (folder / "model.safetensors").read_bytes()
    proc = cli("make-test-model", folder, "--seed", "9", check=False)
    assert proc.returncode == 2 and "not an empty folder" in proc.stderr
    assert (folder / "model.safetensors").read_bytes() == before


def test_serve_on_a_port_in_use_says_so_and_exits_cleanly(tiny_model):
    """It printed the message, then aborted (SIGABRT, exit 134): its engine thread was still running."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli("serve", "--model", tiny_model, "--device", "cpu", "--port", port, check=False)
    assert proc.returncode == 1 and "could not listen" in proc.stderr and "Fatal" not in proc.stderr, proc.stderr
