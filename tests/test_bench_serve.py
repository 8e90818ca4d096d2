"""`r1desk-cli bench --scenario serve` (model_loader.bench_serve): real streaming HTTP clients against `serve` on
the tiny model (CPU), each request timed and counted, failures counted apart with what the server said, and the
report's figures."""

import asyncio
import json
import urllib.request

import pytest

from model_loader.bench_serve import format_serve, run_clients, start_server, stop_server


@pytest.fixture(scope="module")
def bench_server(tiny_model):
    proc, url = start_server(str(tiny_model), "cpu", max_parallel=2)
    try:
        with urllib.request.urlopen(url + "/models") as resp:
            yield url, json.loads(resp.read())["data"][0]["id"]
    finally:
        stop_server(proc)
    assert proc.poll() is not None  # stopped


def test_clients_share_the_requests_and_every_reply_is_timed(bench_server):
    url, model = bench_server
    r = asyncio.run(run_clients(url, model, clients=2, requests=3, prompt_words=8, new_tokens=4))
    assert (r["clients"], r["requests"], r["errors"], r["error_messages"]) == (2, 3, 0, [])
    assert r["tokens"] == 3 * 4 and r["tok_s"] > 0  # greedy, max_tokens 4: every reply runs to its length
    assert 0 < r["ttft_ms_p50"] <= r["ttft_ms_p95"] <= r["ttft_ms_max"]
    assert 0 < r["e2e_s_p50"] <= r["e2e_s_max"] and r["e2e_s_max"] * 1000 >= r["ttft_ms_max"]
    assert r["ttft_ms_p50"] > r["e2e_s_max"]  # milliseconds: a first token is more than a thousandth of a reply
    report = format_serve({**r, "max_parallel": 2})
    assert report.startswith("3 requests from 2 clients, 4 new tokens each, server with --max-parallel 2:")
    assert "0 errors" in report and "error:" not in report


def test_failed_requests_are_counted_apart_with_the_servers_words(bench_server):
    url, _ = bench_server
    r = asyncio.run(run_clients(url, "no-such-model", clients=1, requests=2, prompt_words=4, new_tokens=2))
    assert r["errors"] == 2 and r["tokens"] == 0
    assert len(r["error_messages"]) == 1 and r["error_messages"][0].startswith("HTTP 404")
    assert "\n  error: HTTP 404" in format_serve({**r, "max_parallel": 1})
