"""r1desk-cli bench --scenario serve: real HTTP clients against `r1desk-cli serve`, as a user's tools load it.

Starts `serve` in a child process (its own flags: --max-parallel, the model, the device), waits for its "serving"
line, then runs `clients` concurrent streaming clients that send `requests` chat requests in all (each a different
prompt of about prompt_words words, new_tokens new tokens, greedy) and time each one: time to its first token,
its whole time, its tokens. Reports P50/P90/P95/max of both, aggregate tokens per second over the run and the
errors, like vLLM's benchmark_serving. The server is stopped at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time

from model_loader.bench import FILLER
from model_loader.stats import percentile


def start_server(model: str, device: str, max_parallel: int, extra: list[str] = ()) -> tuple[subprocess.Popen, str]:
    """`r1desk-cli serve` on a free port: (its process, its /v1 URL) once it says it is serving."""
    cmd = [
        sys.executable,
        "-m",
        "desktop.cli",
        "serve",
        "--model",
        model,
        "--device",
        device,
        "--port",
        "0",
        "--max-parallel",
        str(max_parallel),
        "--max-waiting",
        "1024",
        *extra,
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, QT_QPA_PLATFORM="offscreen"),
    )
    line = proc.stdout.readline()
    m = re.match(r"serving (\S+) on (http://\S+/v1)$", line.strip())
    if not m:
        proc.kill()
        raise RuntimeError(f"the server did not start: {line.strip()!r} {proc.stderr.read()[-2000:]}")
    return proc, m.group(2)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


async def _one(http, url: str, model: str, prompt: str, new_tokens: int) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": new_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first, tokens = None, 0
    async with http.post(url + "/chat/completions", json=body) as resp:
        if resp.status != 200:
            return {"error": f"HTTP {resp.status}: {(await resp.text())[:200]}"}
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return {"error": chunk["error"].get("message", "error in the stream")}
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
            if first is None and (delta.get("content") or delta.get("reasoning_content")):
                first = time.perf_counter()
    end = time.perf_counter()
    return {"ttft_s": (first or end) - t0, "e2e_s": end - t0, "tokens": tokens}


async def run_clients(url: str, model: str, clients: int, requests: int, prompt_words: int, new_tokens: int) -> dict:
    import aiohttp

    words = FILLER.split()
    prompts = [
        f"Request {i}. " + " ".join(words[(i + j) % len(words)] for j in range(prompt_words)) for i in range(requests)
    ]
    queue: asyncio.Queue = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    results: list[dict] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)

    async def client(http):
        while not queue.empty():
            prompt = queue.get_nowait()
            try:
                results.append(await _one(http, url, model, prompt, new_tokens))
            except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                results.append({"error": f"{type(err).__name__}: {err}"})

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    wall = time.perf_counter() - t0
    ok = [r for r in results if "error" not in r]
    ttft = [r["ttft_s"] * 1000.0 for r in ok]
    e2e = [r["e2e_s"] for r in ok]
    summary = {
        "clients": clients,
        "requests": requests,
        "new_tokens": new_tokens,
        "prompt_words": prompt_words,
        "wall_s": wall,
        "errors": len(results) - len(ok),
        "error_messages": sorted({r["error"] for r in results if "error" in r})[:5],
        "tokens": sum(r["tokens"] for r in ok),
        "tok_s": sum(r["tokens"] for r in ok) / wall if wall else 0.0,
    }
    for name, values in (("ttft_ms", ttft), ("e2e_s", e2e)):
        for q in (50, 90, 95):
            summary[f"{name}_p{q}"] = percentile(values, q)
        summary[f"{name}_max"] = max(values) if values else float("nan")
    return summary


def run_serve_scenario(
    model: str,
    device: str,
    clients: int,
    requests: int,
    max_parallel: int,
    prompt_words: int = 300,
    new_tokens: int = 256,
    extra: list[str] = (),
) -> dict:
    proc, url = start_server(model, device, max_parallel, list(extra))
    try:
        import urllib.request

        with urllib.request.urlopen(url + "/models") as resp:
            model_id = json.loads(resp.read())["data"][0]["id"]
        asyncio.run(
            run_clients(
                url, model_id, min(clients, requests), min(clients, requests), prompt_words, min(new_tokens, 16)
            )
        )  # warm-up, untimed: every batch size's first replay
        result = asyncio.run(run_clients(url, model_id, clients, requests, prompt_words, new_tokens))
    finally:
        stop_server(proc)
    result.update(max_parallel=max_parallel, model=model_id)
    return result


def format_serve(r: dict) -> str:
    return (
        f"{r['requests']} requests from {r['clients']} clients, {r['new_tokens']} new tokens each, server with "
        f"--max-parallel {r['max_parallel']}: {r['tok_s']:,.1f} tok/s in all over {r['wall_s']:.1f} s, "
        f"{r['errors']} errors\n"
        f"  TTFT ms   p50 {r['ttft_ms_p50']:,.1f}  p90 {r['ttft_ms_p90']:,.1f}  p95 {r['ttft_ms_p95']:,.1f}  "
        f"max {r['ttft_ms_max']:,.1f}\n"
        f"  whole s   p50 {r['e2e_s_p50']:,.2f}  p90 {r['e2e_s_p90']:,.2f}  p95 {r['e2e_s_p95']:,.2f}  "
        f"max {r['e2e_s_max']:,.2f}" + "".join(f"\n  error: {m}" for m in r["error_messages"])
    )
