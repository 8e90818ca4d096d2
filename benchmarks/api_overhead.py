"""What does serving through the local API cost, against the engine alone, one request at a time and four at once?

The engine alone vs the same prompts through `r1desk-cli serve` and the official `openai` client (streamed).

Both sides are timed the same way, from the caller's seat: TTFT = from the call to the first text; decode tok/s =
(completion tokens - 1) / (last text - first text). Greedy; both sides run the identical sequence of requests
(two warm-up requests, then the measured ones) on one engine without clearing its KV cache, so each request
reuses exactly the same prefix on both sides (chat-template tokens at least) and takes the same prefill path.
The server's own engine timings of each request (GET /health) split the API's TTFT into engine and transport.

    python -m benchmarks.api_overhead --model /tmp/full --max-tokens 2048 --runs 3 [--json-out api.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

BODY = "Write a long story about a lighthouse keeper, with dialogue and a list of the ships she saw."
WARM_UP = ["Warm-up one. " + BODY, "Warm-up two. " + BODY]  # first-use paths, on both sides alike


def prompts(n: int, offset: int = 0) -> list[str]:
    return [f"Story {i + offset}. {BODY}" for i in range(n)]


def engine_alone(model: str, context: int, max_tokens: int, texts: list[str]) -> list[dict]:
    from model_loader.engine import Engine
    from model_loader.events import Delta, Finished, SamplingSettings

    engine = Engine.load(model, context_length=context)
    engine.warm_up()
    out = []
    for text in texts:
        t_call, first, last, final = time.perf_counter(), None, None, None
        for ev in engine.generate(
            [{"role": "user", "content": text}], SamplingSettings(temperature=0, max_new_tokens=max_tokens)
        ):
            if isinstance(ev, Delta):
                last = time.perf_counter()
                first = first or last
            elif isinstance(ev, Finished):
                final = ev
        n = final.stats.completion_tokens
        out.append(
            {
                "ttft_ms": (first - t_call) * 1000,
                "tok_s": (n - 1) / (last - first),
                "tokens": n,
                "engine_ttft_ms": final.stats.ttft_ms,
                "engine_tok_s": final.stats.decode_tok_s,
            }
        )
    engine.close()
    return out


def stream_one(client, model_id: str, text: str, max_tokens: int) -> dict:
    t_call, first, last, usage = time.perf_counter(), None, None, None
    for chunk in client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": text}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices:
            d = chunk.choices[0].delta
            if d.content or (d.model_extra or {}).get("reasoning_content"):
                last = time.perf_counter()
                first = first or last
    n = usage.completion_tokens
    return {
        "ttft_ms": (first - t_call) * 1000,
        "tok_s": (n - 1) / (last - first),
        "tokens": n,
        "start": t_call,
        "end": last,
    }


def stream_raw(url: str, model_id: str, text: str, max_tokens: int) -> dict:
    """The same request through http.client and a hand-read SSE stream: no client library's own costs, so the
    difference to stream_one is the openai client's share of the TTFT."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(url)
    body = json.dumps(
        {
            "model": model_id,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
    )
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t_call, first, last, n = time.perf_counter(), None, None, 0
    conn.request("POST", u.path + "/chat/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    while True:
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data: {") and (b'"content":"' in line or b'"reasoning_content":"' in line):
            if b'"content":""' in line and b"reasoning_content" not in line:
                continue  # the role chunk
            last = time.perf_counter()
            first = first or last
    conn.close()
    with urllib.request.urlopen(url.removesuffix("/v1") + "/health") as h:
        st = json.load(h)["last"]
    n = st["completion_tokens"]
    return {
        "ttft_ms": (first - t_call) * 1000,
        "tok_s": (n - 1) / (last - first),
        "tokens": n,
        "server_engine_ttft_ms": st["ttft_ms"],
    }


def through_api(
    model: str, context: int, max_tokens: int, texts: list[str], concurrent: list[str], raw_texts: list[str] = ()
) -> dict:
    import openai

    proc = subprocess.Popen(
        [sys.executable, "-m", "desktop.cli", "serve", "--model", model, "--context", str(context), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, QT_QPA_PLATFORM="offscreen"),
    )
    try:
        line = proc.stdout.readline()
        m = re.match(r"serving (\S+) on (http://\S+/v1)$", line.strip())
        if not m:
            raise SystemExit(f"the server did not start: {line!r}")
        model_id, url = m.groups()
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        for t in WARM_UP:
            stream_one(client, model_id, t, max_tokens)
        one = []
        for t in texts:
            r = stream_one(client, model_id, t, max_tokens)
            with urllib.request.urlopen(url.removesuffix("/v1") + "/health") as h:
                last = json.load(h)["last"]
            r.update(server_engine_ttft_ms=last["ttft_ms"], server_engine_tok_s=last["decode_tok_s"])
            one.append(r)
        raw = [stream_raw(url, model_id, t, max_tokens) for t in raw_texts]
        results: list[dict] = []

        def worker(text):
            results.append(stream_one(client, model_id, text, max_tokens))

        threads = [threading.Thread(target=worker, args=(t,)) for t in concurrent]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = max(r["end"] for r in results) - t0
        four = {
            "requests": results,
            "wall_s": wall,
            "total_tokens": sum(r["tokens"] for r in results),
            "aggregate_tok_s": sum(r["tokens"] for r in results) / wall,
        }
        return {"one_at_a_time": one, "four_at_once": four, "raw_http": raw}
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    texts = prompts(args.runs)
    concurrent = prompts(4, offset=100)
    raw_texts = prompts(args.runs, offset=200)
    alone = engine_alone(args.model, args.context, args.max_tokens, WARM_UP + texts + concurrent)[len(WARM_UP) :]
    api = through_api(args.model, args.context, args.max_tokens, texts, concurrent, raw_texts)
    a1, p1 = alone[: args.runs], api["one_at_a_time"]
    med = statistics.median
    report = {
        "engine_alone": alone,
        "api": api,
        "one": {
            "engine_ttft_ms": med(r["ttft_ms"] for r in a1),
            "api_ttft_ms": med(r["ttft_ms"] for r in p1),
            "engine_tok_s": med(r["tok_s"] for r in a1),
            "api_tok_s": med(r["tok_s"] for r in p1),
            "server_engine_ttft_ms": med(r["server_engine_ttft_ms"] for r in p1),
        },
    }
    four_alone_s = sum(r["ttft_ms"] / 1000 + (r["tokens"] - 1) / r["tok_s"] for r in alone[args.runs :])
    report["four"] = {
        "engine_back_to_back_tok_s": sum(r["tokens"] for r in alone[args.runs :]) / four_alone_s,
        "api_aggregate_tok_s": api["four_at_once"]["aggregate_tok_s"],
        "api_each_tok_s": [r["tok_s"] for r in api["four_at_once"]["requests"]],
    }
    gap = lambda rows: med(r["ttft_ms"] - r["server_engine_ttft_ms"] for r in rows)  # noqa: E731
    report["ttft_over_server_engine_ms"] = {"openai_client": gap(p1), "raw_http": gap(api["raw_http"])}
    o, f = report["one"], report["four"]
    print(
        f"one request : TTFT engine {o['engine_ttft_ms']:.2f} ms, API {o['api_ttft_ms']:.2f} ms "
        f"(+{o['api_ttft_ms'] - o['engine_ttft_ms']:.2f} ms); decode engine {o['engine_tok_s']:.1f} tok/s, "
        f"API {o['api_tok_s']:.1f} tok/s ({100 * o['api_tok_s'] / o['engine_tok_s']:.1f}%); the server's engine "
        f"TTFT {o['server_engine_ttft_ms']:.2f} ms"
    )
    print(
        f"four at once: engine back to back {f['engine_back_to_back_tok_s']:.1f} tok/s, API aggregate "
        f"{f['api_aggregate_tok_s']:.1f} tok/s ({100 * f['api_aggregate_tok_s'] / f['engine_back_to_back_tok_s']:.1f}%)"
        f"; each request's decode {', '.join(f'{x:.0f}' for x in f['api_each_tok_s'])} tok/s"
    )
    g = report["ttft_over_server_engine_ms"]
    print(
        f"client TTFT over the server engine's own TTFT (median): openai client {g['openai_client']:.2f} ms, "
        f"raw HTTP {g['raw_http']:.2f} ms"
    )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
