"""r1desk-cli bench: time to ready, TTFT and decode tokens/s over repeated runs, peak VRAM; optionally the
same prompt through transformers' own generate() (eager dynamic cache, and static cache) in the same process,
with a logits check against transformers on the same weights."""

from __future__ import annotations

import contextlib
import gc
import time

import torch

from model_loader.engine import Engine
from model_loader.events import Finished, SamplingSettings
from model_loader.gpu_clocks import ClockWatch, format_clock_summary
from model_loader.kv_cache import KV_16BIT
from model_loader.stats import percentile

FILLER = (
    "The quick brown fox jumps over the lazy dog. In 1905 Einstein published four papers that changed physics. "
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
    "机器学习是人工智能的一个分支。 Prove that the sum of the first n odd numbers is n^2. "
)


def bench_prompt(engine: Engine, n_tokens: int) -> list[int]:
    """Exactly n_tokens ids: a chat prompt whose user turn is filler text, cut to size."""
    head = engine.chat.render([{"role": "user", "content": ""}]).ids
    filler = engine.chat.encode_plain(FILLER)
    ids = head[:-2]  # drop "<｜Assistant｜><think>\n" tail, re-added below
    tail = head[-2:]
    while len(ids) + len(tail) < n_tokens:
        ids += filler
    ids = ids[: max(1, n_tokens - len(tail))] + tail
    return ids[:n_tokens]


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_ours(engine: Engine, prompt: list[int], new_tokens: int, runs: int, temperature: float) -> dict:
    results = []
    clocks = ClockWatch(engine.info.gpu_uuid)  # the GPU's clock during the timed runs: a capped GPU says so
    for i in range(runs + 1):  # the first run is a warm-up and is not counted
        engine.reset_cache()  # every run prefills the whole prompt: no prefix reuse
        settings = SamplingSettings(
            temperature=temperature, top_p=0.95, max_new_tokens=new_tokens, ignore_eos=True, seed=i
        )
        with clocks if i else contextlib.nullcontext():
            final = [ev for ev in engine.generate_ids(prompt, settings) if isinstance(ev, Finished)][0]
        if i:
            results.append(final)
    ttft = [r.stats.ttft_ms for r in results]
    tps = [r.stats.decode_tok_s for r in results]
    lat = [x for r in results for x in r.stats.token_latencies_ms]
    return {
        "ttft_ms_p50": percentile(ttft, 50),
        "ttft_ms_p95": percentile(ttft, 95),
        "decode_tok_s_p50": percentile(tps, 50),
        "decode_tok_s_p95_low": percentile(tps, 5),
        "token_latency_ms_p50": percentile(lat, 50),
        "token_latency_ms_p95": percentile(lat, 95),
        "completion_tokens": results[0].stats.completion_tokens,
        "token_ids": results[0].token_ids,
        "sm_clock": clocks.summary(),
    }


def _hf_model(engine: Engine, dtype=None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        engine.info.model_path,
        dtype=dtype or engine.model.dtype,
        local_files_only=True,
        trust_remote_code=False,
        attn_implementation="sdpa",
    )
    return model.to(engine.model.device).eval()


def _hf_generate(model, ids: torch.Tensor, new_tokens: int, static: bool) -> tuple[float, float, list[int]]:
    """(ttft_ms, decode_tok_s, generated ids) for one greedy generate() call of exactly new_tokens tokens."""
    kwargs = dict(do_sample=False, min_new_tokens=new_tokens, max_new_tokens=new_tokens, pad_token_id=0)
    if static:
        kwargs["cache_implementation"] = "static"
    _sync(ids.device)
    t0 = time.perf_counter()
    model.generate(ids, **{**kwargs, "min_new_tokens": 1, "max_new_tokens": 1})
    _sync(ids.device)
    t1 = time.perf_counter()
    out = model.generate(ids, **kwargs)
    _sync(ids.device)
    t2 = time.perf_counter()
    ttft = t1 - t0
    return ttft * 1000.0, (new_tokens - 1) / max(t2 - t1 - ttft, 1e-9), out[0, ids.shape[1] :].tolist()


def compare_hf(engine: Engine, prompt: list[int], new_tokens: int, runs: int, ours_ids: list[int]) -> dict:
    model = _hf_model(engine)
    ids = torch.tensor([prompt], device=engine.model.device)
    report: dict = {}
    # Logits on the same weights, at every prompt position (prefill) and at the decode positions of our greedy
    # reply (through our decode path, the code the CUDA graph runs). bf16 rounding alone moves logits, so both
    # r1desk and transformers-in-bf16 are measured against transformers in fp32: "within bf16 tolerance" means
    # our error is no larger than transformers' own bf16 error.
    seq = torch.tensor([prompt + ours_ids[:64]], device=engine.model.device)
    with torch.inference_mode():
        ref16 = model(seq).logits[0].float()
        engine.reset_cache()
        ours = engine.model.prefill(torch.tensor(prompt, device=engine.model.device), 0, all_logits=True)
        dec = []
        for j, tok in enumerate(ours_ids[:64]):
            pos = len(prompt) + j
            engine.step.token.fill_(tok)
            engine.step.pos.fill_(pos)
            dec.append(engine.model.decode(engine.step.token, engine.step.pos, pos))
        ours_all = torch.cat([ours, torch.cat(dec)])  # row i predicts token i+1, as HF's logits do
    engine.reset_cache()
    ref32 = None
    if engine.model.dtype != torch.float32:
        model32 = _hf_model(engine, torch.float32)
        with torch.inference_mode():
            ref32 = model32(seq).logits[0].float()
        del model32
    report["logits_positions_compared"] = int(ours_all.shape[0])
    report["logits_max_abs"] = ref16.abs().max().item()
    report["ours_vs_hf_max_abs_diff"] = (ours_all - ref16).abs().max().item()
    report["top1_agreement_ours_vs_hf"] = (ours_all.argmax(-1) == ref16.argmax(-1)).float().mean().item()
    if ref32 is not None:
        for name, x in (("ours", ours_all), ("hf", ref16)):
            d = (x - ref32).abs()
            report[f"{name}_vs_fp32_max_abs_diff"] = d.max().item()
            report[f"{name}_vs_fp32_mean_abs_diff"] = d.mean().item()
            report[f"{name}_vs_fp32_top1_agreement"] = (x.argmax(-1) == ref32.argmax(-1)).float().mean().item()
    for name, static in (("hf_eager", False), ("hf_static", True)):
        t0 = time.perf_counter()
        _hf_generate(model, ids, min(new_tokens, 8), static)  # warm-up (the static cache compiles here)
        warm = time.perf_counter() - t0
        ttfts, tpss, gen = [], [], []
        for _ in range(max(1, runs)):
            ttft, tps, gen = _hf_generate(model, ids, new_tokens, static)
            ttfts.append(ttft)
            tpss.append(tps)
        report[name] = {
            "ttft_ms_p50": percentile(ttfts, 50),
            "decode_tok_s_p50": percentile(tpss, 50),
            "first_call_s": warm,
        }
        if name == "hf_eager":
            same = 0
            for a, b in zip(gen, ours_ids):
                if a != b:
                    break
                same += 1
            report["greedy_ids_identical_prefix"] = same
    del model
    gc.collect()
    if engine.model.device.type == "cuda":
        torch.cuda.empty_cache()
    return report


def bench_one(
    model: str,
    prompt_tokens: int,
    new_tokens: int,
    runs: int,
    device,
    context: int,
    temperature: float,
    use_triton,
    dtype,
    int4_kernel: str | None = None,
    kv_cache: str = KV_16BIT,
    use_cuda_graphs: bool | None = None,
) -> tuple[Engine, dict, list[int], list[int]]:
    """Load + warm up (timed: time to ready) and the timed runs, for one model folder."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    engine = Engine.load(
        model,
        device=device,
        context_length=context,
        use_triton=use_triton,
        dtype=dtype,
        int4_kernel=int4_kernel,
        kv_cache=kv_cache,
        use_cuda_graphs=use_cuda_graphs,
    )
    t_load = time.perf_counter() - t0
    engine.warm_up()
    ready = time.perf_counter() - t0
    prompt = bench_prompt(engine, prompt_tokens)
    ours = run_ours(engine, prompt, new_tokens, runs, temperature)
    mem = engine.memory()
    result = {
        "model": engine.info.model_name,
        "device": engine.info.device_name,
        "dtype": engine.info.dtype,
        "quantization": engine.info.quantization,
        "kv_cache": engine.info.kv_cache,
        "embed_on_host": engine.info.embed_on_host,
        "gemv": engine.info.gemv,
        "decode_attention": engine.info.decode_attention,
        "torch": torch.__version__,
        "kernels": engine.info.kernels,
        "cuda_graphs": engine.info.cuda_graphs,
        "prompt_tokens": len(prompt),
        "new_tokens": new_tokens,
        "runs": runs,
        "temperature": temperature,
        "context_length": engine.info.context_length,
        "load_s": t_load,
        "load_breakdown": engine.info.load_breakdown,
        "warmup_s": engine.info.warmup_s,
        "ready_s": ready,
        "weights_gib": mem.weights_bytes / 2**30,
        "kv_cache_gib": mem.kv_cache_bytes / 2**30,
        "int4_scratch_gib": engine.model.linear.scratch_bytes / 2**30,
        "peak_vram_gib": mem.peak_allocated_bytes / 2**30,
        "reserved_vram_gib": mem.torch_reserved_bytes / 2**30,
    }
    token_ids = ours.pop("token_ids")
    result.update(ours)
    return engine, result, prompt, token_ids


def run_bench(
    model: str,
    prompt_tokens: int = 512,
    new_tokens: int = 256,
    runs: int = 5,
    device: str | None = None,
    context: int = 4096,
    compare: str | None = None,
    temperature: float = 0.0,
    use_triton: bool | None = None,
    dtype: str | None = None,
    awq: str | None = None,
    int4_kernel: str | None = None,
    kv_cache: str = KV_16BIT,
    use_cuda_graphs: bool | None = None,
) -> dict:
    engine, result, prompt, token_ids = bench_one(
        model,
        prompt_tokens,
        new_tokens,
        runs,
        device,
        context,
        temperature,
        use_triton,
        dtype,
        int4_kernel,
        kv_cache,
        use_cuda_graphs,
    )
    if compare == "hf":
        hf = compare_hf(engine, prompt, new_tokens, runs, token_ids)
        result["compare_hf"] = hf
        for name in ("hf_eager", "hf_static"):
            if hf.get(name, {}).get("decode_tok_s_p50"):
                result[f"speedup_vs_{name}"] = result["decode_tok_s_p50"] / hf[name]["decode_tok_s_p50"]
                result[f"ttft_ratio_vs_{name}"] = hf[name]["ttft_ms_p50"] / result["ttft_ms_p50"]
    if awq:
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        engine, q, _, _ = bench_one(
            awq,
            prompt_tokens,
            new_tokens,
            runs,
            device,
            context,
            temperature,
            use_triton,
            None,
            int4_kernel,
            kv_cache,
            use_cuda_graphs,
        )
        q["decode_speedup_vs_dense"] = q["decode_tok_s_p50"] / result["decode_tok_s_p50"]
        q["weights_ratio_vs_dense"] = q["weights_gib"] / result["weights_gib"]
        result["awq"] = q
    return result


def format_bench(r: dict) -> str:
    lines = [
        f"model {r['model']} on {r['device']} ({r['dtype']}, kernels={r['kernels']}, cuda graphs={r['cuda_graphs']}, "
        f"torch {r['torch']}, {r.get('kv_cache', KV_16BIT)} KV cache)",
        f"prompt {r['prompt_tokens']} tokens, {r['new_tokens']} new tokens, {r['runs']} runs, "
        f"temperature {r['temperature']}",
        f"ready      {r['ready_s']:.2f} s  (load {r['load_s']:.2f} s + warm-up {r['warmup_s']:.2f} s)",
        f"TTFT       P50 {r['ttft_ms_p50']:.1f} ms   P95 {r['ttft_ms_p95']:.1f} ms",
        f"decode     P50 {r['decode_tok_s_p50']:.1f} tok/s   (worst 5% {r['decode_tok_s_p95_low']:.1f})",
        f"per token  P50 {r['token_latency_ms_p50']:.3f} ms   P95 {r['token_latency_ms_p95']:.3f} ms",
        *([f"GPU        {format_clock_summary(r['sm_clock'])}"] if r.get("sm_clock") else []),
        f"memory     weights {r['weights_gib']:.2f} GiB, KV cache {r['kv_cache_gib']:.2f} GiB, "
        f"peak allocated {r['peak_vram_gib']:.2f} GiB",
    ]
    q = r.get("awq")
    if q:
        lines.append(
            f"AWQ {q['model']} ({q['quantization']}): ready {q['ready_s']:.2f} s, TTFT P50 "
            f"{q['ttft_ms_p50']:.1f} ms, decode P50 {q['decode_tok_s_p50']:.1f} tok/s = "
            f"{q['decode_speedup_vs_dense']:.2f}x {r['dtype']}; weights {q['weights_gib']:.2f} GiB = "
            f"{q['weights_ratio_vs_dense']:.1%} of {r['dtype']} in VRAM"
            f"{' (embedding table in host memory)' if q.get('embed_on_host') else ''}"
            f"{'; prefill scratch %.2f GiB' % q['int4_scratch_gib'] if q.get('int4_scratch_gib') else ''}"
        )
    hf = r.get("compare_hf")
    if hf:
        lines.append(
            f"logits vs transformers ({hf['logits_positions_compared']} positions, max |logit| "
            f"{hf['logits_max_abs']:.2f}): max |diff| {hf['ours_vs_hf_max_abs_diff']:.4f}, top-1 agreement "
            f"{hf['top1_agreement_ours_vs_hf']:.4f}; greedy ids identical for the first "
            f"{hf['greedy_ids_identical_prefix']} tokens"
        )
        if "ours_vs_fp32_max_abs_diff" in hf:
            for name in ("ours", "hf"):
                lines.append(
                    f"  {name:>4} {r['dtype']} vs transformers fp32: max |diff| "
                    f"{hf[name + '_vs_fp32_max_abs_diff']:.4f}, "
                    f"mean {hf[name + '_vs_fp32_mean_abs_diff']:.5f}, "
                    f"top-1 agreement {hf[name + '_vs_fp32_top1_agreement']:.4f}"
                )
        for name in ("hf_eager", "hf_static"):
            h = hf[name]
            lines.append(
                f"{name:<10} TTFT {h['ttft_ms_p50']:.1f} ms, decode {h['decode_tok_s_p50']:.1f} tok/s "
                f"(first call {h['first_call_s']:.1f} s) -> r1desk is "
                f"{r.get('speedup_vs_' + name, float('nan')):.2f}x decode, "
                f"{r.get('ttft_ratio_vs_' + name, float('nan')):.2f}x TTFT"
            )
    return "\n".join(lines)
