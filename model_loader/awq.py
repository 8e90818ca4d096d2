"""The AWQ checkpoint format (GEMM packing) and its conversion to what our kernels run.

AWQ ("gemm" version, 4 bits, zero point) stores each linear layer W [out, in] as
  qweight  int32 [in, out/8]        8 four-bit values per int32 along `out`, in AWQ's interleaved order
  qzeros   int32 [in/group, out/8]  the zero points, packed the same way
  scales   fp16  [in/group, out]
with W[o, i] = (q[i, o] - z[i // group, o]) * s[i // group, o]. We read and write that format ourselves
(AutoAWQ is deprecated upstream and does not work with transformers 5). At load it becomes one of
  - RowPackedInt4: our Triton kernels' layout (any CUDA GPU where Triton runs): each output row's ints packed
    along the input, so a single-token GEMV streams whole rows, and prefill dequantises into a scratch
    buffer for cuBLAS;
  - torch's int4 weight-only kernel (aten._weight_int4pack_mm: CUDA sm80+, bf16 activations), whose
    dequantisation is (q - 8) * s + zero, so zero = (8 - z) * s, where Triton can't run; or
  - a dense weight (dequantised once at load) everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # packed nibble i holds column AWQ_ORDER[i] of each group of 8
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]
SUPPORTED_GROUP_SIZES = (32, 64, 128, 256)


def pack(values: torch.Tensor) -> torch.Tensor:
    """[rows, cols] ints in 0..15 -> int32 [rows, cols/8] in AWQ order."""
    rows, cols = values.shape
    v = values.to(torch.int32).view(rows, cols // 8, 8)[:, :, AWQ_ORDER]
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=values.device)
    shifted = v << shifts  # int32 arithmetic wraps, so nibble 7 lands in the sign bit as AWQ's packing does
    out = shifted[..., 0].clone()
    for i in range(1, 8):
        out |= shifted[..., i]
    return out


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """int32 [rows, cols/8] in AWQ order -> int32 [rows, cols] in 0..15 (natural column order)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    v = (packed[:, :, None] >> shifts) & 0xF  # arithmetic shift is fine: the mask drops the sign bits
    return v[:, :, AWQ_REVERSE_ORDER].reshape(packed.shape[0], -1)


def dequantize_ints(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, group_size: int) -> torch.Tensor:
    """Unpacked ints q [in, out], zeros z [in/group, out], scales s [in/group, out] -> dense W [out, in] fp32."""
    z = z.float().repeat_interleave(group_size, dim=0)
    s = s.float().repeat_interleave(group_size, dim=0)
    return ((q.float() - z) * s).t().contiguous()


def dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """Packed AWQ tensors -> dense W [out, in] in fp32."""
    return dequantize_ints(unpack(qweight), unpack(qzeros), scales, group_size)


@dataclass
class RowPackedInt4:
    """A linear weight W [n_out, k_in] for our Triton int4 kernels (kernels/int4_triton.py). Each row's ints
    are packed along the input in blocks of 8 * interleave values: in block b, nibble j (bits 4j..4j+3) of
    int32 number i holds q[n, 8*interleave*b + interleave*j + i]. So for every nibble j a tile of packed ints
    needs a contiguous run of the activations (one vector load), and a group's scale is constant per nibble.
      qweight int32 [n_out, k_in/8]
      scales  fp16  [n_out, k_in/group]
      zeros   fp16  [n_out, k_in/group]  (small ints, exact; fp16 so kernels convert them with a cheap op)
    with W[n, k] = (q[n, k] - zeros[n, k // group]) * scales[n, k // group], exactly AWQ's numbers.
    gate_up_pairs: the MLP's fused [gate; up] weight with its rows stored in pairs (gate row i, then up row i;
    see pair_gate_up), so one GEMV program holds both halves of a pair and can output SiLU(gate) * up. W and
    every dense copy of it keep the [gate; up] row order."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int
    interleave: int
    gate_up_pairs: bool = False

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1] * 8

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.zeros))


def row_pack_interleave(group_size: int) -> int:
    """Ints per row in a packed block: 16 (128 inputs), fewer for groups under 128, so that a block never
    spans two groups (the GEMV applies one scale and zero per row and block). Input widths are multiples of
    the group size, so the blocks tile them."""
    return min(16, group_size // 8)


def to_row_packed(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, group_size: int) -> RowPackedInt4:
    """AWQ ints q [in, out], zeros z [in/group, out], scales s [in/group, out] -> RowPackedInt4 (same device)."""
    k_in, n_out = q.shape
    inter = row_pack_interleave(group_size)
    blocks = q.t().contiguous().view(n_out, k_in // (8 * inter), 8, inter).to(torch.int32)
    packed = blocks[:, :, 0].clone()
    for j in range(1, 8):
        packed |= blocks[:, :, j] << (4 * j)  # nibble 7 wraps into the sign bit; kernels mask after shifting
    return RowPackedInt4(
        packed.view(n_out, k_in // 8),
        s.t().to(torch.float16).contiguous(),
        z.t().to(torch.float16).contiguous(),
        group_size,
        inter,
    )


def dequantize_row_packed(w: RowPackedInt4) -> torch.Tensor:
    """RowPackedInt4 -> dense W [out, in] fp32 (the reference the Triton kernels are tested against)."""
    n, k, inter = w.out_features, w.in_features, w.interleave
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=w.qweight.device)
    packed = w.qweight.view(n, k // (8 * inter), 1, inter)
    q = ((packed >> shifts[:, None]) & 0xF).reshape(n, k).float()  # [n, block, nibble j, i] -> input order
    z = w.zeros.float().repeat_interleave(w.group_size, dim=1)
    s = w.scales.float().repeat_interleave(w.group_size, dim=1)
    dense = (q - z) * s
    if w.gate_up_pairs:  # stored rows (gate 0, up 0, gate 1, ...) -> [gate; up]
        dense = torch.cat([dense[0::2], dense[1::2]])
    return dense


def pair_gate_up(w: RowPackedInt4) -> RowPackedInt4:
    """The fused [gate; up] weight with its rows reordered to gate 0, up 0, gate 1, up 1, ... (gate_up_pairs)."""
    half = w.out_features // 2
    order = torch.stack([torch.arange(half), torch.arange(half, 2 * half)], dim=1).reshape(-1).to(w.qweight.device)
    return RowPackedInt4(
        w.qweight[order].contiguous(),
        w.scales[order].contiguous(),
        w.zeros[order].contiguous(),
        w.group_size,
        w.interleave,
        gate_up_pairs=True,
    )


@dataclass
class Int4Weight:
    """A linear weight for torch's int4 kernel: y = x @ W.T with W [n_out, k_in] stored packed."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor  # [k/group, n, 2] bf16
    group_size: int
    out_features: int
    in_features: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    def nbytes(self) -> int:
        return (
            self.packed.numel() * self.packed.element_size()
            + self.scales_and_zeros.numel() * self.scales_and_zeros.element_size()
        )


def cuda_int4pack_layout(w_uint8: torch.Tensor, inner_k_tiles: int) -> torch.Tensor:
    """What torch's _convert_weight_to_int4pack does on CUDA (tinygemm's tensor-core tile layout), written
    out from its source (aten/src/ATen/native/cuda/int4mm.cu, matrix_to_m16n8k16_Bint4_layout), so CPU tests
    can exercise our dequantiser of that layout: uint8 [n, k/2] (even k in the high nibble) ->
    int32 [n/8, k/(16*inner_k_tiles), 32, inner_k_tiles/2]. Lane t of an 8-row tile holds row t//4; its int32
    for two k-tiles carries bytes kb = base + t%4 + 4i (i = 0..3, base advancing 8 bytes after i = 1):
    the high nibbles (even k) in bits 4i, the low nibbles (odd k) in bits 16 + 4i."""
    n, half_k = w_uint8.shape
    k_outer = 2 * half_k // (16 * inner_k_tiles)
    n_tile, k_o, lane, inner = torch.meshgrid(
        torch.arange(n // 8), torch.arange(k_outer), torch.arange(32), torch.arange(inner_k_tiles // 2), indexing="ij"
    )
    row = n_tile * 8 + lane // 4
    base = (k_o * inner_k_tiles + 2 * inner) * 8
    packed = torch.zeros(n_tile.shape, dtype=torch.int64)
    for i, offset in enumerate((0, 4, 8, 12)):
        v = w_uint8.to(torch.int64)[row, base + offset + lane % 4]
        packed |= ((v >> 4) << (4 * i)) | ((v & 0xF) << (16 + 4 * i))
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def int4pack_inputs(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """AWQ ints q [in, out], zeros z [in/group, out], scales s [in/group, out] ->
    (uint8 [out, in/2] two nibbles per byte, high nibble first; scales_and_zeros [in/group, out, 2] bf16)."""
    w = q.t().contiguous().to(torch.int32)  # [out, in]
    w_uint8 = ((w[:, ::2] << 4) | w[:, 1::2]).to(torch.uint8)
    s = s.float()
    zero = (8.0 - z.float()) * s
    return w_uint8, torch.stack([s, zero], dim=-1).to(torch.bfloat16).contiguous()


def inner_k_tiles(k_in: int) -> int | None:
    """The int4 kernel tiles K by 16 * inner_k_tiles; pick the largest tiling the width allows."""
    for tiles in (8, 4, 2):
        if k_in % (16 * tiles) == 0:
            return tiles
    return None


def int4pack_ok(k_in: int, n_out: int, group_size: int) -> bool:
    return inner_k_tiles(k_in) is not None and n_out % 8 == 0 and group_size in SUPPORTED_GROUP_SIZES


def to_int4pack(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, group_size: int) -> Int4Weight:
    """Convert on the device q/z/s live on (CUDA)."""
    w_uint8, sz = int4pack_inputs(q, z, s)
    packed = torch.ops.aten._convert_weight_to_int4pack(w_uint8, inner_k_tiles(q.shape[0]))
    return Int4Weight(packed, sz, group_size, q.shape[1], q.shape[0])


def int4_linear(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """x [M, in] bf16 -> [M, out] bf16."""
    return torch.ops.aten._weight_int4pack_mm(x, w.packed, w.group_size, w.scales_and_zeros)


def int4pack_supported(device: torch.device) -> bool:
    if device.type != "cuda" or not hasattr(torch.ops.aten, "_weight_int4pack_mm"):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)
