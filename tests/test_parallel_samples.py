"""Parallel samples for a majority vote (model_loader.parallel_samples) and `r1desk-cli chat --vote`."""

import json

from model_loader.events import Finished, GenerationControl, SamplingSettings
from model_loader.parallel_samples import sample_chains
from test_cli import cli

MESSAGES = [
    {
        "role": "user",
        "content": "A farmer has 6 rows of 7 trees. " * 12 + "How many trees? Put your final answer within \\boxed{}.",
    }
]  # > 2 KV blocks


def test_each_chain_is_the_reply_its_seed_gives_alone(cpu_engine):
    """Chain i of a vote seeded s is exactly the single-sequence engine's reply seeded s + i: batching the
    chains changes nothing but the time they take."""
    settings = SamplingSettings(temperature=0.8, top_p=0.95, max_new_tokens=16, seed=11)
    ended = []
    chains = sample_chains(cpu_engine, MESSAGES, settings, 3, on_done=lambda i, ev: ended.append(i))
    assert sorted(ended) == [0, 1, 2]
    for i, chain in enumerate(chains):
        alone = [
            e
            for e in cpu_engine.generate(
                MESSAGES, SamplingSettings(temperature=0.8, top_p=0.95, max_new_tokens=16, seed=11 + i)
            )
            if isinstance(e, Finished)
        ][0]
        assert chain.token_ids == alone.token_ids
        assert chain.text == alone.text
        assert chain.stats.seed == 11 + i
    assert len({tuple(c.token_ids) for c in chains}) == 3
    assert chains[0].stats.prefix_reused_tokens == 0
    assert chains[1].stats.prefix_reused_tokens == chains[2].stats.prefix_reused_tokens >= 128, (
        "the chains after the first reuse the prompt's prefill"
    )


def test_a_cancel_ends_every_chain_with_what_it_wrote(cpu_engine):
    control = GenerationControl()
    control.cancel()
    chains = sample_chains(cpu_engine, MESSAGES, SamplingSettings(max_new_tokens=50, seed=1), 4, control)
    assert [c.stats.finish_reason for c in chains] == ["cancelled"] * 4


def test_cli_vote_prints_the_chains_and_their_vote(tiny_model):
    out = json.loads(
        cli(
            "chat",
            "--model",
            tiny_model,
            "--device",
            "cpu",
            "--prompt",
            "6 * 7?",
            "--vote",
            "3",
            "--max-new-tokens",
            "8",
            "--seed",
            "5",
            "--json",
        ).stdout
    )
    vote = out["vote"]
    assert vote["chains"] == 3 and vote["seeds"] == [5, 6, 7]
    assert len(vote["texts"]) == len(vote["answers"]) == 3
    # random weights: the reasoning never closes, so no chain has an answer to count
    assert vote["summary"] == "none of the 3 chains gave an answer" and vote["support"] == 0
    assert out["text"] == vote["texts"][0]
