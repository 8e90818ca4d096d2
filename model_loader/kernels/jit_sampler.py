"""The fused sampler's Triton kernels (host side: kernels/fused_sampler.py). Like the other jit_*
modules, this module imports Triton and nothing else, so a first start's compile workers can load it fast.

Top-k, then top-p, then a draw, over 16-bit logits (the decode step's own dtype), without sorting the vocabulary:
the boundary of the kept set is found by a radix select on the logits' bits, two bytes, high then low. Each
16-bit value is mapped to an unsigned key that orders like the value (`_keys`), so "the tokens above the
boundary" is "key > t". Per byte, every program makes a 256-bin histogram of its slice of the row with integer
atomics into its own bins (token counts for top-k; weights in fixed point for top-p, so the sums do not depend on
the atomics' order); the program that finishes last (`_last_program`: a ticket counter) adds them up and finds the
bin where the count reaches k or the mass reaches top_p. (Histograms made by comparing each logit with all 256 bins
cost far more than the atomics: docs/BENCHMARKS.md, 'Tried and rejected'.) Tokens equal to the boundary key (ties:
common in bf16) are kept in index order, as many as the definition allows (the sorted-order rule of sampling.sample,
ties taken lowest index first).

The draw is the Gumbel-max race (argmax of log-weight + Gumbel noise: exact multinomial sampling), with the
kept ties raced as one entry of their summed weight, then one of them picked uniformly: the same probability per
token. Noise comes from Philox keyed by the reply's seed, counted by a per-row step counter the kernel advances,
so a seeded reply replays and the CUDA graph needs no host work per token.

State per row (int32 `istate`, fp32 `fstate`, int64 `lstate`: the slots below) is written by one kernel's last
program and read by the next kernel's programs.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Kernels may only read module globals that are tl.constexpr; host code takes their .value. (In the kernels a
# constexpr stays on the right of an operator: in the interpreter `constexpr - tensor` is a constexpr.)
# istate slots
I_TICKET = tl.constexpr(0)  # the last-program ticket counter; every kernel's last program puts it back to 0
I_K_HI = tl.constexpr(1)  # top-k: the high byte of the boundary key
I_K_ABOVE = tl.constexpr(2)  # top-k: tokens in bins above that high byte
I_TK = tl.constexpr(3)  # top-k boundary key (-1: no top-k, every token takes part)
I_NK = tl.constexpr(4)  # how many tokens equal to I_TK are kept (index order)
I_P_HI = tl.constexpr(5)  # top-p: the high byte of the boundary key (-2: no top-p pass needed)
I_TB = tl.constexpr(6)  # the final boundary key (-1: none, every token with a weight is kept)
I_NB = tl.constexpr(7)  # how many tokens equal to I_TB are kept (index order)
I_SLOTS = tl.constexpr(8)
# fstate slots
F_X0 = tl.constexpr(0)  # the largest logit: weights are exp((x - x0) / T) <= 1
F_SLOTS = tl.constexpr(2)
# lstate (int64) slots: masses in fixed point (_fixed_point)
L_ABOVE = tl.constexpr(0)  # top-p: the mass of the keys above the boundary's high byte
L_TARGET = tl.constexpr(1)  # top-p: top_p times the kept mass
L_SLOTS = tl.constexpr(2)
FIXED_ONE = tl.constexpr(1099511627776.0)  # 2^40

BINS = tl.constexpr(256)
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _keys(x):
    """16-bit floats -> int32 keys in [0, 65535] that order like the values (sign flips all bits)."""
    b = x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return tl.where(b >= 0x8000, 0xFFFF - b, b + 0x8000)


@triton.jit
def _key_value(key, x_ptr):
    """The logit (fp32) whose key is `key`, in the logits' own 16-bit dtype."""
    b = tl.where(key >= 0x8000, key - 0x8000, 0xFFFF - key)
    return b.to(tl.int16).to(x_ptr.dtype.element_ty, bitcast=True).to(tl.float32)


@triton.jit
def _fence(FENCE: tl.constexpr):
    # A GPU-scope fence in every thread before the ticket (CUDA's threadfence-reduction pattern): the partial
    # results this program stored are visible to whichever program takes the last ticket. The interpreter
    # (CPU tests) runs programs one after another and needs none.
    if FENCE:
        tl.inline_asm_elementwise(
            "fence.acq_rel.gpu; mov.u32 $0, $1;",
            "=r,r",
            [tl.zeros([1], tl.int32)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


@triton.jit
def _last_program(istate_row, n_programs, FENCE: tl.constexpr):
    """True in the row's program that arrives last: every other program's stores are then readable."""
    _fence(FENCE)
    tl.debug_barrier()
    ticket = tl.atomic_add(istate_row + I_TICKET, 1, sem="acq_rel")
    return ticket == n_programs - 1


@triton.jit
def _sum_partials_reversed(ptr, n_programs, ROWS: tl.constexpr):
    """Sum the programs' [n_programs, BINS] partial histograms, in program order (deterministic), bins reversed:
    element i is bin BINS-1-i, so a cumsum runs from the largest key down."""
    i = tl.arange(0, BINS)
    r = tl.arange(0, ROWS)
    acc = tl.zeros([BINS], ptr.dtype.element_ty)
    for start in range(0, n_programs, ROWS):
        rr = start + r
        acc += tl.sum(
            tl.load(
                ptr + rr[:, None] * BINS + (-i + (BINS - 1))[None, :],
                mask=(rr < n_programs)[:, None],
                other=0,
                cache_modifier=".cg",
            ),
            axis=0,
        )
    return acc


@triton.jit
def _pick(values, where_i, i):
    """values[where_i] for a scalar index into a 1-D block (a masked sum: blocks can't be indexed)."""
    return tl.sum(tl.where(i == where_i, values, 0), axis=0)


@triton.jit
def _cleared_region(hist_ptr, row, pid, n_programs):
    """This program's own BINS-bin histogram, zeroed (then a barrier: the whole program's atomics come after)."""
    region = hist_ptr + (row * n_programs + pid) * BINS
    tl.store(region + tl.arange(0, BINS), tl.zeros([BINS], region.dtype.element_ty))
    tl.debug_barrier()
    return region


@triton.jit
def _fixed_point(w):
    # Weights (<= 1) as integers of 2^-40: integer atomics add up in any order to the same sum, so the boundary
    # (and a seeded reply) is the same every run; floats added by atomics would not be.
    return (w * FIXED_ONE).to(tl.int64)


@triton.jit
def _weight_origin(temperature_ptr, fstate_ptr, row):
    """x0 (the row's largest logit) and log2(e) / T: a weight is exp2((x - x0) * scale) = exp((x - x0) / T)."""
    return tl.load(fstate_ptr + row * F_SLOTS + F_X0), 1.0 / tl.load(temperature_ptr) * LOG2E


@triton.jit
def _slice_weights(x_ptr, row, pid, V, x0, scale, BLOCK: tl.constexpr):
    """This program's slice of the row: its keys, fixed-point weights exp((x - x0) / T) and which lanes are live."""
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    live = offs < V
    x = tl.load(x_ptr + row.to(tl.int64) * V + offs, mask=live, other=0.0)
    return _keys(x), _fixed_point(tl.exp2((x.to(tl.float32) - x0) * scale)), live


@triton.jit
def _key_weight(key, x_ptr, x0, scale):
    """The fixed-point weight of the logit whose key is `key` (the same arithmetic as _slice_weights)."""
    return _fixed_point(tl.exp2((_key_value(key, x_ptr) - x0) * scale))


@triton.jit
def _sampler_max_kernel(
    x_ptr,
    top_k_ptr,
    istate_ptr,
    fstate_ptr,
    part_f_ptr,
    hist_c_ptr,
    V,
    n_programs,
    BLOCK: tl.constexpr,
    NPOW: tl.constexpr,
    FENCE: tl.constexpr,
):
    """Pass 1: the row's largest logit; with top-k on, the count histogram of the keys' high byte and the
    high-byte bin where the k-th largest key lies."""
    pid = tl.program_id(0)
    row = tl.program_id(1)
    x_row = x_ptr + row.to(tl.int64) * V
    istate = istate_ptr + row * I_SLOTS
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    live = offs < V
    x = tl.load(x_row + offs, mask=live, other=0.0)
    tl.store(part_f_ptr + row * n_programs + pid, tl.max(tl.where(live, x.to(tl.float32), float("-inf")), axis=0))
    top_k = tl.load(top_k_ptr)
    bins = tl.arange(0, BINS)
    if top_k < V:
        region = _cleared_region(hist_c_ptr, row, pid, n_programs)
        tl.atomic_add(region + (_keys(x) >> 8), 1, mask=live, sem="relaxed")
    if _last_program(istate, n_programs, FENCE):
        j = tl.arange(0, NPOW)
        x0 = tl.max(
            tl.load(part_f_ptr + row * n_programs + j, mask=j < n_programs, other=float("-inf"), cache_modifier=".cg"),
            axis=0,
        )
        tl.store(fstate_ptr + row * F_SLOTS + F_X0, x0)
        if top_k < V:
            rev = _sum_partials_reversed(hist_c_ptr + row * n_programs * BINS, n_programs, 16)
            incl = tl.cumsum(rev, axis=0)  # tokens with a high byte >= this bin's
            at = tl.min(tl.where(incl >= top_k, bins, BINS), axis=0)
            tl.store(istate + I_K_HI, -at + (BINS - 1))
            tl.store(istate + I_K_ABOVE, _pick(incl - rev, at, bins))
        else:
            tl.store(istate + I_TK, -1)
            tl.store(istate + I_NK, 0)
        tl.store(istate + I_TICKET, 0)


@triton.jit
def _sampler_top_k_kernel(
    x_ptr, top_k_ptr, istate_ptr, hist_c_ptr, V, n_programs, BLOCK: tl.constexpr, FENCE: tl.constexpr
):
    """Pass 2 (top-k on only): the count histogram of the low byte inside the boundary's high-byte bin, and
    from it the boundary key and how many of its ties are kept."""
    top_k = tl.load(top_k_ptr)
    if top_k < V:
        pid = tl.program_id(0)
        row = tl.program_id(1)
        x_row = x_ptr + row.to(tl.int64) * V
        istate = istate_ptr + row * I_SLOTS
        hi = tl.load(istate + I_K_HI)
        bins = tl.arange(0, BINS)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        live = offs < V
        key = _keys(tl.load(x_row + offs, mask=live, other=0.0))
        region = _cleared_region(hist_c_ptr, row, pid, n_programs)
        tl.atomic_add(region + (key & 0xFF), 1, mask=live & ((key >> 8) == hi), sem="relaxed")
        if _last_program(istate, n_programs, FENCE):
            rev = _sum_partials_reversed(hist_c_ptr + row * n_programs * BINS, n_programs, 16)
            incl = tl.load(istate + I_K_ABOVE) + tl.cumsum(rev, axis=0)
            at = tl.min(tl.where(incl >= top_k, bins, BINS), axis=0)
            tl.store(istate + I_TK, hi * BINS + (-at + (BINS - 1)))
            tl.store(istate + I_NK, (top_k - _pick(incl - rev, at, bins)).to(tl.int32))
            tl.store(istate + I_TICKET, 0)


@triton.jit
def _sampler_mass_high_kernel(
    x_ptr,
    temperature_ptr,
    top_p_ptr,
    istate_ptr,
    fstate_ptr,
    lstate_ptr,
    hist_w_ptr,
    V,
    n_programs,
    BLOCK: tl.constexpr,
    FENCE: tl.constexpr,
):
    """Pass 3: the weight histogram of the high byte over the top-k tokens, the kept mass, and the high-byte bin
    where the mass from the top reaches top_p of it. With top_p = 1 the boundary is top-k's (or none)."""
    pid = tl.program_id(0)
    row = tl.program_id(1)
    istate = istate_ptr + row * I_SLOTS
    lstate = lstate_ptr + row * L_SLOTS
    x0, scale = _weight_origin(temperature_ptr, fstate_ptr, row)
    tk = tl.load(istate + I_TK)
    bins = tl.arange(0, BINS)
    key, w, live = _slice_weights(x_ptr, row, pid, V, x0, scale, BLOCK)
    region = _cleared_region(hist_w_ptr, row, pid, n_programs)
    tl.atomic_add(region + (key >> 8), w, mask=live & (key > tk), sem="relaxed")  # ties at tk: added once, below
    if _last_program(istate, n_programs, FENCE):
        rev = _sum_partials_reversed(hist_w_ptr + row * n_programs * BINS, n_programs, 16)
        nk = tl.load(istate + I_NK)
        if tk >= 0:
            w_tk = _key_weight(tk, x_ptr, x0, scale)
            rev += tl.where(bins == -(tk >> 8) + (BINS - 1), nk * w_tk, 0)
        top_p = tl.load(top_p_ptr)
        if top_p >= 1.0:
            tl.store(istate + I_TB, tk)
            tl.store(istate + I_NB, nk)
            tl.store(istate + I_P_HI, -2)
        else:
            target = (top_p.to(tl.float64) * tl.sum(rev, axis=0).to(tl.float64)).to(tl.int64)
            above = tl.cumsum(rev, axis=0) - rev  # the mass of the bins above this one
            at = tl.max(tl.where((rev > 0) & (above < target), bins, -1), axis=0)
            tl.store(istate + I_P_HI, -at + (BINS - 1))
            tl.store(lstate + L_ABOVE, _pick(above, at, bins))
            tl.store(lstate + L_TARGET, target)
        tl.store(istate + I_TICKET, 0)


@triton.jit
def _sampler_mass_low_kernel(
    x_ptr,
    temperature_ptr,
    istate_ptr,
    fstate_ptr,
    lstate_ptr,
    hist_w_ptr,
    hist_c_ptr,
    V,
    n_programs,
    BLOCK: tl.constexpr,
    FENCE: tl.constexpr,
):
    """Pass 4 (top_p < 1 only): weight and count histograms of the low byte inside the boundary's high-byte
    bin; the boundary key, and how many of its ties fit before the mass reaches top_p."""
    pid = tl.program_id(0)
    row = tl.program_id(1)
    istate = istate_ptr + row * I_SLOTS
    hi = tl.load(istate + I_P_HI)
    if hi >= 0:
        lstate = lstate_ptr + row * L_SLOTS
        x0, scale = _weight_origin(temperature_ptr, fstate_ptr, row)
        tk = tl.load(istate + I_TK)
        bins = tl.arange(0, BINS)
        key, w, live = _slice_weights(x_ptr, row, pid, V, x0, scale, BLOCK)
        hit = live & ((key >> 8) == hi) & (key > tk)
        region_w = _cleared_region(hist_w_ptr, row, pid, n_programs)
        region_c = _cleared_region(hist_c_ptr, row, pid, n_programs)
        tl.atomic_add(region_w + (key & 0xFF), w, mask=hit, sem="relaxed")
        tl.atomic_add(region_c + (key & 0xFF), 1, mask=hit, sem="relaxed")
        if _last_program(istate, n_programs, FENCE):
            rev = _sum_partials_reversed(hist_w_ptr + row * n_programs * BINS, n_programs, 16)
            rev_c = _sum_partials_reversed(hist_c_ptr + row * n_programs * BINS, n_programs, 16)
            if (tk >= 0) & ((tk >> 8) == hi):
                nk = tl.load(istate + I_NK)
                tie_bin = bins == -(tk & 0xFF) + (BINS - 1)
                rev += tl.where(tie_bin, nk * _key_weight(tk, x_ptr, x0, scale), 0)
                rev_c += tl.where(tie_bin, nk, 0)
            target = tl.load(lstate + L_TARGET)
            above = tl.load(lstate + L_ABOVE) + tl.cumsum(rev, axis=0) - rev
            at = tl.max(tl.where((rev > 0) & (above < target), bins, -1), axis=0)
            tb = hi * BINS + (-at + (BINS - 1))
            w_tb = _key_weight(tb, x_ptr, x0, scale)
            # the j-th tie (0-based) is kept while the mass before it, above + j * w_tb, is below the target
            kept = (target - _pick(above, at, bins) + w_tb - 1) // w_tb
            kept = tl.minimum(tl.maximum(kept, 1), _pick(rev_c, at, bins).to(tl.int64))
            tl.store(istate + I_TB, tb)
            tl.store(istate + I_NB, kept.to(tl.int32))
            tl.store(istate + I_TICKET, 0)


@triton.jit
def _sampler_draw_kernel(
    x_ptr,
    temperature_ptr,
    seed_ptr,
    steps_ptr,
    istate_ptr,
    fstate_ptr,
    part_f_ptr,
    part_i_ptr,
    part_t_ptr,
    out_ptr,
    V,
    n_programs,
    BLOCK: tl.constexpr,
    NPOW: tl.constexpr,
    FENCE: tl.constexpr,
):
    """Pass 5: the Gumbel-max race over the tokens above the boundary, the kept ties racing as one entry; the
    winner goes to out[row] and the row's step counter moves on (fresh noise for the next token)."""
    pid = tl.program_id(0)
    row = tl.program_id(1)
    x_row = x_ptr + row.to(tl.int64) * V
    istate = istate_ptr + row * I_SLOTS
    x0, scale = _weight_origin(temperature_ptr, fstate_ptr, row)
    tb = tl.load(istate + I_TB)
    seed = tl.load(seed_ptr)
    base = (tl.load(steps_ptr + row) << 32) + row.to(tl.int64) * (V + 2)  # Philox counter: (token, step)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    live = offs < V
    x = tl.load(x_row + offs, mask=live, other=0.0)
    key = tl.where(live, _keys(x), -1)
    u = tl.rand(seed, base + offs)
    score = tl.where(key > tb, (x.to(tl.float32) - x0) * scale - tl.log2(-tl.log(u)), float("-inf"))
    best = tl.max(score, axis=0)
    tl.store(part_f_ptr + row * n_programs + pid, best)
    tl.store(part_i_ptr + row * n_programs + pid, pid * BLOCK + tl.argmax(score, axis=0))
    tl.store(part_t_ptr + row * n_programs + pid, tl.sum((live & (key == tb)).to(tl.int32), axis=0))
    if _last_program(istate, n_programs, FENCE):
        j = tl.arange(0, NPOW)
        bests = tl.load(
            part_f_ptr + row * n_programs + j, mask=j < n_programs, other=float("-inf"), cache_modifier=".cg"
        )
        top = tl.max(bests, axis=0)
        winner = tl.argmax(bests, axis=0)  # ties: the lower program, so the lower token
        token = _pick(
            tl.load(part_i_ptr + row * n_programs + j, mask=j < n_programs, other=0, cache_modifier=".cg"), winner, j
        )
        kept = tl.load(istate + I_NB)
        if kept > 0:
            two = tl.rand(seed, base + V + tl.arange(0, 2))
            u_group = _pick(two, 0, tl.arange(0, 2))
            group = tl.log2(kept.to(tl.float32)) + (_key_value(tb, x_ptr) - x0) * scale - tl.log2(-tl.log(u_group))
            if group > top:
                # one of the kept ties, uniformly: the nth (0-based) tie in index order
                nth = tl.minimum((_pick(two, 1, tl.arange(0, 2)) * kept.to(tl.float32)).to(tl.int32), kept - 1)
                ties = tl.load(part_t_ptr + row * n_programs + j, mask=j < n_programs, other=0, cache_modifier=".cg")
                through = tl.cumsum(ties, axis=0)  # ties in this program's slice and before it
                block = tl.min(tl.where(through > nth, j, NPOW), axis=0)
                rank = nth - (_pick(through, block, j) - _pick(ties, block, j))
                o = block * BLOCK + tl.arange(0, BLOCK)
                hit = (o < V) & (_keys(tl.load(x_row + o, mask=o < V, other=0.0)) == tb)
                seen = tl.cumsum(hit.to(tl.int32), axis=0)
                token = tl.min(tl.where(hit & (seen == rank + 1), o, V), axis=0)
        # Always a token id: logits with NaNs (a broken model) must not make the next embedding read out of range.
        token = tl.minimum(tl.maximum(token, 0), V - 1)
        tl.store(out_ptr + row, token.to(tl.int64))
        tl.store(steps_ptr + row, tl.load(steps_ptr + row) + 1)
        tl.store(istate + I_TICKET, 0)
