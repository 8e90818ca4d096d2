"""paged_model's steps as graphs (fresh prompts through prefill graphs, decoding rows and short continuations through
the decode graphs row by row, the rest eagerly), on the CPU: Triton's interpreter runs the paged kernels and
stand-ins replay the captured functions (graph_standins; a GPU's run replays real CUDA graphs). What is checked is
what could break: the staged inputs (tokens, positions, slots, each row's context, the last row), the padding and
the order of the logits, against the eager step."""

import pytest
import torch

from graph_standins import install
from model_loader.paged_model import PagedForward, PagedKVCache, SeqSlice


@pytest.fixture(scope="module")
def paged_engine(tiny_model):
    from model_loader.engine import Engine

    return Engine.load(tiny_model, device="cpu", context_length=256, use_triton=True)


def paged_forward(paged_engine, buckets=(), decode_buckets=()) -> PagedForward:
    cache = PagedKVCache(paged_engine.model, num_blocks=8, block_size=16)
    fwd = PagedForward(paged_engine.model, cache, max_batch=max((2, *decode_buckets)))
    return install(fwd, prefill_buckets=buckets, decode_buckets=decode_buckets)


def test_a_fresh_prompt_through_the_prefill_graph_matches_the_eager_step(paged_engine):
    ids = paged_engine.chat.render([{"role": "user", "content": "What is 2 + 2? Reason step by step."}]).ids
    n = len(ids)
    assert 16 < n < 32  # the 32 bucket, with padding rows
    blocks = [5, 2]  # not consecutive: each row's slot comes from its block
    eager, graphed = paged_forward(paged_engine), paged_forward(paged_engine, buckets=(16, 32, 64))
    seq = SeqSlice(0, n, n, blocks, logits=True)
    want = eager.step(ids, list(range(n)), [seq])
    got = graphed.step(ids, list(range(n)), [seq])
    assert [g.replays for g, _ in graphed.prefill_graphs.values()] == [0, 1, 0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    written = torch.tensor(eager.slots(blocks, 0, n))
    others = torch.ones(graphed.cache.k.shape[2], dtype=torch.bool)
    others[written] = False
    for cache_a, cache_b in ((eager.cache.k, graphed.cache.k), (eager.cache.v, graphed.cache.v)):
        torch.testing.assert_close(cache_b[:, :, written], cache_a[:, :, written], rtol=1e-4, atol=1e-4)
        assert not cache_b[:, :, others].any()  # the padding rows wrote nothing


def test_a_long_prompts_first_chunk_returns_no_logits_and_other_steps_run_eagerly(paged_engine):
    ids = list(range(100, 140))
    graphed = paged_forward(paged_engine, buckets=(16, 32, 64))
    assert graphed.step(ids, list(range(40)), [SeqSlice(0, 40, 40, [0, 1, 2], logits=False)]).shape[0] == 0
    # its second chunk reads the first's K/V from the cache: not a fresh prompt, so no graph
    more = list(range(140, 150))
    logits = graphed.step(more, list(range(40, 50)), [SeqSlice(0, 10, 50, [0, 1, 2, 3], logits=True)])
    assert logits.shape[0] == 1
    assert [g.replays for g, _ in graphed.prefill_graphs.values()] == [0, 0, 1]
    # past the largest bucket: eagerly too
    long_ids = list(range(100, 180))
    graphed.step(long_ids, list(range(80)), [SeqSlice(0, 80, 80, [4, 5, 6, 7, 0], logits=True)])
    assert [g.replays for g, _ in graphed.prefill_graphs.values()] == [0, 0, 1]


def test_prompts_arriving_beside_a_decoding_reply_run_as_graphs_and_match_the_eager_step(paged_engine):
    """A step of one decoding sequence and two fresh prompts (a burst of new chats): one decode graph replay and
    one prefill graph replay per prompt, the same logits and cache as the eager step."""
    render = paged_engine.chat.render
    first = render([{"role": "user", "content": "Hi there, how are you?"}]).ids
    prompts = [render([{"role": "user", "content": t}]).ids for t in ("What is 2 + 2? Reason step by step.", "Hi")]
    assert 16 < len(prompts[0]) <= 32 and len(prompts[1]) <= 16
    eager = paged_forward(paged_engine)
    graphed = paged_forward(paged_engine, buckets=(16, 32), decode_buckets=(1, 2))
    n = len(first)
    for fwd in (eager, graphed):  # the decoding sequence's prompt, already in the cache
        fwd.step(first, list(range(n)), [SeqSlice(0, n, n, [0, 1, 2], logits=True)])
    before = [g.replays for g, _ in graphed.prefill_graphs.values()]
    tokens, positions = [first[-1] + 1], [n]
    seqs = [SeqSlice(0, 1, n + 1, [0, 1, 2], logits=True)]
    for p, blocks in zip(prompts, ([3, 5], [6])):
        seqs.append(SeqSlice(len(tokens), len(p), len(p), blocks, logits=True))
        tokens += p
        positions += range(len(p))
    want = eager.step(tokens, positions, seqs)
    got = graphed.step(tokens, positions, seqs)
    assert got.shape == want.shape == (3, paged_engine.model.cfg.vocab_size)
    assert [g.replays for g, _ in graphed.graphs.values()] == [1, 0]
    assert [g.replays - b for (g, _), b in zip(graphed.prefill_graphs.values(), before)] == [1, 1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(graphed.cache.k, eager.cache.k, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(graphed.cache.v, eager.cache.v, rtol=1e-4, atol=1e-4)


def test_two_prompts_of_one_length_bucket_keep_their_own_logits(paged_engine):
    """Both replay the one bucket's graph, whose output the second replay overwrites: each prompt's logits are
    copied out first (an fp32 model's .float() would copy nothing)."""
    assert paged_engine.model.dtype == torch.float32
    render = paged_engine.chat.render
    a, b = (render([{"role": "user", "content": t}]).ids for t in ("Hi", "Yo"))
    assert len(a) <= 16 and len(b) <= 16
    eager, graphed = paged_forward(paged_engine), paged_forward(paged_engine, buckets=(16,))
    seqs = [SeqSlice(0, len(a), len(a), [0], True), SeqSlice(len(a), len(b), len(b), [1], True)]
    positions = list(range(len(a))) + list(range(len(b)))
    want = eager.step(a + b, positions, seqs)
    got = graphed.step(a + b, positions, seqs)
    assert not torch.allclose(want[0], want[1])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def prefilled(fwds, prompts):
    """Each prompt (ids, blocks) prefilled into the cache of every forward, eagerly: the cached prefixes of a
    step to come."""
    for ids, blocks in prompts:
        for fwd in fwds:
            fwd._eager(ids, list(range(len(ids))), [SeqSlice(0, len(ids), len(ids), blocks, logits=False)])


def step_of(parts):
    """(tokens, positions, seqs) of a step from (new ids, cached tokens before them, blocks, logits) per sequence."""
    tokens, positions, seqs = [], [], []
    for ids, cached, blocks, logits in parts:
        seqs.append(SeqSlice(len(tokens), len(ids), cached + len(ids), blocks, logits))
        tokens += ids
        positions += range(cached, cached + len(ids))
    return tokens, positions, seqs


def assert_same_step(eager, graphed, tokens, positions, seqs):
    want = eager.step(tokens, positions, seqs)
    got = graphed.step(tokens, positions, seqs)
    assert got.shape == want.shape == (sum(s.logits for s in seqs), eager.model.cfg.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(graphed.cache.k, eager.cache.k, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(graphed.cache.v, eager.cache.v, rtol=1e-4, atol=1e-4)


def test_a_cached_prefixs_continuation_replays_the_decode_graph_row_by_row(paged_engine):
    """A new turn after a cached prefix (5 new tokens over 20 cached) beside a decoding sequence: one replay of
    the 8-row decode graph, each continuation row attending to the positions before it, as the eager step's
    causal attention over the cache does."""
    eager = paged_forward(paged_engine)
    graphed = paged_forward(paged_engine, buckets=(16, 32), decode_buckets=(1, 2, 4, 8))
    decoding, prefix = list(range(200, 230)), list(range(300, 320))
    prefilled((eager, graphed), [(decoding, [0, 1]), (prefix, [5, 3])])
    tokens, positions, seqs = step_of([([231], 30, [0, 1], True), (list(range(400, 405)), 20, [5, 3], True)])
    assert_same_step(eager, graphed, tokens, positions, seqs)
    assert [g.replays for g, _ in graphed.graphs.values()] == [0, 0, 0, 1]
    assert [g.replays for g, _ in graphed.prefill_graphs.values()] == [0, 0]


def test_a_mixed_step_packs_rows_into_replays_and_runs_only_the_rest_eagerly(paged_engine):
    """Decoding, two short continuations, one longer than the largest decode graph and a fresh prompt in one
    step: rows packed into two replays of the 4-row graph (none split), the fresh prompt through its prefill
    graph, the long continuation alone eagerly; logits in the step's order and the cache as the eager step's."""
    eager = paged_forward(paged_engine)
    graphed = paged_forward(paged_engine, buckets=(16, 32), decode_buckets=(1, 2, 4))
    cached = [(list(range(200, 220)), [0, 1]), (list(range(240, 250)), [2]), (list(range(260, 270)), [3])]
    cached.append((list(range(280, 290)), [4]))
    prefilled((eager, graphed), cached)
    fresh = paged_engine.chat.render([{"role": "user", "content": "Hi"}]).ids
    assert len(fresh) <= 16
    tokens, positions, seqs = step_of(
        [
            ([221], 20, [0, 1], True),
            ([501, 502, 503], 10, [2], True),
            ([511, 512, 513], 10, [3], True),
            (list(range(520, 526)), 10, [4], True),  # 6 rows: more than the largest decode graph's 4
            (fresh, 0, [6], True),
        ]
    )
    assert_same_step(eager, graphed, tokens, positions, seqs)
    assert [g.replays for g, _ in graphed.graphs.values()] == [0, 0, 2]
    assert [g.replays for g, _ in graphed.prefill_graphs.values()] == [1, 0]


def test_a_continuation_that_would_read_too_much_row_by_row_runs_eagerly(paged_engine, monkeypatch):
    import model_loader.paged_model as paged_model

    monkeypatch.setattr(paged_model, "ROW_GRAPH_READS", 5 * 24)  # less than 5 rows reading 25 tokens each
    eager = paged_forward(paged_engine)
    graphed = paged_forward(paged_engine, decode_buckets=(1, 2, 4, 8))
    prefilled((eager, graphed), [(list(range(200, 230)), [0, 1]), (list(range(300, 320)), [5, 3])])
    tokens, positions, seqs = step_of([([231], 30, [0, 1], True), (list(range(400, 405)), 20, [5, 3], True)])
    assert_same_step(eager, graphed, tokens, positions, seqs)
    assert [g.replays for g, _ in graphed.graphs.values()] == [1, 0, 0, 0]  # the decoding row alone


@pytest.mark.parametrize("context", [100, 784, 1024, 4097])
def test_block_tables_are_padded_to_16_entries_for_any_context(paged_engine, context, monkeypatch):
    """Triton compiles a kernel variant per int argument that divides by 16 or not: a table width of 13 (a
    784-token context) took 4 decode-attention variants the kernel store lacked, compiled at run time."""
    monkeypatch.setattr(paged_engine.model, "max_ctx", context)
    fwd = PagedForward(paged_engine.model, PagedKVCache(paged_engine.model, num_blocks=4, block_size=64), max_batch=2)
    assert fwd.table_width % 16 == 0 and fwd.table_width * 64 >= context


def test_more_decoding_sequences_than_the_largest_graph_keep_their_samples_on_the_device(paged_engine, monkeypatch):
    """The scheduler's overlapped steps pass the samples it hasn't read as a device tensor: decoding sequences
    beyond the largest decode graph replay it in groups, gathering their tokens on the device (reading them on the
    host would wait for the step before, which the overlap exists to avoid)."""
    eager = paged_forward(paged_engine)
    graphed = paged_forward(paged_engine, decode_buckets=(1, 2))
    prompts = [(list(range(200 + 20 * i, 212 + 20 * i)), [i]) for i in range(3)]
    prefilled((eager, graphed), prompts)
    tokens, positions, seqs = step_of([([300 + i], 12, [i], True) for i in range(3)])
    want = eager.step(tokens, positions, seqs)
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("the samples were read on the host"))
    got = graphed.step(torch.tensor(tokens), positions, seqs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert [g.replays for g, _ in graphed.graphs.values()] == [1, 1]  # three rows: the 2-row graph, then the 1-row


@pytest.mark.parametrize("max_batch,rows", [(1, 32), (32, 32), (40, 48), (100, 128)])
def test_decode_graphs_cover_a_whole_bucket_of_rows(paged_engine, max_batch, rows):
    """max_batch sequences decoding always have a graph (and short continuations 32 rows): the rows captured
    round up to a bucket (48 for 40; 32 left 33 to 40 decoding sequences without one)."""
    fwd = PagedForward(
        paged_engine.model, PagedKVCache(paged_engine.model, num_blocks=2, block_size=16), max_batch=max_batch
    )
    assert fwd.max_rows == rows and fwd._bucket(max_batch) is not None and fwd._bucket(rows) == rows
