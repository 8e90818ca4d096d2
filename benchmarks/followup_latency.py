"""How soon do follow-up turns and the stop-thinking injection give their first token (issue 12, point 2)?

A follow-up: a cached prefix of P tokens (a finished earlier turn) plus N new tokens (the reply sent back and
the new user turn); TTFT is the engine's own (call to first token). The whole table runs once right after
warm-up ("first": nothing may compile or capture lazily after ready) and once more ("again").
Stop thinking: a reply in its reasoning, the request made between two tokens; latency = from the request to
the first answer text (the close tag forced into the decode steps already queued, then the answer's first
token; model_loader.forced_tokens).

    python -m benchmarks.followup_latency --model /tmp/full [--prefixes 512,4096] [--new 1024,2048] [--again 5]
                                           [--pause 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import statistics
import threading
import time
from pathlib import Path

from model_loader.bench import bench_prompt
from model_loader.chat import STOP_THINKING_TEXT
from model_loader.engine import Engine
from model_loader.events import Delta, Finished, GenerationControl, SamplingSettings

PREFIXES = (512, 4096, 8192)
NEW = (16, 256, 1024, 2048)


def one_token(engine: Engine, ids: list[int]):
    s = SamplingSettings(temperature=0, max_new_tokens=1, ignore_eos=True)
    return [e for e in engine.generate_ids(ids, s) if isinstance(e, Finished)][0].stats


def sm_clock_reader(engine: Engine):
    """A function returning the GPU's SM clock in MHz now (NVML), or None where NVML can't tell."""
    try:
        import pynvml

        from model_loader.stats import nvml_handle

        pynvml.nvmlInit()
        handle = nvml_handle(pynvml, engine.info.gpu_uuid)
        if handle is None:
            return lambda: None
        return lambda: int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:
        return lambda: None


def followups(engine: Engine, pool: list[int], prefixes, new, pause_s: float = 0.0, sm_clock=None) -> list[dict]:
    """Each case: a prefix prefilled, then (after pause_s idle seconds: a user reading the reply) the follow-up.
    sm_clock: sm_clock_reader(engine), read just before each follow-up."""
    rows = []
    for p in prefixes:
        for n in new:
            engine.reset_cache()
            one_token(engine, pool[:p])
            if pause_s:
                time.sleep(pause_s)  # the GPU idles as it does while a user reads: its clocks may change
            mhz = sm_clock() if sm_clock is not None else None
            st = one_token(engine, pool[: p + n])
            assert st.prefix_reused_tokens == p, (p, n, st.prefix_reused_tokens)
            rows.append({"prefix": p, "new": n, "ttft_ms": round(st.ttft_ms, 2), "sm_mhz_before": mhz})
    return rows


def stop_thinking(
    engine: Engine, pool: list[int], runs: int = 5, after: int = 64, from_thread: bool = False
) -> list[dict]:
    """Each run: a sampled reply inside its reasoning, asked to stop once `after` tokens came back; the time from
    the request to the first answer text, and the tokens the model wrote in between besides the close tag (the
    steps already past their commit when the tag arrived). from_thread: asked from another thread (as the
    window's GUI thread does) after a random sleep of up to 1.5 ms, i.e. mid-step, instead of by the reply's
    consumer right after a token; tokens are then counted from the last one the consumer had seen."""
    tag = engine.chat.encode_plain(STOP_THINKING_TEXT)
    rng = random.Random(0)
    asks: queue.Queue = queue.Queue()
    out = []

    def asker() -> None:  # one thread for every request, as the window's GUI thread is always the same one
        while (job := asks.get()) is not None:
            control, delay_s, received, asked, done = job
            if delay_s:
                time.sleep(delay_s)  # not a spin: that would hold the GIL the engine's thread needs
            asked.update(at=time.perf_counter(), n=received[0])
            control.stop_thinking()
            asked["call_ms"] = (time.perf_counter() - asked["at"]) * 1000.0
            done.set()

    thread = threading.Thread(target=asker, daemon=True)
    thread.start()
    for r in range(runs):
        engine.reset_cache()
        control = GenerationControl()
        asked: dict = {}
        received = [0]  # tokens the consumer has seen
        done = threading.Event()
        latency, final, sent = None, None, False
        s = SamplingSettings(temperature=0.6, max_new_tokens=after + 64, ignore_eos=True, seed=r)
        for ev in engine.generate_ids(pool[: 512 + r], s, control, in_reasoning=True):
            if isinstance(ev, Finished):
                final = ev
            if not isinstance(ev, Delta):
                continue
            received[0] = ev.token_count
            if not sent and ev.token_count >= after:
                asks.put((control, rng.uniform(0, 0.0015) if from_thread else 0.0, received, asked, done))
                sent = True
                if not from_thread:
                    done.wait()
            elif "at" in asked and latency is None and ev.kind == "answer":
                latency = (time.perf_counter() - asked["at"]) * 1000.0
        done.wait()
        ids = final.token_ids
        start = next((i for i in range(asked["n"], len(ids)) if ids[i : i + len(tag)] == tag), None)
        out.append(
            {
                "ms": round(latency, 2) if latency is not None else float("nan"),
                "tokens_before_tag": None if start is None else start - asked["n"],
                "request_call_ms": round(asked["call_ms"], 3),
            }
        )
    asks.put(None)
    thread.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--json")
    ap.add_argument("--prefixes", default=",".join(map(str, PREFIXES)))
    ap.add_argument("--new", default=",".join(map(str, NEW)))
    ap.add_argument("--device")
    ap.add_argument("--stop-only", action="store_true", help="only the stop-thinking latencies")
    ap.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds the GPU idles between a case's prefix and its follow-up (a user reading the "
        "reply; default 0: back to back); the SM clock before each follow-up is recorded",
    )
    ap.add_argument(
        "--again",
        type=int,
        default=1,
        help="rounds of the table after the first (each case is one follow-up a round: with several, "
        "'again' prints each case's min / median / max)",
    )
    args = ap.parse_args()
    prefixes = [int(x) for x in args.prefixes.split(",")]
    new = [int(x) for x in args.new.split(",")]
    engine = Engine.load(args.model, device=args.device, context_length=max(prefixes) + max(new) + 64)
    engine.warm_up()
    pool = bench_prompt(engine, max(prefixes) + max(new))
    result = {
        "model": engine.info.model_name,
        "device": engine.info.device_name,
        "dtype": engine.info.dtype,
        "quantization": engine.info.quantization,
        "warmup_s": round(engine.info.warmup_s, 2),
        "pause_s": args.pause,
    }
    sm_clock = sm_clock_reader(engine)

    def table():
        return followups(engine, pool, prefixes, new, args.pause, sm_clock)

    result["first"] = [] if args.stop_only else table()
    result["again"] = [] if args.stop_only else table()
    rounds = [result["again"]] + [table() for _ in range(args.again - 1) if not args.stop_only]
    if len(rounds) > 1:  # one sample per case and round: the spread says how much one number means
        result["again_rounds"] = rounds
    result["stop_thinking"] = stop_thinking(engine, pool)
    result["stop_thinking_mid_step"] = stop_thinking(engine, pool, runs=10, from_thread=True)
    for key in ("first", "again"):
        print(
            key
            + ": "
            + "; ".join(
                f"{r['prefix']}+{r['new']}: {r['ttft_ms']} ms"
                + (f" (SM {r['sm_mhz_before']} MHz before)" if r["sm_mhz_before"] else "")
                for r in result[key]
            )
        )
    if "again_rounds" in result:
        cases = zip(*(([r["ttft_ms"] for r in rows]) for rows in result["again_rounds"]))
        print(
            f"again, {len(rounds)} rounds (min / median / max): "
            + "; ".join(
                f"{r['prefix']}+{r['new']}: {min(ms)} / {statistics.median(ms):.2f} / {max(ms)} ms"
                for r, ms in zip(result["again"], cases)
            )
        )
    for key, when in (("stop_thinking", "right after a token"), ("stop_thinking_mid_step", "mid-step, another thread")):
        ms = [r["ms"] for r in result[key]]
        print(
            f"stop thinking ({when}) -> first answer text: {ms} ms (median {statistics.median(ms):.2f}); model "
            f"tokens between the request and the close tag: {[r['tokens_before_tag'] for r in result[key]]}; "
            f"stop_thinking() took {[r['request_call_ms'] for r in result[key]]} ms"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
