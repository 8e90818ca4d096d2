"""Choosing single-token kernels inside the whole decode step (linears.refine_in_step): the search logic, with
the step's GPU time given as a table (on a GPU the engine's warm-up times captured decode graphs instead)."""

import torch

from model_loader.linears import Linears, refine_in_step

GATE_UP = ((17920, 1536), True)
DOWN = ((1536, 8960), False)
QKV = (2048, 1536)


def _linears() -> Linears:
    linear = Linears({"layers": []}, "cpu", torch.float32)
    # timed alone (us): what tune() leaves behind
    linear.alone_us = {("int4", GATE_UP): {"a": 7.5, "b": 7.9, "c": 8.6, "d": 9.0},
                       ("int4", DOWN): {"e": 6.2, "f": 6.6},
                       ("dense", QKV): {None: 5.3, (4, 512, 4): 4.0, (8, 256, 4): 8.0}}
    linear.int4_choice = {GATE_UP: "a", DOWN: "e"}
    linear.gemv_choice = {QKV: (4, 512, 4)}
    return linear


def _step_time(linear: Linears, table: dict) -> callable:
    calls = []

    def step_us() -> float:
        key = (linear.int4_choice[GATE_UP], linear.int4_choice[DOWN], linear.gemv_choice.get(QKV))
        calls.append(key)
        return table.get(key, 1000.0)
    step_us.calls = calls
    return step_us


def test_a_runner_up_that_is_faster_inside_the_step_replaces_the_fastest_alone():
    linear = _linears()
    step_us = _step_time(linear, {("a", "e", (4, 512, 4)): 1019.0, ("b", "e", (4, 512, 4)): 990.0,
                                  ("b", "e", None): 985.0})
    result = refine_in_step(linear, step_us)
    assert linear.int4_choice[GATE_UP] == "b"  # 3% faster in the step although slower alone
    assert QKV not in linear.gemv_choice  # cuBLAS: the dense choice table holds no entry for it
    assert result == {"step_us_before": 1019.0, "step_us_after": 985.0,
                      "changed": {("int4", GATE_UP): "b", ("dense", QKV): None}}
    assert any(call[0] == "c" for call in step_us.calls)  # the third fastest alone is tried too...
    assert not any(call[0] == "d" for call in step_us.calls)  # ...the fourth is not
    assert linear.choice_labels() == {"17920x1536 (SiLU(gate) * up output)": "triton int4 b",
                                      "1536x8960": "triton int4 e", "2048x1536": "cuBLAS"}


def test_differences_within_noise_keep_the_choices():
    linear = _linears()
    step_us = _step_time(linear, {("a", "e", (4, 512, 4)): 1000.0, ("b", "e", (4, 512, 4)): 997.0,
                                  ("a", "f", (4, 512, 4)): 999.0, ("a", "e", None): 1001.0})
    result = refine_in_step(linear, step_us)
    assert (linear.int4_choice, linear.gemv_choice) == ({GATE_UP: "a", DOWN: "e"}, {QKV: (4, 512, 4)})
    assert result["changed"] == {} and result["step_us_after"] == 1000.0
    # biggest weight first, each runner-up once: start, b, c (gate/up), f (down), None, (8, 256, 4) (qkv)
    assert len(step_us.calls) == 6 and step_us.calls[1][0] == "b"
