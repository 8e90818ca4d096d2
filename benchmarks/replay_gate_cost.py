"""What the replay gate (model_loader.replay_gate) costs and gains: decode speed and stop-thinking latency with
each decode graph's body in a conditional node, and without (the gate forced unavailable: queued steps run to
the end, as before). Same process, same model, alternating, so machine drift affects both alike.

    python benchmarks/replay_gate_cost.py --model /tmp/full [--rounds 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from followup_latency import stop_thinking  # noqa: E402

from model_loader import engine as engine_module  # noqa: E402
from model_loader.bench import bench_prompt, run_ours  # noqa: E402
from model_loader.engine import Engine  # noqa: E402
from model_loader.replay_gate import ReplayGate  # noqa: E402


class NoGate(ReplayGate):
    def __init__(self, device):
        super().__init__("cpu")  # unavailable: bodies record plainly, closed() only waits


def measure(model: str, gated: bool) -> dict:
    engine_module.ReplayGate = ReplayGate if gated else NoGate
    engine = Engine.load(model, context_length=4096)
    engine.warm_up()
    assert engine.step.gate.available == gated
    prompt = bench_prompt(engine, 512)
    decode = run_ours(engine, prompt, 1024, 3, temperature=0.0)
    st = stop_thinking(engine, bench_prompt(engine, 1024), runs=7)
    engine.close()
    return {"gated": gated, "decode_tok_s_p50": round(decode["decode_tok_s_p50"], 1),
            "ttft_ms_p50": round(decode["ttft_ms_p50"], 2), "stop_thinking_ms": st,
            "stop_thinking_ms_median": statistics.median(st)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for _ in range(args.rounds):
        for gated in (True, False):
            row = measure(args.model, gated)
            rows.append(row)
            print(f"{'gate' if gated else 'no gate'}: decode {row['decode_tok_s_p50']} tok/s, TTFT "
                  f"{row['ttft_ms_p50']} ms; stop thinking {row['stop_thinking_ms']} ms (median "
                  f"{row['stop_thinking_ms_median']:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
