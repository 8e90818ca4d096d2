"""A first start's kernel compiles, under way while the weights are still loading.

On a machine that never ran r1desk, Triton compiles every kernel variant the warm-up launches (kernels.precompile
submits them all to a thread pool at once, and they still take seconds). What it compiles depends only on
shapes, dtypes, alignments and the integer arguments' divisibility, never on the weights' values, so it need not
wait for the weights (seconds to read). `CompileBesideLoad` walks the warm-up's paths with compile-only launches
(`walk_warm_up_paths`) over a *shape twin* of the model being loaded: one decoder layer with uninitialised
weights in the same layout (fused QKV and gate/up, the same int4 packing), a KV cache with the same strides and
a token table cut to a few rows (only cuBLAS and torch's embedding ever see the vocabulary size). Its compiles run
on the pool beside the weight copies; the warm-up then only waits for what is still compiling.

Walking the real code paths (not a hand-kept list of kernels) is what makes the twin's variants the ones the
warm-up launches; tests/test_precompile.py checks on a GPU that the warm-up compiles nothing itself.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

import torch

from model_loader.forced_tokens import ForcedTokens
from model_loader.kernels import precompile
from model_loader.kv_cache import KV_16BIT

log = logging.getLogger(__name__)

TWIN_VOCAB = 256  # token rows of the twin's embedding and LM head: only torch's kernels read them
TWIN_HEADROOM = 512 * 2**20  # free device memory the twin must leave beside the model's weights


WARM_UP_TOKENS = 8  # the warm-up's eager prompt: its length is one of the things kernels are compiled for


def warm_up_ids(device) -> torch.Tensor:
    """The prompt the warm-up prefills eagerly (its values don't matter; its length and dtype do)."""
    return torch.zeros(WARM_UP_TOKENS, dtype=torch.int64, device=device)


def walk_warm_up_paths(model, buckets, graphs: bool, vocab_size: int | None = None, mark=None) -> None:
    """Every path of the warm-up once, with compile-only Triton launches (kernels.precompile.compile_only):
    submits every kernel variant the warm-up needs to the compile pool at once. `model` is the model itself or
    its shape twin; `buckets` the prefill lengths captured as CUDA graphs; graphs: whether the warm-up captures
    graphs (then it also times every single-token GEMV and decode attention candidate); vocab_size: the real
    model's (a twin has fewer tokens), which the sampler's kernels are specialised on. mark(label), if given, is
    called as each part of the walk ends (first_start_profile's timeline)."""
    mark = mark or (lambda label: None)
    if len(model.w["layers"]) > 1 or not model.last_layer_rows_only:  # the model itself: its paths as they run
        _walk(model, buckets, graphs, vocab_size, mark)
        return
    # A twin's one layer stands for all of the model's, so the paths are walked with every row through every
    # layer (Qwen2Model.last_layer_rows_only), then once more with the last layer's one-row path.
    model.last_layer_rows_only = False
    try:
        _walk(model, buckets, graphs, vocab_size, mark)
    finally:
        model.last_layer_rows_only = True
    with precompile.compile_only(), torch.inference_mode():
        model.prefill(warm_up_ids(model.device), 0)
    mark("the last layer's one-row path")


def _walk(model, buckets, graphs: bool, vocab_size: int | None, mark) -> None:
    dev = model.device
    # The longest compiles are submitted first (the last one to start bounds the first start): the GEMV
    # candidates (the 4-bit ones above all), then the prefill graphs' attention.
    # Inputs have the dtypes and shapes of the engine's warm-up, decode step and prefill graphs.
    with precompile.compile_only(), torch.inference_mode():
        if graphs:
            model.linear.call_every_candidate(model.w, model.dtype)
            mark("GEMV candidates")
            tokens = torch.zeros(max(buckets, default=1), dtype=torch.int64, device=dev)
            last = torch.zeros(1, dtype=torch.int64, device=dev)
            start = torch.zeros(1, dtype=torch.int32, device=dev)
            for bucket in sorted(buckets, reverse=True):  # tile shape and split differ by length: every bucket
                for fresh in (False, True):
                    model.prefill_static(tokens[:bucket], last, start, fresh)
            mark("prefill graphs")
            token = torch.zeros(1, dtype=torch.int64, device=dev)
            pos = torch.zeros(1, dtype=torch.int32, device=dev)
            for config in model.decode_attention_candidates():
                model.set_decode_attention_config(config)
                model.decode(token, pos, 0)
            model.set_decode_attention_config(None)
            mark("decode attention candidates")
            _walk_sampler(dev, model.dtype, vocab_size or model.cfg.vocab_size)
            ForcedTokens(dev, None, use_triton=True).commit(token, token.clone(), pos)  # the step's last kernel
            mark("sampler and commit")
        ids = warm_up_ids(dev)
        model.prefill(ids, 0)
        model.prefill(ids[:2], ids.numel())  # the prefix-reuse path
        mark("eager prefills")


def _walk_sampler(dev, dtype, vocab_size: int) -> None:
    """The sampled decode step's sampler, on logits of the step's dtype and the real vocabulary's size."""
    from model_loader.sampling import SamplerParams, sample

    logits = torch.zeros(1, vocab_size, dtype=dtype, device=dev)
    params = SamplerParams(dev)
    params.set(0.6, 0.95, 0, vocab_size)
    sample(logits, params)


def twin_config(cfg):
    """The model's config with one decoder layer and TWIN_VOCAB tokens."""
    return dataclasses.replace(cfg, num_hidden_layers=1, vocab_size=TWIN_VOCAB)


def twin_bytes(cfg, dtype: torch.dtype, context: int) -> int:
    """A generous bound on the device memory the twin takes while it is walked: one layer's weights (AWQ
    unpacks them to int32 on the way: 4 bytes a weight), a 2,048-token prefill's activations, one layer of KV."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    params = (cfg.q_size + 2 * cfg.kv_size) * h + h * cfg.q_size + 3 * i * h
    activations = 2048 * (2 * i + 4 * h) * 4
    kv = 2 * cfg.num_key_value_heads * context * cfg.head_dim * dtype.itemsize
    return 6 * params + activations + kv


class CompileBesideLoad:
    """Builds the shape twin and walks it on a helper thread, inside a compile pool entered there (Triton's
    async-compile mode is per thread, so the loading thread's own launches are unaffected). The loading thread
    calls release_twin() once its weights are in (waits for the walk, frees the twin, before the free memory is
    measured for the context); the warm-up calls finish() (waits for the compiles); anything that ends the load
    early calls abandon()."""

    def __init__(
        self,
        cfg,
        shards,
        awq,
        int4_layout,
        device,
        dtype,
        context: int,
        buckets,
        graphs: bool,
        int4pack_prefill: bool,
        kv_cache: str = KV_16BIT,
    ):
        self._args = (
            cfg,
            shards,
            awq,
            int4_layout,
            device,
            dtype,
            context,
            buckets,
            graphs,
            int4pack_prefill,
            kv_cache,
        )
        self.device = device
        self.pool: precompile.CompilePool | None = None
        self.error: str | None = None  # why the walk stopped early
        self.walk_s = 0.0
        self.timeline: list[tuple[str, float]] = []  # (what ended, time.perf_counter()) on the walk's thread
        self._thread = threading.Thread(target=self._run, name="r1desk-twin-walk", daemon=True)

    @classmethod
    def start_if_room(
        cls,
        cfg,
        shards,
        awq,
        int4_layout,
        device,
        dtype,
        context: int,
        buckets,
        graphs: bool,
        int4pack_prefill: bool,
        load_bytes: int,
        kv_cache: str = KV_16BIT,
    ) -> "CompileBesideLoad | None":
        """Started, or None where Triton can't compile ahead here or the twin would not fit beside the weights
        (then the warm-up compiles ahead on the loaded model, after the load, as before)."""
        if precompile.async_compile_mode() is None:
            return None
        free, _ = torch.cuda.mem_get_info(device)
        need = load_bytes + twin_bytes(cfg, dtype, context) + TWIN_HEADROOM
        if free < need:
            log.info(
                "compiling after the load: the model's shape twin would not fit beside its weights "
                "(%.2f GiB free, %.2f GiB needed)",
                free / 2**30,
                need / 2**30,
            )
            return None
        ahead = cls(cfg, shards, awq, int4_layout, device, dtype, context, buckets, graphs, int4pack_prefill, kv_cache)
        ahead._thread.start()
        return ahead

    @property
    def threads(self) -> int:
        return self.pool.threads if self.pool is not None else 0

    @property
    def processes(self) -> int:
        return self.pool.processes if self.pool is not None else 0

    @property
    def in_processes(self) -> bool:
        return self.pool is not None and self.pool.workers is not None

    @property
    def worker_stats(self) -> dict | None:
        return self.pool.worker_stats if self.in_processes else None

    def _run(self) -> None:
        import time

        from model_loader.qwen2 import Qwen2Model
        from model_loader.weights import load_weights, twin_entries

        cfg, shards, awq, int4_layout, device, dtype, context, buckets, graphs, int4pack_prefill, kv_cache = self._args
        t = time.perf_counter()

        def mark(label: str) -> None:
            self.timeline.append((label, time.perf_counter()))

        mark("walk started")
        twin = weights = None
        try:
            with torch.cuda.device(device):  # Triton compiles for the thread's current device
                self.pool = precompile.open_compile_pool()
                mark("compile pool open")
                if self.pool is None:
                    self.error = "Triton can't compile ahead here"
                    return
                small = twin_config(cfg)
                weights = load_weights(
                    small,
                    shards,
                    device,
                    dtype,
                    awq=awq,
                    int4_layout=int4_layout,
                    entries=twin_entries(cfg, shards, awq, small),
                    read_values=False,
                )
                twin = Qwen2Model(small, weights, device, dtype, context, use_triton=True, kv_cache=kv_cache)
                if int4pack_prefill:  # as the loaded model will (its check runs on the loading thread)
                    twin.linear.use_int4pack_prefill(weights, device, dtype)
                mark("twin built")
                walk_warm_up_paths(twin, buckets, graphs, vocab_size=cfg.vocab_size, mark=mark)
        except BaseException as err:  # the warm-up walks the loaded model instead (Engine.warm_up)
            # Only the message is kept: the exception's frames would keep the twin in GPU memory.
            self.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            log.warning("compiling ahead beside the load stopped: %s", self.error)
        finally:
            twin = weights = None  # noqa: F841 (frees the twin now, whatever happened)
            self.walk_s = time.perf_counter() - t

    @property
    def complete(self) -> bool:
        """The walk ended (call after release_twin or finish) having submitted every compile the warm-up needs."""
        return not self._thread.is_alive() and self.error is None and self.pool is not None

    def release_twin(self) -> None:
        """Wait for the walk (its compiles go on) and give the twin's memory back to the device."""
        self._thread.join()
        torch.cuda.empty_cache()

    def finish(self) -> None:
        """Wait for every compile submitted (idempotent)."""
        self._thread.join()
        if self.pool is not None:
            self.pool.finish()

    def abandon(self) -> None:
        """The load ended early: wait for the compiles all the same (a compile can't be stopped midway, and a
        kernel left half-registered with Triton would break the next load in this process), free the twin."""
        self.finish()
        torch.cuda.empty_cache()
