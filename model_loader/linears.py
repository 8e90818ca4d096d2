"""y = x @ W.T for every kind of weight the loader produces, with the kernel chosen per weight kind, per
shape and per row count:

  dense [out, in]        cuBLAS, or (one token) our Triton GEMV where warm-up measured it faster; on the
                         Triton path the MLP's gate/up rows are stored in pairs (pair_gate_up_rows) so that
                         the single-token GEMV outputs SiLU(gate) * up itself
  awq.RowPackedInt4      one token: our Triton int4 GEMV (config measured per shape at warm-up; the MLP's
                         gate/up GEMV outputs SiLU(gate) * up);
                         several rows (prefill): dequantise into a shared scratch buffer, then cuBLAS
  awq.Int4Weight         one token: torch's int4 kernel (CUDA sm80+); several rows: our dequantiser of its
                         tile layout + cuBLAS once enable_int4pack_prefill() has checked it against torch's
                         kernel on this GPU (torch's kernel is many times slower than cuBLAS for a prompt's rows),
                         except the row counts of a scheduler's decode steps where choose_int4pack_rows() timed
                         torch's kernel faster (it reads the 4-bit weight once; the dense copy is written and
                         read again in 16 bits)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model_loader.awq import Int4Weight, RowPackedInt4, int4_linear


class Linears:
    def __init__(self, weights: dict, device, dtype):
        self.gemv_choice: dict = {}  # (dense shape, SiLU output?) -> our GEMV config (absent: cuBLAS); see tune()
        self.dense_gate_up_pairs = False  # see pair_dense_gate_up
        self.int4_choice: dict = {}  # (int4 shape, SiLU output?) -> our int4 GEMV config; see tune()
        # One dense copy at a time is enough: the stream runs the linears in order. Allocated up front so CUDA
        # graphs of the prefill can capture it, and so its memory is taken at load, not mid-reply.
        sizes = [w.out_features * w.in_features for w in self._int4_weights(weights)]
        self.int4_gemv = bool(sizes)  # single-token steps run our 4-bit GEMVs (a 4-bit model on a GPU)
        self.scratch = torch.empty(max(sizes), device=device, dtype=dtype) if sizes else None
        if torch.device(device).type == "cuda":
            from model_loader.kernels.gemv import split_counters

            split_counters(device)  # the split GEMVs' arrival counts: before any graph capture
        self.int4pack_prefill = False  # see enable_int4pack_prefill
        self.int4pack_rows: dict = {}  # ((out, in), rows) -> torch's int4 kernel beat dequantise + cuBLAS there

    def pair_dense_gate_up(self, weights: dict) -> None:
        """Store every layer's dense [gate; up] weight with its rows in pairs (gate 0, up 0, gate 1, ...), in place:
        a single-token GEMV then outputs SiLU(gate) * up itself (no separate kernel, which would cost each decode
        step: docs/BENCHMARKS.md, 'Kernel-level numbers (H200)'), and a prefill's GEMM output goes through
        silu_mul(paired=True). Triton path only (the reference ops take [gate | up])."""
        for layer in weights["layers"]:
            w = layer["gate_up_w"]
            if isinstance(w, torch.Tensor):
                pair_gate_up_rows(w)
                self.dense_gate_up_pairs = True

    @staticmethod
    def _int4_weights(weights: dict, kind=RowPackedInt4) -> list:
        return [w for layer in weights["layers"] for w in layer.values() if isinstance(w, kind)]

    def enable_int4pack_prefill(self, weights: dict, device, dtype, reference_linear=int4_linear) -> bool:
        """Prefill AWQ weights held in torch's int4 layout through our dequantiser + cuBLAS, if it reproduces
        torch's own kernel on this GPU (checked on one weight; the layout is torch's internal one)."""
        from model_loader.kernels import int4_triton

        packed = self._int4_weights(weights, Int4Weight)
        if not packed:
            return False
        self.use_int4pack_prefill(weights, device, dtype)
        self.int4pack_prefill = int4_triton.int4pack_dequantize_matches(packed[0], self.scratch, reference_linear)
        if not self.int4pack_prefill and not self._int4_weights(weights):
            self.scratch = None  # not needed after all: give the memory back
        return self.int4pack_prefill

    def use_int4pack_prefill(self, weights: dict, device, dtype) -> None:
        """Prefill torch-layout int4 weights through our dequantiser without checking it (enable_int4pack_prefill
        checks, then calls this): what a model's shape twin does (model_loader.compile_ahead)."""
        packed = self._int4_weights(weights, Int4Weight)
        if not packed:  # every group dequantised at load: nothing to prefill this way
            return
        size = max(w.out_features * w.in_features for w in packed)
        if self.scratch is None or self.scratch.numel() < size:
            self.scratch = torch.empty(size, device=device, dtype=dtype)
        self.int4pack_prefill = True

    def choose_int4pack_rows(self, weights: dict, row_counts) -> dict:
        """For torch-layout int4 weights prefilled through dequantise + cuBLAS: time, per weight shape and row
        count (a scheduler's decode buckets), torch's int4 kernel against dequantise + cuBLAS over every layer's
        weight (each read from HBM, as in decoding), and keep the faster for calls of that many rows. CUDA only;
        call it before capturing graphs of those rows. Returns {"NxK": {rows: {"int4 kernel" | "dequantize +
        cuBLAS": us}}}."""
        if not self.int4pack_prefill:
            return {}
        from model_loader.kernels import int4_triton
        from model_loader.kernels.gemv import time_configs

        by_shape: dict[tuple[int, int], list[Int4Weight]] = {}
        for w in self._int4_weights(weights, Int4Weight):
            by_shape.setdefault(w.shape, []).append(w)
        paths = ("int4 kernel", "dequantize + cuBLAS")
        report: dict[str, dict] = {}
        for shape, ws in by_shape.items():
            for rows in sorted({r for r in row_counts if r > 1} - {r for s, r in self.int4pack_rows if s == shape}):
                x = torch.randn(rows, shape[1], device=ws[0].packed.device, dtype=self.scratch.dtype)

                def call(w, path, x=x):
                    if path == paths[0]:
                        return int4_linear(x, w)
                    return F.linear(x, int4_triton.int4pack_dequantize(w, self.scratch))

                timings = time_configs(ws, paths, call)
                self.int4pack_rows[(shape, rows)] = min(timings, key=timings.get, default=None) == paths[0]
                report.setdefault(f"{shape[0]}x{shape[1]}", {})[rows] = timings
        return report

    @property
    def scratch_bytes(self) -> int:
        return 0 if self.scratch is None else self.scratch.numel() * self.scratch.element_size()

    def __call__(self, x: torch.Tensor, w) -> torch.Tensor:
        if isinstance(w, RowPackedInt4):
            from model_loader.kernels import int4_triton

            if x.shape[0] == 1:
                return int4_triton.int4_gemv(x, w, self._int4_config(w, False))
            return F.linear(x, int4_triton.int4_dequantize(w, self.scratch))
        if isinstance(w, Int4Weight):
            if self.int4pack_prefill and x.shape[0] > 1 and not self.int4pack_rows.get((w.shape, x.shape[0])):
                from model_loader.kernels import int4_triton

                return F.linear(x, int4_triton.int4pack_dequantize(w, self.scratch))
            return int4_linear(x, w)
        if self.gemv_choice and x.shape[0] == 1:
            config = self.gemv_choice.get((tuple(w.shape), False))
            if config is not None:
                from model_loader.kernels.gemv import gemv

                return gemv(x, w, config)
        return F.linear(x, w)

    def mlp(self, x: torch.Tensor, gate_up_w, down_w, silu_mul) -> torch.Tensor:
        """down(SiLU(gate(x)) * up(x)). For one token on gate/up weights stored in pairs (int4, or dense on the
        Triton path where our GEMV won the tuning), the gate/up GEMV outputs SiLU(gate) * up itself (no
        [gate | up] round trip through memory, no separate SiLU kernel)."""
        if isinstance(gate_up_w, RowPackedInt4) and gate_up_w.gate_up_pairs and x.shape[0] == 1:
            from model_loader.kernels import int4_triton

            return self(
                int4_triton.int4_gemv(x, gate_up_w, self._int4_config(gate_up_w, True), silu_output=True), down_w
            )
        if self.dense_gate_up_pairs and isinstance(gate_up_w, torch.Tensor):
            config = self.gemv_choice.get((tuple(gate_up_w.shape), True)) if x.shape[0] == 1 else None
            if config is not None:
                from model_loader.kernels.gemv import gemv

                return self(gemv(x, gate_up_w, config, silu_output=True), down_w)
            return self(silu_mul(F.linear(x, gate_up_w), paired=True), down_w)
        return self(silu_mul(self(x, gate_up_w)), down_w)

    def _int4_config(self, w: RowPackedInt4, silu_output: bool) -> tuple:
        """The tuned int4 GEMV config for this use, else the first candidate (before tuning, e.g. in the
        compile-ahead pass, or without CUDA graphs): never a variant the tuning would not compile anyway."""
        config = self.int4_choice.get((w.shape, silu_output))
        if config is None:
            from model_loader.kernels.int4_triton import int4_gemv_candidates

            config = int4_gemv_candidates(w, silu_output)[0]
        return config

    def single_token_uses(self, weights: dict) -> tuple[dict, dict]:
        """The single-token GEMVs a decode step makes, grouped as tune() times them: ({(dense shape, SiLU
        output?): [weights]}, {(int4 shape, SiLU output?): [weights]})."""
        dense: dict[tuple[tuple[int, int], bool], list[torch.Tensor]] = {}
        int4: dict[tuple[tuple[int, int], bool], list[RowPackedInt4]] = {}
        for layer in weights["layers"]:
            for key in ("qkv_w", "o_w", "gate_up_w", "down_w"):
                w = layer[key]
                if isinstance(w, torch.Tensor):
                    silu = key == "gate_up_w" and self.dense_gate_up_pairs
                    dense.setdefault((tuple(w.shape), silu), []).append(w)
                elif isinstance(w, RowPackedInt4):
                    int4.setdefault((w.shape, w.gate_up_pairs), []).append(w)
        return dense, int4

    def call_every_candidate(self, weights: dict, dtype) -> None:
        """Call each single-token kernel configuration tune() may choose, once per weight use, as tune() calls
        it: the pass that kernels.precompile runs to compile them all at once, before tune() times them."""
        from model_loader.kernels.gemv import gemv, gemv_candidates

        dense, int4 = self.single_token_uses(weights)
        for ((_, k), silu), ws in dense.items():
            x = torch.zeros(1, k, device=ws[0].device, dtype=ws[0].dtype)
            for config in gemv_candidates(k, silu):
                gemv(x, ws[0], config, silu_output=silu)
        if int4:
            from model_loader.kernels.int4_triton import int4_gemv, int4_gemv_candidates

            for (shape, silu), ws in int4.items():
                x = torch.zeros(1, shape[1], device=ws[0].qweight.device, dtype=dtype)
                for config in int4_gemv_candidates(ws[0], silu):
                    int4_gemv(x, ws[0], config, silu_output=silu)

    def tune(self, weights: dict, dtype) -> dict:
        """Measure, for each single-token weight shape, cuBLAS against our dense GEMV configs and our int4 GEMV
        configs against each other (the gate/up one with its SiLU output, as it runs); keep the fastest.
        Returns {"choice": {"NxK": label}, "timings_us": {"NxK": {config: us}}}."""
        from model_loader.kernels.gemv import gemv_autotune

        dense, int4 = self.single_token_uses(weights)
        choice, timings = {}, {}
        if dense:
            result = gemv_autotune(dense)
            self.gemv_choice = {use: c for use, c in result["choice"].items() if c is not None}
            for ((n, k), silu), c in result["choice"].items():
                label = f"{n}x{k}" + (" (SiLU(gate) * up output)" if silu else "")
                choice[label] = "cuBLAS" if c is None else f"triton {c}"
                timings[label] = result["timings_us"][((n, k), silu)]
        if int4:
            from model_loader.kernels.int4_triton import int4_gemv_autotune

            result = int4_gemv_autotune(int4, dtype)
            self.int4_choice = dict(result["choice"])
            for ((n, k), silu), c in result["choice"].items():
                label = f"{n}x{k}" + (" (SiLU(gate) * up output)" if silu else "")
                choice[label] = f"triton int4 {c}"
                timings[label] = result["timings_us"][((n, k), silu)]
        return {"choice": choice, "timings_us": timings}


def pair_gate_up_rows(w: torch.Tensor) -> None:
    """[gate; up] rows -> (gate 0, up 0, gate 1, up 1, ...), in place (awq.pair_gate_up's order for int4)."""
    half = w.shape[0] // 2
    w.copy_(w.view(2, half, -1).transpose(0, 1).reshape(w.shape))
