"""Loading a model folder for the engine: validate it, choose the device, precision, int4 path and context, copy
the weights onto the device while the tokenizer loads and (on a first start) the GPU kernels compile beside the
load, and describe the result (EngineInfo). Engine.load (engine.py) makes the engine of what this returns."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

import torch

from model_loader import kernel_cache
from model_loader.chat import ChatFormat
from model_loader.context import AUTO_TARGET, NoRoomForContext, auto_context, requested_context
from model_loader.decode_graphs import PrefillGraphs
from model_loader.device import pick_device, pick_dtype, use_device
from model_loader.errors import ModelError, OutOfMemoryError
from model_loader.kernels import reference, triton_problem, triton_unavailable
from model_loader.kv_cache import KV_16BIT, check_kv_cache, unsupported_reason
from model_loader.locate import ModelFolder, resolve_model
from model_loader.qwen2 import Qwen2Model
from model_loader.stats import gpu_uuid
from model_loader.tokenizer import check_vocabulary, load_tokenizer
from model_loader.variants import choose_int4_layout, kernel_variant, quantization_label
from model_loader.weights import load_peak_bytes, load_weights

log = logging.getLogger(__name__)
OOM_ADVICE = "try a shorter context length or 4-bit (AWQ) weights"


@dataclass
class EngineInfo:
    model_path: str
    model_name: str
    device: str
    device_name: str
    dtype: str
    context_length: int
    context_auto: bool  # chosen from the free memory at load (model_loader.context)
    kernels: str  # "triton" or "pytorch"
    cuda_graphs: bool
    reasons: bool
    quantization: str | None = None  # None (dense), or which AWQ path is in use
    embed_on_host: bool = False  # the embedding table is read from host memory (saves its VRAM)
    gemv: dict = field(default_factory=dict)  # "NxK" weight shape -> "cuBLAS" or our Triton GEMV config (measured)
    decode_attention: dict = field(default_factory=dict)  # "<=depth" -> the attention configuration (measured)
    load_s: float = 0.0
    load_breakdown: dict = field(default_factory=dict)  # tokenizer_s, device_init_s, weights_s
    warmup_s: float = 0.0
    weights_bytes: int = 0
    kv_cache_bytes: int = 0
    kv_cache: str = KV_16BIT  # the cache's format (model_loader.kv_cache)
    # what a decode step reads: these weight bytes and this many cache bytes a token of context (stats.
    # decode_context; a live panel's read rate)
    decode_weight_bytes: int = 0
    kv_bytes_per_token: int = 0
    compile_workers: dict | None = None  # a first start's compiles in worker processes (precompile.CompilePool)
    gpu_uuid: str | None = None  # NVML's name for the GPU (stats.gpu_uuid): its numbering is not CUDA's
    vocab_size: int = 0  # rows of the embedding: token ids a request may name (logit_bias) are below it
    tools: bool = False  # the chat template renders tool definitions (model_loader.tool_calls)
    fim: bool = False  # the tokenizer has fill-in-the-middle tokens (completions' suffix)
    kernels_note: str | None = None  # kernels "pytorch": why, and how to get Triton's kernels back


@dataclass
class LoadedModel:
    folder: ModelFolder
    model: Qwen2Model
    chat: ChatFormat
    info: EngineInfo
    ahead: object | None  # compile_ahead.CompileBesideLoad: a first start's compiles, for the warm-up to finish


def load_model(
    spec,
    device: str | None = None,
    context_length: int | str = 4096,
    dtype: str | None = None,
    progress=None,
    use_triton: bool | None = None,
    use_cuda_graphs: bool | None = None,
    embed_on_host: bool | None = None,
    int4_kernel: str | None = None,
    on_compiling=None,
    kv_cache: str = KV_16BIT,
) -> "LoadedModel":
    """Engine.load's work: the folder validated, the weights on the device, the tokenizer, the context chosen, and
    on a first start the kernels compiling beside the load (their CompileBesideLoad in `ahead`, for the warm-up)."""
    t0 = time.perf_counter()
    check_kv_cache(kv_cache)
    folder = resolve_model(spec)
    reference.keep_off_cudnn()
    dev = pick_device(device)
    use_device(dev)
    if dev.type == "cuda":
        reason = unsupported_reason(
            kv_cache, "cuda", torch.cuda.get_device_capability(dev), torch.cuda.get_device_name(dev)
        )
        if reason:
            raise ModelError(reason)
    torch_dtype = pick_dtype(dev, dtype)
    cfg = folder.config
    auto = context_length in ("auto", 0, None)
    ctx = None if auto else requested_context(context_length, cfg.max_position_embeddings)
    # Explicit use_triton=True also works on the CPU under TRITON_INTERPRET=1: how the tests run the
    # fused kernels end to end without a GPU.
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    # why Triton's kernels don't run, and what would bring them back (the live panel says it on a GPU)
    kernels_note = "turned off for this run (--no-triton)." if use_triton is False else triton_unavailable(dev)
    triton_ok = kernels_note is None if use_triton is None else (use_triton and (kernels_note is None or interpreting))
    # Whether Triton really works here (it compiles a C launcher and a kernel, too long for a first start to
    # wait for) is checked on a helper thread while the weights load; the choices made before the answer are
    # undone below if it says no.
    triton_check: dict = {}
    check_thread = None
    if triton_ok and dev.type == "cuda":
        check_thread = threading.Thread(
            target=lambda: triton_check.update(problem=triton_problem(dev)), name="r1desk-triton-check", daemon=True
        )
    breakdown: dict[str, float] = {}
    # The tokenizer (importing transformers is most of it) loads on a helper thread while the weights copy.
    tok_box: dict = {}

    def load_tok():
        t = time.perf_counter()
        try:
            tok_box["tokenizer"] = load_tokenizer(folder.path)
        except BaseException as err:  # re-raised on the loading thread below
            tok_box["error"] = err
        breakdown["tokenizer_s"] = time.perf_counter() - t

    tok_thread = threading.Thread(target=load_tok, name="r1desk-tokenizer", daemon=True)
    tok_thread.start()
    ahead = None  # compile_ahead.CompileBesideLoad on a first start
    try:
        t = time.perf_counter()
        if dev.type == "cuda":
            torch.cuda.init()
            torch.empty(1, device=dev)  # create the CUDA context now, so it is timed on its own
        breakdown["device_init_s"] = time.perf_counter() - t
        if check_thread is not None:
            check_thread.start()
        t = time.perf_counter()
        int4 = choose_int4_layout(dev, torch_dtype, triton_ok, int4_kernel) if cfg.awq else None
        # 4-bit users are saving VRAM: keep their embedding table in host memory (see host_mapped_alias)
        on_host = cfg.awq is not None if embed_on_host is None else embed_on_host
        # CUDA graphs with Triton's kernels or, where it can't run, with plain PyTorch ops (torch_graph_ops)
        graphs = dev.type == "cuda" and (use_cuda_graphs is None or use_cuda_graphs)
        if check_thread is not None:  # a first start compiles its kernels while the weights load
            ahead = _compile_beside_load(folder, dev, torch_dtype, int4, ctx, graphs, on_host, kv_cache)
            if ahead is not None and on_compiling is not None:
                on_compiling()
        weights = load_weights(
            cfg, folder.shards, dev, torch_dtype, progress, awq=cfg.awq, int4_layout=int4, embed_on_host=on_host
        )
        if check_thread is not None:
            check_thread.join()
            # a check that failed (or never ran) is tried once more now the load is done: it may have run short of
            # memory beside it
            if triton_check.get("problem", "") is not None:
                triton_check["problem"] = triton_problem(dev)
            kernels_note = triton_check["problem"]  # and logged
            if kernels_note is not None:
                triton_ok = False
                if ahead is not None:  # its kernels will not be used
                    ahead.abandon()
                    ahead = None
                if int4 == "triton":  # that layout needs Triton's kernels: load the weights for another path
                    del weights
                    torch.cuda.empty_cache()
                    int4 = choose_int4_layout(dev, torch_dtype, False, int4_kernel) if cfg.awq else None
                    weights = load_weights(
                        cfg,
                        folder.shards,
                        dev,
                        torch_dtype,
                        progress,
                        awq=cfg.awq,
                        int4_layout=int4,
                        embed_on_host=on_host,
                    )
        if ahead is not None:  # before the free memory is measured for the context
            ahead.release_twin()
        breakdown["weights_s"] = time.perf_counter() - t
        if auto:  # measured now, with the weights in place and before the KV cache is allocated
            try:
                ctx = auto_context(dev, cfg, torch_dtype.itemsize, kv_cache)
            except NoRoomForContext as err:
                raise OutOfMemoryError(f"{folder.name} fits, but {err}; {OOM_ADVICE}") from None
        model = Qwen2Model(cfg, weights, dev, torch_dtype, ctx, use_triton=triton_ok, kv_cache=kv_cache)
        if int4 == "torch" and triton_ok:
            if ahead is not None:  # the check below launches a kernel that may still be compiling
                ahead.finish()
            try:
                fast_prefill = model.linear.enable_int4pack_prefill(weights, dev, torch_dtype)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as err:  # a kernel that fails to build here: keep torch's kernel for prefill
                log.warning("4-bit prefill dequantiser unusable (%s: %s)", type(err).__name__, err)
                model.linear.int4pack_prefill = fast_prefill = False
            log.log(
                logging.INFO if fast_prefill else logging.WARNING,
                "4-bit prefill: %s",
                "our dequantiser + cuBLAS"
                if fast_prefill
                else "torch's int4 kernel (our dequantiser of its layout is not usable on this GPU)",
            )
    except BaseException as err:
        if ahead is not None:
            ahead.abandon()
        if isinstance(err, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
            raise OutOfMemoryError(f"out of GPU memory while loading {folder.name}; {OOM_ADVICE}") from err
        raise
    finally:
        tok_thread.join()
        if check_thread is not None and check_thread.is_alive():  # a load that failed early
            check_thread.join()
    try:
        if "error" in tok_box:
            raise tok_box["error"]
        check_vocabulary(tok_box["tokenizer"], cfg, folder.path)
        chat = ChatFormat(tok_box["tokenizer"], cfg.eos_token_id)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        info = EngineInfo(
            model_path=str(folder.path),
            model_name=folder.name,
            device=str(dev),
            device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU",
            gpu_uuid=gpu_uuid(dev.index) if dev.type == "cuda" else None,
            dtype=str(torch_dtype).replace("torch.", ""),
            context_length=ctx,
            context_auto=auto,
            kernels="triton" if triton_ok else "pytorch",
            kernels_note=None if triton_ok else kernels_note,
            cuda_graphs=graphs,
            reasons=chat.reasons,
            quantization=quantization_label(cfg, int4, torch_dtype, model.linear.int4pack_prefill),
            embed_on_host=model.embed_on_host,
            load_s=time.perf_counter() - t0,
            load_breakdown=breakdown,
            weights_bytes=model.weights_bytes,
            kv_cache_bytes=model.kv_cache_bytes,
            kv_cache=kv_cache,
            decode_weight_bytes=model.decode_weight_bytes,
            kv_bytes_per_token=model.kv_bytes_per_token,
            vocab_size=cfg.vocab_size,
            tools=chat.tools_supported,
            fim=chat.fim,
        )
    except BaseException:
        if ahead is not None:  # the compiles it began end before the error is reported
            ahead.abandon()
        raise
    log.info(
        "loaded %s on %s (%s, kernels=%s, cuda graphs=%s, quantization=%s) in %.2fs",
        folder.name,
        info.device_name,
        info.dtype,
        info.kernels,
        graphs,
        info.quantization,
        info.load_s,
    )
    if ahead is not None:
        breakdown["compile_walk_s"] = ahead.walk_s
    return LoadedModel(folder, model, chat, info, ahead)


def _compile_beside_load(folder, dev, dtype, int4, ctx, graphs: bool, on_host: bool, kv_cache: str):
    """On a first start (no kernels prepared for this GPU and model kind), start compiling every kernel the
    warm-up needs on a shape twin of the model while its weights load (model_loader.compile_ahead). None
    otherwise, or where the twin would not fit beside the weights."""
    try:
        return _start_compile_beside_load(folder, dev, dtype, int4, ctx, graphs, on_host, kv_cache)
    except Exception as err:  # only a faster first start is lost: the warm-up compiles as before
        log.warning("not compiling beside the load: %s: %s", type(err).__name__, err)
        return None


def _start_compile_beside_load(folder, dev, dtype, int4, ctx, graphs: bool, on_host: bool, kv_cache: str):
    from model_loader.compile_ahead import CompileBesideLoad

    cfg = folder.config
    # torch's int4 layout prefills through our dequantiser only where its check passes (after the load):
    # prepared under either label counts
    labels = {quantization_label(cfg, int4, dtype, int4pack_prefill=check) for check in (int4 == "torch", False)}
    if any(kernel_cache.kernels_prepared(dev, kernel_variant(cfg, dtype, label, kv_cache)) for label in labels):
        return None
    # the context is chosen after the load when automatic: compile for the largest it can be (a prefill
    # bucket too many costs a compile, one too few a compile on the warm-up's thread)
    context = ctx if ctx is not None else min(AUTO_TARGET, cfg.max_position_embeddings)
    buckets = PrefillGraphs.buckets_for(context, Qwen2Model.PREFILL_CHUNK) if graphs else ()
    return CompileBesideLoad.start_if_room(
        cfg,
        folder.shards,
        cfg.awq,
        int4,
        dev,
        dtype,
        context,
        buckets,
        graphs,
        int4 == "torch",
        load_peak_bytes(cfg, folder.shards, dtype, on_host),
        kv_cache,
    )
