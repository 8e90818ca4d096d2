"""The prefill MLP of 28 layers (the 1.5B's shapes, random weights) for 2,048 and 1,024 tokens, GPU time through
CUDA graphs, by how it is cut: whole, in token chunks (so the gate/up output could stay in L2), in two halves of
the intermediate size with an accumulating down projection; and without the SiLU·mul kernel at all (wrong maths:
a bound on what fusing it could save).

usage: python benchmarks/prefill_mlp_cuts.py
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model_loader.kernels import triton_ops as T  # noqa: E402

H, I, L = 1536, 8960, 28
torch.manual_seed(0)
dev = "cuda"
gu = [torch.randn(2 * I, H, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(L)]
dw = [torch.randn(H, I, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(L)]
# intermediate halves: rows gate[a:b] + up[a:b] for each half
half = I // 2
gu_h = [[torch.cat([w[:half], w[I:I + half]]).contiguous(), torch.cat([w[half:I], w[I + half:]]).contiguous()] for w in gu]
dw_h = [[w[:, :half].contiguous(), w[:, half:].contiguous()] for w in dw]


def full(x, out):
    for i in range(L):
        a = T.silu_mul(F.linear(x, gu[i]))
        torch.mm(a, dw[i].t(), out=out)


def no_silu(x, out):  # lower bound: no SiLU pass at all (wrong maths)
    for i in range(L):
        g = F.linear(x, gu[i])
        torch.mm(g[:, :I], dw[i].t(), out=out)


def tok(chunk):
    def f(x, out):
        for i in range(L):
            for c in range(0, x.shape[0], chunk):
                a = T.silu_mul(F.linear(x[c:c + chunk], gu[i]))
                torch.mm(a, dw[i].t(), out=out[c:c + chunk])
    return f


def inter2(x, out):
    for i in range(L):
        a = T.silu_mul(F.linear(x, gu_h[i][0]))
        torch.mm(a, dw_h[i][0].t(), out=out)
        a = T.silu_mul(F.linear(x, gu_h[i][1]))
        out.addmm_(a, dw_h[i][1].t())


variants = {"full": full, "no_silu": no_silu, "tok1024": tok(1024), "tok512": tok(512), "inter2": inter2}
for t in (2048, 1024):
    x = torch.randn(t, H, device=dev, dtype=torch.bfloat16)
    out = torch.empty(t, H, device=dev, dtype=torch.bfloat16)
    ref = None
    res = {}
    graphs = {}
    for name, fn in variants.items():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn(x, out)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        if name == "full":
            ref = out.clone()
        elif name != "no_silu":
            err = (out.float() - ref.float()).abs().max().item()
            print(f"{t} {name} max err vs full {err:.4f}", flush=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(x, out)
        graphs[name] = g
    for rep in range(3):
        for name, g in graphs.items():
            g.replay(); torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(10):
                g.replay()
            e1.record(); torch.cuda.synchronize()
            ms = e0.elapsed_time(e1) / 10
            res.setdefault(name, []).append(round(ms, 3))
    print(f"T={t}: " + "; ".join(f"{n} {min(v):.3f} ms {v}" for n, v in res.items()), flush=True)
