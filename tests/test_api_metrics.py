"""GET /metrics' content (desktop.api.metrics), without a server: the counters and histograms move by exactly what
each ended request's stats say, a failed request counts as "error" with nothing measured, and the live gauges read
the service's queue and, when there is one, the scheduler's snapshot at each scrape. Parsed back with
prometheus-client's own parser, as a Prometheus server reads it. The page over HTTP, next to real requests, is
checked by tests/test_api_server_parallel.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from desktop.api.metrics import ServiceMetrics
from model_loader.events import GenerationStats


class Service:
    """What ServiceMetrics reads of the engine service: its queue, its parallelism, its worker's scheduler, and the
    request_ended signal (here: a list of listeners called by end())."""

    def __init__(self, scheduler=None):
        self.active, self.waiting, self.parallel = {}, [], 1
        self.host = SimpleNamespace(worker=SimpleNamespace(scheduler=scheduler))
        self._listeners = []
        self.request_ended = SimpleNamespace(connect=self._listeners.append)

    def end(self, client: str, stats: GenerationStats | None) -> None:
        for listener in self._listeners:
            listener(SimpleNamespace(client=client), stats)


def stats(**kw) -> GenerationStats:
    base = dict(
        finish_reason="stop",
        prompt_tokens=20,
        completion_tokens=5,
        reasoning_tokens=3,
        prefix_reused_tokens=16,
        context_length=512,
        ttft_ms=30.0,
        first_answer_ms=None,
        decode_tok_s=100.0,
        total_s=0.07,
        token_latencies_ms=[10.0, 10.0, 12.0, 8.0],
    )
    return GenerationStats(**{**base, **kw})


def scrape(metrics: ServiceMetrics) -> dict[tuple[str, tuple], float]:
    """Every sample on the page: (name, its labels sorted) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }


def test_ended_requests_add_their_tokens_and_times():
    service = Service()
    metrics = ServiceMetrics(service)
    service.end("api", stats())
    service.end("api", stats(finish_reason="length", prompt_tokens=7, prefix_reused_tokens=0, ttft_ms=600.0))
    service.end("window", stats(completion_tokens=0, token_latencies_ms=[], total_s=0.01))
    page = scrape(metrics)
    assert page["r1desk_requests_total", (("client", "api"), ("finish_reason", "stop"))] == 1
    assert page["r1desk_requests_total", (("client", "api"), ("finish_reason", "length"))] == 1
    assert page["r1desk_requests_total", (("client", "window"), ("finish_reason", "stop"))] == 1
    assert page["r1desk_prompt_tokens_total", ()] == 20 + 7 + 20
    assert page["r1desk_prompt_cached_tokens_total", ()] == 16 + 0 + 16
    assert page["r1desk_generation_tokens_total", ()] == 5 + 5 + 0
    # a reply with no token has no first-token time: two observations, 30 ms and 600 ms
    assert page["r1desk_time_to_first_token_seconds_count", ()] == 2
    assert page["r1desk_time_to_first_token_seconds_sum", ()] == pytest.approx(0.63)
    assert page["r1desk_time_to_first_token_seconds_bucket", (("le", "0.04"),)] == 1
    assert page["r1desk_time_to_first_token_seconds_bucket", (("le", "0.75"),)] == 2
    # every gap between tokens, in seconds
    assert page["r1desk_inter_token_latency_seconds_count", ()] == 8
    assert page["r1desk_inter_token_latency_seconds_sum", ()] == pytest.approx(0.08)
    assert page["r1desk_inter_token_latency_seconds_bucket", (("le", "0.0075"),)] == 0
    assert page["r1desk_inter_token_latency_seconds_bucket", (("le", "0.01"),)] == 6
    assert page["r1desk_e2e_request_latency_seconds_count", ()] == 3
    assert page["r1desk_e2e_request_latency_seconds_sum", ()] == pytest.approx(0.15)


def test_a_failed_request_counts_as_an_error_and_measures_nothing():
    service = Service()
    metrics = ServiceMetrics(service)
    service.end("api", None)
    page = scrape(metrics)
    assert page["r1desk_requests_total", (("client", "api"), ("finish_reason", "error"))] == 1
    assert page["r1desk_prompt_tokens_total", ()] == 0
    assert page["r1desk_e2e_request_latency_seconds_count", ()] == 0


def test_the_queue_gauges_are_read_at_each_scrape():
    service = Service()
    metrics = ServiceMetrics(service)
    service.active, service.waiting, service.parallel = {"a": 1, "b": 2}, ["c"], 4
    page = scrape(metrics)
    assert page["r1desk_requests_running", ()] == 2
    assert page["r1desk_requests_waiting", ()] == 1
    assert page["r1desk_max_parallel", ()] == 4
    assert not any(name.startswith("r1desk_kv_") for name, _ in page)  # one reply at a time: no scheduler
    service.waiting = []
    assert scrape(metrics)["r1desk_requests_waiting", ()] == 0


def test_with_a_scheduler_its_blocks_and_prefix_cache_are_shown():
    snap = dict(
        running=3,
        waiting=2,
        kv_blocks_used=30,
        kv_blocks_free=90,
        kv_block_tokens=16,
        prefix_cache_hits=6,
        prefix_cache_lookups=8,
        preemptions=1,
    )
    page = scrape(ServiceMetrics(Service(scheduler=SimpleNamespace(snapshot=lambda: snap))))
    assert page["r1desk_kv_blocks_used", ()] == 30
    assert page["r1desk_kv_blocks_free", ()] == 90
    assert page["r1desk_kv_block_tokens", ()] == 16
    assert page["r1desk_kv_cache_usage_ratio", ()] == 0.25
    assert page["r1desk_prefix_cache_hit_ratio", ()] == 0.75
    assert page["r1desk_sequences_running", ()] == 3
    assert page["r1desk_sequences_waiting", ()] == 2
    assert page["r1desk_preemptions", ()] == 1
    snap.update(prefix_cache_hits=0, prefix_cache_lookups=0, kv_blocks_used=0, kv_blocks_free=0)
    page = scrape(ServiceMetrics(Service(scheduler=SimpleNamespace(snapshot=lambda: snap))))
    assert page["r1desk_prefix_cache_hit_ratio", ()] == 0.0  # no lookup yet: 0, not a division by zero
    assert page["r1desk_kv_cache_usage_ratio", ()] == 0.0


def test_two_servers_in_one_process_keep_apart():
    first, second = Service(), Service()
    a, b = ServiceMetrics(first), ServiceMetrics(second)
    first.end("api", stats())
    assert scrape(a)["r1desk_generation_tokens_total", ()] == 5
    assert scrape(b)["r1desk_generation_tokens_total", ()] == 0
