"""The linear layers' kernel choice (model_loader.linears): the single-token uses the decode step makes, the
candidates compiled ahead and the ones timed at warm-up, use by use."""

import torch

from model_loader.kernels import gemv


def test_dense_warm_up_compiles_and_times_the_same_gemv_candidates_per_use(monkeypatch):
    """The dense single-token uses as the decode step makes them: on the Triton path the gate/up weight's rows are
    stored in pairs and its GEMV outputs SiLU(gate) * up, so its candidates are GEMV_SILU_CONFIGS with that
    output; a weight of >= GEMV_SPLIT_MIN_K inputs (the down projection) also tries the K splits. The pass that
    compiles ahead (Linears.call_every_candidate) and the tuning that times them must agree use by use (a config
    the tuning times but nobody compiled ahead compiles on the warm-up's own thread on a first start)."""
    from model_loader.linears import Linears

    big_k = gemv.GEMV_SPLIT_MIN_K
    gate_up = torch.randn(2 * 24, 64)
    weights = {
        "layers": [
            {
                "qkv_w": torch.randn(48, 64),
                "o_w": torch.randn(64, 32),
                "gate_up_w": gate_up.clone(),
                "down_w": torch.randn(64, big_k),
            }
        ]
    }
    linears = Linears(weights, "cpu", torch.float32)
    linears.pair_dense_gate_up(weights)
    assert linears.dense_gate_up_pairs
    assert torch.equal(weights["layers"][0]["gate_up_w"][0::2], gate_up[:24])
    compiled, timed = [], []
    monkeypatch.setattr(
        gemv,
        "gemv",
        lambda x, w, config, silu_output=False: compiled.append((tuple(w.shape), silu_output, config)),
    )
    linears.call_every_candidate(weights, torch.float32)
    expected = {
        ((48, 64), False): gemv.GEMV_CONFIGS,
        ((64, 32), False): gemv.GEMV_CONFIGS,
        ((48, 64), True): gemv.GEMV_SILU_CONFIGS,
        ((64, big_k), False): gemv.GEMV_CONFIGS + gemv.GEMV_SPLIT_CONFIGS,
    }
    assert {use: tuple(c for s, si, c in compiled if (s, si) == use) for use in expected} == expected
    monkeypatch.setattr(
        gemv,
        "time_configs",
        lambda ws, configs, call: timed.append((tuple(ws[0].shape), tuple(configs))) or {None: 1.0},
    )
    linears.tune(weights, torch.float32)
    assert sorted(timed) == sorted((shape, (None,) + configs) for (shape, _), configs in expected.items())
