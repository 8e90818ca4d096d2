"""The single-sequence engine's CUDA graphs (model_loader.decode_graphs): the decode step's configuration per
depth bucket, tuned at warm-up by timing whole steps; the prefill's length buckets."""

from model_loader.kernels import decode_attention


def test_warm_up_picks_each_depth_buckets_attention_by_timing_the_whole_step(tiny_model, device):
    """On a GPU the warm-up times one captured decode step per attention configuration at the top of each depth
    bucket and keeps the fastest per bucket (DecodeStep.tune): every bucket gets the configuration with the least
    time it measured, and only the chosen configurations keep graphs, for both sampling modes. The replies
    across a bucket boundary are the same as without graphs. Without graphs (the CPU) nothing is tuned."""
    from model_loader.engine import Engine
    from model_loader.events import SamplingSettings

    engine = Engine.load(
        tiny_model, device=device, use_triton=True, context_length=1100
    )  # rounded up to 1104 (context.requested_context)
    engine.warm_up()
    if device != "cuda":
        assert engine.info.decode_attention == {} and not engine.step.graphs
        return
    buckets = decode_attention.depth_buckets(engine.model.max_ctx)
    assert buckets == [1024, 1104]
    assert list(engine.info.decode_attention) == [f"<={b}" for b in buckets]
    timings = engine.step.tuned_us
    for upper, config in engine.step.plan:
        assert timings[upper][str(config)] == min(timings[upper].values())
        assert set(timings[upper]) == {str(c) for c in decode_attention.decode_attention_candidates(device)}
    chosen = {config for _, config in engine.step.plan}
    assert set(engine.step.graphs) == {(mode, c) for mode in ("greedy", "sample") for c in chosen}
    # a reply that crosses from one bucket's graph into the other's (forced to differ) gives the same text as
    # the same steps without graphs
    step = engine.step
    step.plan = [(1024, decode_attention.DECODE_ATTN_CONFIGS[0]), (1104, decode_attention.DECODE_ATTN_CONFIGS[1])]
    step.graphs.clear()
    step.capture("greedy")  # its steps write into the cache: nothing cached counts
    engine.reset_cache()
    reps = 300
    while len(engine.chat.render([{"role": "user", "content": "Count slowly " * reps}]).ids) < 990:
        reps += 10
    prompt = [{"role": "user", "content": "Count slowly " * reps}]
    n_prompt = len(engine.chat.render(prompt).ids)
    settings = SamplingSettings(temperature=0, max_new_tokens=60, ignore_eos=True)
    assert n_prompt < 1024 < n_prompt + settings.max_new_tokens <= engine.model.max_ctx
    graphed = list(engine.generate(prompt, settings))
    step.graphs.clear()
    step.use_graphs = False
    engine.reset_cache()
    eager = list(engine.generate(prompt, settings))
    text = lambda events: "".join(getattr(e, "text", "") for e in events)  # noqa: E731
    assert text(graphed) == text(eager) and text(graphed)


def test_a_step_takes_the_attention_configuration_of_its_depth_bucket():
    """plan: (largest depth, configuration) per bucket, deepest last; a depth past every bucket (the cache is never
    deeper than its last) takes the last one."""
    from model_loader.decode_graphs import DecodeStep

    step = DecodeStep.__new__(DecodeStep)  # config_for reads the plan alone: no model or graphs needed
    step.plan = [(1024, "short"), (4096, "long")]
    assert [step.config_for(n) for n in (1, 1023, 1024, 1025, 4096, 5000)] == [
        "short",
        "short",
        "short",
        "long",
        "long",
        "long",
    ]


def test_prefill_buckets_stop_at_the_chunk_and_the_context():
    """A context holds the buckets up to its length and the prefill chunk (a longer prompt is prefilled in chunks);
    a context shorter than the smallest bucket still gets it. A prompt takes the smallest bucket that holds its new
    tokens and, padded to it, still ends inside the cache, else none (it is prefilled eagerly)."""
    from types import SimpleNamespace

    from model_loader.decode_graphs import PrefillGraphs

    assert PrefillGraphs.buckets_for(32768, 512) == (16, 32, 64, 128, 256, 512)
    assert PrefillGraphs.buckets_for(32768, 4096) == PrefillGraphs.BUCKETS
    assert PrefillGraphs.buckets_for(100, 512) == (16, 32, 64)
    assert PrefillGraphs.buckets_for(8, 512) == (16,)
    graphs = SimpleNamespace(buckets=(16, 32, 64), model=SimpleNamespace(max_ctx=100))
    bucket_for = PrefillGraphs.bucket_for
    assert [bucket_for(graphs, n, 0) for n in (1, 16, 17, 64, 65)] == [16, 16, 32, 64, None]
    assert bucket_for(graphs, 10, 80) == 16  # 80 + 16 ends at 96, inside the 100-token cache
    assert bucket_for(graphs, 20, 80) is None  # 80 + 32 would run past it
    assert bucket_for(graphs, 20, 68) == 32  # ends exactly at the cache's end
